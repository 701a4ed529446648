"""Holding a run's declared coordination while a process works on it.

:class:`RunCoordinator` is the executor's :class:`~django_reactor.engine.coordination.Coordinator`:
it takes what a reactor's ``Meta.coordination`` declares before the run's first step, in a
fixed order, keeps it extended while the run runs, keeps it across parks, gives it back when
the run pauses or ends, and takes a step's own coordination around the step's body.

Order on the way in (each only if declared): the ordered-lock gate, the period, the rate limit
(charged once per run), then locks and semaphores sorted by key. A run denied anything holds
nothing it took in that attempt. Redis (or the database) is advisory: the run's ownership
stays with its PostgreSQL lease and fence.
"""

from __future__ import annotations

import functools
import logging
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .. import store
from ..conf import reactor_settings
from ..engine.coordination import (
    NOT_STARTED,
    Blocked,
    CoordinationKeyError,
    Declaration,
    DispatchRefused,
    Lock,
    OrderedLock,
    Period,
    RateLimit,
    Semaphore,
    resolve_key,
)
from ..engine.definition import ReactorDefinition
from ..engine.templates import InputRef
from ..exceptions import ReactorImproperlyConfigured
from ..states import ExecutionStatus
from ..store import Kept
from .backends import get_backend
from .exceptions import CoordinationUnavailable, UnknownRateLimit
from .periods import bucket_for, period_seconds
from .rates import named_rate_limit, parse_windows

logger = logging.getLogger("django_reactor.coordination")

#: How often a waiting inline caller tries again.
INLINE_POLL = 0.05

FAILED = (
    ExecutionStatus.FAILED,
    ExecutionStatus.NEEDS_ATTENTION,
    ExecutionStatus.CANCELLED,
    ExecutionStatus.ABORTED,
)


def backend_key(kind: str, key: str) -> str:
    """The backend key of a declared key: ``lock:order-7``, ``ordered:account-1``, ... (the
    kinds never share a key on the backend; operators and tests read them this way too)."""
    return f"{kind}:{key}"


def coordinated(definition: ReactorDefinition) -> bool:
    """Whether the reactor or any of its steps declares coordination."""
    return bool(definition.coordination) or any(s.coordination for s in definition.steps)


def check_backend(definition: ReactorDefinition) -> None:
    """Raise ReactorImproperlyConfigured when the reactor declares coordination and the
    configured backend cannot be set up (no server is contacted). Called before a run is
    written, so a misconfigured project refuses the run instead of leaving it half started."""
    if coordinated(definition):
        get_backend()


def unconfigured(exc: ReactorImproperlyConfigured) -> Blocked:
    """Why a run cannot take its coordination when the backend is misconfigured (it fails:
    nothing runs unlocked)."""
    return Blocked(
        "fail",
        f"coordination is not configured, so nothing runs unlocked: {exc}",
        error_kind="coordination_unavailable",
    )


def coordinator_for(
    definition: ReactorDefinition,
    *,
    execution_id: uuid.UUID,
    owner_id: uuid.UUID,
    inputs: Mapping[str, Any],
    in_worker: bool,
) -> RunCoordinator | None:
    """The coordinator of one run, or None when nothing is declared (no backend is touched).

    ``owner_id`` owns the locks and semaphores: the root run for a composed child (it shares
    its root's locks), the run itself otherwise (async units never share).
    """
    if not coordinated(definition):
        return None
    return RunCoordinator(
        definition,
        execution_id=execution_id,
        owner_id=owner_id,
        inputs=inputs,
        in_worker=in_worker,
    )


def enqueue(
    definition: ReactorDefinition, execution_id: uuid.UUID, inputs: Mapping[str, Any]
) -> None:
    """Take the run's place in its ordered locks' queues, in the order runs are started.

    A key that cannot be computed is left to the run's first entry, which fails it.
    """
    ordered = [d for d in definition.coordination if isinstance(d, OrderedLock)]
    if not ordered:
        return
    for declaration in ordered:
        try:
            key = resolve_key(declaration.key, inputs, "OrderedLock")
        except CoordinationKeyError:
            return
        get_backend().enqueue_ordered(backend_key("ordered", key), str(execution_id))


def guard_dispatch(
    definition: ReactorDefinition, inputs: Mapping[str, Any], *, holder_id: uuid.UUID
) -> None:
    """Refuse to dispatch an async unit whose own lock (or single-slot semaphore) the run
    tree dispatching it holds: the unit would wait for its parent, which waits for it.

    The unit's locks are its reactor's ``Meta.coordination`` and, for an ``async_step``, the
    step class's own (keyed on its arguments, which are the unit's inputs). Raises
    DispatchRefused naming the key; a key the unit cannot compute is left to the unit.
    """
    declared = list(definition.coordination)
    for spec in definition.steps:
        if _arguments_are_inputs(spec):
            declared.extend(spec.coordination)
    exclusive = [
        d for d in declared if isinstance(d, Lock) or (isinstance(d, Semaphore) and d.limit == 1)
    ]
    if not exclusive:
        return
    owner = f"run:{holder_id}"
    backend = get_backend()
    for declaration in exclusive:
        try:
            key = resolve_key(declaration.key, inputs, type(declaration).__name__)
        except CoordinationKeyError:
            continue
        if isinstance(declaration, Lock):
            held = backend.lock_holder(backend_key("lock", key)) == owner
        else:
            held = owner in backend.semaphore_holders(backend_key("semaphore", key))
        if held:
            raise DispatchRefused(
                f"it needs {declaration.kind} {key!r}, which this run holds: it would wait "
                "for this run while this run waits for it. Give the unit another key, or "
                "compose it instead (a composed child shares its parent's locks)"
            )


def _arguments_are_inputs(spec: Any) -> bool:
    """Whether a step's arguments are its reactor's inputs of the same names (an async_step's
    unit): its own keys can then be computed before the unit starts."""
    return all(
        isinstance(template, InputRef)
        and template.name == name
        and not template.path
        and template.transform is None
        for name, template in spec.arguments.items()
    )


@dataclass
class _Held:
    """A lock or semaphore slot held for a run: ``owned`` when this run gives it back (else
    an enclosing run of the same tree holds it and does)."""

    kind: str  # "lock" or "semaphore"
    key: str
    ttl: float
    fence: int | None = None
    owned: bool = True
    # Taken around a step's body (or its undo), not for the whole run.
    step: bool = False


def _state_key(kind: str, *, step: bool) -> str:
    """Where the run's coordination state lists the keys of ``kind`` it took (run-level ones,
    or around a step), so a process taking the run over knows which it must give back."""
    return f"{'step_' if step else ''}{kind}s"


@dataclass
class StepHoldings:
    """A step's coordination while its body runs (the executor's ``StepHold``)."""

    coordinator: RunCoordinator
    held: list[_Held] = field(default_factory=list)
    period: tuple[str, str, float] | None = None
    fences: dict[str, int] = field(default_factory=dict)

    def release(self, succeeded: bool = True) -> None:
        self.coordinator._release(self.held)
        if self.period is not None:
            key, bucket, keep = self.period
            backend = self.coordinator.backend
            try:
                if succeeded:
                    backend.confirm_period(key, bucket, self.coordinator.run_owner, keep)
                else:
                    backend.release_period(key, bucket, self.coordinator.run_owner)
            except CoordinationUnavailable:
                logger.warning("could not settle period %s %s", key, bucket, exc_info=True)
        self.coordinator._flush()


def _flushes(method: Callable[..., Any]) -> Callable[..., Any]:
    """Write the run's coordination state once, when ``method`` ends (however it ends)."""

    @functools.wraps(method)
    def wrapper(self: RunCoordinator, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        finally:
            self._flush()

    return wrapper


class RunCoordinator:
    """Acquires, keeps and releases one run's coordination (see the module's docstring)."""

    def __init__(
        self,
        definition: ReactorDefinition,
        *,
        execution_id: uuid.UUID,
        owner_id: uuid.UUID,
        inputs: Mapping[str, Any],
        in_worker: bool,
    ) -> None:
        self.definition = definition
        self.execution_id = execution_id
        self.owner = f"run:{owner_id}"  # locks and semaphores: shared by a run tree
        self.run_owner = str(execution_id)  # rate limits, periods, ordered locks: this run
        self.inputs = inputs
        self.in_worker = in_worker
        self.lost = False
        self.fences: dict[str, int] = {}
        self.notes: list[dict[str, Any]] = []
        self._held: list[_Held] = []
        self._keeper: _Keeper | None = None
        self._state: dict[str, Any] = store.coordination_state(execution_id)
        self._dirty = False
        self._backend: Any = None

    @property
    def backend(self) -> Any:
        if self._backend is None:
            self._backend = get_backend()
        return self._backend

    # ------------------------------------------------------------------ the run

    @_flushes
    def enter(self, *, new: bool) -> Blocked | None:
        """Take the run's coordination; None when held, else why the run cannot go on."""
        declarations = self.definition.coordination
        if not declarations:
            return None
        try:
            keys = [(d, self._key(d, self.inputs)) for d in declarations]
        except CoordinationKeyError as exc:
            return Blocked("fail", str(exc))
        try:
            blocked = self._enter(keys)
        except UnknownRateLimit as exc:
            return Blocked("fail", str(exc))
        except ReactorImproperlyConfigured as exc:
            return unconfigured(exc)
        except CoordinationUnavailable as exc:
            self._release_quietly()
            return _unavailable(exc)
        if blocked is None:
            self.lost = False
            if self._state.pop("waiting", None) is not None:
                self._save()
            self._start_keeper()
        return blocked

    def _enter(self, keys: list[tuple[Declaration, str]]) -> Blocked | None:
        state = self._state
        for declaration, key in keys:
            if isinstance(declaration, OrderedLock):
                blocked = self._ordered_gate(declaration, key)
                if blocked is not None:
                    return blocked
        for declaration, key in keys:
            if isinstance(declaration, Period) and "period" not in state:
                reserved = self._reserve_period(declaration, key)
                if isinstance(reserved, Blocked):
                    return reserved
                state["period"] = list(reserved)
                self._note({"period": key, "bucket": reserved[1]})
                self._save()
        charged = list(state.get("charged", []))
        for declaration, key in keys:
            if isinstance(declaration, RateLimit) and key not in charged:
                blocked = self._charge(declaration, key)
                if blocked is not None:
                    return blocked
                charged.append(key)  # charged once per run: never again on a resume
                state["charged"] = charged
                self._save()
        return self._take(
            [(d, k) for d, k in keys if isinstance(d, Lock | Semaphore)], wait=not self.in_worker
        )

    def _reserve_period(self, declaration: Period, key: str) -> tuple[str, str, float] | Blocked:
        """Hold the current bucket of ``key`` for this run: ``(backend key, bucket, keep)``,
        or a halt naming the run that reserved or claimed it."""
        backend = self.backend
        bucket = bucket_for(declaration.every, backend.server_time())
        keep = 2 * period_seconds(declaration.every)
        full = backend_key("period", key)
        claim = backend.reserve_period(full, bucket, self.run_owner, keep)
        if not claim.granted:
            return Blocked(
                "halt",
                f"period {key!r} ({bucket}) was already {claim.state or 'claimed'} by "
                f"execution {claim.holder}",
            )
        return full, bucket, keep

    def _ordered_gate(self, declaration: OrderedLock, key: str) -> Blocked | None:
        backend = self.backend
        full = backend_key("ordered", key)
        if not self._state.get("enqueued"):
            backend.enqueue_ordered(full, self.run_owner)  # idempotent: started elsewhere too
            self._state["enqueued"] = True
            self._save()
        head = backend.ordered_head(full, declaration.poison_after)
        if head == self.run_owner:
            return None
        if head is None:
            status = backend.ordered_status(full)
            if status.halted:
                # The chain halted after a failure: this run halts too and leaves the queue.
                backend.complete_ordered(full, self.run_owner, False, declaration.strict)
                return Blocked("halt", status.reason)
            if self.run_owner not in status.queue:
                backend.enqueue_ordered(full, self.run_owner)
                return Blocked(
                    "contention",
                    f"ordered lock {key!r}: this run was no longer queued; queued again",
                    retry_after=_delay(),
                )
        return Blocked(
            "contention",
            f"ordered lock {key!r}: waiting for execution {head} to finish first",
            retry_after=_delay(),
        )

    def _charge(self, declaration: RateLimit, key: str) -> Blocked | None:
        if declaration.name is not None:
            full, windows = named_rate_limit(declaration.name)
            label = declaration.name
        else:
            full, windows = backend_key("rate", key), parse_windows(declaration.limits)
            label = key
        decision = self.backend.check_rate(full, windows)
        if decision.allowed:
            self._note({"rate_limit": label})
            return None
        return Blocked(
            "contention",
            f"rate limit {label!r} reached ({decision.limited_by}); try again in "
            f"{decision.retry_after:.2f} s",
            retry_after=decision.retry_after,
        )

    def _take(
        self,
        keys: Sequence[tuple[Declaration, str]],
        *,
        wait: bool,
        into: list[_Held] | None = None,
        wait_at_least: float = 0.0,
    ) -> Blocked | None:
        """Locks then semaphores, by key; on contention give back what this call took.

        With ``wait``, each is waited for up to its declaration's ``wait`` (and at least
        ``wait_at_least``); an unreachable backend is tried again within the same bound, then
        CoordinationUnavailable is raised.
        """
        held = self._held if into is None else into
        taken: list[_Held] = []
        ordered = sorted(keys, key=lambda dk: (isinstance(dk[0], Semaphore), dk[1]))
        for declaration, key in ordered:
            assert isinstance(declaration, Lock | Semaphore)
            bound = max(declaration.wait if wait else 0.0, wait_at_least)
            step = into is not None
            try:
                got = self._acquire_within(declaration, key, bound, step=step)
            except CoordinationUnavailable:
                self._withdraw(_full_key(declaration, key), _state_key(declaration.kind, step=step))
                self._give_back(taken)
                raise
            if got is None:
                self._withdraw(_full_key(declaration, key), _state_key(declaration.kind, step=step))
                self._release(taken)
                if into is None and self.in_worker:
                    # Rescheduled: the run holding it wakes this one when it lets go.
                    self._state["waiting"] = _full_key(declaration, key)
                    self._save()
                return Blocked(
                    "contention", self._contended(declaration, key), retry_after=_delay()
                )
            if all(h.key != got.key for h in held):
                taken.append(got)
        held.extend(taken)
        return None

    def _acquire_within(
        self, declaration: Lock | Semaphore, key: str, bound: float, *, step: bool
    ) -> _Held | None:
        """Try to take ``key`` until ``bound`` seconds have passed: None when another holder
        kept it; CoordinationUnavailable when the backend stayed unreachable."""
        deadline = time.monotonic() + bound
        while True:
            try:
                got = self._acquire(declaration, key, step=step)
            except CoordinationUnavailable:
                if time.monotonic() >= deadline:
                    raise
                got = None
            if got is not None or time.monotonic() >= deadline:
                return got
            time.sleep(INLINE_POLL)

    def _give_back(self, taken: list[_Held]) -> None:
        """Release what one acquisition took before the backend went away (its TTL frees
        what cannot be released now)."""
        try:
            self._release(taken)
        except CoordinationUnavailable:
            taken.clear()

    def _acquire(self, declaration: Lock | Semaphore, key: str, *, step: bool) -> _Held | None:
        """Take ``key`` once; None when another holder has it (the intent stays recorded
        while the caller waits; :meth:`_take` withdraws it if it gives up)."""
        backend = self.backend
        kind = "lock" if isinstance(declaration, Lock) else "semaphore"
        full = backend_key(kind, key)
        state_key = _state_key(kind, step=step)
        recorded = self._intend(full, state_key)
        fence: int | None = None
        if isinstance(declaration, Lock):
            grant = backend.acquire_lock(full, self.owner, declaration.ttl)
            if grant is None:
                return None
            self.fences[key] = fence = grant.fence
            reentered = grant.reentered
            if not reentered:
                self._note({"lock": key, "fence": grant.fence})
        else:
            slot = backend.acquire_semaphore(full, self.owner, declaration.limit, declaration.ttl)
            if slot is None:
                return None
            reentered = slot.reentered
            if not reentered:
                self._note({"semaphore": key, "holders": slot.holders})
        # Re-entered without a record of ours: an enclosing run of the same tree holds it (or
        # this run does, around a step declaring the same key) and gives it back. Re-entered
        # with one: this run took it before its process died (or before it parked).
        owned = recorded or not reentered
        if not owned:
            self._withdraw(full, state_key)
        return _Held(kind, full, declaration.ttl, fence, owned=owned, step=step)

    def _intend(self, full: str, state_key: str) -> bool:
        """Record, durably and before taking it, that this run is taking ``full``; whether it
        was recorded already. A process that dies after the backend granted the key leaves the
        record, so the process taking the run over knows the key is this run's to give back."""
        ours = self._state.get(state_key, [])
        if full in ours:
            return True
        self._state[state_key] = sorted({*ours, full})
        self._save()
        self._flush()
        return False

    def _withdraw(self, full: str, state_key: str) -> None:
        ours = self._state.get(state_key, [])
        if full in ours:
            self._state[state_key] = [k for k in ours if k != full]
            self._save()

    def _contended(self, declaration: Lock | Semaphore, key: str) -> str:
        try:
            if isinstance(declaration, Lock):
                holder = self.backend.lock_holder(backend_key("lock", key))
                return f"lock {key!r} is held by {_who(holder)}"
            holders = self.backend.semaphore_holders(backend_key("semaphore", key))
            return (
                f"semaphore {key!r} has no free slot ({len(holders)} of {declaration.limit} held)"
            )
        except CoordinationUnavailable:
            return f"{declaration.kind} {key!r} is taken"

    @_flushes
    def enter_rollback(self) -> None:
        """Hold the run's locks and slots while it rolls back, without waiting for them."""
        declarations = [d for d in self.definition.coordination if isinstance(d, Lock | Semaphore)]
        if not declarations:
            return
        try:
            keys = [(d, self._key(d, self.inputs)) for d in declarations]
            blocked = self._take(keys, wait=False)
        except (CoordinationKeyError, CoordinationUnavailable, ReactorImproperlyConfigured) as exc:
            logger.warning("execution %s rolls back without its locks: %s", self.execution_id, exc)
            return
        if blocked is not None:
            logger.warning(
                "execution %s rolls back without all its locks: %s",
                self.execution_id,
                blocked.message,
            )
        self._start_keeper()

    @_flushes
    def exit(self, status: str | None) -> None:
        """The run stopped with ``status``: keep what a parked run holds, give back the rest."""
        self._stop_keeper()
        if status is None or status in (ExecutionStatus.PENDING, ExecutionStatus.ROLLING_BACK):
            return  # parked, handed off or interrupted: the next process re-adopts them
        self._release(self._held)
        if status == ExecutionStatus.PAUSED:
            return  # waiting for a payload holds no lock; its place and period stay
        state = self._state
        try:
            backend = self.backend
            if "period" in state:
                key, bucket, keep = state["period"]
                if status == ExecutionStatus.COMPLETED:
                    backend.confirm_period(key, bucket, self.run_owner, keep)
                else:
                    backend.release_period(key, bucket, self.run_owner)
            for declaration in self.definition.coordination:
                if isinstance(declaration, OrderedLock):
                    key = self._key(declaration, self.inputs)
                    failed = status in FAILED and status != NOT_STARTED
                    backend.complete_ordered(
                        backend_key("ordered", key), self.run_owner, failed, declaration.strict
                    )
        except (CoordinationUnavailable, CoordinationKeyError, ReactorImproperlyConfigured):
            logger.warning(
                "could not settle the coordination of execution %s",
                self.execution_id,
                exc_info=True,
            )

    def snoozes_left(self) -> bool:
        """Count one more reschedule for contention; False when the limit is reached."""
        snoozes = int(self._state.get("snoozes", 0)) + 1
        self._state["snoozes"] = snoozes
        self._save()
        self._flush()
        return snoozes <= reactor_settings.MAX_CONTENTION_SNOOZES

    # ------------------------------------------------------------------ steps

    @_flushes
    def enter_step(
        self, step: str, declarations: tuple[Declaration, ...], arguments: Mapping[str, object]
    ) -> StepHoldings | Blocked:
        """Take a step's coordination for its body: period, locks and semaphores, then the
        rate limit (charged last, so a step denied a lock is not charged)."""
        holdings = StepHoldings(self)
        where = f"step {step!r}"
        try:
            keys = [(d, self._key(d, arguments, where)) for d in declarations]
            for declaration, key in keys:
                if isinstance(declaration, Period):
                    reserved = self._reserve_period(declaration, key)
                    if isinstance(reserved, Blocked):
                        return reserved
                    holdings.period = reserved
            blocked = self._take(
                [(d, k) for d, k in keys if isinstance(d, Lock | Semaphore)],
                wait=not self.in_worker,
                into=holdings.held,
            )
            if blocked is None:
                for declaration, key in keys:
                    if isinstance(declaration, RateLimit):
                        blocked = self._charge(declaration, key)
                        if blocked is not None:
                            break
        except CoordinationKeyError as exc:
            return Blocked("fail", f"{exc}")
        except UnknownRateLimit as exc:
            holdings.release(succeeded=False)
            return Blocked("fail", str(exc))
        except ReactorImproperlyConfigured as exc:
            return unconfigured(exc)
        except CoordinationUnavailable as exc:
            holdings.release(succeeded=False)
            return _unavailable(exc)
        if blocked is not None:
            holdings.release(succeeded=False)
            return blocked
        holdings.fences = {**self.fences}
        return holdings

    @_flushes
    def enter_step_rollback(
        self, step: str, declarations: tuple[Declaration, ...], arguments: Mapping[str, object]
    ) -> StepHoldings | Blocked:
        """Take a step's locks and semaphore slots for its undo or compensate (never its rate
        limit or period), waiting up to ``REACTOR["ROLLBACK_WAIT"]`` seconds for them, inline
        and on workers alike: a rollback cannot be rescheduled halfway."""
        holdings = StepHoldings(self)
        exclusive = [d for d in declarations if isinstance(d, Lock | Semaphore)]
        if not exclusive:
            return holdings
        where = f"step {step!r}"
        try:
            keys = [(d, self._key(d, arguments, where)) for d in exclusive]
            blocked = self._take(
                keys,
                wait=True,
                into=holdings.held,
                wait_at_least=reactor_settings.ROLLBACK_WAIT,
            )
        except CoordinationKeyError as exc:
            return Blocked("fail", str(exc))
        except ReactorImproperlyConfigured as exc:
            return unconfigured(exc)
        except CoordinationUnavailable as exc:
            return _unavailable(exc)
        if blocked is not None:
            return Blocked("contention", blocked.message, error_kind="coordination_unavailable")
        holdings.fences = {**self.fences}
        return holdings

    # ------------------------------------------------------------------ holding

    def _release(self, held: list[_Held]) -> None:
        if not held:
            return
        backend = self.backend
        for item in reversed(held):
            if not item.owned:
                continue  # an enclosing run holds it: it gives it back
            try:
                if item.kind == "lock":
                    backend.release_lock(item.key, self.owner)
                else:
                    backend.release_semaphore(item.key, self.owner)
            except CoordinationUnavailable:
                logger.warning("could not release %s %s (its TTL frees it)", item.kind, item.key)
            self._forget(item)
            store.wake_waiter(item.key)  # one run rescheduled for it goes on now
        held.clear()

    def _release_quietly(self) -> None:
        try:
            self._release(self._held)
        except Exception:  # the backend is down: the TTLs free them
            self._held.clear()

    def _forget(self, item: _Held) -> None:
        self._withdraw(item.key, _state_key(item.kind, step=item.step))

    def _start_keeper(self) -> None:
        extendable = list(self._held)
        ordered = [d for d in self.definition.coordination if isinstance(d, OrderedLock)]
        if (extendable or ordered) and self._keeper is None:
            self._keeper = _Keeper(self, extendable, ordered)
            self._keeper.__enter__()

    def _stop_keeper(self) -> None:
        if self._keeper is not None:
            self._keeper.__exit__()
            self._keeper = None

    # ------------------------------------------------------------------ bookkeeping

    def _key(self, declaration: Declaration, values: Mapping[str, Any], where: str = "") -> str:
        if isinstance(declaration, RateLimit) and declaration.key is None:
            return declaration.name or ""
        label = f"{type(declaration).__name__}" + (f" of {where}" if where else "")
        return resolve_key(declaration.key, values, label)  # type: ignore[arg-type]

    def _note(self, data: dict[str, Any]) -> None:
        self.notes.append(data)

    def _save(self) -> None:
        self._dirty = True  # written once, when the operation that changed it ends

    def _flush(self) -> None:
        if self._dirty:
            store.save_coordination_state(self.execution_id, self._state)
            self._dirty = False


class _Keeper(Kept):
    """Extends a run's locks and slots (and its ordered-lock heartbeat) from the process's
    heartbeat thread while the run runs; marks the run ``lost`` when one has lapsed."""

    def __init__(
        self, coordinator: RunCoordinator, held: list[_Held], ordered: list[OrderedLock]
    ) -> None:
        self.coordinator = coordinator
        self.held = list(held)
        self.ordered = ordered
        ttls = [h.ttl for h in held] or [reactor_settings.LEASE_SECONDS]
        super().__init__(max(min(ttls) / 3, 0.05))

    @property
    def label(self) -> str:
        return f"the coordination of execution {self.coordinator.execution_id}"

    def extend(self) -> bool:
        coordinator = self.coordinator
        backend = coordinator.backend
        for item in self.held:
            if item.kind == "semaphore":
                ok = backend.extend_semaphore(item.key, coordinator.owner, item.ttl)
            else:
                ok = backend.extend_lock(item.key, coordinator.owner, item.ttl)
            if not ok:
                logger.warning(
                    "execution %s lost %s %s (its TTL lapsed); it takes it again before its "
                    "next step",
                    coordinator.execution_id,
                    item.kind,
                    item.key,
                )
                coordinator.lost = True
                return False
        for declaration in self.ordered:
            key = coordinator._key(declaration, coordinator.inputs)
            backend.heartbeat_ordered(backend_key("ordered", key), coordinator.run_owner)
        return True


def _full_key(declaration: Lock | Semaphore, key: str) -> str:
    return backend_key("lock" if isinstance(declaration, Lock) else "semaphore", key)


def _unavailable(exc: CoordinationUnavailable) -> Blocked:
    return Blocked(
        "unavailable",
        f"the coordination backend cannot be reached ({exc}); nothing runs unlocked",
        retry_after=max(_delay(), 1.0),
        error_kind="coordination_unavailable",
    )


def _delay() -> float:
    return reactor_settings.CONTENTION_DELAY


def _who(holder: str | None) -> str:
    if holder is None:
        return "another run (it was released meanwhile)"
    return f"execution {holder.removeprefix('run:')}"
