"""reactor_fork: forking a run from the command line."""

from __future__ import annotations

import json

import pytest

from django_reactor.models import Execution
from django_reactor.states import ExecutionStatus
from tests.commands.test_reactor_steer import command, failing
from tests.integration.reactors import ledger
from tests.integration.test_forks import Pipeline, failed_at

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_dry_run_shows_the_plan_and_writes_nothing() -> None:
    original = str(Pipeline.run({"n": 1}).execution_id)
    out, _ = command("reactor_fork", original, from_step="s6", dry_run=True)
    assert out.splitlines() == [
        "fork from s6:",
        "  carried (not run again): s1, s2, s3, s4, s5",
        "  undone first, in this order: s8, s7, s6",
        "  run again: s6, s7, s8 (and every step not carried)",
    ]
    assert Execution.objects.count() == 1


def test_a_fork_that_abandons_steps_is_refused_until_confirmed() -> None:
    original = str(Pipeline.run({"n": 1}).execution_id)
    out, _, message = failing("reactor_fork", original, from_step="s7")
    assert "undone first, in this order: s8, s7" in out
    assert "run again with --undo-abandoned" in message
    assert Execution.objects.count() == 1

    ledger.clear()
    out, _ = command("reactor_fork", original, from_step="s7", undo_abandoned=True, json=True)
    data = json.loads(out)
    assert data["status"] == ExecutionStatus.COMPLETED
    assert ledger.calls == [("undo", "s8"), ("undo", "s7"), ("run", "s7"), ("run", "s8")]


def test_a_failed_run_is_forked_and_bad_arguments_say_why() -> None:
    original = str(failed_at("s5"))
    out, _ = command("reactor_fork", original, from_step="s5")
    assert f"execution {original}: forked as " in out
    assert out.splitlines()[0].endswith("from s5: completed")
    _, _, message = failing("reactor_fork", original, from_step="s5")
    assert "re-run already" in message
    _, _, message = failing("reactor_fork", original, from_step="nope", dry_run=True)
    assert "has no step 'nope' to fork from" in message
    _, _, message = failing("reactor_fork", original, from_step="s5", inputs="[1]")
    assert "--inputs" in message
