"""The database backend: coordination in the project's own database, on its server's clock.

For deployments without Redis (and the SQLite demo). Each operation that writes is one
``transaction.atomic(durable=True)``: it locks the row of its key (``SELECT ... FOR UPDATE``,
created on first use under a unique constraint), then reads the database server's clock
(``clock_timestamp()`` on PostgreSQL, so a wait for the row lock never makes the time stale),
decides and writes. Such operations must not run inside a caller's transaction (Django raises
RuntimeError): their state has to commit on its own, and their row locks must not be held for
the caller's work. Reads (``server_time``, ``lock_holder``, ``semaphore_holders``,
``rate_count``, ``peek_ordered``, ``ordered_status``) are plain queries, callable anywhere.

PostgreSQL is the production database for it. SQLite works for one process (or several with
``"OPTIONS": {"transaction_mode": "IMMEDIATE"}``); its clock has millisecond resolution.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.db import InterfaceError, OperationalError, connections, router, transaction
from django.db.models import Count, F, Max, Q, Sum, Window
from django.db.models.functions import RowNumber

from ...exceptions import ReactorImproperlyConfigured
from ...store.dialects import dialect_for
from ..exceptions import CoordinationUnavailable
from ..models import (
    CoordinationKey,
    CoordinationLock,
    OrderedLockEntry,
    OrderedLockState,
    PeriodMarker,
    RateLimitEvent,
    SemaphoreHolder,
)
from ..types import (
    CoordinationSnapshot,
    HeldLock,
    LockGrant,
    OrderedQueue,
    OrderedStatus,
    PeriodClaim,
    PeriodHold,
    RateDecision,
    RateUsage,
    SemaphoreGrant,
    SemaphoreSlots,
)
from ..types import Window as RateWindow
from .base import (
    INSPECT_LIMIT,
    INSPECT_PERIODS,
    INSPECT_QUEUED,
    SKIPPED_KEPT,
    CoordinationBackend,
    check_inspection,
    check_key,
    check_seconds,
    check_windows,
)

logger = logging.getLogger("django_reactor.coordination")

# PostgreSQL fast paths for locks: one statement each instead of a locked read, a clock read
# and a write. The clock is read once per statement (``clock_timestamp()`` in a CTE), so a
# statement that waited for the row lock decides on the time it got it.
_ACQUIRE_LOCK_SQL = """
WITH clock AS (SELECT clock_timestamp() AS t)
INSERT INTO {table} (key, owner, fence, acquired_at, expires_at)
SELECT %s, %s, 1, t, t + make_interval(secs => %s) FROM clock
ON CONFLICT (key) DO UPDATE SET
    fence = CASE WHEN {table}.owner = EXCLUDED.owner
        AND {table}.expires_at > EXCLUDED.acquired_at THEN {table}.fence ELSE {table}.fence + 1 END,
    acquired_at = CASE WHEN {table}.owner = EXCLUDED.owner
        AND {table}.expires_at > EXCLUDED.acquired_at THEN {table}.acquired_at
        ELSE EXCLUDED.acquired_at END,
    owner = EXCLUDED.owner,
    expires_at = EXCLUDED.expires_at
WHERE {table}.owner IS NULL OR {table}.expires_at IS NULL
    OR {table}.expires_at <= EXCLUDED.acquired_at OR {table}.owner = EXCLUDED.owner
RETURNING fence, acquired_at <> (SELECT t FROM clock)
"""
_EXTEND_LOCK_SQL = """
WITH clock AS (SELECT clock_timestamp() AS t)
UPDATE {table} SET expires_at = clock.t + make_interval(secs => %s) FROM clock
WHERE key = %s AND owner = %s AND expires_at > clock.t
RETURNING fence
"""
_RELEASE_LOCK_SQL = """
WITH old AS (
    SELECT id, expires_at > clock_timestamp() AS live FROM {table}
    WHERE key = %s AND owner = %s FOR UPDATE
)
UPDATE {table} AS t SET owner = NULL, expires_at = NULL FROM old WHERE t.id = old.id
RETURNING old.live
"""

RESERVED = PeriodMarker.State.RESERVED
CLAIMED = PeriodMarker.State.CLAIMED


def _dt(seconds: float) -> datetime:
    moment = datetime.fromtimestamp(seconds, tz=UTC)
    return moment if settings.USE_TZ else moment.replace(tzinfo=None)


def _ts(moment: datetime) -> float:
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def _live(expires_at: datetime | None, now: float) -> bool:
    return expires_at is not None and _ts(expires_at) > now


class DatabaseBackend(CoordinationBackend):
    """Coordination in the database that Django routes the coordination models to.

    ``using``: the database alias (default: the router's choice for writes, usually
    ``"default"``).
    """

    def __init__(self, using: str | None = None) -> None:
        self.using = using or router.db_for_write(CoordinationLock)

    # --- plumbing ---------------------------------------------------------------------------

    @contextmanager
    def _errors(self) -> Iterator[None]:
        try:
            yield
        except (OperationalError, InterfaceError) as exc:
            # Connection loss, timeouts, "database is locked": infrastructure, fail closed.
            # A missing table (ProgrammingError) is a deployment mistake and propagates.
            raise CoordinationUnavailable(f"the coordination database failed: {exc}") from exc

    @contextmanager
    def _atomic(self) -> Iterator[None]:
        """A transaction of its own for a write: never inside the caller's transaction."""
        with self._errors(), transaction.atomic(using=self.using, durable=True):
            yield

    def _now(self) -> float:
        dialect = dialect_for(self.using)
        sql = dialect.clock_sql
        if sql is None:
            raise ReactorImproperlyConfigured(
                f"the database coordination backend does not support {dialect.name}"
            )
        with connections[self.using].cursor() as cursor:
            cursor.execute(sql)
            return float(cursor.fetchone()[0])

    def _guard(self, kind: str, key: str) -> None:
        CoordinationKey.objects.using(self.using).select_for_update().get_or_create(
            kind=kind, key=key
        )

    # --- clock ------------------------------------------------------------------------------

    def server_time(self) -> float:
        with self._errors():
            return self._now()

    # --- locks --------------------------------------------------------------------------------

    def _one_statement_locks(self) -> bool:
        """Whether the locks' PostgreSQL statements below can be sent (the store's dialect)."""
        return dialect_for(self.using).one_statement_locks

    def _one(self, sql: str, params: Sequence[Any]) -> tuple[Any, ...] | None:
        """One statement in a transaction of its own (PostgreSQL fast paths)."""
        with self._atomic(), connections[self.using].cursor() as cursor:
            return self._run_sql(cursor, sql.format(table=CoordinationLock._meta.db_table), params)

    def _run_sql(self, cursor: Any, sql: str, params: Sequence[Any]) -> tuple[Any, ...] | None:
        cursor.execute(sql, params)
        return cursor.fetchone()

    def acquire_lock(self, key: str, owner: str, ttl: float) -> LockGrant | None:
        check_key(key)
        check_key(owner, "owner")
        ttl = check_seconds(ttl, "a lock's ttl")
        if self._one_statement_locks():
            found = self._one(_ACQUIRE_LOCK_SQL, [key, owner, ttl])
            if found is None:
                return None
            fence, reentered = found
            return LockGrant(key, owner, fence, ttl, reentered=bool(reentered))
        with self._atomic():
            row, _ = (
                CoordinationLock.objects.using(self.using)
                .select_for_update()
                .get_or_create(key=key)
            )
            now = self._now()
            live = row.owner is not None and _live(row.expires_at, now)
            if live and row.owner != owner:
                return None
            row.expires_at = _dt(now + ttl)
            if live:
                row.save(update_fields=["expires_at"])
                return LockGrant(key, owner, row.fence, ttl, reentered=True)
            row.owner, row.fence, row.acquired_at = owner, row.fence + 1, _dt(now)
            row.save(update_fields=["owner", "fence", "acquired_at", "expires_at"])
            return LockGrant(key, owner, row.fence, ttl)

    def _owned_lock(self, key: str, owner: str) -> tuple[CoordinationLock | None, float]:
        row = (
            CoordinationLock.objects.using(self.using)
            .select_for_update()
            .filter(key=check_key(key), owner=check_key(owner, "owner"))
            .first()
        )
        return row, self._now()

    def extend_lock(self, key: str, owner: str, ttl: float) -> bool:
        ttl = check_seconds(ttl, "a lock's ttl")
        if self._one_statement_locks():
            return (
                self._one(_EXTEND_LOCK_SQL, [ttl, check_key(key), check_key(owner, "owner")])
                is not None
            )
        with self._atomic():
            row, now = self._owned_lock(key, owner)
            if row is None or not _live(row.expires_at, now):
                return False
            row.expires_at = _dt(now + ttl)
            row.save(update_fields=["expires_at"])
            return True

    def release_lock(self, key: str, owner: str) -> bool:
        if self._one_statement_locks():
            found = self._one(_RELEASE_LOCK_SQL, [check_key(key), check_key(owner, "owner")])
            return found is not None and bool(found[0])
        with self._atomic():
            row, now = self._owned_lock(key, owner)
            if row is None:
                return False
            was_live = _live(row.expires_at, now)
            row.owner, row.expires_at = None, None
            row.save(update_fields=["owner", "expires_at"])
            return was_live

    def lock_holder(self, key: str) -> str | None:
        check_key(key)
        with self._errors():
            row = CoordinationLock.objects.using(self.using).filter(key=key).first()
            if row is None or row.owner is None or not _live(row.expires_at, self._now()):
                return None
            return row.owner

    # --- semaphores --------------------------------------------------------------------------

    def acquire_semaphore(
        self, key: str, owner: str, limit: int, ttl: float
    ) -> SemaphoreGrant | None:
        check_key(key)
        check_key(owner, "owner")
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"a semaphore's limit must be a positive integer, got {limit!r}")
        ttl = check_seconds(ttl, "a semaphore's ttl")
        holders = SemaphoreHolder.objects.using(self.using)
        with self._atomic():
            self._guard(CoordinationKey.Kind.SEMAPHORE, key)
            now = self._now()
            holders.filter(key=key, expires_at__lte=_dt(now)).delete()
            renewed = holders.filter(key=key, owner=owner).update(expires_at=_dt(now + ttl))
            count = holders.filter(key=key).count()
            if renewed:
                return SemaphoreGrant(key, owner, count, limit, reentered=True)
            if count >= limit:
                return None
            holders.create(key=key, owner=owner, acquired_at=_dt(now), expires_at=_dt(now + ttl))
            return SemaphoreGrant(key, owner, count + 1, limit)

    def extend_semaphore(self, key: str, owner: str, ttl: float) -> bool:
        check_key(key)
        check_key(owner, "owner")
        ttl = check_seconds(ttl, "a semaphore's ttl")
        with self._atomic():
            self._guard(CoordinationKey.Kind.SEMAPHORE, key)
            now = self._now()
            return bool(
                SemaphoreHolder.objects.using(self.using)
                .filter(key=key, owner=owner, expires_at__gt=_dt(now))
                .update(expires_at=_dt(now + ttl))
            )

    def release_semaphore(self, key: str, owner: str) -> bool:
        check_key(key)
        check_key(owner, "owner")
        with self._atomic():
            self._guard(CoordinationKey.Kind.SEMAPHORE, key)
            now = self._now()
            mine = SemaphoreHolder.objects.using(self.using).filter(key=key, owner=owner)
            live = mine.filter(expires_at__gt=_dt(now)).exists()
            mine.delete()
            return live

    def semaphore_holders(self, key: str) -> list[str]:
        check_key(key)
        with self._errors():
            now = self._now()
            return list(
                SemaphoreHolder.objects.using(self.using)
                .filter(key=key, expires_at__gt=_dt(now))
                .order_by("expires_at", "id")
                .values_list("owner", flat=True)
            )

    # --- rate limits -------------------------------------------------------------------------

    def check_rate(self, key: str, windows: Sequence[RateWindow], cost: int = 1) -> RateDecision:
        check_key(key)
        checked = check_windows(windows, cost)
        longest = max(w.period for w in checked)
        events = RateLimitEvent.objects.using(self.using).filter(key=key)
        with self._atomic():
            self._guard(CoordinationKey.Kind.RATE, key)
            now = self._now()
            events.filter(at__lte=_dt(now - longest)).delete()
            sums = events.aggregate(
                **{
                    f"w{i}": Sum("cost", filter=Q(at__gt=_dt(now - w.period)), default=0)
                    for i, w in enumerate(checked)
                }
            )
            counts = [int(sums[f"w{i}"]) for i in range(len(checked))]
            retry, limited_by = 0.0, None
            for window, count in zip(checked, counts, strict=True):
                excess = count + cost - window.limit
                if excess > 0:
                    wait = self._leaves_after(events, window, now, excess)
                    if limited_by is None or wait > retry:
                        retry, limited_by = wait, window
            if limited_by is not None:
                return RateDecision(False, retry, tuple(counts), limited_by, now)
            events.create(key=key, at=_dt(now), cost=cost, expires_at=_dt(now + longest))
            return RateDecision(True, 0.0, tuple(c + cost for c in counts), None, now)

    @staticmethod
    def _leaves_after(events: Any, window: RateWindow, now: float, excess: int) -> float:
        """Seconds until the oldest charges of ``window`` worth ``excess`` have left it."""
        freed = 0
        for at, cost in (
            events.filter(at__gt=_dt(now - window.period))
            .order_by("at", "id")
            .values_list("at", "cost")
        ):
            freed += cost
            if freed >= excess:
                return max(0.0, _ts(at) + window.period - now)
        return window.period  # unreachable when counts are consistent

    def rate_count(self, key: str, window: RateWindow) -> int:
        check_key(key)
        with self._errors():
            now = self._now()
            total = (
                RateLimitEvent.objects.using(self.using)
                .filter(key=key, at__gt=_dt(now - window.period))
                .aggregate(total=Sum("cost", default=0))["total"]
            )
            return int(total)

    # --- periods -----------------------------------------------------------------------------

    def _marker(self, key: str, bucket: str, owner: str) -> tuple[PeriodMarker, bool, float]:
        row, created = (
            PeriodMarker.objects.using(self.using)
            .select_for_update()
            .get_or_create(
                key=check_key(key),
                bucket=check_key(bucket, "bucket"),
                defaults={"owner": check_key(owner, "owner"), "state": RESERVED},
            )
        )
        return row, created, self._now()

    def reserve_period(self, key: str, bucket: str, owner: str, ttl: float) -> PeriodClaim:
        ttl = check_seconds(ttl, "a period reservation's ttl")
        with self._atomic():
            row, created, now = self._marker(key, bucket, owner)
            if not created and _live(row.expires_at, now) and row.owner != owner:
                return PeriodClaim(False, row.owner, row.state)
            if created or not _live(row.expires_at, now):
                row.owner, row.state = owner, RESERVED
            if row.state == RESERVED:
                row.expires_at = _dt(now + ttl)
            row.save()
            return PeriodClaim(True, owner, row.state)

    def confirm_period(self, key: str, bucket: str, owner: str, keep_for: float) -> bool:
        keep_for = check_seconds(keep_for, "a claimed period's keep_for")
        with self._atomic():
            row, created, now = self._marker(key, bucket, owner)
            if not created and _live(row.expires_at, now) and row.owner != owner:
                return False
            row.owner, row.state, row.expires_at = owner, CLAIMED, _dt(now + keep_for)
            row.save()
            return True

    def release_period(self, key: str, bucket: str, owner: str) -> bool:
        check_key(owner, "owner")
        with self._atomic():
            row = (
                PeriodMarker.objects.using(self.using)
                .select_for_update()
                .filter(key=check_key(key), bucket=check_key(bucket, "bucket"))
                .first()
            )
            if row is None or row.owner != owner or row.state != RESERVED:
                return False
            live = _live(row.expires_at, self._now())
            row.delete()
            return live

    # --- ordered locks -------------------------------------------------------------------------

    def _ordered(self, key: str) -> tuple[OrderedLockState, float]:
        state, _ = (
            OrderedLockState.objects.using(self.using)
            .select_for_update()
            .get_or_create(key=check_key(key))
        )
        return state, self._now()

    def _entries(self, key: str) -> Any:
        return OrderedLockEntry.objects.using(self.using).filter(key=key).order_by("seq")

    def _refresh_head(self, state: OrderedLockState, now: float) -> str | None:
        first = self._entries(state.key).values_list("owner", flat=True).first()
        if first != state.head:
            state.head, state.head_since = first, (None if first is None else _dt(now))
            state.save(update_fields=["head", "head_since"])
        return first

    def _remember_skip(self, state: OrderedLockState, owner: str) -> None:
        state.skipped = [*state.skipped, owner][-SKIPPED_KEPT:]
        state.save(update_fields=["skipped"])

    def enqueue_ordered(self, key: str, owner: str) -> int:
        check_key(owner, "owner")
        with self._atomic():
            state, now = self._ordered(key)
            entries = self._entries(key)
            mine = entries.filter(owner=owner).first()
            if mine is None:
                state.next_seq += 1
                state.save(update_fields=["next_seq"])
                mine = entries.create(
                    key=key, owner=owner, seq=state.next_seq, enqueued_at=_dt(now)
                )
                self._refresh_head(state, now)
            return entries.filter(seq__lt=mine.seq).count()

    def ordered_head(self, key: str, poison_after: float) -> str | None:
        poison_after = check_seconds(poison_after, "poison_after")
        with self._atomic():
            state, now = self._ordered(key)
            if state.halted_after is not None:
                return None
            while (head := self._refresh_head(state, now)) is not None:
                assert state.head_since is not None
                if now - _ts(state.head_since) <= poison_after:
                    return head
                self._entries(key).filter(owner=head).delete()
                self._remember_skip(state, head)
                logger.warning(
                    "ordered lock %r: skipped %s, head for more than %ss without completing",
                    key,
                    head,
                    poison_after,
                )
            return None

    def heartbeat_ordered(self, key: str, owner: str) -> bool:
        check_key(owner, "owner")
        with self._atomic():
            state, now = self._ordered(key)
            if self._refresh_head(state, now) != owner:
                return False
            state.head_since = _dt(now)
            state.save(update_fields=["head_since"])
            return True

    def complete_ordered(self, key: str, owner: str, failed: bool, strict: bool) -> bool:
        check_key(owner, "owner")
        with self._atomic():
            state, now = self._ordered(key)
            removed, _ = self._entries(key).filter(owner=owner).delete()
            if removed and failed and strict and state.halted_after is None:
                state.halted_after = owner
                state.save(update_fields=["halted_after"])
            self._refresh_head(state, now)
            return bool(removed)

    def peek_ordered(self, key: str) -> list[str]:
        check_key(key)
        with self._errors():
            return list(self._entries(key).values_list("owner", flat=True))

    def skip_ordered(self, key: str, owner: str) -> bool:
        check_key(owner, "owner")
        with self._atomic():
            state, now = self._ordered(key)
            removed, _ = self._entries(key).filter(owner=owner).delete()
            if removed:
                self._remember_skip(state, owner)
            self._refresh_head(state, now)
            return bool(removed)

    def reset_ordered(self, key: str) -> int:
        with self._atomic():
            state, _ = self._ordered(key)
            removed, _ = self._entries(key).delete()
            state.head = state.head_since = state.halted_after = None
            state.skipped = []
            state.save(update_fields=["head", "head_since", "halted_after", "skipped"])
            return removed

    def ordered_status(self, key: str) -> OrderedStatus:
        check_key(key)
        with self._errors():
            state = OrderedLockState.objects.using(self.using).filter(key=key).first()
            queue = tuple(self._entries(key).values_list("owner", flat=True))
        if state is None:
            return OrderedStatus(key, queue, None, None, ())
        return OrderedStatus(
            key=key,
            queue=queue,
            head_since=None if state.head_since is None else _ts(state.head_since),
            halted_after=state.halted_after,
            skipped=tuple(state.skipped),
        )

    # --- inspection ----------------------------------------------------------------------------

    def inspect(
        self, limit: int = INSPECT_LIMIT, periods: Sequence[float] = INSPECT_PERIODS
    ) -> CoordinationSnapshot:
        """See :meth:`CoordinationBackend.inspect`: plain reads, each through an index (the
        held locks' and halted ordered locks' partial indexes of migration 0016), at most
        ``limit + 1`` keys of each kind."""
        periods = check_inspection(limit, periods)
        with self._errors():
            now = self._now()
            cut: list[str] = []

            def first(rows: list[Any], name: str) -> list[Any]:
                if len(rows) > limit:
                    cut.append(name)
                return rows[:limit]

            return CoordinationSnapshot(
                at=now,
                periods=periods,
                locks=tuple(self._held_locks(now, limit, first)),
                semaphores=tuple(self._slots(now, limit, first)),
                rates=tuple(self._rates(now, limit, periods, first)),
                period_holds=tuple(self._period_holds(now, limit, first)),
                ordered=tuple(self._queues(limit, first)),
                cut=tuple(cut),
            )

    def _held_locks(self, now: float, limit: int, first: Any) -> list[HeldLock]:
        rows = (
            CoordinationLock.objects.using(self.using)
            .filter(owner__isnull=False, expires_at__gt=_dt(now))
            .order_by("key")
            .values_list("key", "owner", "fence", "expires_at")[: limit + 1]
        )
        return [
            HeldLock(key, owner, fence, _ts(expires_at) - now)
            for key, owner, fence, expires_at in first(list(rows), "locks")
        ]

    def _slots(self, now: float, limit: int, first: Any) -> list[SemaphoreSlots]:
        live = SemaphoreHolder.objects.using(self.using).filter(expires_at__gt=_dt(now))
        keys = first(
            list(live.order_by("key").values_list("key", flat=True).distinct()[: limit + 1]),
            "semaphores",
        )
        holders: dict[str, list[tuple[str, float]]] = {key: [] for key in keys}
        for key, owner, expires_at in (
            live.filter(key__in=keys)
            .order_by("key", "expires_at", "id")
            .values_list("key", "owner", "expires_at")
        ):
            holders[key].append((owner, _ts(expires_at) - now))
        return [SemaphoreSlots(key, tuple(holders[key])) for key in keys]

    def _rates(
        self, now: float, limit: int, periods: tuple[float, ...], first: Any
    ) -> list[RateUsage]:
        rows = (
            RateLimitEvent.objects.using(self.using)
            .filter(at__gt=_dt(now - periods[-1]))
            .values("key")
            .annotate(
                last=Max("at"),
                **{
                    f"p{i}": Sum("cost", filter=Q(at__gt=_dt(now - period)), default=0)
                    for i, period in enumerate(periods)
                },
            )
            .order_by("key")[: limit + 1]
        )
        return [
            RateUsage(
                row["key"],
                tuple(int(row[f"p{i}"]) for i in range(len(periods))),
                _ts(row["last"]),
            )
            for row in first(list(rows), "rates")
        ]

    def _period_holds(self, now: float, limit: int, first: Any) -> list[PeriodHold]:
        rows = (
            PeriodMarker.objects.using(self.using)
            .filter(expires_at__gt=_dt(now))
            .order_by("key", "bucket")
            .values_list("key", "bucket", "owner", "state", "expires_at")[: limit + 1]
        )
        return [
            PeriodHold(key, bucket, owner, state, _ts(expires_at) - now)
            for key, bucket, owner, state, expires_at in first(list(rows), "periods")
        ]

    def _queues(self, limit: int, first: Any) -> list[OrderedQueue]:
        entries = OrderedLockEntry.objects.using(self.using)
        states = OrderedLockState.objects.using(self.using)
        queued = entries.order_by("key").values_list("key", flat=True).distinct()[: limit + 1]
        halted = (
            states.filter(halted_after__isnull=False)
            .order_by("key")
            .values_list("key", flat=True)[: limit + 1]
        )
        keys = first(sorted({*queued, *halted}), "ordered")
        counts = dict(
            entries.filter(key__in=keys)
            .values("key")
            .annotate(n=Count("id"))
            .order_by()
            .values_list("key", "n")
        )
        heads: dict[str, list[str]] = {key: [] for key in keys}
        for key, owner in (
            entries.filter(key__in=keys)
            .annotate(rank=Window(RowNumber(), partition_by=F("key"), order_by=F("seq").asc()))
            .filter(rank__lte=INSPECT_QUEUED)
            .order_by("key", "seq")
            .values_list("key", "owner")
        ):
            heads[key].append(owner)
        found = {state.key: state for state in states.filter(key__in=keys)}
        result = []
        for key in keys:
            state = found.get(key)
            result.append(
                OrderedQueue(
                    key=key,
                    queued=counts.get(key, 0),
                    first=tuple(heads[key]),
                    head_since=_ts(state.head_since) if state and state.head_since else None,
                    halted_after=state.halted_after if state else None,
                    skipped=tuple(state.skipped[-INSPECT_QUEUED:]) if state else (),
                )
            )
        return result

    # --- housekeeping --------------------------------------------------------------------------

    def purge_expired(self) -> int:
        """Delete lapsed semaphore holders, period markers and rate-limit charges.

        A charge is kept until it leaves the longest window it was checked against; a key whose
        windows later grow may forget charges early. Lock rows are kept: they hold the fences.
        """
        with self._atomic():
            cutoff = _dt(self._now())
            removed = 0
            for model in (SemaphoreHolder, PeriodMarker, RateLimitEvent):
                count, _ = model.objects.using(self.using).filter(expires_at__lte=cutoff).delete()
                removed += count
            return removed
