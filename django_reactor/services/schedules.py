"""Schedules: a reactor run on a cron expression or an interval, fired by the sweeper.

The operations the admin, the ``reactor_schedule`` command and your code share: :func:`create`,
:func:`update`, :func:`pause`, :func:`resume`, :func:`run_now`, :func:`remove`, :func:`list`,
:func:`get`, :func:`fires` and :func:`upcoming`; and :func:`fire_due`, the sweeper's part
(``services.sweep()`` calls it).

How a sweep fires a schedule whose next tick has come (``fire_due``): the ticks from its next
fire time up to now are split into the *missed* ones, more than ``SCHEDULE_MISSED_AFTER``
seconds old (nothing swept while they came: downtime, a stopped beat), which follow the
schedule's catch-up policy, and the *timely* ones, which fire. A firing tick follows the
overlap policy when the schedule's previous run has not finished, else it starts a run on a
worker with the idempotency key ``schedule:<id>:<fire time>``. Each tick (or range of skipped
ticks) is recorded exactly once across any number of sweepers, in ``store.schedules``: the
timely ticks of a batch of due schedules in one transaction (on PostgreSQL), the ticks of a
catch-up one transaction each.
"""

from __future__ import annotations

import builtins
import datetime as dt
import functools
import json
import logging
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.utils import timezone as django_timezone

from .. import registry, store
from ..conf import reactor_settings
from ..engine.redaction import REDACTED, redact
from ..engine.validation import error_messages
from ..exceptions import InvalidSchedule, ReactorError, ReactorNotRegistered, ScheduleNotFound
from ..states import CatchUp, FireOutcome, Overlap
from ..store.schedules import Decision, FireRow, ScheduleRow
from . import audit, runs
from .audit import check_reason
from .cadence import Cadence, check_cron, check_zone, parse_every
from .databases import on_reactors_database
from .guards import reactor_named

if TYPE_CHECKING:
    from ..engine.actors import Steering
    from ..reactor import Reactor

__all__ = [
    "FireReport",
    "FireRow",
    "ScheduleRow",
    "cadence_of",
    "create",
    "fire_due",
    "fires",
    "get",
    "idempotency_key",
    "keep_secrets",
    "list",
    "pause",
    "remove",
    "resume",
    "run_now",
    "shown_inputs",
    "update",
    "validate",
]

#: The fields :func:`update` changes.
FIELDS = (
    "name",
    "reactor",
    "cron",
    "every",
    "timezone",
    "inputs",
    "catch_up",
    "overlap",
    "enabled",
)
NAME_LENGTH = 200

logger = logging.getLogger("django_reactor.services")


@dataclass(slots=True)
class FireReport:
    """What one :func:`fire_due` did: ticks by outcome (a range of skipped ticks counts once)."""

    started: int = 0
    queued: int = 0
    skipped: int = 0
    refused: int = 0
    # The earliest next tick of an enabled schedule after this call's time (None: none).
    next_due_at: dt.datetime | None = None

    def add(self, fire: FireRow) -> None:
        outcome = fire.outcome
        setattr(self, outcome, getattr(self, outcome) + 1)

    def as_dict(self) -> dict[str, int]:
        return {
            "started": self.started,
            "queued": self.queued,
            "skipped": self.skipped,
            "refused": self.refused,
        }


# ---------------------------------------------------------------------------- reading


def get(schedule: int | str | ScheduleRow) -> ScheduleRow:
    """The schedule with this id or name (a name is never a number); ScheduleNotFound."""
    key = schedule.id if isinstance(schedule, ScheduleRow) else schedule
    if isinstance(key, str) and key.strip().isdigit():
        key = int(key)
    row = store.schedules.get(key)
    if row is None:
        raise ScheduleNotFound(f"no schedule has the id or name {key!r}")
    return row


def list(*, reactor: str | None = None, enabled: bool | None = None) -> tuple[ScheduleRow, ...]:
    """Every schedule by name, or those of ``reactor`` (its registered name), or only the
    enabled (paused) ones."""
    return tuple(store.schedules.listed(reactor=reactor, enabled=enabled))


def fires(schedule: int | str | ScheduleRow, limit: int = 20) -> tuple[FireRow, ...]:
    """The schedule's latest fires, newest first."""
    return tuple(store.schedules.recent_fires(get(schedule).id, limit))


def shown_inputs(row: ScheduleRow) -> Any:
    """The schedule's inputs for display: the reactor's secret fields (``write_only``) masked
    as ``[REDACTED]``, as a run's inputs are."""
    return redact(row.inputs, _secret_paths(row.reactor))


def keep_secrets(row: ScheduleRow, inputs: Any) -> Any:
    """``inputs`` edited from :func:`shown_inputs`: a secret field left ``[REDACTED]`` keeps the
    value stored in ``row``."""
    if not isinstance(inputs, Mapping) or not isinstance(row.inputs, Mapping):
        return inputs
    kept = json.loads(json.dumps(inputs))
    for path in _secret_paths(row.reactor):
        if "*" in path:
            continue
        target: Any = kept
        stored: Any = row.inputs
        for key in path[:-1]:
            target, stored = target.get(key), stored.get(key)
            if not isinstance(target, dict) or not isinstance(stored, Mapping):
                break
        else:
            if target.get(path[-1]) == REDACTED and path[-1] in stored:
                target[path[-1]] = stored[path[-1]]
    return kept


def _secret_paths(reactor: str) -> builtins.list[tuple[str, ...]]:
    try:
        return [tuple(p) for p in registry.get(reactor).definition.input_secret_paths]
    except ReactorNotRegistered:
        return []


def cadence_of(row: ScheduleRow) -> Cadence:
    """When the schedule ticks (ValueError for stored values no longer valid)."""
    return Cadence.of(row.cron, row.every, row.timezone)


def upcoming(schedule: int | str | ScheduleRow, count: int = 10) -> tuple[dt.datetime, ...]:
    """The schedule's next ``count`` fire times (UTC), from its next fire on, as the sweeper
    will fire them (daylight saving time included); none for a paused schedule, or one whose
    stored cadence is no longer valid. The first may be past, when a sweep is due."""
    row = schedule if isinstance(schedule, ScheduleRow) else get(schedule)
    if not row.enabled or row.next_fire_at is None or count <= 0:
        return ()
    try:
        cadence = cadence_of(row)
    except ValueError:
        return ()
    fires = [row.next_fire_at]
    while len(fires) < count:
        try:
            fires.append(cadence.after(fires[-1]))
        except ValueError:  # past the years a date can hold (InvalidTime is one)
            break
    return tuple(fires)


# ---------------------------------------------------------------------------- changes


def create(
    reactor: str | type[Reactor],
    *,
    cron: str | None = None,
    every: Any = None,
    timezone: str | None = None,
    inputs: Mapping[str, Any] | None = None,
    catch_up: str = CatchUp.ONCE,
    overlap: str = Overlap.SKIP,
    name: str | None = None,
    enabled: bool = True,
) -> ScheduleRow:
    """Add a schedule that runs ``reactor`` with ``inputs`` on a ``cron`` expression (read in
    ``timezone``, default ``settings.TIME_ZONE``) or ``every`` interval (a ``timedelta``,
    seconds, or text such as ``15m``).

    Raises InvalidSchedule, naming each field that is wrong, and writes nothing: a reactor
    that is not registered, a cron expression that does not parse, an unknown time zone,
    neither or both of ``cron`` and ``every``, inputs its ``Inputs`` serializer refuses, an
    unknown policy, a name taken or made of digits. ``name`` defaults to the reactor's class
    name and a short random suffix.
    """
    reactor_name = reactor if isinstance(reactor, str) else reactor.definition.name
    fields = _clean(
        {
            "name": name,
            "reactor": reactor_name,
            "cron": cron,
            "every": every,
            "timezone": timezone,
            "inputs": {} if inputs is None else inputs,
            "catch_up": catch_up,
            "overlap": overlap,
            "enabled": enabled,
        },
        current=None,
    )
    cadence = Cadence.of(fields["cron"], fields["every"], fields["timezone"])
    now = django_timezone.now()
    next_fire_at = cadence.after(now) if fields["enabled"] else None
    try:
        # In the database of the reactor's runs (``REACTOR["DATABASE"]``), where its fires go.
        with on_reactors_database(reactor_name):
            return store.schedules.create(**fields, next_fire_at=next_fire_at)
    except store.schedules.NameTaken:
        raise InvalidSchedule({"name": [_name_taken(fields["name"])]}) from None


def update(schedule: int | str | ScheduleRow, **changes: Any) -> ScheduleRow:
    """Change some of a schedule's fields (those of :func:`create`, and ``enabled``); the
    rest stay. To swap a cron expression for an interval pass both, the old one as None.
    Raises InvalidSchedule as :func:`create` does. A changed cadence or time zone moves the
    next fire to the first tick after now (never to or before the latest tick handled)."""
    row = get(schedule)
    unknown = sorted(set(changes) - set(FIELDS))
    if unknown:
        raise TypeError(f"update() got unknown field(s): {', '.join(unknown)}")
    values = {f: getattr(row, f) for f in FIELDS}
    values.update(changes)
    fields = _clean(values, current=row)
    if not fields["enabled"] and row.enabled:
        store.schedules.pause(row.id, _PAUSED)
    cadence = Cadence.of(fields["cron"], fields["every"], fields["timezone"])
    moved = any(fields[f] != getattr(row, f) for f in ("cron", "every", "timezone"))
    if fields["enabled"] and (moved or not row.enabled or row.next_fire_at is None):
        fields["next_fire_at"] = _next_after_now(cadence, row)
    elif not fields["enabled"]:
        fields["next_fire_at"] = None
    try:
        updated = store.schedules.update(row.id, **fields)
    except store.schedules.NameTaken:
        raise InvalidSchedule({"name": [_name_taken(fields["name"])]}) from None
    if updated is None:
        raise ScheduleNotFound(f"the schedule {row.name!r} was removed meanwhile")
    return updated


def pause(schedule: int | str | ScheduleRow, *, reason: str = "") -> ScheduleRow:
    """Stop a schedule's ticks (it keeps its fires); a tick it queued is recorded skipped.
    Pausing a paused schedule changes nothing. Recorded in the steering history with who
    paused it and ``reason``."""
    check_reason(reason, "pause a schedule")
    row = get(schedule)
    if not row.enabled:
        return row
    paused = store.schedules.pause(
        row.id, _PAUSED, steering=_steering("schedule_pause", row, reason)
    )
    if paused is None:
        raise ScheduleNotFound(f"the schedule {row.name!r} was removed meanwhile")
    return paused


def resume(schedule: int | str | ScheduleRow, *, reason: str = "") -> ScheduleRow:
    """Start a paused schedule again from the first tick after now: the ticks that came while
    it was paused are not fired (they are not recorded either). Resuming a running schedule
    changes nothing. Recorded in the steering history with who resumed it and ``reason``."""
    check_reason(reason, "resume a schedule")
    row = get(schedule)
    if row.enabled and row.next_fire_at is not None:
        return row
    next_fire_at = _next_after_now(cadence_of(row), row)
    resumed = store.schedules.update(
        row.id,
        enabled=True,
        next_fire_at=next_fire_at,
        steering=_steering("schedule_resume", row, reason),
    )
    if resumed is None:
        raise ScheduleNotFound(f"the schedule {row.name!r} was removed meanwhile")
    return resumed


def run_now(schedule: int | str | ScheduleRow, *, reason: str = "") -> FireRow:
    """Start a run of the schedule at once, whatever its next tick and its overlap policy
    (paused or not); recorded as a manual fire, and in the steering history with who asked,
    ``reason`` and the run started. The fire says ``refused`` (and why) when the reactor
    refuses the stored inputs or is not known to this process."""
    check_reason(reason, "run a schedule now")
    row = get(schedule)
    steering = _steering("schedule_run_now", row, reason)
    for attempt in range(3):
        fire_at = django_timezone.now() + dt.timedelta(microseconds=attempt)
        fire = store.schedules.record_manual(
            row.id,
            fire_at,
            functools.partial(_start_run, fire_at=fire_at, note="run now"),
            steering=steering,
        )
        if fire is not None:
            return fire
        get(row.id)  # ScheduleNotFound when it was removed; else the moment was taken
    raise ReactorError(f"could not record a fire of schedule {row.name!r}; try again")


def _steering(action: str, row: ScheduleRow, reason: str) -> Steering:
    """The steering action ``action`` on the schedule ``row``, for the history."""
    return audit.steering(
        action,
        reason=reason,
        reactor=row.reactor,
        target=f"schedule {row.name}",
        detail={"schedule": row.id},
    )


def remove(schedule: int | str | ScheduleRow) -> None:
    """Delete a schedule and its fires; the runs it started stay."""
    row = get(schedule)
    if not store.schedules.delete(row.id):
        raise ScheduleNotFound(f"the schedule {row.name!r} was removed meanwhile")


def validate(**values: Any) -> dict[str, Any]:
    """The fields of :func:`create` checked and tidied, as they would be stored; raises
    InvalidSchedule. For forms that report errors before saving."""
    current = values.pop("current", None)
    return _clean(values, current=current)


_PAUSED = "the schedule was paused before the previous run finished"


def _next_after_now(cadence: Cadence, row: ScheduleRow) -> dt.datetime:
    # Never back to or before the latest tick handled, whatever this host's clock says.
    base = django_timezone.now()
    if row.last_fire_at is not None and row.last_fire_at > base:
        base = row.last_fire_at
    return cadence.after(base)


def _name_taken(name: str) -> str:
    return f"another schedule is named {name!r}; choose another name"


def _clean(values: Mapping[str, Any], *, current: ScheduleRow | None) -> dict[str, Any]:
    """Every field checked; InvalidSchedule naming each field that is wrong."""
    errors: dict[str, Any] = {}
    out: dict[str, Any] = {}

    reactor: type[Reactor] | None = None
    name = str(values.get("reactor") or "").strip()
    if not name:
        errors["reactor"] = ["choose the reactor to run"]
    else:
        try:
            reactor = reactor_named(name)
            out["reactor"] = reactor.definition.name
        except ReactorNotRegistered as exc:
            errors["reactor"] = [str(exc)]

    cron = str(values.get("cron") or "").strip()
    every = values.get("every")
    every = None if every in (None, "") else every
    out["cron"], out["every"] = "", None
    if cron and every is not None:
        errors["every"] = ["give a cron expression or an interval, not both"]
    elif not cron and every is None:
        errors["cron"] = ["give a cron expression (such as '30 2 * * *') or an interval"]
    elif cron:
        try:
            out["cron"] = check_cron(cron)
        except ValueError as exc:
            errors["cron"] = [str(exc)]
    else:
        try:
            out["every"] = parse_every(every)
        except ValueError as exc:
            errors["every"] = [str(exc)]

    zone = values.get("timezone")
    zone = django_timezone.get_default_timezone_name() if zone in (None, "") else str(zone)
    try:
        out["timezone"] = check_zone(zone).key
    except ValueError as exc:
        errors["timezone"] = [str(exc)]

    inputs = values.get("inputs")
    if not isinstance(inputs, Mapping):
        errors["inputs"] = [f"the inputs must be a JSON object, got {type(inputs).__name__}"]
    else:
        out["inputs"] = dict(inputs)
        if reactor is not None:
            problems = _input_problems(reactor, out["inputs"])
            if problems:
                errors["inputs"] = problems

    for field, choices in (("catch_up", CatchUp), ("overlap", Overlap)):
        value = str(values.get(field) or "")
        if value not in choices.values:
            errors[field] = [f"{value!r} is not one of {', '.join(choices.values)}"]
        else:
            out[field] = value

    out["enabled"] = bool(values.get("enabled", True))
    label = values.get("name")
    label = "" if label is None else str(label).strip()
    if not label and current is None and reactor is not None:
        label = f"{reactor.__name__}-{uuid.uuid4().hex[:6]}"
    if not label:
        errors.setdefault("name", ["enter a name"])
    elif len(label) > NAME_LENGTH:
        errors["name"] = [f"a name has at most {NAME_LENGTH} characters"]
    elif label.isdigit():
        errors["name"] = ["a name is not a number (numbers are schedule ids)"]
    elif store.schedules.name_taken(label, exclude=current.id if current else None):
        errors["name"] = [_name_taken(label)]
    out["name"] = label
    if errors:
        raise InvalidSchedule(errors)
    return out


def _input_problems(reactor: type[Reactor], inputs: dict[str, Any]) -> Sequence[str]:
    """What the reactor's Inputs serializer says about ``inputs`` (nothing when they pass)."""
    try:
        json.dumps(inputs, allow_nan=False)
    except (TypeError, ValueError) as exc:
        return [f"the inputs cannot be stored as JSON: {exc}"]
    _, error = runs.validated_inputs(reactor.definition, inputs)
    if error is None:
        return []
    if error.field_errors:
        return [
            f"{path}: {message}" if path else message
            for path, message in error_messages(error.field_errors)
        ]
    return [error.message]


# ---------------------------------------------------------------------------- firing


@dataclass(frozen=True, slots=True)
class _Entry:
    """One step of a schedule's catch-up: a tick to fire, or ticks to record skipped."""

    fire_at: dt.datetime
    fire: bool
    until: dt.datetime | None = None
    note: str = ""


def fire_due(*, now: dt.datetime | None = None, rounds: store.Rounds | None = None) -> FireReport:
    """Fire what is due at ``now`` (default: the current time): the ticks of enabled schedules
    whose next fire time has come, the most overdue first, then the queued ticks whose previous
    run has finished.

    ``SWEEP_BATCH`` schedules at a time, each batch of timely ticks recorded and its runs
    started in one transaction (on PostgreSQL), published once it commits; a full batch is
    followed at once by the next, within the time of ``rounds`` (default: ``SWEEP_BUDGET``
    seconds from now). Safe on any number of hosts at once (see ``store.schedules``).
    """
    now = now or django_timezone.now()
    limit = reactor_settings.SWEEP_BATCH
    rounds = rounds or store.Rounds(reactor_settings.SWEEP_BUDGET)
    report = FireReport()
    rounds.run(limit, functools.partial(_fire_batch, now, limit, report))
    rounds.run(limit, functools.partial(_start_queued, limit, report))
    report.next_due_at = store.schedules.next_fire_after(now)
    if any(report.as_dict().values()):
        logger.info("schedules fired: %s", report.as_dict())
    return report


def _fire_batch(now: dt.datetime, limit: int, report: FireReport) -> int:
    """Fire the ticks of (at most) ``limit`` due schedules: one timely tick each, together;
    catch-ups tick by tick. How many schedules were read, or 0 when none of them moved."""
    rows = store.schedules.due(now, limit)
    budget = limit
    together: dict[int, tuple[_Entry, store.schedules.Tick]] = {}
    recorded = 0
    for row in rows:
        if budget <= 0:
            break
        try:
            entries = _plan(row, now, budget)
            if len(entries) == 1 and entries[0].fire and store.schedules.batches_ticks():
                entry = entries[0]
                following = cadence_of(row).after(entry.fire_at)
                together[row.id] = (entry, store.schedules.Tick(row.id, entry.fire_at, following))
                budget -= 1
            else:
                done = _catch_up(row, entries, report)
                budget -= done
                recorded += done
        except ValueError as exc:  # stored values no longer valid (edited in the database)
            logger.error("schedule %s (%s) cannot fire: %s", row.id, row.name, exc)
    if together:
        fires = store.schedules.record_ticks(
            [tick for _, tick in together.values()],
            lambda schedule, tick: _decide(together[tick.schedule_id][0])(schedule),
        )
        for fire in fires.values():
            if isinstance(fire, FireRow):
                report.add(fire)
            recorded += fire != store.schedules.MOVED
    return len(rows) if recorded else 0


def _start_queued(limit: int, report: FireReport) -> int:
    """Start (at most) ``limit`` queued ticks whose previous run finished; how many were read,
    or 0 when none started."""
    rows = store.schedules.queued_ready(limit)
    started_any = False
    for row in rows:
        fire_id = row.queued_fire_id
        assert fire_id is not None
        assert row.queued_fire_at is not None
        start = functools.partial(
            _start_run, fire_at=row.queued_fire_at, note="started when the previous run finished"
        )
        started = store.schedules.start_queued(row.id, fire_id, start)
        if started is not None:
            report.add(started)
            started_any = True
    return len(rows) if started_any else 0


def _catch_up(row: ScheduleRow, entries: builtins.list[_Entry], report: FireReport) -> int:
    """Record the planned ticks of one schedule, each in its own transaction; how many."""
    recorded = 0
    for index, entry in enumerate(entries):
        if index + 1 < len(entries):
            following = entries[index + 1].fire_at
        else:
            following = cadence_of(row).after(entry.until or entry.fire_at)
        fire = store.schedules.record_tick(
            row.id,
            expected=entry.fire_at,  # where the previous entry left the next fire time
            fire_at=entry.fire_at,
            until=entry.until,
            following=following,
            decide=_decide(entry),
        )
        if fire == store.schedules.MOVED:
            break  # another sweeper has this schedule, or it changed: leave it
        if isinstance(fire, FireRow):  # (PASSED: it fired before; the next fire moved past it)
            report.add(fire)
            recorded += 1
    return recorded


def _plan(row: ScheduleRow, now: dt.datetime, budget: int) -> builtins.list[_Entry]:
    """The steps that bring a due schedule up to ``now``: its missed ticks by its catch-up
    policy, then its timely ticks; at most ``budget`` of them."""
    cadence = cadence_of(row)
    first = row.next_fire_at
    assert first is not None
    grace = max(reactor_settings.SCHEDULE_MISSED_AFTER, 2 * reactor_settings.SWEEP_INTERVAL)
    boundary = now - dt.timedelta(seconds=grace)
    entries: builtins.list[_Entry] = []
    tick = first
    if first <= boundary:  # ticks came while nothing swept
        last = max(first, cadence.at_or_before(boundary))
        if row.catch_up == CatchUp.SKIP:
            note = "missed while nothing swept (catch-up: skip)"
            entries.append(_Entry(first, False, None if last == first else last, note))
        elif row.catch_up == CatchUp.ONCE:
            if last != first:
                until = max(first, cadence.before(last))
                note = (
                    f"missed while nothing swept; run once at {last.isoformat()} (catch-up: once)"
                )
                entries.append(_Entry(first, False, None if until == first else until, note))
            entries.append(_Entry(last, True, note="missed while nothing swept (catch-up: once)"))
        else:
            kept = [last]
            limit = reactor_settings.SCHEDULE_CATCH_UP_LIMIT
            while len(kept) < limit and kept[-1] != first:
                kept.append(max(first, cadence.before(kept[-1])))
            if kept[-1] != first:
                until = max(first, cadence.before(kept[-1]))
                note = (
                    f"missed while nothing swept, beyond the {limit} most recent ticks run "
                    "(catch-up: all, SCHEDULE_CATCH_UP_LIMIT)"
                )
                entries.append(_Entry(first, False, None if until == first else until, note))
            note = "missed while nothing swept (catch-up: all)"
            entries.extend(_Entry(t, True, note=note) for t in reversed(kept))
        tick = cadence.after(last)
    while tick <= now and len(entries) < budget:
        entries.append(_Entry(tick, True))
        tick = cadence.after(tick)
    return entries[:budget]


def _decide(entry: _Entry) -> Any:
    """What the tick of ``entry`` does once it is this sweeper's: skipped ticks are recorded,
    a firing tick follows the overlap policy or starts its run."""

    def decide(row: ScheduleRow) -> Decision:
        if not entry.fire:
            return Decision(FireOutcome.SKIPPED, entry.note)
        if row.previous_running:
            previous = str(row.last_execution_id)[:8]
            if row.overlap == Overlap.SKIP:
                return Decision(
                    FireOutcome.SKIPPED,
                    f"the previous run {previous} has not finished (overlap: skip)",
                )
            if row.overlap == Overlap.QUEUE:
                if row.queued_fire_id is None:
                    return Decision(
                        FireOutcome.QUEUED,
                        f"waits for the previous run {previous} to finish (overlap: queue)",
                    )
                return Decision(
                    FireOutcome.SKIPPED,
                    f"a tick already waits for the previous run {previous} (overlap: queue "
                    "keeps one)",
                )
        return _start_run(row, entry.fire_at, entry.note)

    return decide


def idempotency_key(schedule_id: int, fire_at: dt.datetime) -> str:
    """The idempotency key of the run a schedule's tick starts."""
    return f"schedule:{schedule_id}:{fire_at.astimezone(dt.UTC).isoformat()}"


def _start_run(row: ScheduleRow, fire_at: dt.datetime, note: str) -> Decision:
    """Start the schedule's run for the tick ``fire_at`` on a worker (in the caller's
    transaction), or say why not."""
    try:
        reactor = registry.get(row.reactor)
    except ReactorNotRegistered as exc:
        return Decision(FireOutcome.REFUSED, f"the reactor is not known here: {exc}")
    definition = reactor.definition
    if not isinstance(row.inputs, Mapping):
        return Decision(FireOutcome.REFUSED, "the stored inputs are not a JSON object")
    try:
        stored, error = runs.validated_inputs(definition, row.inputs)
    except Exception as exc:  # a serializer that raises must not stop the other schedules
        logger.exception("schedule %s: the Inputs serializer of %s raised", row.id, row.reactor)
        return Decision(
            FireOutcome.REFUSED, f"the Inputs serializer raised {type(exc).__name__}: {exc}"
        )
    if error is not None:
        return Decision(FireOutcome.REFUSED, error.message)
    try:
        outcome = runs._start(
            definition,
            stored,
            idempotency_key=idempotency_key(row.id, fire_at),
            all_in_background=True,
        )
    except ReactorError as exc:
        return Decision(FireOutcome.REFUSED, f"the run could not start: {exc}")
    return Decision(FireOutcome.STARTED, note, execution_id=outcome.execution_id)
