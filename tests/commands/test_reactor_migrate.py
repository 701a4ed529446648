"""reactor_migrate: runs parked definition_changed move onto the deployed definition when their
recorded steps map onto it (renamed steps with --map), keeping their results; others are
refused with the reason, unchanged."""

from __future__ import annotations

import json
import re
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from django_reactor import services
from django_reactor.models import AuditEntry, Execution, StepRecord
from django_reactor.states import ExecutionStatus
from tests.commands.test_reactor_deploy_check import (
    MINUTE,
    remove_v1,
    remove_v2,
    rename_v1,
    rename_v2,
    start,
)

pytestmark = pytest.mark.django_db(transaction=True)


def parked_after_deploy(reactor_clock: Any, old: Any, new: Any, *, past_first_sleep: bool) -> Any:
    """A run of ``old`` asleep (at its first sleep, or past it at its second), then ``new``
    deployed and the run woken: it parks definition_changed."""
    run = start(old())
    reactor_clock.tick()
    if past_first_sleep:
        reactor_clock.advance(MINUTE)
    new()
    reactor_clock.advance(minutes=2)
    row = Execution.objects.get(pk=run)
    assert row.status == ExecutionStatus.NEEDS_ATTENTION
    assert row.failure["kind"] == "definition_changed"
    return run


def migrate(*args: str) -> tuple[list[dict[str, Any]], int]:
    out = StringIO()
    try:
        call_command("reactor_migrate", *args, "--json", stdout=out)
    except CommandError as exc:
        return json.loads(out.getvalue()), exc.returncode
    return json.loads(out.getvalue()), 0


def test_a_renamed_step_is_mapped_and_the_run_finishes_with_its_results(
    reactor_clock: Any,
) -> None:
    run = parked_after_deploy(reactor_clock, rename_v1, rename_v2, past_first_sleep=False)
    one_result = StepRecord.objects.get(execution_id=run, step="one").result
    # Without the map the recorded step is gone: refused, nothing changed.
    refused, code = migrate("deploytest.Rename")
    assert code == 1
    assert refused == [
        {
            "execution_id": str(run),
            "moved": False,
            "reason": "step 'nap' ran but no longer exists; map a renamed step with --map old=new",
            "renames": {},
        }
    ]
    # A dry run says it would move, and moves nothing.
    planned, code = migrate("deploytest.Rename", "--map", "nap=rest", "--dry-run")
    assert (code, planned[0]["moved"], planned[0]["renames"]) == (0, True, {"nap": "rest"})
    assert Execution.objects.get(pk=run).status == ExecutionStatus.NEEDS_ATTENTION
    # Migrated: a worker takes it again; it sleeps out its nap (now "rest") and finishes.
    out = StringIO()
    call_command(
        "reactor_migrate", "deploytest.Rename", "--map", "nap=rest", "--reason", "v2 rename",
        stdout=out, no_color=True,
    )  # fmt: skip
    assert f"execution {run}: moved: a worker takes it again (steps renamed: nap -> rest)" in (
        out.getvalue()
    )
    row = Execution.objects.get(pk=run)
    assert (row.status, row.failure) == (ExecutionStatus.PENDING, None)
    assert row.definition_hash == rename_v2().definition.definition_hash
    steer = [e for e in services.find(run).trace if e.kind == "steer"][-1]
    assert (steer.data["action"], steer.data["renamed"], steer.data["reason"]) == (
        "migrate",
        {"nap": "rest"},
        "v2 rename",
    )
    assert AuditEntry.objects.filter(action="migrate", execution_id=run).exists()
    reactor_clock.advance(minutes=2)
    handle = services.find(run)
    assert handle.status == ExecutionStatus.COMPLETED
    assert [s.name for s in handle.steps] == ["one", "rest", "done"]
    # The step it ran before the deploy was not run again: its result is the one it recorded.
    assert StepRecord.objects.get(execution_id=run, step="one").result == one_result


def test_a_run_past_a_removed_step_is_refused_with_the_reason(reactor_clock: Any) -> None:
    run = parked_after_deploy(reactor_clock, remove_v1, remove_v2, past_first_sleep=True)
    refused, code = migrate("deploytest.Remove")
    assert code == 1
    assert refused[0]["reason"].startswith("step 'nap2' ran but its implementation or inputs")
    # Its removed step cannot take the name of another step it ran with.
    refused, code = migrate("deploytest.Remove", "--map", "two=three")
    assert code == 1
    assert refused[0]["reason"].startswith("the definition it ran with has step(s) 'three' already")
    row = Execution.objects.get(pk=run)
    assert row.status == ExecutionStatus.NEEDS_ATTENTION
    assert StepRecord.objects.filter(execution_id=run, step="two").exists()


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["deploytest.Rename", "--map", "nap"], "--map takes old=new"),
        (["deploytest.Rename", "--map", "nap=nowhere"], "names step(s) 'nowhere' that"),
        (["deploytest.Nope"], "deploytest.Nope"),
    ],
)
def test_bad_arguments_are_refused(args: list[str], says: str) -> None:
    rename_v2()
    with pytest.raises(CommandError, match=f"cannot migrate: .*{re.escape(says)}"):
        call_command("reactor_migrate", *args)


def test_a_run_that_is_not_parked_is_refused(reactor_clock: Any) -> None:
    run = start(rename_v2())
    with pytest.raises(
        CommandError, match="only runs parked definition_changed or patch_removed are migrated"
    ):
        call_command("reactor_migrate", "deploytest.Rename", "--execution", str(run))
    assert Execution.objects.get(pk=run).status == ExecutionStatus.PENDING
    out = StringIO()
    call_command("reactor_migrate", "deploytest.Rename", stdout=out)
    assert "no run of deploytest.Rename is parked definition_changed" in out.getvalue()


def test_the_admin_action_migrates_the_runs_that_map_and_refuses_the_others(
    reactor_clock: Any, client: Any
) -> None:
    from django.contrib.auth.models import User
    from django.contrib.messages import get_messages

    removed = parked_after_deploy(reactor_clock, remove_v1, remove_v2, past_first_sleep=True)
    # A run before the removed step parks only if it recorded it: this one did not, so it went
    # on; park one by hand the way a worker would have, to show the action moving it.
    rename_v1()
    kept = start(rename_v1())
    reactor_clock.tick()
    Execution.objects.filter(pk=kept).update(
        status=ExecutionStatus.NEEDS_ATTENTION,
        failure={"kind": "definition_changed", "message": "parked by the test"},
    )
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    changelist = "/admin/django_reactor/execution/"
    asked = client.post(
        changelist,
        {"action": "migrate_selected", "_selected_action": [str(removed), str(kept)]},
    )
    assert "Migrate executions onto the deployed definition" in asked.content.decode()
    done = client.post(
        changelist,
        {
            "action": "migrate_selected",
            "_selected_action": [str(removed), str(kept)],
            "post": "yes",
            "reason": "after the v2 deploy",
        },
    )
    texts = [str(m) for m in get_messages(done.wsgi_request)]
    assert "Migrated 1 execution." in texts
    assert any("step 'nap2' ran but its implementation or inputs changed" in t for t in texts)
    assert Execution.objects.get(pk=kept).status == ExecutionStatus.PENDING
    assert Execution.objects.get(pk=removed).status == ExecutionStatus.NEEDS_ATTENTION
    reactor_clock.advance(minutes=2)
    assert services.find(kept).status == ExecutionStatus.COMPLETED
