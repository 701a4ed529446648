"""The values the coordination backends return: grants, windows, decisions, claims, statuses.

All times are seconds. Timestamps (``at``, ``head_since``) are on the backend server's clock
(:meth:`CoordinationBackend.server_time`), never the Python process's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class LockGrant:
    """An exclusive lock held by ``owner`` until ``ttl`` seconds after the grant (or extension).

    ``fence`` is strictly greater than the fence of every earlier grant of ``key`` (a re-entrant
    re-acquire by the same live owner returns the same fence, with ``reentered=True``). Pass it
    to the writes the lock protects, so a write from a holder whose lock lapsed can be refused.
    """

    key: str
    owner: str
    fence: int
    ttl: float
    reentered: bool = False


@dataclass(frozen=True)
class SemaphoreGrant:
    """A slot of semaphore ``key`` held by ``owner``: ``holders`` live holders of ``limit``.

    ``reentered`` is true when ``owner`` already held a live slot (its TTL was renewed).
    """

    key: str
    owner: str
    holders: int
    limit: int
    reentered: bool = False


@dataclass(frozen=True)
class Window:
    """A rate-limit window: at most ``limit`` units of cost in any ``period`` seconds."""

    limit: int
    period: float

    def __post_init__(self) -> None:
        if isinstance(self.limit, bool) or not isinstance(self.limit, int) or self.limit < 1:
            raise ValueError(f"a window's limit must be a positive integer, got {self.limit!r}")
        period = self.period
        if isinstance(period, bool) or not isinstance(period, int | float):
            raise ValueError(f"a window's period must be a number of seconds, got {period!r}")
        if not math.isfinite(period) or period <= 0:
            raise ValueError(f"a window's period must be positive seconds, got {period!r}")
        object.__setattr__(self, "period", float(period))

    def __str__(self) -> str:
        return f"{self.limit}/{self.period:g}s"


@dataclass(frozen=True)
class RateDecision:
    """The answer of a rate-limit check.

    ``allowed``: the cost was charged to every window. Otherwise nothing was charged and
    ``retry_after`` is the number of seconds after which the same check would pass if nothing
    else is charged meanwhile (0.0 when allowed). ``counts`` are the cost in each window
    (in the order given) after the decision; ``limited_by`` is the window that needs the
    longest wait (None when allowed); ``at`` is the server time of the decision.
    """

    allowed: bool
    retry_after: float
    counts: tuple[int, ...]
    limited_by: Window | None
    at: float


@dataclass(frozen=True)
class PeriodClaim:
    """The answer of :meth:`~CoordinationBackend.reserve_period`.

    ``granted``: the bucket is reserved for the caller (it was free, or already the caller's).
    Otherwise ``holder`` is the owner that reserved or claimed it and ``state`` says which
    (``"reserved"``: a run is in flight; ``"claimed"``: a run succeeded in this bucket).
    """

    granted: bool
    holder: str | None
    state: str | None = None


@dataclass(frozen=True)
class OrderedStatus:
    """The state of an ordered lock (what :meth:`~CoordinationBackend.ordered_status` returns).

    ``queue``: owners in enqueue order (the first is the head); ``head_since``: server time the
    head became head (or last heartbeat); ``halted_after``: the owner whose failure halted the
    chain in strict mode (None: not halted); ``skipped``: owners removed by the poison-pill
    timeout or by an operator, newest last (bounded).
    """

    key: str
    queue: tuple[str, ...]
    head_since: float | None
    halted_after: str | None
    skipped: tuple[str, ...]

    @property
    def head(self) -> str | None:
        """The owner allowed to run now, or None (empty queue or halted chain)."""
        if self.halted_after is not None or not self.queue:
            return None
        return self.queue[0]

    @property
    def halted(self) -> bool:
        return self.halted_after is not None

    @property
    def reason(self) -> str:
        """Why the head is None, for a halt reason shown to people ('' when there is a head)."""
        if self.halted_after is not None:
            return f"ordered lock {self.key!r} halted after {self.halted_after} failed"
        if not self.queue:
            return f"ordered lock {self.key!r} has no queued owner"
        return ""


# ---------------------------------------------------------------------------- inspection
#
# What :meth:`CoordinationBackend.inspect` reports. Times left (``expires_in``) are seconds from
# the snapshot's ``at``; moments (``at``, ``head_since``, ``last_at``) are on the server's clock.


@dataclass(frozen=True)
class HeldLock:
    """A lock held now: its ``owner``, the ``fence`` of its grant, the seconds it has left."""

    key: str
    owner: str
    fence: int
    expires_in: float


@dataclass(frozen=True)
class SemaphoreSlots:
    """The live slots of a semaphore: ``(owner, seconds left)``, soonest expiry first."""

    key: str
    holders: tuple[tuple[str, float], ...]


@dataclass(frozen=True)
class RateUsage:
    """The cost charged to a rate-limit key in each of the snapshot's ``periods`` (the same
    order), and when it was last charged."""

    key: str
    counts: tuple[int, ...]
    last_at: float | None


@dataclass(frozen=True)
class PeriodHold:
    """A bucket of a period key, ``"reserved"`` by a run in flight or ``"claimed"`` by a run
    that succeeded in it, until ``expires_in`` seconds from now."""

    key: str
    bucket: str
    owner: str
    state: str
    expires_in: float | None


@dataclass(frozen=True)
class OrderedQueue:
    """An ordered lock with owners queued, or halted: its head and since when, how many are
    queued, the first of them (``first``, head first), its halt and its latest skips."""

    key: str
    queued: int
    first: tuple[str, ...]
    head_since: float | None
    halted_after: str | None
    skipped: tuple[str, ...]

    @property
    def head(self) -> str | None:
        """The owner whose turn it is (None when empty or halted)."""
        if self.halted_after is not None or not self.first:
            return None
        return self.first[0]


@dataclass(frozen=True)
class CoordinationSnapshot:
    """What a coordination backend holds at server time ``at`` (see ``inspect``).

    Each list is sorted by key and has at most the ``limit`` asked for; ``cut`` names the
    kinds that had more (or, on Redis, that the bounded scan of the key space may have missed).
    """

    at: float
    periods: tuple[float, ...]
    locks: tuple[HeldLock, ...] = ()
    semaphores: tuple[SemaphoreSlots, ...] = ()
    rates: tuple[RateUsage, ...] = ()
    period_holds: tuple[PeriodHold, ...] = ()
    ordered: tuple[OrderedQueue, ...] = ()
    cut: tuple[str, ...] = ()
