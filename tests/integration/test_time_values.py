"""Times no date can hold, given to each Python entry point on PostgreSQL: refused before
anything is written (``InvalidTime``), or, read from a run's inputs and results, the step that
reads them fails as any step does and the run rolls back; never an ``OverflowError`` and never
a run left ``running``."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.test import override_settings
from rest_framework import serializers

from django_reactor import Failed, Reactor, Retry, arg, services, sleep, sleep_until, step
from django_reactor.exceptions import InvalidTime, ReactorError
from django_reactor.models import Execution, StepRecord
from django_reactor.states import ExecutionStatus, StepStatus
from tests.helpers import ledger

# A database server (PostgreSQL, and MariaDB in its pass), not SQLite.
pytestmark = [pytest.mark.postgres, pytest.mark.mariadb, pytest.mark.django_db(transaction=True)]

#: The last moment a datetime holds, five hours behind UTC: year 10000 in UTC, which
#: PostgreSQL stores and then cannot give back to Python.
PAST_THE_END = dt.datetime.max.replace(tzinfo=dt.timezone(dt.timedelta(hours=-5)))


def kinds(execution_id: Any) -> list[tuple[str, str]]:
    return [(e.kind, e.step) for e in services.find(execution_id).trace]


class Seconds(serializers.Serializer):
    seconds = serializers.FloatField()


class WaitFromInputs(Reactor):
    """Charge, then wait as long as the caller says."""

    Inputs = Seconds

    @step()
    def charge() -> str:
        ledger("run", "charge")
        return "charged"

    @charge.undo
    def refund(result: Any) -> None:
        ledger("undo", "charge")

    window = sleep(arg.input("seconds"), after=["charge"])


class WaitUntilAResult(Reactor):
    """Book a departure, then wait until the time the booking gave."""

    @step()
    def book() -> str:
        ledger("run", "book")
        return PAST_THE_END.isoformat()

    @book.undo
    def cancel_booking(result: Any) -> None:
        ledger("undo", "book")

    departure = sleep_until(arg.result("book"), after=["book"])


def test_a_sleep_read_from_the_inputs_that_no_date_can_hold_fails_its_step() -> None:
    outcome = WaitFromInputs.run({"seconds": 1e15})
    assert isinstance(outcome, Failed)
    assert outcome.error.step == "window"
    assert outcome.error.message.startswith(
        "a sleep is 1e+15 s (about 31,688,088 years), longer than a date can hold: "
    )
    assert "give a shorter one" in outcome.error.message
    # The normal rule: what completed before the failing step is rolled back.
    assert ledger.calls == [("run", "charge"), ("undo", "charge")]
    row = Execution.objects.get(pk=outcome.execution_id)
    assert row.status == ExecutionStatus.FAILED
    assert row.lease_owner is None
    assert row.wake_at is None
    assert kinds(row.id) == [
        ("start", ""),
        ("run", "charge"),
        ("fail", "window"),
        ("undo", "charge"),
        ("fail", ""),
    ]
    statuses = dict(StepRecord.objects.filter(execution_id=row.id).values_list("step", "status"))
    assert statuses["window"] == StepStatus.FAILED


def test_a_sleep_until_a_result_past_the_end_of_dates_fails_its_step() -> None:
    outcome = WaitUntilAResult.run({})
    assert isinstance(outcome, Failed)
    assert outcome.error.step == "departure"
    assert outcome.error.message == (
        "sleep_until is 9999-12-31T23:59:59.999999-05:00, later than a date can hold: the "
        "latest time django_reactor accepts is 9999-01-01T00:00:00+00:00; give an earlier one"
    )
    assert ledger.calls == [("run", "book"), ("undo", "book")]
    assert Execution.objects.get(pk=outcome.execution_id).status == ExecutionStatus.FAILED


class Hello(Reactor):
    hello = step(lambda: ledger("run", "hello"))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"delay": 1e12},
            "Hello.run(delay=...) is 1e+12 s (about 31,688 years), longer than a date can hold",
        ),
        (
            {"delay": float("inf")},
            "Hello.run(delay=...) cannot be infinite; give a finite timedelta or number of seconds",
        ),
        ({"delay": float("nan")}, "Hello.run(delay=...) is not a number (NaN)"),
        (
            {"deadline": dt.timedelta(days=999999999)},
            "Hello.run(deadline=...) is 8.64e+13 s (about 2,737,851 years), longer than a date "
            "can hold",
        ),
        ({"deadline": float("inf")}, "Hello.run(deadline=...) cannot be infinite"),
        (
            {"at": PAST_THE_END},
            "Hello.run(at=...) is 9999-12-31T23:59:59.999999-05:00, later than a date can hold: "
            "the latest time django_reactor accepts is 9999-01-01T00:00:00+00:00",
        ),
        (
            {"deadline": PAST_THE_END},
            "Hello.run(deadline=...) is 9999-12-31T23:59:59.999999-05:00, later than a date",
        ),
        (
            {"delay": dt.timedelta(days=365 * 7000), "deadline": dt.timedelta(days=365 * 1500)},
            "Hello.run(deadline=...) is 4.7304e+10 s (about 1,499 years), longer than a date can "
            "hold: the latest time django_reactor accepts, 9999-01-01 (UTC), is 3.08",
        ),
    ],
)
def test_a_time_no_date_can_hold_is_refused_by_run_before_anything_is_written(
    options: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidTime) as refused:
        Hello.run({}, **options)
    assert message in str(refused.value)
    assert isinstance(refused.value, ReactorError)
    assert Execution.objects.count() == 0
    assert ledger.calls == []


def test_a_meta_deadline_is_refused_when_the_start_leaves_no_date_for_it() -> None:
    class Patient(Reactor):
        wait = step(lambda: "waited")

        class Meta:
            deadline = dt.timedelta(days=365 * 1500)

    with pytest.raises(InvalidTime, match=r"Patient.Meta.deadline from the run's start is"):
        Patient.run({}, delay=dt.timedelta(days=365 * 7000))
    assert Execution.objects.count() == 0


@pytest.mark.parametrize(
    ("timeout", "message"),
    [
        (float("nan"), "wait(timeout=...) is not a number (NaN)"),
        (float("inf"), "wait(timeout=...) cannot be infinite"),
        (-1, "wait(timeout=...) cannot be negative, got -1"),
    ],
)
def test_waiting_for_a_run_refuses_a_timeout_no_clock_reaches(timeout: float, message: str) -> None:
    handle = services.find(Hello.run({}).execution_id)
    with pytest.raises(InvalidTime) as refused:
        handle.wait(timeout=timeout)
    assert message in str(refused.value)


@override_settings(REACTOR={"STEP_TIMEOUT": float("inf")})
def test_an_unbounded_step_timeout_runs_the_body_once_and_records_what_it_returned() -> None:
    """It used to record the attempt failed (OverflowError from the wait) while the body went
    on in its thread, and a retry started a second copy beside it."""

    class Charge(Reactor):
        @step(retry=Retry(attempts=3, delay=0))
        def charge() -> str:
            ledger("run", "charge")
            return "charged"

    outcome = Charge.run({})
    assert outcome.ok, outcome
    assert ledger.calls == [("run", "charge")]
    assert kinds(outcome.execution_id) == [("start", ""), ("run", "charge"), ("complete", "")]


def test_pruning_further_back_than_any_date_is_refused_and_deletes_nothing() -> None:
    finished = Hello.run({}).execution_id
    with pytest.raises(InvalidTime, match=r"older_than_days=99999999 is .* earlier than a date"):
        services.prune(99999999)
    with pytest.raises(InvalidTime, match=r"older_than_days=nan is not a number \(NaN\)"):
        services.prune(float("nan"))
    assert list(Execution.objects.values_list("pk", flat=True)) == [finished]
