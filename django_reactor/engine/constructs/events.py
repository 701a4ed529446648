"""Events across runs: ``wait_for_event(name, match=...)`` and ``on_event(name, ...)``.

An event is a fact emitted once with ``django_reactor.emit(name, payload, key=...)``. A
``wait_for_event`` step is an interrupt whose payload is the first event of its name whose key
equals the run's ``match`` value, emitted after the run reached the step or up to
``lookback`` before; one event resumes every run waiting for it::

    class Refund(Reactor):
        charge = step(Charge, order_id=arg.input("order_id"))
        refunded = wait_for_event(
            "charge.refunded", match=arg.result("charge", "payment_id"),
            lookback=dt.timedelta(minutes=5), timeout=dt.timedelta(days=30),
            default={"refunded": False},
        )

        class Meta:
            triggers = [on_event("checkout.session.completed", inputs=checkout_inputs)]
            cancel_on = [on_event("order.cancelled", match=arg.input("order_id"))]

``Meta.triggers`` starts one run per event (its run's idempotency key is derived from the
event's id); ``Meta.cancel_on`` cancels the runs in flight whose input matches the event's key.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ...exceptions import DefinitionError, InvalidEvent, ReactorError
from .. import timevalues
from ..declarations import StepDeclaration
from ..serialization import safe_repr
from ..templates import InputRef, ResolutionScope, Template
from .interrupt import SHAPE_MODULE, EventWait, InterruptStep, key_for
from .receive import NO_DEFAULT, TOPIC_MAX_LENGTH, TOPIC_PATTERN, receive


def check_event_name(name: object) -> str:
    """``name`` if it is a valid event name; InvalidEvent saying what one looks like if not."""
    if (
        isinstance(name, str)
        and len(name) <= TOPIC_MAX_LENGTH
        and TOPIC_PATTERN.fullmatch(name) is not None
    ):
        return name
    raise InvalidEvent(
        f"an event name is at most {TOPIC_MAX_LENGTH} letters, digits and '._:-', starting "
        f"with a letter or a digit (such as 'invoice.paid'), got {safe_repr(name)}"
    )


def wait_for_event(
    name: str,
    *,
    match: Callable[[ResolutionScope], object] | Template | None = None,
    after: Iterable[str] | str = (),
    serializer: type | None = None,
    timeout: float | dt.timedelta | None = None,
    default: object = NO_DEFAULT,
    lookback: float | dt.timedelta = 0,
    resume: str = "background",
) -> StepDeclaration:
    """Declare a step that waits for an event ``name`` emitted with ``emit()``.

    - ``match``: ``arg.input(...)``, ``arg.result(...)`` or ``callable(run) -> str``: the
      event's ``key`` must equal this value of the run. Without it, any event of the name.
    - ``lookback`` (seconds or a ``timedelta``): events emitted up to this long before the
      run reached the step count too (the earliest first); 0 takes only later ones.
    - ``serializer``: a DRF serializer class validating the event's payload; an event it
      refuses is recorded as invalid in the run's mailbox and the step takes the next one.
    - ``timeout``, ``default``, ``after``: as for ``receive``.
    - ``resume``: ``"background"`` (a worker runs the rest; an emit that wakes a thousand runs
      returns at once) or ``"inline"`` (the emitting process runs it).
    """
    try:
        check_event_name(name)
    except ReactorError as exc:
        raise DefinitionError(f"wait_for_event(name=...): {exc}") from None
    if match is not None and not (isinstance(match, Template) or callable(match)):
        raise DefinitionError(
            "wait_for_event(match=...) must be arg.input(...), arg.result(...) or a callable "
            f"(run) -> str, got {match!r}"
        )
    seconds = (
        0.0
        if lookback == 0 or lookback == dt.timedelta(0)
        else timevalues.declared(lookback, "wait_for_event(lookback=...)")
    )
    if isinstance(after, str):
        after = (after,)
    after = tuple(after)
    reads = match.depends_on if isinstance(match, Template) else None
    if reads is not None and reads not in after:
        after = (*after, reads)  # the value it matches must be there first
    try:
        declared = receive(
            name,
            after=after,
            serializer=serializer,
            timeout=timeout,
            default=default,
            resume=resume,
        )
    except DefinitionError as exc:
        raise DefinitionError(str(exc).replace("receive(", "wait_for_event(")) from None
    receives = declared.impl
    assert issubclass(receives, InterruptStep)  # receive() made it
    spec = dataclasses.replace(
        receives.interrupt, topic=None, event=EventWait(name, match, seconds)
    )
    impl = type("WaitForEvent", (InterruptStep,), {"interrupt": spec, "__module__": SHAPE_MODULE})
    return StepDeclaration(impl, {}, wait_for=declared.wait_for)


@dataclass(frozen=True, slots=True)
class EmittedEvent:
    """An event as a trigger's ``inputs`` callable sees it."""

    name: str
    key: str | None
    event_id: str
    payload: Any


@dataclass(frozen=True, slots=True)
class EventRule:
    """``on_event(name, ...)``: a rule of ``Meta.triggers`` (start a run with ``inputs``) or
    of ``Meta.cancel_on`` (cancel the runs whose ``match`` input equals the event's key)."""

    name: str
    inputs: Callable[[EmittedEvent], Mapping[str, Any]] | None = None
    match: Template | None = None

    def inputs_for(self, event: EmittedEvent) -> Mapping[str, Any]:
        """The inputs of the run this trigger starts for ``event`` (its payload, without an
        ``inputs`` callable). Raises InvalidEvent with a plain reason when they are no dict."""
        if self.inputs is None:
            value: object = event.payload
        else:
            try:
                value = self.inputs(event)
            except Exception as exc:
                raise InvalidEvent(
                    f"on_event({self.name!r}, inputs=...) raised {type(exc).__name__} for "
                    f"event {event.event_id!r}: {exc}"
                ) from exc
        if not isinstance(value, Mapping):
            raise InvalidEvent(
                f"on_event({self.name!r}) needs the run's inputs as a dict, got "
                f"{type(value).__name__} for event {event.event_id!r}; give inputs=a callable "
                "(event) -> dict"
            )
        return value


def on_event(
    name: str,
    *,
    inputs: Callable[[EmittedEvent], Mapping[str, Any]] | None = None,
    match: Template | None = None,
) -> EventRule:
    """A rule on the event ``name``: in ``Meta.triggers``, a run starts for each event, with
    ``inputs(event)`` (the event's payload, without it); in ``Meta.cancel_on``, runs in
    flight whose ``match`` (``arg.input(...)``) equals the event's key are cancelled."""
    try:
        check_event_name(name)
    except ReactorError as exc:
        raise DefinitionError(f"on_event(name=...): {exc}") from None
    if inputs is not None and not callable(inputs):
        raise DefinitionError(
            f"on_event(inputs=...) must be a callable (event) -> dict, got {inputs!r}"
        )
    if match is not None and not isinstance(match, InputRef):
        raise DefinitionError(
            "on_event(match=...) must be arg.input(...): the input a run started with, "
            f"compared with the event's key, got {match!r}"
        )
    return EventRule(name, inputs, match)


def check_triggers(option: object, reactor: str) -> tuple[EventRule, ...]:
    """``Meta.triggers``: on_event(...) rules without ``match``."""
    rules = _rules(option, f"{reactor}.Meta.triggers")
    for rule in rules:
        if rule.match is not None:
            raise DefinitionError(
                f"{reactor}.Meta.triggers: on_event({rule.name!r}) starts a run for every "
                "event of its name; match= belongs to cancel_on and wait_for_event"
            )
    return rules


def check_cancel_on(
    option: object, reactor: str, input_fields: frozenset[str] | None
) -> tuple[EventRule, ...]:
    """``Meta.cancel_on``: on_event(..., match=arg.input(...)) rules."""
    rules = _rules(option, f"{reactor}.Meta.cancel_on")
    for rule in rules:
        if rule.match is None or rule.inputs is not None:
            raise DefinitionError(
                f"{reactor}.Meta.cancel_on: on_event({rule.name!r}) needs "
                'match=arg.input("<input>") (which runs it cancels) and no inputs='
            )
        assert isinstance(rule.match, InputRef)
        if input_fields is not None and rule.match.name not in input_fields:
            raise DefinitionError(
                f"{reactor}.Meta.cancel_on: on_event({rule.name!r}) matches input "
                f"{rule.match.name!r}, which {reactor}.Inputs does not declare"
            )
    return rules


def _rules(option: object, where: str) -> tuple[EventRule, ...]:
    if option is None:
        return ()
    if isinstance(option, EventRule):
        option = [option]
    if not isinstance(option, (list, tuple)) or not all(
        isinstance(rule, EventRule) for rule in option
    ):
        raise DefinitionError(f"{where} must be a list of on_event(...) rules, got {option!r}")
    return tuple(option)


def cancel_keys(rules: Iterable[EventRule], scope: ResolutionScope) -> list[tuple[str, str]]:
    """The ``(event name, key)`` pairs that cancel a run started with ``scope``'s inputs (a
    rule whose input the run lacks, or is empty, cancels nothing)."""
    found: list[tuple[str, str]] = []
    for rule in rules:
        try:
            key = key_for(rule.match, scope, f"cancel_on {rule.name!r}")
        except ValueError:
            continue
        if key is not None and (rule.name, key) not in found:
            found.append((rule.name, key))
    return found
