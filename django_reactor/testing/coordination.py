"""Reading coordination in a test: who holds a lock, free slots, a rate limit's count."""

from __future__ import annotations

import uuid
from typing import Any

# pytest loads this package through the ``pytest11`` entry point before Django is configured:
# nothing here may import models or settings at import time, so imports are inside functions.


def lock_holder(key: str) -> uuid.UUID | None:
    """The run holding lock ``key`` (as declared, ``"order-7"``) on the configured backend."""
    from ..coordination import get_backend
    from ..coordination.coordinator import backend_key

    holder = get_backend().lock_holder(backend_key("lock", key))
    return uuid.UUID(holder.removeprefix("run:")) if holder else None


def assert_lock_held(key: str, by: Any = None) -> None:
    """Lock ``key`` is held (by the run ``by``, an execution id or a ReactorResult, if given)."""
    holder = lock_holder(key)
    wanted = getattr(by, "execution_id", by)
    if holder is None or (wanted is not None and str(holder) != str(wanted)):
        raise AssertionError(
            f"expected lock {key!r} to be held"
            + (f" by execution {wanted}" if wanted is not None else "")
            + (f", but execution {holder} holds it" if holder else ", but it is free")
        )


def assert_lock_free(key: str) -> None:
    """Nobody holds lock ``key``."""
    holder = lock_holder(key)
    if holder is not None:
        raise AssertionError(f"expected lock {key!r} to be free, but execution {holder} holds it")


def semaphore_available(key: str, limit: int) -> int:
    """Free slots of semaphore ``key`` (declared with ``limit``)."""
    from ..coordination import get_backend
    from ..coordination.coordinator import backend_key

    return limit - len(get_backend().semaphore_holders(backend_key("semaphore", key)))


def rate_limit_count(key: str, seconds: float, *, name: bool = False) -> int:
    """Starts charged to rate limit ``key`` (or the named limit ``key``) in the last
    ``seconds``."""
    from ..coordination import Window, get_backend
    from ..coordination.coordinator import backend_key
    from ..coordination.rates import named_rate_limit

    full = named_rate_limit(key)[0] if name else backend_key("rate", key)
    return get_backend().rate_count(full, Window(1_000_000, seconds))
