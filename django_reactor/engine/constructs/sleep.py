"""``sleep(...)`` and ``sleep_until(...)``: a step that waits until a time, holding nothing.

::

    class Marketplace(Reactor):
        charge = step(ChargeBuyer, order=arg.input("order"))
        return_window = sleep(dt.timedelta(days=3), after=["charge"])
        payout = step(PaySeller, order=arg.input("order"), wait_for=["return_window"])

        departure = sleep_until(arg.result("book", "departs_at"), after=["book"])

Reaching a sleep records the time it waits until (a ``sleeping`` step record) and parks the
run: no worker, no thread and no message waits for it, and it survives restarts. The sweeper
wakes it once the time has come (so within a sweep interval of it; many runs due together are
woken together) and the step completes with that time (ISO 8601) as its result. A
time already past completes the step at once, and the trace says so. ``sleep`` takes a
``timedelta`` or a number of seconds; ``sleep_until`` an aware ``datetime`` (or ISO text), and
either may come from ``arg.input``/``arg.result``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from ...exceptions import DefinitionError, InvalidTime
from ...states import EventKind, StepStatus
from .. import timevalues
from ..declarations import StepDeclaration
from ..journal import RecordedStep, StepWrite
from ..outcomes import ErrorKind, Rescheduled
from ..serialization import decode
from ..step import Step
from ..templates import Template, ValueRef
from .base import Construct, StepDone, StepFailed, StepResult, Stop

if TYPE_CHECKING:
    from ..context import RunContext
    from ..spec import StepSpec
    from ..state import RunState


@dataclass(frozen=True, slots=True)
class SleepSpec:
    """What a sleep waits for: a duration (``sleep``) or a time (``sleep_until``)."""

    until: bool


class SleepStep(Step):
    """The step a ``sleep()`` or ``sleep_until()`` declaration makes; the executor parks the
    run there instead of running a body."""

    sleep: ClassVar[SleepSpec]

    def run(
        self, delay: object = None, until: object = None
    ) -> object:  # pragma: no cover - the executor never calls it
        raise NotImplementedError("a sleep has no body: the run waits until its time")


def seconds_of(delay: object, *, now: dt.datetime | None = None) -> float:
    """A sleep's length in seconds; InvalidTime (a ValueError) with a plain reason for anything
    else, and for a length that, from ``now``, is past what a date can hold."""
    return timevalues.seconds(delay, "a sleep", zero=True, now=now)


def time_of(when: object) -> dt.datetime:
    """The time a ``sleep_until`` waits for: an aware datetime (or ISO 8601 text with an
    offset) a date can hold; InvalidTime (a ValueError) with a plain reason for anything else."""
    return timevalues.instant(when, "sleep_until", text=True)


def _declare(name: str, until: bool, value: object, after: Iterable[str] | str) -> StepDeclaration:
    if isinstance(after, str):
        after = (after,)
    after = tuple(after)
    if not all(isinstance(a, str) for a in after):
        raise DefinitionError(f"{name}(after=...) must name steps as strings, got {after!r}")
    if not isinstance(value, Template):
        try:
            value = time_of(value) if until else seconds_of(value)
        except InvalidTime as exc:
            raise DefinitionError(str(exc)) from None
        value = ValueRef(value=value)
    kind = "SleepUntil" if until else "SleepFor"
    impl = type(
        kind,
        (SleepStep,),
        {
            "sleep": SleepSpec(until=until),
            "__module__": SHAPE_MODULE,
            "__qualname__": kind,
            "__doc__": "Waits until a time." if until else "Waits for a while.",
        },
    )
    return StepDeclaration(impl, {"until" if until else "delay": value}, wait_for=after)


# The module a sleep step's class names: it is part of the shape stored with every run.
SHAPE_MODULE = "django_reactor.engine.constructs.sleep"


def sleep(
    delay: float | dt.timedelta | Template, /, *, after: Iterable[str] | str = ()
) -> StepDeclaration:
    """Declare a step that waits ``delay`` (a ``timedelta`` or a number of seconds, or
    ``arg.input``/``arg.result`` giving one) once the steps in ``after`` are done, holding no
    worker. Its result is the time it waited until (ISO 8601). Refused: a negative delay."""
    return _declare("sleep", False, delay, after)


def sleep_until(
    when: dt.datetime | str | Template, /, *, after: Iterable[str] | str = ()
) -> StepDeclaration:
    """Declare a step that waits until ``when`` (an aware ``datetime`` or ISO 8601 text, or
    ``arg.input``/``arg.result`` giving one) once the steps in ``after`` are done. A time
    already past completes at once (the trace says so). Its result is that time."""
    return _declare("sleep_until", True, when, after)


class Sleep(Construct):
    """Parks the run until the sleep's time, then completes the step with it."""

    name = "sleep"
    in_value = False

    def claims(self, spec: StepSpec) -> bool:
        return issubclass(spec.impl, SleepStep)

    def undoes(self, spec: StepSpec) -> bool:
        return False

    def restore(self, state: RunState, spec: StepSpec | None, record: RecordedStep) -> None:
        """A sleep reached waits until the time its record keeps."""
        if record.status == StepStatus.SLEEPING:
            state.sleeping[record.step] = str(decode(record.result))
            return
        super().restore(state, spec, record)

    def run(
        self, run: RunContext, spec: StepSpec, arguments: dict[str, object], started_at: dt.datetime
    ) -> StepResult:
        """Complete the step when its time has come; park the run until then."""
        now = run.clock()
        due_text = run.state.sleeping.get(spec.name)
        if due_text is None:
            try:
                due = self._due(spec, arguments, now)
            except InvalidTime as exc:
                error = run.step_error(spec, ErrorKind.ARGUMENT, str(exc), arguments=arguments)
                return StepFailed(error)
            if due <= now:
                run.note(
                    EventKind.SLEEP,
                    {"until": due.isoformat(), "past": True},
                    step=spec.name,
                )
                return StepDone(due.isoformat(), attempts=1, duration_ms=0.0)
            return Stop(self._park(run, spec, arguments, started_at, due, now, first=True))
        due = dt.datetime.fromisoformat(due_text)
        if due <= now:
            return StepDone(due_text, attempts=1, duration_ms=0.0)
        # Woken before its time (a message delivered twice, a run resumed by hand): wait on.
        return Stop(self._park(run, spec, arguments, started_at, due, now, first=False))

    @staticmethod
    def _due(spec: StepSpec, arguments: dict[str, object], now: dt.datetime) -> dt.datetime:
        if spec.impl.sleep.until:  # type: ignore[attr-defined]
            return time_of(arguments.get("until"))
        delay = seconds_of(arguments.get("delay"), now=now)
        return timevalues.later(now, delay, "a sleep")

    @staticmethod
    def _park(
        run: RunContext,
        spec: StepSpec,
        arguments: dict[str, object],
        started_at: dt.datetime,
        due: dt.datetime,
        now: dt.datetime,
        *,
        first: bool,
    ) -> Rescheduled:
        delay = (due - now).total_seconds()
        event = run.event(EventKind.SLEEP, step=spec.name, data={"until": due.isoformat()})
        record = (
            StepWrite.of(
                spec, StepStatus.SLEEPING, event, 0, arguments, started_at, result=due.isoformat()
            )
            if first
            else None
        )
        # No message waits for it (a countdown would sit in a worker's memory): the sweeper
        # wakes the run once its wake-up time has come, many at a time.
        return run.park(spec.name, reason="sleep", delay=delay, event=event, record=record)


SLEEP = Sleep()
