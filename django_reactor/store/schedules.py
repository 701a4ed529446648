"""Schedules and their fires: the rows behind ``services.schedules``.

A tick is recorded by :func:`record_tick` in one transaction: its ``ScheduleFire`` row first
(unique on schedule and fire time: of any number of sweepers racing for a tick, one inserts
the row and the others insert nothing, ``sql.INSERT_FIRE``), then the schedule's next fire
time moves on, conditionally on still being the one the sweeper planned from (an edit, a
pause or another sweeper may have moved it), then the caller decides what the tick does
(start a run, queue it, skip it), and the run it starts commits with its fire row. Nothing
here takes a lock beyond the rows the statements write.

On PostgreSQL the sweeper records many schedules' ticks together (:func:`record_ticks`): the
same statements, each sent once for the batch, in one transaction; the guarantees are those of
:func:`record_tick`, tick by tick.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.db import IntegrityError, connections, transaction
from django.db.models import Q
from django.utils import timezone

from ..models import Schedule, ScheduleFire
from ..states import TERMINAL_STATUSES, FireOutcome
from . import audit, sql
from .db import using
from .dialects import dialect

if TYPE_CHECKING:
    from ..engine.actors import Steering

_VALUES = (
    "id",
    "name",
    "reactor",
    "inputs",
    "cron",
    "every",
    "timezone",
    "enabled",
    "catch_up",
    "overlap",
    "next_fire_at",
    "last_fire_at",
    "last_execution_id",
    "last_execution__status",
    "queued_fire_id",
    "queued_fire__fire_at",
    "created_at",
    "updated_at",
)


@dataclass(frozen=True, slots=True)
class ScheduleRow:
    """A schedule as stored, with the status of its latest run."""

    id: int
    name: str
    reactor: str
    inputs: Any
    cron: str
    every: dt.timedelta | None
    timezone: str
    enabled: bool
    catch_up: str
    overlap: str
    next_fire_at: dt.datetime | None
    last_fire_at: dt.datetime | None
    last_execution_id: uuid.UUID | None
    last_status: str | None
    queued_fire_id: int | None
    queued_fire_at: dt.datetime | None
    created_at: dt.datetime
    updated_at: dt.datetime

    @property
    def previous_running(self) -> bool:
        """Whether the latest run the schedule started has not finished."""
        return self.last_status is not None and self.last_status not in TERMINAL_STATUSES


@dataclass(frozen=True, slots=True)
class FireRow:
    """One recorded tick (or range of skipped ticks) and what became of it."""

    id: int
    schedule_id: int
    fire_at: dt.datetime
    until: dt.datetime | None
    outcome: str
    manual: bool
    execution_id: uuid.UUID | None
    note: str
    created_at: dt.datetime


@dataclass(frozen=True, slots=True)
class Decision:
    """What a tick does, as the caller of :func:`record_tick` decided (it may have started
    the run, in the tick's transaction)."""

    outcome: str
    note: str = ""
    execution_id: uuid.UUID | None = None


class NameTaken(Exception):
    """Another schedule has the name."""


def _schedule(values: dict[str, Any]) -> ScheduleRow:
    return ScheduleRow(
        id=values["id"],
        name=values["name"],
        reactor=values["reactor"],
        inputs=values["inputs"],
        cron=values["cron"],
        every=values["every"],
        timezone=values["timezone"],
        enabled=values["enabled"],
        catch_up=values["catch_up"],
        overlap=values["overlap"],
        next_fire_at=values["next_fire_at"],
        last_fire_at=values["last_fire_at"],
        last_execution_id=values["last_execution_id"],
        last_status=values["last_execution__status"],
        queued_fire_id=values["queued_fire_id"],
        queued_fire_at=values["queued_fire__fire_at"],
        created_at=values["created_at"],
        updated_at=values["updated_at"],
    )


def _fire(fire: ScheduleFire) -> FireRow:
    return FireRow(
        id=fire.id,
        schedule_id=fire.schedule_id,
        fire_at=fire.fire_at,
        until=fire.until,
        outcome=fire.outcome,
        manual=fire.manual,
        execution_id=fire.execution_id,
        note=fire.note,
        created_at=fire.created_at,
    )


def _schedules() -> Any:
    return Schedule.objects.using(using())


# ---------------------------------------------------------------------------- reads


def get(key: int | str) -> ScheduleRow | None:
    """The schedule with id ``key`` (an int) or name ``key`` (a str); None when none."""
    lookup = {"pk": key} if isinstance(key, int) else {"name": key}
    values = _schedules().filter(**lookup).values(*_VALUES).first()
    return _schedule(values) if values is not None else None


def listed(*, reactor: str | None = None, enabled: bool | None = None) -> list[ScheduleRow]:
    """Schedules by name, narrowed by reactor and by whether they are enabled."""
    rows = _schedules().all()
    if reactor is not None:
        rows = rows.filter(reactor=reactor)
    if enabled is not None:
        rows = rows.filter(enabled=enabled)
    return [_schedule(v) for v in rows.order_by("name").values(*_VALUES)]


def name_taken(name: str, *, exclude: int | None = None) -> bool:
    rows = _schedules().filter(name=name)
    if exclude is not None:
        rows = rows.exclude(pk=exclude)
    return bool(rows.exists())


def recent_fires(schedule_id: int, limit: int) -> list[FireRow]:
    """The schedule's latest fires, newest first (the unique index, read backwards)."""
    fires = ScheduleFire.objects.using(using()).filter(schedule_id=schedule_id)
    return [_fire(f) for f in fires.order_by("-fire_at")[:limit]]


def due(now: dt.datetime, limit: int) -> list[ScheduleRow]:
    """Enabled schedules whose next tick has come, the most overdue first
    (``reactor_schedule_due_idx``)."""
    rows = _schedules().filter(enabled=True, next_fire_at__lte=now).order_by("next_fire_at")
    return [_schedule(v) for v in rows.values(*_VALUES)[:limit]]


def next_fire_after(now: dt.datetime) -> dt.datetime | None:
    """The earliest next fire time later than ``now`` of an enabled schedule
    (``reactor_schedule_due_idx``)."""
    rows = _schedules().filter(enabled=True, next_fire_at__gt=now).order_by("next_fire_at")
    return rows.values_list("next_fire_at", flat=True).first()


def queued_ready(limit: int) -> list[ScheduleRow]:
    """Schedules holding a queued tick whose previous run has finished (or is gone)."""
    rows = (
        _schedules()
        .filter(queued_fire__isnull=False)
        .filter(Q(last_execution__isnull=True) | Q(last_execution__status__in=TERMINAL_STATUSES))
        .order_by("queued_fire_id")
    )
    return [_schedule(v) for v in rows.values(*_VALUES)[:limit]]


# ---------------------------------------------------------------------------- edits


def create(**fields: Any) -> ScheduleRow:
    """Insert a schedule; NameTaken when its name is."""
    try:
        with transaction.atomic(using=using()):
            schedule = _schedules().create(**fields)
    except IntegrityError:
        if name_taken(fields["name"]):
            raise NameTaken(fields["name"]) from None
        raise
    row = get(schedule.id)
    assert row is not None
    return row


def update(
    schedule_id: int, *, steering: Steering | None = None, **fields: Any
) -> ScheduleRow | None:
    """Change a schedule's fields; None when it is gone, NameTaken when the name is.
    ``steering`` (an operator's resume) is recorded with the change."""
    fields["updated_at"] = timezone.now()
    try:
        with transaction.atomic(using=using()):
            changed = _schedules().filter(pk=schedule_id).update(**fields)
            if changed and steering is not None:
                audit.write(steering)
    except IntegrityError:
        if "name" in fields and name_taken(fields["name"], exclude=schedule_id):
            raise NameTaken(fields["name"]) from None
        raise
    return get(schedule_id) if changed else None


def pause(schedule_id: int, note: str, *, steering: Steering | None = None) -> ScheduleRow | None:
    """Disable a schedule: no next fire, and a queued tick is recorded skipped (``note``);
    ``steering`` (the operator who paused it) is recorded with the change."""
    with transaction.atomic(using=using()):
        queued = _schedules().filter(pk=schedule_id).values_list("queued_fire_id", flat=True)
        queued_id = queued.first()
        changed = (
            _schedules()
            .filter(pk=schedule_id)
            .update(enabled=False, next_fire_at=None, queued_fire=None, updated_at=timezone.now())
        )
        if queued_id is not None:
            ScheduleFire.objects.using(using()).filter(
                pk=queued_id, outcome=FireOutcome.QUEUED
            ).update(outcome=FireOutcome.SKIPPED, note=note)
        if changed and steering is not None:
            audit.write(steering)
    return get(schedule_id) if changed else None


def delete(schedule_id: int) -> bool:
    """Delete a schedule and its fires (the runs stay); False when it was gone."""
    with transaction.atomic(using=using()):
        # The schedule points at one of its fires: let go of it first.
        _schedules().filter(pk=schedule_id).update(queued_fire=None)
        deleted, _ = _schedules().filter(pk=schedule_id).delete()
    return bool(deleted)


def make_due(schedule_ids: Iterable[int] | None, at: dt.datetime) -> int:
    """Move enabled schedules' next fire time to ``at`` (the testing helper's write)."""
    rows = _schedules().filter(enabled=True)
    if schedule_ids is not None:
        rows = rows.filter(pk__in=list(schedule_ids))
    return int(rows.update(next_fire_at=at))


# ---------------------------------------------------------------------------- fires


class _Changed(Exception):
    """The schedule moved under the sweeper: roll the tick's transaction back."""


#: What :func:`record_tick` returns when it recorded nothing: the schedule moved under the
#: caller (another sweeper has it, or it was paused, changed or deleted): leave it.
MOVED = "moved"
#: ... or the tick had been recorded before (a clock that went back moved the next fire onto
#: it): the schedule's next fire moved past it, and the caller may go on with the next tick.
PASSED = "passed"


def record_tick(
    schedule_id: int,
    *,
    expected: dt.datetime,
    fire_at: dt.datetime,
    until: dt.datetime | None,
    following: dt.datetime,
    decide: Callable[[ScheduleRow], Decision],
) -> FireRow | str:
    """Record the tick ``fire_at`` (with ``until``: the skipped ticks up to it) of a schedule
    whose next fire time is ``expected``, and move that to ``following``, in one transaction.

    ``decide(schedule)`` says what the tick does; it runs inside the transaction, after the
    tick is known to be this caller's, and may start the run there. Returns the fire, or
    :data:`MOVED` or :data:`PASSED`.
    """
    try:
        with transaction.atomic(using=using()):
            fire = _insert_fire(schedule_id, fire_at, until, manual=False)
            if fire is None:
                # The tick is recorded: by a sweeper that won it (and moved the next fire on,
                # committing before this insert gave up), or long ago.
                passed = _advance(schedule_id, expected, following, until or fire_at)
                return PASSED if passed else MOVED
            if not _advance(schedule_id, expected, following, until or fire_at):
                raise _Changed
            return _settle(fire, schedule_id, decide)
    except _Changed:
        return MOVED


@dataclass(frozen=True, slots=True)
class Tick:
    """A schedule's one due tick, for :func:`record_ticks`: its time (the schedule's next fire
    time as read) and the next fire time after it."""

    schedule_id: int
    fire_at: dt.datetime
    following: dt.datetime


def batches_ticks() -> bool:
    """Whether :func:`record_ticks` may be used (PostgreSQL); otherwise tick by tick."""
    return dialect().batches_ticks


def record_ticks(
    ticks: Sequence[Tick], decide: Callable[[ScheduleRow, Tick], Decision]
) -> dict[int, FireRow | str]:
    """Record many schedules' ticks (at most one each) in one transaction, as
    :func:`record_tick` records one: its fire row inserted (the race for the tick), the next
    fire time moved on if still the one read, then ``decide(schedule, tick)`` for each tick
    that is this caller's. Returns each schedule's fire, or :data:`MOVED` or :data:`PASSED`.

    About six statements for the batch, plus what ``decide`` sends: an error in one of them
    rolls the batch back (nothing fired; the next sweep tries again).
    """
    ordered = sorted(ticks, key=lambda t: t.schedule_id)
    if not ordered:
        return {}
    connection = connections[using()]
    adapt = connection.ops.adapt_datetimefield_value
    now = timezone.now()
    with transaction.atomic(using=using()), connection.cursor() as cursor:
        cursor.execute(
            sql.INSERT_FIRES.format(rows=", ".join([sql.INSERT_FIRES_ROW] * len(ordered))),
            [
                value
                for t in ordered
                for value in (t.schedule_id, adapt(t.fire_at), FireOutcome.SKIPPED, adapt(now))
            ],
        )
        inserted = {schedule_id: (fire_id, created) for fire_id, schedule_id, created in cursor}
        cursor.execute(
            sql.ADVANCE_SCHEDULES.format(
                rows=", ".join([sql.ADVANCE_SCHEDULES_ROW] * len(ordered))
            ),
            [
                adapt(now),
                *[
                    value
                    for t in ordered
                    for value in (t.schedule_id, adapt(t.fire_at), adapt(t.following))
                ],
            ],
        )
        advanced = {row[0] for row in cursor}
        outcome: dict[int, FireRow | str] = {}
        moved = []
        for t in ordered:
            if t.schedule_id not in inserted:
                # Recorded already: by a sweeper that won it, or long ago (see record_tick).
                outcome[t.schedule_id] = PASSED if t.schedule_id in advanced else MOVED
            elif t.schedule_id not in advanced:
                # The schedule moved under the sweeper: its fire row is not this tick's.
                moved.append(inserted.pop(t.schedule_id)[0])
                outcome[t.schedule_id] = MOVED
        if moved:
            ScheduleFire.objects.using(using()).filter(pk__in=moved).delete()
        if not inserted:
            return outcome
        rows = {
            v["id"]: _schedule(v)
            for v in _schedules().filter(pk__in=list(inserted)).values(*_VALUES)
        }
        settled = []
        for t in ordered:
            if t.schedule_id not in inserted:
                continue
            fire_id, created_at = inserted[t.schedule_id]
            decision = decide(rows[t.schedule_id], t)
            settled.append((t.schedule_id, fire_id, decision))
            outcome[t.schedule_id] = FireRow(
                id=fire_id,
                schedule_id=t.schedule_id,
                fire_at=t.fire_at,
                until=None,
                outcome=decision.outcome,
                manual=False,
                execution_id=decision.execution_id,
                note=decision.note,
                created_at=created_at,
            )
        cursor.execute(
            sql.SETTLE_FIRES.format(rows=", ".join([sql.SETTLE_FIRES_ROW] * len(settled))),
            [
                value
                for schedule_id, fire_id, d in settled
                for value in (
                    fire_id,
                    schedule_id,
                    d.outcome,
                    d.note,
                    d.execution_id,
                    d.outcome == FireOutcome.QUEUED,
                )
            ],
        )
    return outcome


def _advance(
    schedule_id: int, expected: dt.datetime, following: dt.datetime, last: dt.datetime
) -> bool:
    """Move the next fire from ``expected`` to ``following`` if it is still ``expected``."""
    moved = (
        _schedules()
        .filter(pk=schedule_id, enabled=True, next_fire_at=expected)
        .update(next_fire_at=following, last_fire_at=last, updated_at=timezone.now())
    )
    return bool(moved)


def _insert_fire(
    schedule_id: int, fire_at: dt.datetime, until: dt.datetime | None, *, manual: bool
) -> FireRow | None:
    """Insert a fire row (outcome to be settled); None when the tick has one already."""
    connection = connections[using()]
    features = connection.features
    if not (
        features.supports_update_conflicts_with_target and features.can_return_columns_from_insert
    ):
        # No INSERT ... ON CONFLICT (...) DO NOTHING RETURNING (MariaDB, MySQL): the unique
        # key on (schedule, fire_at) refuses the second row, in a savepoint of its own.
        try:
            with transaction.atomic(using=using()):
                fire = ScheduleFire.objects.using(using()).create(
                    schedule_id=schedule_id,
                    fire_at=fire_at,
                    until=until,
                    outcome=FireOutcome.SKIPPED,
                    manual=manual,
                    note="",
                )
        except IntegrityError:
            return None
        return FireRow(
            id=fire.id,
            schedule_id=schedule_id,
            fire_at=fire_at,
            until=until,
            outcome=FireOutcome.SKIPPED,
            manual=manual,
            execution_id=None,
            note="",
            created_at=fire.created_at,
        )
    adapt = connection.ops.adapt_datetimefield_value
    with connection.cursor() as cursor:
        cursor.execute(
            sql.INSERT_FIRE,
            [
                schedule_id,
                adapt(fire_at),
                adapt(until),
                FireOutcome.SKIPPED,
                manual,
                adapt(timezone.now()),
            ],
        )
        inserted = cursor.fetchone()
    if inserted is None:
        return None
    created_at = inserted[1]
    if isinstance(created_at, str):  # SQLite
        created_at = ScheduleFire._meta.get_field("created_at").to_python(created_at)
    return FireRow(
        id=inserted[0],
        schedule_id=schedule_id,
        fire_at=fire_at,
        until=until,
        outcome=FireOutcome.SKIPPED,
        manual=manual,
        execution_id=None,
        note="",
        created_at=created_at,
    )


def record_manual(
    schedule_id: int,
    fire_at: dt.datetime,
    decide: Callable[[ScheduleRow], Decision],
    *,
    steering: Steering | None = None,
) -> FireRow | None:
    """Record a fire asked for by an operator (run now) at ``fire_at``; None when the
    schedule is gone or the moment is taken (call again with a later one). ``steering`` (the
    operator) is recorded with the fire, naming the run it started."""
    try:
        with transaction.atomic(using=using()):
            if not _schedules().filter(pk=schedule_id).update(updated_at=timezone.now()):
                return None
            fire = _insert_fire(schedule_id, fire_at, None, manual=True)
            if fire is None:
                return None
            settled = _settle(fire, schedule_id, decide)
            if steering is not None:
                if settled.execution_id is not None:
                    steering = steering.on(settled.execution_id)
                audit.write(steering, fire=settled.id, outcome=settled.outcome)
            return settled
    except _Changed:
        return None


def start_queued(
    schedule_id: int, fire_id: int, decide: Callable[[ScheduleRow], Decision]
) -> FireRow | None:
    """Take the schedule's queued tick ``fire_id`` and let ``decide`` start it, in one
    transaction; None when another sweeper took it, or the previous run is moving again."""
    try:
        with transaction.atomic(using=using()):
            taken = (
                _schedules()
                .filter(pk=schedule_id, queued_fire_id=fire_id)
                .update(queued_fire=None, updated_at=timezone.now())
            )
            if not taken:
                return None
            fire = _fire(ScheduleFire.objects.using(using()).get(pk=fire_id))
            return _settle(fire, schedule_id, decide, queued=True)
    except _Changed:
        return None


def _settle(
    fire: FireRow,
    schedule_id: int,
    decide: Callable[[ScheduleRow], Decision],
    *,
    queued: bool = False,
) -> FireRow:
    row = get(schedule_id)
    if row is None or (queued and row.previous_running):
        raise _Changed
    decision = decide(row)
    ScheduleFire.objects.using(using()).filter(pk=fire.id).update(
        outcome=decision.outcome, note=decision.note, execution_id=decision.execution_id
    )
    changes: dict[str, Any] = {}
    if decision.execution_id is not None:
        changes["last_execution_id"] = decision.execution_id
    if decision.outcome == FireOutcome.QUEUED:
        changes["queued_fire_id"] = fire.id
    if changes:
        _schedules().filter(pk=schedule_id).update(**changes)
    return dataclasses.replace(
        fire, outcome=decision.outcome, note=decision.note, execution_id=decision.execution_id
    )
