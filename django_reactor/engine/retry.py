"""Retry policies for steps."""

from __future__ import annotations

import datetime as dt
import random
from collections.abc import Callable
from dataclasses import dataclass

from ..exceptions import DefinitionError
from . import timevalues

BACKOFFS = ("fixed", "linear", "exponential")
# 2 ** 64 seconds is past any date already: larger exponents change nothing (and overflow).
_LARGEST_EXPONENT = 64


@dataclass(frozen=True, slots=True)
class Retry:
    """How often and how patiently a failing step is tried again.

    Args:
        attempts: total tries, the first one included (``attempts=1`` means no retry).
        backoff: ``"fixed"`` (``delay`` every time), ``"linear"`` (``delay * n``) or
            ``"exponential"`` (``delay * 2**(n-1)``), where ``n`` is the attempt that failed.
        delay: base delay in seconds.
        max_delay: upper bound of a single delay, in seconds.
        jitter: fraction of randomness added to each delay (0.2 = up to ±20 %), so that many
            failing runs do not retry in lockstep.
        on: only exceptions of these types are retried (default: every exception). A step that
            returns ``Failure(..., retryable=False)`` is never retried.

    >>> Retry(attempts=5, backoff="exponential", delay=1).delay_after(3, jitter_source=None)
    4.0
    """

    attempts: int = 3
    backoff: str = "exponential"
    delay: float = 1.0
    max_delay: float | None = 300.0
    jitter: float = 0.0
    on: tuple[type[BaseException], ...] = (Exception,)

    def __post_init__(self) -> None:
        if not isinstance(self.attempts, int) or isinstance(self.attempts, bool):
            raise DefinitionError(f"Retry(attempts=...) must be an integer, got {self.attempts!r}")
        if self.attempts < 1:
            raise DefinitionError(
                f"Retry(attempts={self.attempts}) must be at least 1 (the first try counts)"
            )
        if self.backoff not in BACKOFFS:
            raise DefinitionError(
                f"Retry(backoff={self.backoff!r}) must be one of {', '.join(BACKOFFS)}"
            )
        for option in ("delay", "max_delay"):
            value = getattr(self, option)
            if value is None and option == "max_delay":
                continue
            if isinstance(value, dt.timedelta):
                raise DefinitionError(
                    f"Retry({option}=...) takes a number of seconds, got {value!r}; write "
                    f"{option}={value.total_seconds():g}"
                )
            timevalues.declared(value, f"Retry({option}=...)", zero=True)
        if not 0 <= self.jitter <= 1:
            raise DefinitionError(f"Retry(jitter={self.jitter!r}) must be between 0 and 1")
        on = self.on if isinstance(self.on, tuple) else (self.on,)
        if not all(isinstance(t, type) and issubclass(t, BaseException) for t in on):
            raise DefinitionError(f"Retry(on=...) must be exception classes, got {self.on!r}")
        object.__setattr__(self, "on", on)

    def retries_exception(self, exc: BaseException) -> bool:
        """Whether an exception of this kind may be retried under this policy."""
        if getattr(exc, "retryable", True) is False:
            return False
        return isinstance(exc, self.on)

    def delay_after(
        self,
        attempt: int,
        *,
        jitter_source: Callable[[float, float], float] | None = random.uniform,
    ) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based), never longer than
        a date can hold from now (an exponential backoff without ``max_delay`` grows past it)."""
        if self.backoff == "fixed":
            base = float(self.delay)
        elif self.backoff == "linear":
            base = float(self.delay) * attempt
        else:
            base = float(self.delay) * 2.0 ** min(attempt - 1, _LARGEST_EXPONENT)
        if self.jitter and jitter_source is not None:
            base += base * jitter_source(-self.jitter, self.jitter)
        if self.max_delay is not None:
            base = min(base, float(self.max_delay))
        return min(max(0.0, base), timevalues.longest())

    def describe(self) -> dict[str, int | float | str | None]:
        return {
            "attempts": self.attempts,
            "backoff": self.backoff,
            "delay": self.delay,
            "max_delay": self.max_delay,
            "jitter": self.jitter,
        }


NO_RETRY = Retry(attempts=1, delay=0)
