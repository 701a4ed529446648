"""Errors of the coordination layer."""

from __future__ import annotations

from collections.abc import Iterable

from ..exceptions import ReactorError


class CoordinationError(ReactorError):
    """Base class of the coordination layer's errors."""


class CoordinationUnavailable(CoordinationError):
    """The coordination backend could not be reached or refused to write.

    An infrastructure error, not a business failure: callers fail closed (no run proceeds
    unlocked or unlimited) and a worker retries later. The original error is ``__cause__``.
    """


class UnknownRateLimit(CoordinationError, LookupError):
    """A named rate limit is not in ``REACTOR["RATE_LIMITS"]`` (a permanent error)."""

    def __init__(self, name: str, known: Iterable[str] = ()) -> None:
        self.name = name
        self.known = tuple(sorted(known))
        listed = ", ".join(repr(k) for k in self.known) or "none"
        super().__init__(f'unknown rate limit {name!r}: REACTOR["RATE_LIMITS"] defines {listed}')
