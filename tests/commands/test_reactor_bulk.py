"""reactor_bulk: one action on every run a filter matches, from the command line."""

from __future__ import annotations

import json

import pytest

from django_reactor.models import BulkOperation, Execution
from tests.commands.test_reactor_steer import command, failing
from tests.integration.test_bulk import failed_orders

pytestmark = pytest.mark.django_db(transaction=True)

FILTER = ["reactor=tests.bulk.Order", "status=failed"]


def test_a_dry_run_previews_and_writes_nothing() -> None:
    failed = failed_orders(2)
    out, _ = command("reactor_bulk", "retry", filter=FILTER, dry_run=True)
    lines = out.splitlines()
    assert lines[0] == (
        "retry 2 run(s) (2 failed): starts a new run from the first step. Nothing was written "
        "(dry run)."
    )
    assert str(failed[0]) in out
    assert not BulkOperation.objects.exists()
    out, _ = command("reactor_bulk", "undo", filter=FILTER, dry_run=True, json=True)
    assert json.loads(out)["count"] == 2


def test_an_operation_runs_here_and_reports_its_progress() -> None:
    failed = failed_orders(3)
    out, _ = command("reactor_bulk", "retry", filter=FILTER, reason="fixed")
    lines = out.splitlines()
    assert lines[0].startswith("bulk operation ")
    assert "retry of 3 run(s); if this process stops, reactor_bulk --continue" in lines[0]
    assert lines[-1].endswith("retry, done: 3 run(s), 3 done, 0 skipped, 0 failed, 0 left")
    assert Execution.objects.filter(retry_of__in=failed).count() == 3
    operation = BulkOperation.objects.get()
    out, _ = command("reactor_bulk", show=str(operation.id), json=True)
    assert json.loads(out)["status"] == "done"
    # The failed runs stay failed: a second retry of them is refused, run by run.
    out, _ = command("reactor_bulk", "retry", filter=FILTER)
    assert out.splitlines()[-1].endswith("done: 3 run(s), 0 done, 3 skipped, 0 failed, 0 left")


def test_a_stopped_operation_and_one_continued() -> None:
    failed_orders(2)
    out, _ = command("reactor_bulk", "retry", filter=FILTER, background=True, json=True)
    started = json.loads(out)
    assert (started["status"], started["total"]) == ("pending", 2)
    out, _ = command("reactor_bulk", continue_id=started["id"])
    assert "retry, done: 2 run(s), 2 done" in out
    out, _ = command("reactor_bulk", stop=started["id"])
    assert ", done:" in out  # finished already: stopping changes nothing


def test_bad_arguments_say_what_to_give() -> None:
    _, _, message = failing("reactor_bulk")
    assert message.startswith("give an action")
    _, _, message = failing("reactor_bulk", "retry")
    assert "never takes every run" in message
    _, _, message = failing("reactor_bulk", "retry", filter=["colour=red"])
    assert "has no key 'colour'" in message
    _, _, message = failing("reactor_bulk", "retry", filter=["status"])
    assert "is not a key=value pair" in message
    _, _, message = failing("reactor_bulk", "fork", filter=FILTER)
    assert "fork needs from_step" in message
    _, _, message = failing("reactor_bulk", show="nope")
    assert "not a bulk operation's id" in message
