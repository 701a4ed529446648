"""The Redis backend: every operation is one Lua script, atomic, on the Redis server's clock.

Connect through a django-redis cache alias (``REACTOR["COORDINATION_REDIS"] = "default"``) or a
``redis://`` URL. Run the coordination Redis with ``maxmemory-policy noeviction`` so keys are
never evicted; a full Redis then refuses writes and the backend fails closed. Redis is advisory:
the engine's own ownership of a run stays in the database (lease and fence).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

import redis.exceptions as errors

from ...conf import reactor_settings
from ...exceptions import ReactorImproperlyConfigured
from ..exceptions import CoordinationUnavailable
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
    Window,
)
from . import lua
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

T = TypeVar("T")

_URL_SCHEMES = ("redis://", "rediss://", "unix://")
#: An inspection's scan of the key space: keys asked for per SCAN call, and calls at most.
SCAN_COUNT = 1000
SCAN_CALLS = 100
#: The Redis kind of each part of a backend key, and the part suffixes that are not the state.
_KIND_PARTS = {"lock": ("fence",), "sem": (), "rate": ("seq",)}
_ORDERED_PARTS = ("queue", "state", "skipped")
_UNAVAILABLE_REPLIES = ("OOM", "READONLY", "MASTERDOWN", "CLUSTERDOWN", "LOADING", "TRYAGAIN")
_url_clients: dict[str, Any] = {}


def redis_client(target: str) -> Any:
    """The redis-py client for a django-redis cache alias or a ``redis://`` URL."""
    if target.startswith(_URL_SCHEMES):
        if target not in _url_clients:
            import redis

            _url_clients[target] = redis.Redis.from_url(
                target, socket_timeout=5, socket_connect_timeout=2
            )
        return _url_clients[target]
    from django_redis import get_redis_connection

    try:
        return get_redis_connection(target)
    except Exception as exc:
        raise ReactorImproperlyConfigured(
            f'REACTOR["COORDINATION_REDIS"] = {target!r} is neither a redis:// URL nor the '
            f"alias of a django-redis cache ({exc})"
        ) from exc


def _ms(seconds: float) -> int:
    return max(1, math.ceil(seconds * 1000))


def _us(seconds: float) -> int:
    return max(1, math.ceil(seconds * 1_000_000))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class RedisBackend(CoordinationBackend):
    """Coordination on Redis, through django-redis or a URL.

    ``target``: a django-redis cache alias or a ``redis://`` URL (default: the
    ``COORDINATION_REDIS`` setting); ``client``: a redis-py client to use instead; ``prefix``:
    the first part of every key (default: the ``COORDINATION_KEY_PREFIX`` setting). The keys
    of one primitive share a hash tag (the caller's key in braces).
    """

    def __init__(
        self, target: str | None = None, *, client: Any = None, prefix: str | None = None
    ) -> None:
        if client is None:
            client = redis_client(target or reactor_settings.COORDINATION_REDIS)
        self.client = client
        self.prefix = prefix if prefix is not None else reactor_settings.COORDINATION_KEY_PREFIX
        # register_script() only computes the SHA: scripts are loaded on first use (EVALSHA,
        # then SCRIPT LOAD on NOSCRIPT), once per server.
        self._scripts: dict[str, Any] = {
            name: client.register_script(getattr(lua, name))
            for name in dir(lua)
            if name.isupper() and not name.startswith("_")
        }

    # --- plumbing ---------------------------------------------------------------------------

    def _key(self, kind: str, key: str, part: str = "") -> str:
        name = f"{self.prefix}:{kind}:{{{check_key(key)}}}"
        return f"{name}:{part}" if part else name

    @contextmanager
    def _guard(self) -> Iterator[None]:
        try:
            yield
        except (errors.ConnectionError, errors.TimeoutError) as exc:
            raise CoordinationUnavailable(f"Redis is unreachable: {exc}") from exc
        except errors.ResponseError as exc:
            if str(exc).upper().startswith(_UNAVAILABLE_REPLIES):
                raise CoordinationUnavailable(f"Redis refused the operation: {exc}") from exc
            raise

    def _run(self, script: str, keys: Sequence[str], args: Sequence[Any] = ()) -> Any:
        with self._guard():
            return self._scripts[script](keys=list(keys), args=list(args))

    def _call(self, command: Callable[..., T], *args: Any) -> T:
        with self._guard():
            return command(*args)

    # --- clock ------------------------------------------------------------------------------

    def server_time(self) -> float:
        seconds, micros = self._call(self.client.time)
        return seconds + micros / 1_000_000

    # --- locks --------------------------------------------------------------------------------

    def acquire_lock(self, key: str, owner: str, ttl: float) -> LockGrant | None:
        check_key(owner, "owner")
        ttl = check_seconds(ttl, "a lock's ttl")
        keys = [self._key("lock", key), self._key("lock", key, "fence")]
        reply = self._run("LOCK_ACQUIRE", keys, [owner, _ms(ttl)])
        if reply is None:
            return None
        return LockGrant(key, owner, int(_text(reply[1])), ttl, reentered=bool(reply[0]))

    def extend_lock(self, key: str, owner: str, ttl: float) -> bool:
        check_key(owner, "owner")
        ttl = check_seconds(ttl, "a lock's ttl")
        return bool(self._run("LOCK_EXTEND", [self._key("lock", key)], [owner, _ms(ttl)]))

    def release_lock(self, key: str, owner: str) -> bool:
        check_key(owner, "owner")
        return bool(self._run("LOCK_RELEASE", [self._key("lock", key)], [owner]))

    def lock_holder(self, key: str) -> str | None:
        owner = self._call(self.client.hget, self._key("lock", key), "owner")
        return None if owner is None else _text(owner)

    # --- semaphores --------------------------------------------------------------------------

    def acquire_semaphore(
        self, key: str, owner: str, limit: int, ttl: float
    ) -> SemaphoreGrant | None:
        check_key(owner, "owner")
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"a semaphore's limit must be a positive integer, got {limit!r}")
        ttl = check_seconds(ttl, "a semaphore's ttl")
        reply = self._run("SEM_ACQUIRE", [self._key("sem", key)], [owner, limit, _ms(ttl)])
        if reply is None:
            return None
        return SemaphoreGrant(key, owner, int(reply[1]), limit, reentered=bool(reply[0]))

    def extend_semaphore(self, key: str, owner: str, ttl: float) -> bool:
        check_key(owner, "owner")
        ttl = check_seconds(ttl, "a semaphore's ttl")
        return bool(self._run("SEM_EXTEND", [self._key("sem", key)], [owner, _ms(ttl)]))

    def release_semaphore(self, key: str, owner: str) -> bool:
        check_key(owner, "owner")
        return bool(self._run("SEM_RELEASE", [self._key("sem", key)], [owner]))

    def semaphore_holders(self, key: str) -> list[str]:
        return [_text(o) for o in self._run("SEM_HOLDERS", [self._key("sem", key)])]

    # --- rate limits -------------------------------------------------------------------------

    def check_rate(self, key: str, windows: Sequence[Window], cost: int = 1) -> RateDecision:
        checked = check_windows(windows, cost)
        args: list[Any] = [cost, len(checked)]
        for window in checked:
            args += [window.limit, _us(window.period)]
        keys = [self._key("rate", key), self._key("rate", key, "seq")]
        reply = self._run("RATE_CHECK", keys, args)
        allowed, retry_us, limiting, now_us = (
            bool(reply[0]),
            int(_text(reply[1])),
            int(reply[2]),
            int(_text(reply[3])),
        )
        return RateDecision(
            allowed=allowed,
            retry_after=0.0 if allowed else retry_us / 1_000_000,
            counts=tuple(int(c) for c in reply[4:]),
            limited_by=checked[limiting - 1] if limiting else None,
            at=now_us / 1_000_000,
        )

    def rate_count(self, key: str, window: Window) -> int:
        return int(self._run("RATE_COUNT", [self._key("rate", key)], [_us(window.period)]))

    # --- periods -----------------------------------------------------------------------------

    def _bucket_key(self, key: str, bucket: str) -> str:
        return self._key("period", key, check_key(bucket, "bucket"))

    def reserve_period(self, key: str, bucket: str, owner: str, ttl: float) -> PeriodClaim:
        check_key(owner, "owner")
        ttl = check_seconds(ttl, "a period reservation's ttl")
        granted, holder, state = self._run(
            "PERIOD_RESERVE", [self._bucket_key(key, bucket)], [owner, _ms(ttl)]
        )
        return PeriodClaim(bool(granted), _text(holder), _text(state))

    def confirm_period(self, key: str, bucket: str, owner: str, keep_for: float) -> bool:
        check_key(owner, "owner")
        keep_for = check_seconds(keep_for, "a claimed period's keep_for")
        return bool(
            self._run("PERIOD_CONFIRM", [self._bucket_key(key, bucket)], [owner, _ms(keep_for)])
        )

    def release_period(self, key: str, bucket: str, owner: str) -> bool:
        check_key(owner, "owner")
        return bool(self._run("PERIOD_RELEASE", [self._bucket_key(key, bucket)], [owner]))

    # --- ordered locks -------------------------------------------------------------------------

    def _ordered_keys(self, key: str) -> list[str]:
        return [self._key("ordered", key, part) for part in ("queue", "state", "skipped")]

    def enqueue_ordered(self, key: str, owner: str) -> int:
        check_key(owner, "owner")
        return int(self._run("ORDERED_ENQUEUE", self._ordered_keys(key), [owner]))

    def ordered_head(self, key: str, poison_after: float) -> str | None:
        poison_after = check_seconds(poison_after, "poison_after")
        reply = self._run(
            "ORDERED_HEAD", self._ordered_keys(key), [_us(poison_after), SKIPPED_KEPT]
        )
        for skipped in reply[1:]:
            logger.warning(
                "ordered lock %r: skipped %s, head for more than %ss without completing",
                key,
                _text(skipped),
                poison_after,
            )
        return None if reply[0] is None else _text(reply[0])

    def heartbeat_ordered(self, key: str, owner: str) -> bool:
        check_key(owner, "owner")
        return bool(self._run("ORDERED_HEARTBEAT", self._ordered_keys(key), [owner]))

    def complete_ordered(self, key: str, owner: str, failed: bool, strict: bool) -> bool:
        check_key(owner, "owner")
        halt = "1" if failed and strict else "0"
        return bool(self._run("ORDERED_COMPLETE", self._ordered_keys(key), [owner, halt]))

    def peek_ordered(self, key: str) -> list[str]:
        queue = self._ordered_keys(key)[0]
        return [_text(o) for o in self._call(self.client.zrange, queue, 0, -1)]

    def skip_ordered(self, key: str, owner: str) -> bool:
        check_key(owner, "owner")
        return bool(self._run("ORDERED_SKIP", self._ordered_keys(key), [owner, SKIPPED_KEPT]))

    def reset_ordered(self, key: str) -> int:
        return int(self._run("ORDERED_RESET", self._ordered_keys(key)))

    def ordered_status(self, key: str) -> OrderedStatus:
        queue, since, halted, skipped = self._run("ORDERED_STATUS", self._ordered_keys(key))
        return OrderedStatus(
            key=key,
            queue=tuple(_text(o) for o in queue),
            head_since=None if since is None else int(_text(since)) / 1_000_000,
            halted_after=None if halted is None else _text(halted),
            skipped=tuple(_text(o) for o in skipped),
        )

    # --- inspection ----------------------------------------------------------------------------

    def inspect(
        self, limit: int = INSPECT_LIMIT, periods: Sequence[float] = INSPECT_PERIODS
    ) -> CoordinationSnapshot:
        """See :meth:`CoordinationBackend.inspect`. Finds the keys with a bounded ``SCAN`` of
        ``SCAN_CALLS`` calls (a Redis shared with other data may hold keys it never reaches:
        the snapshot's ``cut`` then names every kind), then reads them in one pipeline."""
        periods = check_inspection(limit, periods)
        found, complete = self._scan_keys()
        cut = [] if complete else ["locks", "semaphores", "rates", "periods", "ordered"]
        chosen: dict[str, list[Any]] = {}
        for kind, name in (
            ("lock", "locks"),
            ("sem", "semaphores"),
            ("rate", "rates"),
            ("period", "periods"),
            ("ordered", "ordered"),
        ):
            keys = sorted(found[kind])
            if len(keys) > limit and name not in cut:
                cut.append(name)
            chosen[kind] = keys[:limit]
        now_us = self._now_us()
        replies = self._read_state(chosen, now_us, periods)
        return CoordinationSnapshot(
            at=now_us / 1_000_000,
            periods=periods,
            locks=tuple(
                HeldLock(key, state["owner"], int(state.get("fence") or 0), ttl / 1000)
                for key, (state, ttl) in zip(chosen["lock"], replies["lock"], strict=True)
                if "owner" in state and ttl > 0
            ),
            semaphores=tuple(
                SemaphoreSlots(
                    key, tuple((_text(o), (ms - now_us / 1000) / 1000) for o, ms in rows)
                )
                for key, rows in zip(chosen["sem"], replies["sem"], strict=True)
                if rows
            ),
            rates=tuple(
                RateUsage(
                    key,
                    tuple(int(c) for c in counts),
                    None if not last else last[0][1] / 1_000_000,
                )
                for key, (counts, last) in zip(chosen["rate"], replies["rate"], strict=True)
                if counts[-1]
            ),
            period_holds=tuple(
                PeriodHold(
                    key,
                    bucket,
                    state["owner"],
                    state.get("state", ""),
                    None if ttl < 0 else ttl / 1000,
                )
                for (key, bucket), (state, ttl) in zip(
                    chosen["period"], replies["period"], strict=True
                )
                if "owner" in state
            ),
            ordered=tuple(
                OrderedQueue(
                    key=key,
                    queued=int(queued),
                    first=tuple(_text(o) for o in first),
                    head_since=None if since is None else int(_text(since)) / 1_000_000,
                    halted_after=None if halted is None else _text(halted),
                    skipped=tuple(_text(o) for o in skipped),
                )
                for key, (queued, first, since, halted, skipped) in zip(
                    chosen["ordered"], replies["ordered"], strict=True
                )
                if queued or halted is not None
            ),
            cut=tuple(cut),
        )

    def _now_us(self) -> int:
        seconds, micros = self._call(self.client.time)
        return int(seconds) * 1_000_000 + int(micros)

    def _scan_keys(self) -> tuple[dict[str, set[Any]], bool]:
        """The keys of this prefix by kind (periods as ``(key, bucket)``), and whether the
        scan went through the whole key space."""
        head = f"{self.prefix}:"
        pattern = "".join(f"\\{c}" if c in "*?[]\\" else c for c in head) + "*"
        found: dict[str, set[Any]] = {
            k: set() for k in ("lock", "sem", "rate", "period", "ordered")
        }
        cursor: Any = 0
        with self._guard():
            for _ in range(SCAN_CALLS):
                cursor, names = self.client.scan(cursor, match=pattern, count=SCAN_COUNT)
                for name in names:
                    parsed = _parse_key(_text(name)[len(head) :])
                    if parsed is not None:
                        found[parsed[0]].add(parsed[1])
                if int(cursor) == 0:
                    return found, True
        return found, False

    def _read_state(
        self, chosen: dict[str, list[Any]], now_us: int, periods: tuple[float, ...]
    ) -> dict[str, list[Any]]:
        """Everything the snapshot shows of ``chosen`` keys, in one pipeline."""
        pipe = self.client.pipeline(transaction=False)
        for key in chosen["lock"]:
            pipe.hgetall(self._key("lock", key))
            pipe.pttl(self._key("lock", key))
        for key in chosen["sem"]:
            pipe.zrangebyscore(self._key("sem", key), f"({now_us // 1000}", "+inf", withscores=True)
        for key in chosen["rate"]:
            for period in periods:
                pipe.zcount(self._key("rate", key), f"({now_us - _us(period)}", "+inf")
            pipe.zrange(self._key("rate", key), -1, -1, withscores=True)
        for key, bucket in chosen["period"]:
            pipe.hgetall(self._bucket_key(key, bucket))
            pipe.pttl(self._bucket_key(key, bucket))
        for key in chosen["ordered"]:
            queue, state, skipped = self._ordered_keys(key)
            pipe.zcard(queue)
            pipe.zrange(queue, 0, INSPECT_QUEUED - 1)
            pipe.hget(state, "since")
            pipe.hget(state, "halted")
            pipe.lrange(skipped, -INSPECT_QUEUED, -1)
        with self._guard():
            replies = iter(pipe.execute())
        n = len(periods)

        def fields() -> dict[str, str]:  # a hash, whether the client decodes replies or not
            return {_text(k): _text(v) for k, v in next(replies).items()}

        return {
            "lock": [(fields(), next(replies)) for _ in chosen["lock"]],
            "sem": [next(replies) for _ in chosen["sem"]],
            "rate": [([next(replies) for _ in range(n)], next(replies)) for _ in chosen["rate"]],
            "period": [(fields(), next(replies)) for _ in chosen["period"]],
            "ordered": [tuple(next(replies) for _ in range(5)) for _ in chosen["ordered"]],
        }


def _parse_key(rest: str) -> tuple[str, Any] | None:
    """``(kind, key)`` of a backend key without its prefix (``lock:{order-7}``), periods as
    ``("period", (key, bucket))``; None for a part that is not a primitive's state (a
    lock's fence counter, a rate log's sequence) or a key this backend did not write."""
    kind, _, named = rest.partition(":")
    if not named.startswith("{"):
        return None
    if kind in _KIND_PARTS:
        if named.endswith("}"):
            return kind, named[1:-1]
        return None
    if kind == "period":
        end = named.rfind("}:")
        return None if end < 1 else ("period", (named[1:end], named[end + 2 :]))
    if kind == "ordered":
        for part in _ORDERED_PARTS:
            if named.endswith("}:" + part):
                return "ordered", named[1 : -len(part) - 2]
    return None
