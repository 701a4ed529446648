"""Concurrency per key (``Meta.concurrency``) for the services: what a new run's start does
at its key's limit, and admitting queued runs when runs of their key end.

A run that ends releases its slot simply by ending (the count is read from the runs); what
needs doing is admitting the next queued runs of its key. The process that ended it does that
at once (:func:`ended`: a worker, an inline caller, a cancel); the sweeper admits whatever a
crash left waiting (:func:`admit_waiting`), so a queued run waits at most a sweep interval
longer than it must.
"""

from __future__ import annotations

import datetime as dt
import logging
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .. import registry, store
from ..engine.coordination import CoordinationKeyError
from ..engine.outcomes import Outcome
from ..exceptions import InvalidInputs, ReactorNotRegistered
from .health import format_duration

if TYPE_CHECKING:
    from ..engine.definition import ReactorDefinition
    from ..engine.flow import Keyed

logger = logging.getLogger("django_reactor.services")

#: The stored key of a reactor whose ``Concurrency`` has no key template: one for all its runs.
WHOLE_REACTOR = "*"


def key_of(
    declared: Keyed | None, definition: ReactorDefinition, inputs: Mapping[str, object]
) -> str:
    """The key a run of ``definition`` on ``inputs`` has under ``declared`` (its
    ``Meta.concurrency``, ``throttle`` or ``debounce``; ``""``: none declared). InvalidInputs
    (nothing written) when an input the key names is missing."""
    if declared is None:
        return ""
    try:
        return declared.key_of(inputs, definition.name) or WHOLE_REACTOR
    except CoordinationKeyError as exc:
        raise InvalidInputs(
            f"cannot start {definition.name}: {exc}", errors={"non_field_errors": [str(exc)]}
        ) from None


@dataclass(frozen=True)
class Decision:
    """What a start does at its key: ``start``, ``queue``, ``skip`` (to ``holder``'s run),
    ``cancel_newest``, or ``cancel_in_progress`` (queue, and cancel ``cancelling``)."""

    action: str
    holder: uuid.UUID | None = None
    cancelling: tuple[uuid.UUID, ...] = ()
    in_flight: int = 0


def decide(definition: ReactorDefinition, state: store.flow.KeyState | None) -> Decision:
    """The decision for a new run, from its key's state under the key's lock."""
    declared = definition.concurrency
    if declared is None or state is None or state.has_room(declared.limit):
        return Decision("start")
    in_flight = len(state.holders)
    if declared.on_limit == "skip" and state.holders:
        return Decision("skip", holder=state.holders[-1], in_flight=in_flight)
    if declared.on_limit == "cancel_newest":
        return Decision("cancel_newest", in_flight=in_flight)
    if declared.on_limit == "cancel_in_progress":
        excess = max(in_flight - declared.limit + 1, 0)
        return Decision(
            "cancel_in_progress", cancelling=tuple(state.holders[:excess]), in_flight=in_flight
        )
    return Decision("queue", in_flight=in_flight)


def over_limit(definition: ReactorDefinition, key: str, decision: Decision) -> str:
    """Why a run did not start: the sentence its trace, the admin and its outcome show."""
    declared = definition.concurrency
    assert declared is not None
    return (
        f"concurrency limit of {definition.name}: {decision.in_flight} of {declared.limit} "
        f"run(s) with key {key!r} in flight"
    )


def throttled(definition: ReactorDefinition, key: str) -> str:
    """Why a run was delayed: the sentence its trace and pages show."""
    declared = definition.throttle
    assert declared is not None
    return (
        f"throttle of {definition.name}: {declared.limit} start(s) per "
        f"{format_duration(declared.seconds)} with key {key!r}"
    )


def ended(definition: ReactorDefinition, key: str, outcome: Outcome | None) -> None:
    """A process took a run of ``key`` as far as it goes: when it left the key's slot (ended,
    or stopped holding it), admit the key's next queued runs.

    Whether any are queued is read without the key's lock, after the run's end committed: a
    start that counted the run as in flight before that commit and queued itself admits
    itself once it has committed (:func:`queued_start`), when it sees the slot free. One of
    the two always sees the other, and an uncontended run pays one read, no lock.
    """
    declared = definition.concurrency
    if declared is None or not key:
        return
    if outcome is not None and outcome.status in store.flow.HOLDING:
        return
    if store.flow.has_queued(definition.name, key):
        store.flow.admit_queued(definition.name, key, declared.limit)


def queued_start(definition: ReactorDefinition, key: str) -> None:
    """A start was queued and has committed: if a run of its key ended meanwhile (and, not
    seeing it queued yet, admitted nobody), take the free slot now."""
    declared = definition.concurrency
    assert declared is not None
    store.flow.admit_queued(definition.name, key, declared.limit)


def released(reactor: str, key: str) -> None:
    """:func:`ended` for a run of ``reactor`` that was holding ``key`` and has ended (an
    operator's cancel). A reactor this process does not know is left to the sweeper."""
    if not key:
        return
    try:
        definition = registry.get(reactor).definition
    except ReactorNotRegistered:
        return
    ended(definition, key, None)


def admit_waiting() -> int:
    """Admit the queued runs whose keys have free slots (the sweeper's backstop for a run that
    ended where nothing admitted the next); how many were admitted. Keys of reactors this
    process does not know are left for a process that does."""
    admitted = 0
    for reactor, key in store.flow.waiting_keys():
        try:
            declared = registry.get(reactor).definition.concurrency
        except ReactorNotRegistered:
            continue
        # A reactor that no longer declares a limit lets them all go.
        limit = 1 << 30 if declared is None else declared.limit
        admitted += len(store.flow.admit_queued(reactor, key, limit))
    if admitted:
        logger.info("the sweeper admitted %d queued run(s) whose keys had room", admitted)
    return admitted


@dataclass(frozen=True)
class KeyRow:
    """A concurrency key for the faces: its reactor, key, runs in flight and queued, and the
    reactor's declared limit and strategy (None when this process does not know it)."""

    reactor: str
    key: str
    in_flight: int
    queued: int
    limit: int | None
    on_limit: str


def keys_in_use(limit: int = 200) -> list[KeyRow]:
    """The concurrency keys with runs in flight or queued, the most queued first."""
    rows = []
    for figures in store.flow.key_figures(limit=limit):
        try:
            declared = registry.get(figures.reactor).definition.concurrency
        except ReactorNotRegistered:
            declared = None
        rows.append(
            KeyRow(
                figures.reactor,
                figures.key,
                figures.in_flight,
                figures.queued,
                declared.limit if declared is not None else None,
                declared.on_limit if declared is not None else "",
            )
        )
    return rows


def delayed_keys(limit: int = 200) -> list[store.flow.DelayedKey]:
    """Throttle and debounce keys with runs waiting to start (the coordination page's)."""
    return store.flow.delayed_keys(limit)


def waiting_detail(reactor: str, key: str, created_at: object) -> str:
    """What a queued run waits for, as its page and ``reactor_show`` say it."""
    try:
        declared = registry.get(reactor).definition.concurrency
    except ReactorNotRegistered:
        declared = None
    in_flight, ahead = store.flow.position(reactor, key, created_at)
    limit = f" of {declared.limit}" if declared is not None else ""
    return (
        f"waiting for its concurrency key {key!r}: {in_flight}{limit} run(s) in flight, "
        f"{ahead} queued ahead of it; it starts when one of them ends"
    )


def throttle_slot(
    definition: ReactorDefinition, latest: Sequence[dt.datetime], wanted: dt.datetime
) -> dt.datetime:
    """When a run that wants to start at ``wanted`` may start under its throttle, given its
    key's ``latest`` start slots (newest first, at most ``limit``): at ``wanted`` while fewer
    than ``limit`` started within a period before it, else a period after the oldest of them.
    Slots are handed out in order under the key's lock, so no period holds more than
    ``limit`` starts."""
    declared = definition.throttle
    assert declared is not None
    if len(latest) < declared.limit:
        return wanted
    return max(wanted, latest[declared.limit - 1] + dt.timedelta(seconds=declared.seconds))


def debounce_start(
    definition: ReactorDefinition, now: dt.datetime, latest: dt.datetime | None
) -> tuple[dt.datetime, dt.datetime | None]:
    """When a debounced run starts after a call at ``now``: a period later, but not after
    ``latest`` (its first call's ``max_wait``; None: computed for a first call). Returns the
    start and the latest start to keep."""
    declared = definition.debounce
    assert declared is not None
    if latest is None and declared.max_wait_seconds is not None:
        latest = now + dt.timedelta(seconds=declared.max_wait_seconds)
    start = now + dt.timedelta(seconds=declared.seconds)
    if latest is not None:
        start = min(start, latest)
    return start, latest
