"""A stored run this code cannot read is parked for a person on the first delivery, saying
what cannot be read; it is never mistaken for a lost worker and nothing of it runs."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import DataError

from django_reactor import Reactor, Step, services, step
from django_reactor.engine.outcomes import ErrorKind
from django_reactor.engine.serialization import TAG
from django_reactor.models import Execution, StepRecord
from django_reactor.states import EventKind, ExecutionStatus
from tests.integration.reactors import Tracked, ledger
from tests.shapes import give_shape

pytestmark = pytest.mark.django_db


class HandsOff(Reactor):
    one = step(Tracked)
    two = step(Tracked, wait_for=["one"])

    class Meta:
        background = {"after": "one"}


def handed_off() -> Any:
    outcome = HandsOff.run({})
    assert outcome.status == ExecutionStatus.PENDING
    ledger.clear()
    return outcome.execution_id


def corrupt_result(execution_id: Any, value: Any) -> None:
    StepRecord.objects.filter(execution_id=execution_id, step="one").update(result=value)


@pytest.mark.parametrize(
    ("corrupt", "message"),
    [
        (lambda e: corrupt_result(e, {TAG: "frobnicated", "v": 1}), "type tag 'frobnicated'"),
        (
            lambda e: corrupt_result(e, {TAG: "datetime", "v": "last tuesday"}),
            "stored datetime value cannot be read",
        ),
        (
            lambda e: Execution.objects.filter(pk=e).update(inputs=["not", "an", "object"]),
            "the stored inputs are a list, not a JSON object",
        ),
        (
            lambda e: give_shape(e, ["garbage"]),
            "stored definition shape is a list",
        ),
        (
            lambda e: give_shape(e, {"one": "x"}),
            "stored definition shape of step 'one'",
        ),
    ],
)
def test_an_unreadable_run_is_parked_on_its_first_delivery(corrupt: Any, message: str) -> None:
    execution_id = handed_off()
    corrupt(execution_id)
    outcome = services.resume(execution_id)
    assert outcome is not None
    assert outcome.status == ExecutionStatus.NEEDS_ATTENTION
    row = Execution.objects.get(pk=execution_id)
    assert row.status == ExecutionStatus.NEEDS_ATTENTION
    assert row.lease_owner is None
    assert row.recovery_attempts == 0
    assert row.failure["kind"] == ErrorKind.UNREADABLE
    assert message in row.failure["message"]
    assert "lost its worker" not in row.failure["message"]
    assert ledger.calls == []  # nothing ran
    assert services.find(execution_id).trace[-1].kind == EventKind.ATTENTION
    assert services.resume(execution_id) is None  # a redelivery finds nothing to do


def test_a_shape_that_lacks_a_step_that_ran_is_a_definition_change() -> None:
    execution_id = handed_off()
    give_shape(execution_id, {"two": HandsOff.definition.shape["two"]})
    outcome = services.resume(execution_id)
    assert outcome is not None
    row = Execution.objects.get(pk=execution_id)
    assert row.failure["kind"] == ErrorKind.DEFINITION_CHANGED
    assert "step 'one' ran but the run's stored definition lacks it" in row.failure["message"]
    assert ledger.calls == []


class Refused(Step):
    def run(self) -> Any:
        ledger("run", self.context.step)
        return "ok"


class RefusedByTheDatabase(Reactor):
    one = step(Refused)

    class Meta:
        background = "all"


def test_an_engine_error_parks_the_run_instead_of_recovering_it_in_a_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from django_reactor import store

    outcome = RefusedByTheDatabase.run({})

    def refuse(self: Any, batch: Any) -> Any:
        raise DataError("value too long for type character varying(10)")

    monkeypatch.setattr(store.DatabaseJournal, "commit", refuse)
    result = services.resume(outcome.execution_id)
    monkeypatch.undo()
    assert result is not None
    row = Execution.objects.get(pk=outcome.execution_id)
    assert row.status == ExecutionStatus.NEEDS_ATTENTION
    assert row.failure["kind"] == ErrorKind.ENGINE
    assert "DataError: value too long" in row.failure["message"]
    assert ledger.calls == [("run", "one")]  # ran once; not again on every recovery
    assert services.resume(outcome.execution_id) is None


def test_an_unreadable_run_can_still_be_shown(admin_client: Any, admin_user: Any) -> None:
    from io import StringIO

    from django.core.management import call_command
    from django.urls import reverse
    from rest_framework.test import APIClient

    execution_id = handed_off()
    corrupt_result(execution_id, {TAG: "frobnicated", "v": 1})
    services.resume(execution_id)
    handle = services.find(execution_id)
    assert handle.steps[0].result == {TAG: "frobnicated", "v": 1}  # shown as stored
    page = admin_client.get(reverse("admin:django_reactor_execution_change", args=[execution_id]))
    assert page.status_code == 200
    assert b"unreadable_record" in page.content
    api = APIClient()
    api.force_authenticate(admin_user)
    detail = api.get(f"/reactor/executions/{execution_id}/")
    assert detail.status_code == 200, detail.content
    out = StringIO()
    call_command("reactor_show", str(execution_id), stdout=out)
    assert "frobnicated" in out.getvalue()
