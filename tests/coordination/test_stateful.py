"""Hypothesis stateful tests of the semaphore and the rate limiter against in-memory models.

The backends read their server's clock, which the tests cannot stop, so the models are exact
where time does not matter and tolerant where it does: a holder taken with a short TTL may lapse
at any moment (the model only knows it "may be held"), and rate decisions are compared with the
model at the server time each decision reports (``RateDecision.at``), except within a
millisecond of a window edge.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from django_reactor.coordination import Window
from django_reactor.coordination.backends.base import CoordinationBackend

OWNERS = st.sampled_from([f"o{i}" for i in range(6)])
SHORT_TTL = 0.05
EDGE = 0.001  # the model does not judge charges this close to a window's edge
SEMAPHORE_RUN = settings(
    max_examples=20,
    stateful_step_count=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
RATE_RUN = settings(
    max_examples=10,
    stateful_step_count=15,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


class SemaphoreModel(RuleBasedStateMachine):
    """A semaphore of limit 3: exact for long-TTL holders, tolerant for short-TTL ones."""

    backend: CoordinationBackend
    limit = 3

    def __init__(self) -> None:
        super().__init__()
        self.key = f"sem-{uuid.uuid4().hex}"
        self.held: set[str] = set()  # long TTL: certainly held
        self.maybe: set[str] = set()  # short TTL: held until it lapses

    def _hold(self, owner: str, certain: bool) -> None:
        self.held.discard(owner)
        self.maybe.discard(owner)
        (self.held if certain else self.maybe).add(owner)

    def _drop(self, owner: str) -> None:
        self.held.discard(owner)
        self.maybe.discard(owner)

    def _acquire(self, owner: str, ttl: float) -> None:
        grant = self.backend.acquire_semaphore(self.key, owner, self.limit, ttl)
        if owner in self.held:
            assert grant is not None
            assert grant.reentered
        elif owner not in self.maybe:
            if len(self.held) + len(self.maybe) < self.limit:
                assert grant is not None, "a free slot was refused"
            if len(self.held) >= self.limit:
                assert grant is None, "a full semaphore granted a slot"
        if grant is not None:
            assert grant.holders <= self.limit
            self._hold(owner, certain=ttl > 1)
        else:
            self.maybe.discard(owner)

    @rule(owner=OWNERS)
    def acquire(self, owner: str) -> None:
        self._acquire(owner, ttl=30)

    @rule(owner=OWNERS)
    def acquire_and_crash(self, owner: str) -> None:
        self._acquire(owner, ttl=SHORT_TTL)

    @rule(owner=OWNERS)
    def extend(self, owner: str) -> None:
        extended = self.backend.extend_semaphore(self.key, owner, ttl=30)
        if owner in self.held:
            assert extended
        elif owner not in self.maybe:
            assert not extended, "a non-holder extended a slot"
        if extended:
            self._hold(owner, certain=True)
        else:
            self._drop(owner)

    @rule(owner=OWNERS)
    def release(self, owner: str) -> None:
        released = self.backend.release_semaphore(self.key, owner)
        if owner in self.held:
            assert released
        elif owner not in self.maybe:
            assert not released, "a release by a non-holder did something"
        self._drop(owner)

    @rule()
    def forged_release(self) -> None:
        before = set(self.backend.semaphore_holders(self.key))
        assert not self.backend.release_semaphore(self.key, f"forged-{uuid.uuid4().hex}")
        assert set(self.backend.semaphore_holders(self.key)) <= before

    @rule()
    def let_time_pass(self) -> None:
        time.sleep(SHORT_TTL + 0.01)

    @invariant()
    def never_over_the_limit(self) -> None:
        holders = set(self.backend.semaphore_holders(self.key))
        assert len(holders) <= self.limit
        assert self.held <= holders, "a long-TTL holder lost its slot"
        assert holders <= self.held | self.maybe, "someone holds a slot nobody was granted"
        self.maybe &= holders  # a lapsed slot never comes back by itself


class RateLimitModel(RuleBasedStateMachine):
    """Two windows checked together against the log of what the model saw allowed."""

    backend: CoordinationBackend
    windows = (Window(2, 0.1), Window(3, 0.25))

    def __init__(self) -> None:
        super().__init__()
        self.key = f"rate-{uuid.uuid4().hex}"
        self.charges: list[tuple[float, int]] = []  # (server time, cost) of allowed checks

    def _expected(self, at: float, cost: int) -> tuple[bool, tuple[int, ...], float] | None:
        counts, retry = [], 0.0
        for window in self.windows:
            edge = at - window.period
            if any(abs(t - edge) < EDGE for t, _ in self.charges):
                return None
            inside = sorted((t, c) for t, c in self.charges if t > edge)
            count = sum(c for _, c in inside)
            counts.append(count)
            excess, freed = count + cost - window.limit, 0
            for t, c in inside:
                if excess <= 0:
                    break
                freed += c
                if freed >= excess:
                    retry = max(retry, t + window.period - at)
                    break
        allowed = all(c + cost <= w.limit for c, w in zip(counts, self.windows, strict=True))
        return allowed, tuple(counts), retry

    @rule(cost=st.sampled_from([1, 1, 2]))
    def check(self, cost: int) -> None:
        decision = self.backend.check_rate(self.key, self.windows, cost)
        expected = self._expected(decision.at, cost)
        if expected is not None:
            allowed, counts, retry = expected
            assert decision.allowed == allowed
            if allowed:
                assert decision.counts == tuple(c + cost for c in counts)
            else:
                assert decision.counts == counts, "a denial charged a window"
                assert decision.retry_after == pytest.approx(retry, abs=0.002)
        if decision.allowed:
            self.charges.append((decision.at, cost))
        else:
            assert decision.retry_after > 0

    @rule(seconds=st.sampled_from([0.01, 0.05, 0.12]))
    def let_time_pass(self, seconds: float) -> None:
        time.sleep(seconds)

    @invariant()
    def never_over_any_limit(self) -> None:
        # In every interval (t - period, t] ending at an allowed charge, at most the limit.
        for window in self.windows:
            for end, _ in self.charges:
                inside = sum(c for t, c in self.charges if end - window.period < t <= end)
                assert inside <= window.limit


def _run(machine: type[Any], backend: CoordinationBackend, run: settings) -> None:
    machine.backend = backend
    try:
        run_state_machine_as_test(machine, settings=run)
    finally:
        del machine.backend


def test_semaphore_against_a_model(backend: CoordinationBackend) -> None:
    _run(SemaphoreModel, backend, SEMAPHORE_RUN)


def test_rate_limiter_against_a_model(backend: CoordinationBackend) -> None:
    _run(RateLimitModel, backend, RATE_RUN)
