"""Pausing and unpausing: one run, or every run of a reactor.

A paused run stops at its next step boundary and is ``suspended``: it holds no worker and no
lease, keeps its cursor, its undo stack and its wake-up time, and goes on where it stopped when
it is unpaused. A run that waits for nothing but a worker (pending, scheduled, sleeping, backing
off) is suspended at once; one a live process runs, or that waits at an interrupt, stops after
its current step (a payload delivered meanwhile is accepted, then the run stops). A paused
reactor's new runs are stored and not started; unpausing it releases its suspended runs oldest
first, at most ``REACTOR["UNPAUSE_RATE"]`` a second.
"""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass

from .. import store
from ..conf import reactor_settings
from ..exceptions import InvalidTransition
from ..handle import ExecutionHandle
from ..states import ExecutionStatus
from . import audit
from .databases import across_databases, in_each_database, on_reactors_database
from .guards import reactor_named, refuse_child
from .handles import find

# Suspended at once when no live process runs them (a running run whose process is gone too:
# its step in flight runs again when it is unpaused, as a recovery would).
SUSPENDABLE = (
    ExecutionStatus.PENDING,
    ExecutionStatus.SCHEDULED,
    ExecutionStatus.RUNNING,
)


@dataclass(frozen=True, slots=True)
class ReactorPause:
    """A paused reactor, as :func:`pause_reactor` and :func:`paused_reactors` give it."""

    reactor: str
    reason: str
    paused_by: str
    paused_at: dt.datetime
    #: False when the reactor was paused already (the first pause and its reason stand).
    new: bool = True


@dataclass(frozen=True, slots=True)
class Unpaused:
    """What :func:`unpause_reactor` did: whether the reactor was paused, and how many of its
    suspended runs it released (the first second's worth at once, the rest at
    ``UNPAUSE_RATE`` a second, woken by the sweeper)."""

    reactor: str
    was_paused: bool
    released: int


@across_databases
def pause(execution_id: uuid.UUID | str, *, reason: str = "") -> ExecutionHandle:
    """Pause a run: it stops at its next step boundary (at once when nobody runs it) and is
    ``suspended`` until :func:`unpause`. Pausing a paused run changes nothing.

    Raises InvalidTransition for a run that ended or rolls back, and for a composed child or
    an async unit (pause the run at the top).
    """
    steering = audit.steering("pause", reason=reason)
    row = store.get_row(execution_id)
    if row.parent_id is not None:
        raise InvalidTransition(
            f"cannot pause execution {row.id}: it is the "
            f"{'async unit' if row.detached else 'composed child'} run by step "
            f"{row.parent_step!r} of execution {row.parent_id}; pause that execution instead",
            status=row.status,
        )
    store.pauses.pause_run(
        row.id, steering=steering.on(row.id, row.reactor), suspendable=SUSPENDABLE
    )
    return find(row.id)


@across_databases
def unpause(execution_id: uuid.UUID | str, *, reason: str = "") -> ExecutionHandle:
    """Take a run's pause away: a suspended run goes on where it stopped (a worker takes it,
    at its wake-up time when it sleeps); one that had not stopped yet simply does not.

    Raises InvalidTransition for a run that is not paused, and for one whose reactor is
    paused (unpause the reactor).
    """
    steering = audit.steering("unpause", reason=reason)
    row = store.get_row(execution_id)
    refuse_child(row, "unpause")
    reactor_paused = store.pauses.reactor_pause(row.reactor)
    if reactor_paused is not None and row.status == ExecutionStatus.SUSPENDED:
        raise InvalidTransition(
            f"cannot unpause execution {row.id}: every run of its reactor {row.reactor} is "
            f"paused ({reactor_paused.reason or 'no reason given'}); unpause the reactor "
            f"(reactor_unpause {row.reactor}) to let its runs go on",
            status=row.status,
        )
    waiting = store.pauses.run_pause(row.id)
    if waiting is not None and waiting.waits_for_id is not None:
        original = store.status_of(waiting.waits_for_id)
        if original == ExecutionStatus.ROLLING_BACK:
            raise InvalidTransition(
                f"cannot unpause execution {row.id}: it is a fork waiting until execution "
                f"{waiting.waits_for_id} has undone its abandoned branch, which it is still "
                "doing; it goes on by itself once that undo has ended",
                status=row.status,
            )
    had, released = store.pauses.unpause_run(row.id, steering=steering.on(row.id, row.reactor))
    if not had and not released:
        raise InvalidTransition(
            f"cannot unpause execution {row.id}: it is {row.status} and not paused",
            status=row.status,
        )
    return find(row.id)


def pause_reactor(reactor: object, *, reason: str = "") -> ReactorPause:
    """Pause every run of ``reactor`` (the class or its name): running runs stop at their next
    step boundary, runs waiting for a worker or a wake-up stop when they would move, new runs
    are stored and not started. In every database runs are written to. Pausing a paused
    reactor keeps the first pause."""
    name = reactor_named(reactor).definition.name  # type: ignore[arg-type]
    steering = audit.steering(
        "pause_reactor", reason=reason, reactor=name, target=f"reactor {name}"
    )
    with on_reactors_database(name):  # where its runs are, and where they look for it
        row, new = store.pauses.pause_reactor(name, steering=steering)
    return ReactorPause(name, row.reason, row.paused_by, row.created_at, new=new)


def unpause_reactor(reactor: object, *, reason: str = "") -> Unpaused:
    """Let every run of ``reactor`` go on: its suspended runs (but those paused one by one)
    are released oldest first, at most ``REACTOR["UNPAUSE_RATE"]`` a second."""
    name = reactor_named(reactor).definition.name  # type: ignore[arg-type]
    steering = audit.steering(
        "unpause_reactor", reason=reason, reactor=name, target=f"reactor {name}"
    )
    with on_reactors_database(name):
        was_paused, released = store.pauses.unpause_reactor(
            name, steering=steering, rate=reactor_settings.UNPAUSE_RATE
        )
    return Unpaused(name, was_paused=was_paused, released=released)


def paused_reactors() -> list[ReactorPause]:
    """The reactors paused as a whole, the most recent pause first."""
    return [
        ReactorPause(row.reactor, row.reason, row.paused_by, row.created_at)
        for rows in in_each_database(store.pauses.paused_reactors)
        for row in rows
    ]
