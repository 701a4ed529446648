"""The interface every coordination backend implements, and the argument checks they share.

Every operation is atomic (one Lua script on Redis, one transaction on the database) and
reads the backend server's clock: TTLs, windows and expiries never depend on the clock of the
Python process that calls. When the backend cannot be reached every operation raises
:class:`~django_reactor.coordination.CoordinationUnavailable`: callers fail closed.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

from ...engine import timevalues
from ..types import (
    CoordinationSnapshot,
    LockGrant,
    OrderedStatus,
    PeriodClaim,
    RateDecision,
    SemaphoreGrant,
    Window,
)

#: Longest key or owner any backend accepts (the database backend's column width).
MAX_KEY_LENGTH = 255

#: How many skipped owners an ordered lock remembers for its status.
SKIPPED_KEPT = 50

#: The most entries of each kind :meth:`CoordinationBackend.inspect` reports by default.
INSPECT_LIMIT = 100
#: The periods (seconds) a rate-limit key's charges are counted over by default.
INSPECT_PERIODS = (1.0, 60.0, 3600.0)
#: Queued owners of an ordered lock an inspection names (the rest are counted).
INSPECT_QUEUED = 5


def check_key(key: str, what: str = "key") -> str:
    """``key`` if it is a non-empty string of at most MAX_KEY_LENGTH characters."""
    if not isinstance(key, str) or not key:
        raise ValueError(f"a coordination {what} must be a non-empty string, got {key!r}")
    if len(key) > MAX_KEY_LENGTH:
        raise ValueError(
            f"a coordination {what} has at most {MAX_KEY_LENGTH} characters, got {len(key)}"
        )
    return key


def check_seconds(value: float, what: str) -> float:
    """``value`` as float if it is a positive number of seconds a date can hold from now;
    InvalidTime (a ValueError) otherwise."""
    return timevalues.seconds(value, what)


def check_windows(windows: Sequence[Window], cost: int) -> tuple[Window, ...]:
    """The windows, checked: at least one, distinct periods, and ``cost`` fits in each."""
    checked = tuple(windows)
    if not checked or not all(isinstance(w, Window) for w in checked):
        raise ValueError(f"check_rate() needs one or more Window values, got {windows!r}")
    if len({w.period for w in checked}) != len(checked):
        raise ValueError(f"two windows have the same period: {checked!r}")
    if isinstance(cost, bool) or not isinstance(cost, int) or cost < 1:
        raise ValueError(f"a rate-limit cost must be a positive integer, got {cost!r}")
    too_small = [w for w in checked if w.limit < cost]
    if too_small:
        raise ValueError(f"cost {cost} can never fit in {too_small[0]}")
    return checked


def check_inspection(limit: int, periods: Sequence[float]) -> tuple[float, ...]:
    """The periods of an inspection, checked (positive seconds, at least one) and sorted."""
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(f"an inspection's limit must be a positive integer, got {limit!r}")
    checked = tuple(sorted({check_seconds(p, "an inspection period") for p in periods}))
    if not checked:
        raise ValueError("an inspection needs at least one period to count charges over")
    return checked


class CoordinationBackend(ABC):
    """Locks, semaphores, rate limits, periods and ordered locks on a shared server.

    Keys and owners are strings of at most 255 characters. Owners identify the holder across
    processes (an execution id, say): the same owner may re-acquire, extend and release.
    Keys of different primitives never collide (a lock and a semaphore may share a name).
    """

    # --- Clock -------------------------------------------------------------------------

    @abstractmethod
    def server_time(self) -> float:
        """The backend server's clock, in seconds since the Unix epoch."""

    # --- Locks ---------------------------------------------------------------------------

    @abstractmethod
    def acquire_lock(self, key: str, owner: str, ttl: float) -> LockGrant | None:
        """Take the exclusive lock ``key`` for ``owner`` for ``ttl`` seconds, or return None.

        Free (never taken, released or lapsed): a fresh grant whose fence is strictly greater
        than the fence of any earlier grant of ``key``, even after expiry or release. Held by
        ``owner`` itself and live: re-entrant, the TTL is renewed and the SAME fence comes back
        (``reentered=True``). Held by someone else: None (nothing changes).
        """

    @abstractmethod
    def extend_lock(self, key: str, owner: str, ttl: float) -> bool:
        """Renew ``owner``'s live lock to ``ttl`` seconds from now; False if it is not held.

        A holder whose TTL lapsed gets False even if nobody took the lock since: it must stop
        and acquire again (a fresh grant, a new fence).
        """

    @abstractmethod
    def release_lock(self, key: str, owner: str) -> bool:
        """Release ``owner``'s live lock; False (a no-op) for a forged, lapsed or double release."""

    @abstractmethod
    def lock_holder(self, key: str) -> str | None:
        """The owner holding ``key`` now, or None."""

    # --- Semaphores -----------------------------------------------------------------------

    @abstractmethod
    def acquire_semaphore(
        self, key: str, owner: str, limit: int, ttl: float
    ) -> SemaphoreGrant | None:
        """Take a slot of ``key`` (at most ``limit`` live holders) for ``ttl`` seconds.

        Idempotent for ``owner``: a live holder keeps its one slot and its TTL is renewed. A
        holder whose TTL lapsed no longer counts, so a crashed holder's slot comes back within
        its TTL. Returns None, changing nothing, when ``limit`` other owners hold live slots.
        ``limit`` is the caller's: callers sharing a key should pass the same limit.
        """

    @abstractmethod
    def extend_semaphore(self, key: str, owner: str, ttl: float) -> bool:
        """Renew ``owner``'s live slot to ``ttl`` seconds from now; False if it holds none."""

    @abstractmethod
    def release_semaphore(self, key: str, owner: str) -> bool:
        """Give back the slot of ``owner``; False (a no-op) for a forged, lapsed or double one."""

    @abstractmethod
    def semaphore_holders(self, key: str) -> list[str]:
        """The owners holding live slots of ``key``, soonest expiry first."""

    # --- Rate limits ------------------------------------------------------------------------

    @abstractmethod
    def check_rate(self, key: str, windows: Sequence[Window], cost: int = 1) -> RateDecision:
        """Charge ``cost`` to every window of ``key`` if all of them have room, else nothing.

        Sliding-window log: each charge is recorded with the server time ``t`` it was allowed
        at, and a check at time ``now`` counts the charges with ``t > now - period`` in each
        window. The check passes when, for every window, that count plus ``cost`` is at most
        the window's limit; then the charge is recorded once (shared by all windows). The
        guarantee: in ANY half-open interval ``(t - period, t]`` of the server's clock, the
        charges allowed total at most ``limit``; there is no boundary at which twice the limit
        gets through (unlike fixed windows). A denial records nothing, in any window, and
        ``retry_after`` is when the oldest charges that block it leave their windows.
        Callers sharing a key must pass the same windows: charges older than the longest
        window of a check are forgotten.
        """

    @abstractmethod
    def rate_count(self, key: str, window: Window) -> int:
        """The cost charged to ``key`` in the last ``window.period`` seconds (for tests)."""

    # --- Periods ----------------------------------------------------------------------------

    @abstractmethod
    def reserve_period(self, key: str, bucket: str, owner: str, ttl: float) -> PeriodClaim:
        """Hold ``bucket`` of ``key`` for ``owner`` for ``ttl`` seconds while its run is in flight.

        Granted when the bucket is free (never held, released, or its reservation lapsed) or
        already ``owner``'s (a repeat renews a reservation's TTL). Otherwise not granted, and
        the claim names the holder and whether it is ``"reserved"`` or ``"claimed"``.
        """

    @abstractmethod
    def confirm_period(self, key: str, bucket: str, owner: str, keep_for: float) -> bool:
        """``owner``'s run succeeded: the bucket is claimed by it for ``keep_for`` seconds.

        True when the bucket was ``owner``'s or free (its reservation lapsed and nobody took
        it); False when another owner reserved or claimed it meanwhile.
        """

    @abstractmethod
    def release_period(self, key: str, bucket: str, owner: str) -> bool:
        """``owner``'s run failed: drop its reservation (failures do not claim a bucket).

        False (a no-op) when ``owner`` has no reservation there; a claimed bucket stays
        claimed.
        """

    # --- Ordered locks --------------------------------------------------------------------

    @abstractmethod
    def enqueue_ordered(self, key: str, owner: str) -> int:
        """Put ``owner`` at the tail of ``key``'s queue; its position (0 = head).

        Idempotent: an owner already queued keeps its place and gets its current position.
        """

    @abstractmethod
    def ordered_head(self, key: str, poison_after: float) -> str | None:
        """The owner whose turn it is, or None when the queue is empty or the chain is halted.

        A head that has been head for more than ``poison_after`` seconds (since it became head
        or its last :meth:`heartbeat_ordered`) without completing is removed, recorded in the
        status's ``skipped`` and logged, and the next owner becomes head.
        """

    @abstractmethod
    def heartbeat_ordered(self, key: str, owner: str) -> bool:
        """``owner`` is head and still working: restart its poison-pill clock; False if not head."""

    @abstractmethod
    def complete_ordered(self, key: str, owner: str, failed: bool, strict: bool) -> bool:
        """``owner`` finished: remove it from the queue; False when it was not queued.

        With ``failed`` and ``strict`` the chain halts after it: :meth:`ordered_head` returns
        None and :meth:`ordered_status` says "halted after <owner> failed" until
        :meth:`reset_ordered`. Owners may still enqueue and complete while it is halted.
        """

    @abstractmethod
    def peek_ordered(self, key: str) -> list[str]:
        """The queued owners, head first."""

    @abstractmethod
    def skip_ordered(self, key: str, owner: str) -> bool:
        """Remove ``owner`` from the queue (an operator's skip); False when it was not queued."""

    @abstractmethod
    def reset_ordered(self, key: str) -> int:
        """Clear ``key``: empty its queue, lift a halt, forget skips; the owners removed.

        Owners still waiting must enqueue again.
        """

    @abstractmethod
    def ordered_status(self, key: str) -> OrderedStatus:
        """Queue, head, halt and skips of ``key``."""

    # --- Inspection --------------------------------------------------------------------------

    def inspect(
        self, limit: int = INSPECT_LIMIT, periods: Sequence[float] = INSPECT_PERIODS
    ) -> CoordinationSnapshot:
        """What the backend holds now, for people (the admin's coordination panel): the locks
        held (owner, fence, time left), the semaphores' live slots, the rate-limit keys
        charged in the longest of ``periods`` (with their cost in each period), the period
        buckets reserved or claimed, and the ordered locks with owners queued or halted.

        At most ``limit`` of each kind, by key; the snapshot's ``cut`` names the kinds that had
        more. Read-only, and bounded: it never reads more than its limits' worth of state per
        kind (Redis: a bounded scan of the key space).
        """
        raise NotImplementedError(
            f"{type(self).__name__} cannot list what it holds (it does not implement inspect())"
        )

    # --- Housekeeping ----------------------------------------------------------------------

    def purge_expired(self) -> int:
        """Delete state that has expired (rows the sweeper may remove); the number removed.

        Redis expires keys itself, so its backend returns 0.
        """
        return 0
