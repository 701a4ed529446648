"""A map's summary against a hand-computed one, undo_all, interrupts and retries inside
elements, and the lazy ``MapResults`` reader."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework import serializers

from django_reactor import (
    Completed,
    Failed,
    Reactor,
    Retry,
    Step,
    arg,
    interrupt,
    map_over,
    services,
    step,
    store,
)
from django_reactor.models import MapResult, MapRun
from django_reactor.runtime.maps import ElementResult, MapResults
from django_reactor.states import ElementStatus, ExecutionStatus, MapStatus
from tests.integration.reactors import FAIL_AT, ledger

pytestmark = pytest.mark.django_db

SIZE = 40
#: Every element fails except each fourth one: 30 failures, 10 successes.
FAILING = [i for i in range(SIZE) if i % 4]
DEPTH = 16  # frames of the recursion helper: deeper than the 10 frames a sample keeps


def ping(depth: int, n: int) -> int:
    # Two functions in turn: Python would fold a run of identical frames into one line.
    if depth:
        return pong(depth - 1, n)
    raise ValueError(f"element {n} hit the bottom")


def pong(depth: int, n: int) -> int:
    return ping(depth - 1, n)


def deep(n: int) -> int:
    if n % 4:
        return ping(DEPTH, n)
    return n * 10


class Deep(Reactor):
    class Inputs(serializers.Serializer):
        items = serializers.ListField(child=serializers.IntegerField())

    lines = map_over(arg.input("items"), deep, n=arg.element(), atomic=False, chunk_size=7)

    class Meta:
        returns = "lines"


def _map_id(execution_id: Any, step: str = "lines") -> Any:
    return MapRun.objects.get(execution_id=execution_id, step=step).pk


def test_the_summary_of_a_tolerant_map_matches_a_hand_computed_one() -> None:
    outcome = Deep.run({"items": list(range(SIZE))})
    assert isinstance(outcome, Completed), outcome
    map_id = _map_id(outcome.execution_id)

    with CaptureQueriesContext(connection) as queries:
        summary = store.maps.summary(map_id)
    assert len(queries.captured_queries) == 2  # the map (its counters), one sample: no scan

    sample = summary.pop("failures")
    assert summary == {
        "type": "map_results",
        "map_id": str(map_id),
        "step": "lines",
        "status": MapStatus.SETTLED,
        "size": SIZE,
        "total": SIZE,
        "succeeded": 10,
        "failed": 30,
        "halted": 0,
        "pending": 0,
        "not_started": 0,
        "undone": 0,
        "undoing": 0,
        "undo_failed": 0,
        "failures_truncated": True,
    }
    # The first 25 failures by index: 1, 2, 3, 5, 6, 7, 9, ... 33.
    expected = FAILING[:25]
    assert expected[-1] == 33
    assert [f["index"] for f in sample] == expected
    for failure in sample:
        n = failure["index"]
        assert failure["message"] == f"element {n} hit the bottom"
        assert failure["exception_class"] == "ValueError"
        assert failure["step"] == "deep"
        stored = MapResult.objects.get(map_run_id=map_id, index=n).error["traceback"]
        full = [line for line in stored.splitlines() if line.strip()]
        assert sum(line.lstrip().startswith('File "') for line in full) > DEPTH
        cut = failure["traceback"].splitlines()
        assert cut[0] == "Traceback (most recent call last, earlier frames cut):"
        assert sum(line.lstrip().startswith('File "') for line in cut) == 10
        # The last 10 frames, as stored: the innermost calls, ending with the raise.
        assert cut[1:] == full[len(full) - len(cut) + 1 :]
        assert sum(line.endswith(("in ping", "in pong")) for line in cut) == 10
        assert cut[-3].endswith("in ping")
        assert cut[-2].strip() == 'raise ValueError(f"element {n} hit the bottom")'
        assert cut[-1] == f"ValueError: element {n} hit the bottom"

    # The reader gives the same summary.
    assert MapResults(map_id).summary() == {**summary, "failures": sample}


def test_a_summary_below_the_sample_size_is_not_truncated_and_keeps_short_tracebacks() -> None:
    def shallow(n: int) -> int:
        if n in (2, 5):
            raise KeyError(n)
        return n

    class Shallow(Reactor):
        lines = map_over(arg.value(list(range(8))), shallow, n=arg.element(), atomic=False)

    outcome = Shallow.run({})
    assert isinstance(outcome, Completed), outcome
    summary = store.maps.summary(_map_id(outcome.execution_id))
    assert (summary["total"], summary["succeeded"], summary["failed"]) == (8, 6, 2)
    assert summary["failures_truncated"] is False
    assert [f["index"] for f in summary["failures"]] == [2, 5]
    traceback = summary["failures"][0]["traceback"]
    assert traceback.startswith("Traceback (most recent call last):")
    assert "earlier frames cut" not in traceback
    assert traceback.splitlines()[-1] == "KeyError: 2"


def test_the_summary_of_an_atomic_map_counts_not_started_and_undone_elements() -> None:
    def charge(n: int) -> int:
        ledger("run", f"n-{n}")
        if n == 3:
            raise RuntimeError("declined")
        return n

    class Atomic(Reactor):
        lines = map_over(arg.value(list(range(6))), charge, n=arg.element(), chunk_size=1)

    outcome = Atomic.run({})
    assert isinstance(outcome, Failed), outcome
    summary = store.maps.summary(_map_id(outcome.execution_id))
    counts = {k: summary[k] for k in ("total", "succeeded", "failed", "pending", "not_started")}
    assert counts == {"total": 6, "succeeded": 0, "failed": 1, "pending": 0, "not_started": 2}
    assert (summary["undone"], summary["undo_failed"]) == (3, 0)
    assert summary["status"] == MapStatus.ROLLED_BACK
    assert [f["index"] for f in summary["failures"]] == [3]
    assert summary["failures"][0]["message"] == "declined"


def test_the_summary_of_an_unknown_map_is_empty() -> None:
    import uuid

    assert store.maps.summary(uuid.uuid4()) == {}


# ---------------------------------------------------------------------------- undo_all


class Refunded(Step):
    def run(self, n: int) -> Any:
        ledger("run", f"n-{n}")
        return {"n": n, "charged": n * 100}

    def undo(self, result: Any, n: int) -> None:
        ledger("undo", f"n-{n}")  # never: undo_all replaces the per-element undo


undo_all_calls: list[list[Any]] = []


def refund_all(results: Any) -> None:
    assert isinstance(results, MapResults)
    undo_all_calls.append(list(results))
    ledger("undo_all", "lines")
    if "undo_all" in FAIL_AT:
        raise ConnectionError("the batch refund API is down")


class BulkRefund(Reactor):
    class Inputs(serializers.Serializer):
        items = serializers.ListField(child=serializers.IntegerField())

    @step()
    def reserve() -> Any:
        ledger("run", "reserve")
        return "held"

    @reserve.undo
    def release(result: Any) -> None:
        ledger("undo", "reserve")

    lines = map_over(
        arg.input("items"), Refunded, n=arg.element(), wait_for=["reserve"], undo_all=refund_all
    )

    @step(lines=arg.result("lines"))
    def total(lines: Any) -> Any:
        ledger("run", "total")
        raise RuntimeError("the ledger is closed")


@pytest.fixture
def undo_all_log() -> Any:
    """The calls of ``refund_all`` in this test."""
    undo_all_calls.clear()
    yield undo_all_calls
    undo_all_calls.clear()


def test_undo_all_receives_every_completed_result_once(undo_all_log: list[Any]) -> None:
    outcome = BulkRefund.run({"items": [1, 2, 3, 4]})
    assert isinstance(outcome, Failed), outcome
    assert outcome.status == ExecutionStatus.FAILED
    assert outcome.error.step == "total"
    assert undo_all_log == [[{"n": n, "charged": n * 100} for n in (1, 2, 3, 4)]]
    assert ledger.calls == [
        ("run", "reserve"),
        *[("run", f"n-{n}") for n in (1, 2, 3, 4)],
        ("run", "total"),
        ("undo_all", "lines"),
        ("undo", "reserve"),
    ]
    map_id = _map_id(outcome.execution_id)
    statuses = set(MapResult.objects.filter(map_run_id=map_id).values_list("status", flat=True))
    assert statuses == {ElementStatus.UNDONE}
    run = MapRun.objects.get(pk=map_id)
    assert (run.status, run.rollback_total, run.rollback_settled) == (MapStatus.ROLLED_BACK, 4, 4)
    assert not outcome.error.rollback_failures


def test_undo_all_raising_is_one_rollback_failure(undo_all_log: list[Any]) -> None:
    FAIL_AT.add("undo_all")
    outcome = BulkRefund.run({"items": [1, 2, 3]})
    assert isinstance(outcome, Failed), outcome
    assert outcome.status == ExecutionStatus.NEEDS_ATTENTION
    assert len(undo_all_log) == 1
    (failure,) = outcome.error.rollback_failures
    assert failure.action == "undo_all"
    assert failure.step == "lines"
    assert failure.exception_class.rsplit(".", 1)[-1] == "ConnectionError"
    assert failure.message == "the batch refund API is down"
    assert failure.index is None
    assert ("undo", "reserve") in ledger.calls  # the steps before it were still undone
    assert not [c for c in ledger.calls if c[0] == "undo" and c[1].startswith("n-")]
    map_id = _map_id(outcome.execution_id)
    statuses = set(MapResult.objects.filter(map_run_id=map_id).values_list("status", flat=True))
    assert statuses == {ElementStatus.UNDO_FAILED}
    assert store.maps.summary(map_id)["undo_failed"] == 3


def test_a_map_rollback_failure_names_its_exception_class_as_other_failures_do(
    undo_all_log: list[Any],
) -> None:
    # Step errors and step rollback failures name builtins without a module ("TimeoutError",
    # engine.outcomes.qualified_class_name); a map's rollback failures should too.
    FAIL_AT.add("undo_all")
    outcome = BulkRefund.run({"items": [1]})
    assert isinstance(outcome, Failed), outcome
    (failure,) = outcome.error.rollback_failures
    assert failure.exception_class == "ConnectionError"


# ---------------------------------------------------------------------------- inside elements


class Approval(serializers.Serializer):
    ok = serializers.BooleanField()


class NeedsApproval(Reactor):
    class Inputs(serializers.Serializer):
        n = serializers.IntegerField()

    @step(n=arg.input("n"))
    def prepare(n: int) -> Any:
        ledger("run", f"prepare-{n}")
        return n

    @prepare.undo
    def unprepare(result: Any, n: int) -> None:
        ledger("undo", f"prepare-{n}")

    approval = interrupt(after="prepare", payload=Approval)

    @step(approval=arg.result("approval"))
    def finish(approval: Any) -> Any:
        ledger("run", "finish")
        return approval


def test_an_interrupt_inside_a_map_element_fails_that_element_clearly() -> None:
    class Approvals(Reactor):
        lines = map_over(arg.value([1, 2]), NeedsApproval, n=arg.element(), atomic=False)

    outcome = Approvals.run({})
    assert isinstance(outcome, Completed), outcome  # tolerant: the map completes
    # Each element rolled itself back; none paused the run, none reached "finish".
    assert ledger.calls == [
        ("run", "prepare-1"),
        ("undo", "prepare-1"),
        ("run", "prepare-2"),
        ("undo", "prepare-2"),
    ]
    failures = list(MapResults(_map_id(outcome.execution_id)).failures())
    assert [f.index for f in failures] == [0, 1]
    error = failures[0].error
    assert error["step"] == "approval"
    assert "interrupt approval cannot pause inside a map element" in error["message"]
    assert "Move the interrupt to the reactor that declares the map" in error["message"]
    assert services.find(outcome.execution_id).status == ExecutionStatus.COMPLETED


def test_an_interrupt_inside_an_atomic_map_element_fails_the_run() -> None:
    class Approvals(Reactor):
        lines = map_over(arg.value([1, 2]), NeedsApproval, n=arg.element())

    outcome = Approvals.run({})
    assert isinstance(outcome, Failed), outcome
    assert outcome.error.step == "lines"
    assert "map element 0 (of 2) failed at step 'approval'" in outcome.error.message
    assert "cannot pause inside a map element" in outcome.error.message
    assert not services.find(outcome.execution_id).interrupts


attempts: dict[int, int] = {}


class Flaky(Step):
    """Fails the first two attempts of every element; element 9 fails all of them."""

    def run(self, n: int) -> Any:
        attempts[n] = attempts.get(n, 0) + 1
        assert self.context.attempt == attempts[n]
        if n == 9 or self.context.attempt < 3:
            raise TimeoutError(f"attempt {self.context.attempt} of {n} timed out")
        return n


class FlakyLine(Reactor):
    class Inputs(serializers.Serializer):
        n = serializers.IntegerField()

    call = step(Flaky, n=arg.input("n"), retry=Retry(attempts=3, backoff="fixed", delay=0))

    class Meta:
        returns = "call"


def test_a_retrying_step_retries_inside_its_element() -> None:
    attempts.clear()

    class Calls(Reactor):
        lines = map_over(
            arg.value([1, 9, 2]), FlakyLine, n=arg.element(), atomic=False, collect=list
        )

        class Meta:
            returns = "lines"

    outcome = Calls.run({})
    assert isinstance(outcome, Completed), outcome
    assert outcome.value == [1, 2]
    assert attempts == {1: 3, 9: 3, 2: 3}
    (failure,) = MapResults(_map_id(outcome.execution_id)).failures()
    assert failure.index == 1
    assert failure.error["message"] == "attempt 3 of 9 timed out"
    assert failure.error["attempts"] == 3
    # The retries happened inside the element: the run's trace has no retry of its own.
    kinds = [e.kind for e in services.find(outcome.execution_id).trace]
    assert "retry" not in kinds


# ---------------------------------------------------------------------------- the reader


def test_the_results_reader_pages_through_every_outcome_in_index_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    outcome = Deep.run({"items": list(range(SIZE))})
    assert isinstance(outcome, Completed), outcome
    results = services.find(outcome.execution_id).step_result("lines")
    assert isinstance(results, MapResults)
    assert results == MapResults(_map_id(outcome.execution_id))
    monkeypatch.setattr(MapResults, "page_size", 3)

    assert len(results) == 10
    with CaptureQueriesContext(connection) as queries:
        values = list(results)
    assert values == [n * 10 for n in range(0, SIZE, 4)]
    # Pages of 3: 3 + 3 + 3 + 1 (list() also asks len() for a size hint: one COUNT).
    pages = [q["sql"] for q in queries.captured_queries if "COUNT(" not in q["sql"]]
    assert len(pages) == 4
    assert all(sql.endswith("LIMIT 3") for sql in pages)
    assert results.values() == values

    outcomes = list(results.outcomes())
    assert [o.index for o in outcomes] == list(range(SIZE))
    assert all(isinstance(o, ElementResult) for o in outcomes)
    assert [o.succeeded for o in outcomes] == [i % 4 == 0 for i in range(SIZE)]
    assert outcomes[0] == ElementResult(0, ElementStatus.SUCCEEDED, 0, None)
    assert outcomes[1].status == ElementStatus.FAILED
    assert outcomes[1].value is None
    assert outcomes[1].error["message"] == "element 1 hit the bottom"

    failures = list(results.failures())
    assert [f.index for f in failures] == FAILING
    assert {f.status for f in failures} == {ElementStatus.FAILED}
    assert len(failures) == 30  # not capped at the summary's sample size


def test_undoing_again_after_undo_all_failed_reports_it_once_more(
    undo_all_log: list[Any],
) -> None:
    from django_reactor import services

    FAIL_AT.add("undo_all")
    outcome = BulkRefund.run({"items": [1, 2, 3]})
    assert outcome.status == ExecutionStatus.NEEDS_ATTENTION
    handle = services.undo(outcome.execution_id)
    assert handle.status == ExecutionStatus.NEEDS_ATTENTION
    (failure,) = handle.error.rollback_failures
    assert (failure.action, failure.step) == ("undo_all", "lines")
    assert len(undo_all_log) == 1  # the elements' slots say undo_all failed; it is not re-run
