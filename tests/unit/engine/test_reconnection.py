"""A step body's lost database connection in the pure executor: the attempt is abandoned and
run again (not one of the step's attempts), the trace notes it, and past
``Reconnect.within`` the loss is the attempt's failure."""

from __future__ import annotations

from typing import Any

import pytest

from django_reactor import Reactor, Retry, Step, Success, step
from django_reactor.engine.context import Reconnect, RunPolicy
from django_reactor.engine.journal import MemoryJournal
from django_reactor.engine.outcomes import Completed, Failed
from django_reactor.exceptions import LeaseLost
from django_reactor.states import EventKind, ExecutionStatus, RollbackStatus
from tests.helpers import run_in_memory


class ConnectionGone(Exception):
    """What a database driver raises when the connection broke."""


#: How many more times each step's action loses its connection, by (step, action).
LOSSES: dict[tuple[str, str], int] = {}
#: Every body call, as (step, action, attempt).
CALLS: list[tuple[str, str, int]] = []


@pytest.fixture(autouse=True)
def _reset() -> Any:
    LOSSES.clear()
    CALLS.clear()
    yield
    LOSSES.clear()
    CALLS.clear()


def _maybe_lose(step_name: str, action: str) -> None:
    left = LOSSES.get((step_name, action), 0)
    if left:
        LOSSES[(step_name, action)] = left - 1
        raise ConnectionGone(f"server closed the connection unexpectedly ({step_name})")


class Writes(Step):
    retry = Retry(attempts=1)

    def run(self, **arguments: Any) -> Any:
        CALLS.append((self.context.step, "run", self.context.attempt))
        _maybe_lose(self.context.step, "run")
        if self.context.step == "boom":
            raise RuntimeError("boom")
        return Success(self.context.step)

    def undo(self, result: Any, **arguments: Any) -> None:
        CALLS.append((self.context.step, "undo", self.context.attempt))
        _maybe_lose(self.context.step, "undo")

    def compensate(self, error: Any, **arguments: Any) -> None:
        CALLS.append((self.context.step, "compensate", self.context.attempt))
        _maybe_lose(self.context.step, "compensate")


class Two(Reactor):
    first = step(Writes)
    second = step(Writes)


class Rolls(Reactor):
    first = step(Writes)
    boom = step(Writes)


class Repairs:
    """A ``Reconnect.after`` that knows ConnectionGone, counting its repairs."""

    def __init__(self) -> None:
        self.repaired = 0
        self.asked = 0

    def __call__(self, error: BaseException) -> bool:
        self.asked += 1
        if isinstance(error, ConnectionGone):
            self.repaired += 1
            return True
        return False


def _policy(within: float = 30.0) -> tuple[RunPolicy, Repairs]:
    repairs = Repairs()
    return RunPolicy(reconnect=Reconnect(repairs, within)), repairs


def test_a_lost_connection_runs_the_attempt_again_without_spending_an_attempt() -> None:
    LOSSES[("second", "run")] = 2
    policy, repairs = _policy()
    sleeps: list[float] = []
    outcome, journal = run_in_memory(Two, policy=policy, sleeps=sleeps)
    assert isinstance(outcome, Completed), outcome
    # Retry(attempts=1) allows no retry: both runs again were the same attempt.
    assert CALLS == [("first", "run", 1), ("second", "run", 1), ("second", "run", 1),
                     ("second", "run", 1)]  # fmt: skip
    assert repairs.repaired == 2
    kinds = [(e.kind, e.step) for e in journal.events if e.step]
    assert kinds == [
        (EventKind.RUN, "first"),
        (EventKind.RECONNECT, "second"),
        (EventKind.RECONNECT, "second"),
        (EventKind.RUN, "second"),
    ]
    notes = [e for e in journal.events if e.kind == EventKind.RECONNECT]
    assert [n.data["losses"] for n in notes] == [1, 2]
    assert {n.data["attempt"] for n in notes} == {1}
    assert notes[0].data["action"] == "run"
    assert "server closed the connection" in notes[0].data["error"]
    assert notes[0].data["exception_class"].endswith("ConnectionGone")
    # No pause after the first loss (one broken connection); one after the second.
    assert sleeps == [Reconnect(lambda e: True, 1).pause(2)]
    assert journal.steps["second"].attempts == 1


def test_other_errors_are_failures_as_before() -> None:
    policy, repairs = _policy()
    outcome, journal = run_in_memory(Rolls, policy=policy)
    assert isinstance(outcome, Failed)
    assert repairs.asked == 1
    assert repairs.repaired == 0
    assert not [e for e in journal.events if e.kind == EventKind.RECONNECT]


def test_without_reconnect_a_lost_connection_fails_the_step() -> None:
    LOSSES[("second", "run")] = 1
    outcome, _journal = run_in_memory(Two)
    assert isinstance(outcome, Failed)
    assert outcome.error.exception_class.endswith("ConnectionGone")
    assert CALLS == [
        ("first", "run", 1),
        ("second", "run", 1),
        ("second", "compensate", 1),
        ("first", "undo", 1),
    ]


def test_past_within_the_loss_is_the_attempts_failure() -> None:
    LOSSES[("second", "run")] = 100
    policy, repairs = _policy(within=0.0)
    outcome, journal = run_in_memory(Two, policy=policy, sleeps=[])
    assert isinstance(outcome, Failed)
    # The first loss is run again; the second, already past 0 s of losses, fails the attempt.
    assert [c for c in CALLS if c[1] == "run"] == [("first", "run", 1)] + [("second", "run", 1)] * 2
    assert repairs.repaired == 2  # the connection is repaired before the failure is recorded
    assert journal.statuses[-1] == ExecutionStatus.FAILED


@pytest.mark.parametrize("action", ["undo", "compensate"])
def test_an_undo_or_compensation_that_lost_its_connection_runs_again(action: str) -> None:
    step_name = "first" if action == "undo" else "boom"
    LOSSES[(step_name, action)] = 1
    policy, _ = _policy()
    outcome, journal = run_in_memory(Rolls, policy=policy)
    assert isinstance(outcome, Failed)
    assert outcome.status == "failed"  # not undo_failed: the rollback completed
    assert CALLS.count((step_name, action, 1)) == 2
    done_status = RollbackStatus.UNDONE if action == "undo" else RollbackStatus.COMPENSATED
    assert journal.rollbacks[step_name].status == done_status
    kinds = [(e.kind, e.step) for e in journal.events if e.step == step_name]
    assert (EventKind.RECONNECT, step_name) in kinds
    done = EventKind.UNDO if action == "undo" else EventKind.COMPENSATE
    assert kinds[-1] == (done, step_name)
    note = next(e for e in journal.events if e.kind == EventKind.RECONNECT)
    assert note.data["action"] == action
    assert isinstance(journal, MemoryJournal)


@pytest.mark.parametrize(
    ("step_name", "action", "reactor"),
    [("second", "run", Two), ("first", "undo", Rolls), ("boom", "compensate", Rolls)],
)
def test_a_body_whose_run_was_taken_over_meanwhile_is_not_run_again(
    step_name: str, action: str, reactor: type[Reactor]
) -> None:
    """The connection was lost because the process stalled past its lease and the process
    that took the run over ended its session: that process runs the step. Here the body is
    not run again: LeaseLost stops this process, and nothing more is written."""
    LOSSES[(step_name, action)] = 1
    journal = MemoryJournal()
    repairs = Repairs()

    def repaired_after_a_takeover(error: BaseException) -> bool:
        if not repairs(error):
            return False
        journal.taken_over = True  # another process took the run while the connection was gone
        return True

    policy = RunPolicy(reconnect=Reconnect(repaired_after_a_takeover, 30.0))
    with pytest.raises(LeaseLost):
        run_in_memory(reactor, journal=journal, policy=policy)
    assert CALLS.count((step_name, action, 1)) == 1
    assert repairs.repaired == 1
    assert not [e for e in journal.events if e.kind == EventKind.RECONNECT]
    if action == "run":
        assert step_name not in journal.steps
    else:
        assert step_name not in journal.rollbacks
