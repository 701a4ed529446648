"""Emitting an event: kept once, given to the runs waiting for it, starting and cancelling runs.

:func:`emit` keeps the event once per ``(name, event_id)`` and then sees to what it matches:
the runs of reactors whose ``Meta.triggers`` name it start (each exactly once per event: the
run's idempotency key is ``event:<name>:<event_id>``), each ``wait_for_event`` waiting for it
takes it (a message of its run's mailbox, consumed exactly once), and the runs in flight that
``Meta.cancel_on`` subscribed to its key are cancelled and rolled back on a worker. The event
is marked handled after; the sweeper (:func:`finish_events`) redoes what a process that stopped
left undone, every part of it idempotent.
"""

from __future__ import annotations

import hashlib
import json
import logging
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from .. import registry, store
from ..conf import reactor_settings
from ..engine.actors import MAX_WHO_LENGTH, Actor
from ..engine.constructs.events import EmittedEvent, EventRule, check_event_name
from ..engine.outcomes import InProgress
from ..engine.serialization import encode, safe_repr, unstorable
from ..engine.spec import ReactorDefinition
from ..exceptions import (
    ExecutionNotFound,
    IdempotencyKeyReused,
    InvalidAttribute,
    InvalidEvent,
    InvalidInputs,
    InvalidTransition,
    ReactorError,
    ResultNotSerializable,
    UnknownEvent,
)
from ..models import Event
from ..states import TERMINAL_STATUSES, ExecutionStatus
from . import audit
from .databases import in_each_database
from .interrupts import give_event
from .runs import start

logger = logging.getLogger("django_reactor.services")

#: How long an event may stay unhandled before the sweeper sees to it (its emitter stopped).
UNHANDLED_AFTER_SECONDS = 10.0

#: The statuses an event's cancellation takes a run from (one a live process owns is asked to
#: stop after its step, and rolled back once it has).
CANCELLED_FROM = (
    ExecutionStatus.PENDING,
    ExecutionStatus.SCHEDULED,
    ExecutionStatus.PAUSED,
    ExecutionStatus.RUNNING,
)


@dataclass(frozen=True, slots=True)
class Emitted:
    """What an emit did.

    ``replay``: the event id was emitted before (with the same key and payload) and nothing new
    was done. ``started``: the runs its triggers started (or had started); ``resumed``: the runs
    it woke (their wait took it); ``given``: the runs whose waits were given it (taken now,
    or when the run next pauses); ``cancelled``: the runs it cancelled; ``errors``: what could
    not be done, such as a trigger whose reactor refused the inputs.
    """

    name: str
    event_id: str
    replay: bool = False
    started: tuple[uuid.UUID, ...] = ()
    given: tuple[uuid.UUID, ...] = ()
    resumed: tuple[uuid.UUID, ...] = ()
    cancelled: tuple[uuid.UUID, ...] = ()
    errors: tuple[str, ...] = ()


def emit(
    name: str,
    payload: Any = None,
    *,
    key: str | int | None = None,
    event_id: str | int | None = None,
    source: str = "python",
) -> Emitted:
    """Record the event ``name`` durably and see to what it matches (see the module).

    ``key`` is what ``wait_for_event(match=...)`` and ``Meta.cancel_on`` compare; ``event_id``
    makes emitting idempotent (a new id is made without one): the same id again with the same
    key and payload does nothing new (``replay``). Raises UnknownEvent (no registered reactor
    waits for, starts on or cancels on ``name``) and InvalidEvent (no event name; a key or id
    that is no short text; a payload that is not JSON or larger than
    ``REACTOR["API_MAX_BODY_BYTES"]``; an id reused for another event); nothing is written then.
    """
    check_event_name(name)
    key = _short_text(key, "key", name)
    event_id = _short_text(event_id, "event_id", name) or uuid.uuid4().hex
    try:
        stored = encode(payload)
    except ResultNotSerializable as exc:
        raise InvalidEvent(f"the payload of event {name!r} cannot be stored: {exc}") from None
    limit = reactor_settings.API_MAX_BODY_BYTES
    if len(json.dumps(stored, separators=(",", ":")).encode()) > limit:
        raise InvalidEvent(
            f"the payload of event {name!r} is larger than {limit} bytes "
            '(REACTOR["API_MAX_BODY_BYTES"]); emit a reference to the data instead'
        )
    uses = event_uses()
    if name not in uses:
        known = set(uses)
        raise UnknownEvent(
            f"no registered reactor waits for, starts on or cancels on event {name!r} (the "
            f"events they do: {', '.join(sorted(known)) or 'none'}); declare "
            f"wait_for_event({name!r}) or on_event({name!r}) in a reactor",
            known=tuple(sorted(known)),
        )
    emitted = in_each_database(lambda: _emit_here(name, stored, key, event_id, source, uses[name]))
    return Emitted(
        name,
        event_id,
        replay=all(part.replay for part in emitted),
        started=tuple(run for part in emitted for run in part.started),
        given=tuple(run for part in emitted for run in part.given),
        resumed=tuple(run for part in emitted for run in part.resumed),
        cancelled=tuple(run for part in emitted for run in part.cancelled),
        errors=tuple(error for part in emitted for error in part.errors),
    )


def _short_text(value: object, what: str, name: str) -> str | None:
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str) or not value or len(value) > 255 or unstorable(value):
        raise InvalidEvent(
            f"the {what} of event {name!r} must be a non-empty text of at most 255 characters "
            f"the database can store, got {safe_repr(value)}"
        )
    return value


def _emit_here(
    name: str, stored: Any, key: str | None, event_id: str, source: str, uses: Uses
) -> Emitted:
    recorded = store.events.record(
        name,
        stored,
        key=key,
        event_id=event_id,
        source=source,
        waits=uses.waited,
        cancels=uses.cancels,
    )
    if recorded.replay and recorded.event.handled_at is not None:
        return Emitted(name, event_id, replay=True)
    handled = handle(recorded.event, recorded.waits, recorded.cancels)
    return Emitted(
        name,
        event_id,
        replay=recorded.replay,
        started=handled.started,
        given=handled.given,
        resumed=handled.resumed,
        cancelled=handled.cancelled,
        errors=handled.errors,
    )


def handle(event: Event, waits: Iterable[Any], cancels: Iterable[uuid.UUID]) -> Emitted:
    """See to what ``event`` matches in the bound database (its triggers, the interrupt rows
    ``waits`` and the runs ``cancels``), then mark it handled. Each part is idempotent."""
    errors: list[str] = []
    started = _start_triggered(event, errors)
    given, resumed = _give(event, waits)
    cancelled = [run for run in cancels if _cancel(run, event)]
    store.events.mark_handled(event, errors)
    return Emitted(
        event.name,
        event.event_id,
        started=tuple(started),
        given=tuple(given),
        resumed=tuple(resumed),
        cancelled=tuple(cancelled),
        errors=tuple(errors),
    )


def trigger_key(name: str, event_id: str) -> str:
    """The idempotency key of the run a trigger starts for an event: one run per event."""
    key = f"event:{name}:{event_id}"
    if len(key) <= 255:
        return key
    digest = hashlib.sha256(name.encode() + b"\0" + event_id.encode()).hexdigest()
    return f"event:{digest}"


def _start_triggered(event: Event, errors: list[str]) -> list[uuid.UUID]:
    if not event_uses().get(event.name, Uses()).triggers:
        return []
    seen = EmittedEvent(event.name, event.key, event.event_id, event.payload)
    started: list[uuid.UUID] = []
    here = store.bound_alias()
    for reactor_name, rule in _rules(lambda d: d.triggers, event.name):
        if store.alias_for(reactor_name) != here:
            continue  # started where that reactor's runs are, by the emit there
        try:
            outcome = start(
                reactor_name,
                rule.inputs_for(seen),
                idempotency_key=trigger_key(event.name, event.event_id),
            )
        except InvalidInputs as exc:
            errors.append(
                f"{reactor_name} refused the inputs of event {event.event_id!r}: "
                f"{json.dumps(exc.errors, default=str)}"
            )
            continue
        except (InvalidEvent, IdempotencyKeyReused, InvalidAttribute) as exc:
            errors.append(f"{reactor_name}: {exc}")
            continue
        if outcome.execution_id is not None:
            started.append(outcome.execution_id)
    return started


def _give(event: Event, waits: Iterable[Any]) -> tuple[list[uuid.UUID], list[uuid.UUID]]:
    """Give ``event`` to each waiting interrupt in ``waits`` (a message of its run's mailbox,
    taken by the wait in the same transaction); the runs given it and those it moved on."""
    given: list[uuid.UUID] = []
    resumed: list[uuid.UUID] = []
    key = store.events.message_key(event.pk)
    for row in waits:
        try:
            run_id, moved = give_event(row, event.payload, key)
        except (InvalidTransition, ExecutionNotFound):
            continue  # the run ended meanwhile
        except ReactorError as exc:  # the run is busy or its definition changed
            logger.warning("event %s for %s: %s", event.event_id, row.execution_id, exc)
            continue
        if run_id is None:
            continue
        given.append(run_id)
        if moved is not None and not isinstance(moved, InProgress):
            resumed.append(run_id)
    return given, resumed


def _cancel(execution_id: uuid.UUID, event: Event) -> bool:
    """Cancel the run for ``event`` and have a worker roll it back; a run a live process has
    in a step is asked to stop after it, and rolled back by the sweeper once it has."""
    reason = f"event {event.name!r} ({event.event_id}) cancelled it"
    data = {"event": event.name, "event_id": event.event_id}
    try:
        reactor = store.get_row(execution_id).reactor
    except ExecutionNotFound:
        return False
    steering = audit.steering(
        "cancel",
        reason=reason,
        detail=data,
        actor=Actor(f"event {event.name}"[:MAX_WHO_LENGTH], "system"),
    ).on(execution_id, reactor)
    if store.roll_back_on_worker(
        execution_id, reason=reason, allowed=CANCELLED_FROM, data=data, steering=steering
    ):
        store.events.unsubscribe(execution_id)
        return True
    try:
        store.request_cancel(execution_id, reason=reason, cancellable=(), steering=steering)
    except (InvalidTransition, ExecutionNotFound):
        return False  # it ended, or is rolling back already
    store.events.fire(execution_id)
    return True


def finish_events(limit: int | None = None) -> int:
    """For the sweeper: handle the events whose emitter stopped before it did, and roll back
    the runs an event asked to stop once they have; how many events and runs."""
    batch = limit or reactor_settings.SWEEP_BATCH
    done = 0
    for event in store.events.unhandled(batch, older_than=UNHANDLED_AFTER_SECONDS):
        handle(event, store.events.waits_for(event), store.events.cancels_for(event))
        done += 1
    for execution_id, status in store.events.fired(batch):
        if store.roll_back_on_worker(
            execution_id,
            reason="an event cancelled it while it ran a step; it stopped after that step",
            allowed=(ExecutionStatus.CANCELLED, *CANCELLED_FROM),
            data={},
        ):
            done += 1
            store.events.unsubscribe(execution_id)
        elif status in TERMINAL_STATUSES or status == ExecutionStatus.ROLLING_BACK:
            store.events.unsubscribe(execution_id)  # it ended before the request took effect
    return done


def _definitions() -> Iterable[tuple[str, ReactorDefinition]]:
    for reactor_name, reactor in registry.all_reactors().items():
        definition = getattr(reactor, "definition", None)
        if isinstance(definition, ReactorDefinition):
            yield reactor_name, definition


def _rules(
    rules_of: Callable[[ReactorDefinition], Iterable[EventRule]], name: str
) -> Iterable[tuple[str, EventRule]]:
    for reactor_name, definition in _definitions():
        for rule in rules_of(definition):
            if rule.name == name:
                yield reactor_name, rule


def _waited_names(definition: ReactorDefinition) -> Iterable[str]:
    for spec in definition.steps:
        if spec.interrupt is not None and spec.interrupt.event is not None:
            yield spec.interrupt.event.name
        elif spec.child is not None:
            yield from _waited_names(spec.child.definition)


@dataclass(frozen=True, slots=True)
class Uses:
    """What the registered reactors do with the events of one name."""

    waited: bool = False  # a wait_for_event waits for it
    triggers: bool = False  # Meta.triggers start runs on it
    cancels: bool = False  # Meta.cancel_on cancels runs on it


_uses_cache: dict[tuple[tuple[str, int], ...], dict[str, Uses]] = {}


def event_uses() -> dict[str, Uses]:
    """By event name, what the registered reactors do with it (worked out once for each set
    of registered reactor classes: an emit asks for every event)."""
    reactors = tuple((name, id(reactor)) for name, reactor in registry.all_reactors().items())
    found = _uses_cache.get(reactors)
    if found is not None:
        return found
    waited: set[str] = set()
    triggered: set[str] = set()
    cancelled: set[str] = set()
    for _reactor, definition in _definitions():
        waited.update(_waited_names(definition))
        triggered.update(rule.name for rule in definition.triggers)
        cancelled.update(rule.name for rule in definition.cancel_on)
    found = {
        name: Uses(name in waited, name in triggered, name in cancelled)
        for name in waited | triggered | cancelled
    }
    _uses_cache.clear()  # only the registry as it is now
    _uses_cache[reactors] = found
    return found


def event_names() -> set[str]:
    """Every event name a registered reactor waits for, starts on or cancels on."""
    return set(event_uses())
