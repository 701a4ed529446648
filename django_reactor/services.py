"""The operations the API, the admin, the commands and ``Reactor`` share.

The statuses each operation accepts are derived from ``states.TRANSITIONS``, and each takes the
run's lease (or asks its live owner) before changing it: no other module changes an execution's
state.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from django.db import connections

from . import interrupt_store, map_store, registry, request_keys, store
from .composition import DatabaseChildRunner, finish_rollback
from .conf import reactor_settings
from .coordination import runtime as coordination_runtime
from .coordination.exceptions import CoordinationUnavailable
from .engine.executor import Executor, RunState, UndoEntry, utcnow
from .engine.interrupts import ContinueWith
from .engine.journal import Event
from .engine.mapping import MapRollbackPending
from .engine.outcomes import (
    Dispatched,
    ErrorInfo,
    ErrorKind,
    Failed,
    InProgress,
    Outcome,
    Paused,
    PendingInterrupt,
    qualified_class_name,
)
from .engine.redaction import redact
from .engine.serialization import decode, encode, printable, safe_repr, shown, unstorable
from .engine.validation import summarise_errors, validate
from .exceptions import (
    AlreadyRetried,
    DefinitionChanged,
    ExecutionBusy,
    ExecutionNotFound,
    IdempotencyKeyReused,
    InterruptNotFound,
    InvalidPayload,
    InvalidTransition,
    LeaseLost,
    ReactorError,
    ReactorNotRegistered,
    ResultNotSerializable,
    StoredValueUnreadable,
    TransactionActive,
)
from .handle import ExecutionHandle, outcome_of
from .observability import observer_for
from .states import EventKind, ExecutionStatus, InterruptStatus, sources_of

if TYPE_CHECKING:
    from .engine.definition import ReactorDefinition
    from .reactor import Reactor

logger = logging.getLogger("django_reactor.services")

MAX_KEY_LENGTH = 255


def _check_key(key: Any) -> None:
    """Refuse an idempotency key that is not short, storable text."""
    problem = None
    if not isinstance(key, str) or not 0 < len(key) <= MAX_KEY_LENGTH:
        problem = f"a non-empty string of at most {MAX_KEY_LENGTH} characters"
    elif (why := unstorable(key)) is not None:
        problem = f"storable text ({why})"
    if problem is not None:
        raise ReactorError(f"idempotency_key must be {problem}, got {safe_repr(key)}")


def _refuse_open_transaction(action: str) -> None:
    if reactor_settings.REFUSE_INLINE_IN_TRANSACTION and store.inside_user_transaction():
        raise TransactionActive(
            f"cannot {action} inside transaction.atomic(): step code would run inside your "
            "transaction and could be rolled back after the saga recorded it as done. Call it "
            "after the transaction commits (transaction.on_commit), or outside atomic() (for "
            "views under ATOMIC_REQUESTS, decorate them with transaction.non_atomic_requests)."
        )


# ---------------------------------------------------------------------------- run


def run(
    reactor: type[Reactor],
    inputs: Mapping[str, Any],
    *,
    idempotency_key: str | None = None,
) -> Outcome:
    """Validate ``inputs`` and run ``reactor`` in this process. See ``Reactor.run``."""
    return _run(reactor, inputs, idempotency_key=idempotency_key, all_in_background=False)


def _run(
    reactor: type[Reactor],
    inputs: Mapping[str, Any],
    *,
    idempotency_key: str | None,
    all_in_background: bool,
) -> Outcome:
    """``run`` and ``run_in_background``: check the call, record invalid inputs, start."""
    definition = reactor.definition
    method = "run_in_background" if all_in_background else "run"
    if not isinstance(inputs, Mapping):
        raise ReactorError(
            f"{reactor.__qualname__}.{method}() takes the inputs as a dict, got "
            f"{type(inputs).__name__}"
        )
    if idempotency_key is not None:
        _check_key(idempotency_key)
    background = definition.background
    if not all_in_background and (background is None or background.mode != "all"):
        # A fully background run executes no step code here: inside a transaction it simply
        # commits (or rolls back) with the caller's work, and its task is published on commit.
        _refuse_open_transaction(f"run {reactor.__qualname__}")

    stored_inputs, error = _validate_inputs(definition, inputs)
    if error is not None:
        # Recorded for operators, without the idempotency key: a corrected call may reuse it.
        created = store.create_execution(
            reactor=definition.name,
            definition_hash=definition.definition_hash,
            inputs=error.inputs,
            secret_paths=[],
            status=ExecutionStatus.FAILED,
            owner=None,
            failure=error.to_dict(),
            events=[
                Event(
                    1, EventKind.FAIL, utcnow(), data={"kind": error.kind, "error": error.message}
                ),
            ],
        )
        return Failed(execution_id=created.execution_id, error=error)

    return _start(
        definition,
        stored_inputs,
        idempotency_key=idempotency_key,
        all_in_background=all_in_background,
    )


def _start(
    definition: ReactorDefinition,
    stored_inputs: Any,
    *,
    idempotency_key: str | None = None,
    retry_of: uuid.UUID | None = None,
    all_in_background: bool = False,
) -> Outcome:
    first = definition.next_ready(frozenset())
    # A misconfigured coordination backend refuses the run before anything is written.
    coordination_runtime.check_backend(definition)
    background = all_in_background or (
        definition.background is not None and definition.background.mode == "all"
    )
    try:
        owned = store.create_execution(
            reactor=definition.name,
            definition_hash=definition.definition_hash,
            definition_shape=definition.shape,
            inputs=stored_inputs,
            secret_paths=definition.input_secret_paths,
            # A background run is written pending with its dispatch; a worker takes it.
            status=ExecutionStatus.PENDING if background else ExecutionStatus.RUNNING,
            owner=None if background else store.lease_owner_token(),
            dispatch="start" if background else None,
            idempotency_key=idempotency_key,
            retry_of=retry_of,
            current_step=first.name if first is not None else "",
            events=[
                Event(
                    1,
                    EventKind.START,
                    utcnow(),
                    data={"retry_of": str(retry_of)} if retry_of else {},
                )
            ],
        )
    except store.IdempotencyConflict as conflict:
        holder = store.get_row(conflict.execution_id)
        if holder.inputs_digest != store.inputs_digest(stored_inputs):
            raise IdempotencyKeyReused(
                f"idempotency key {idempotency_key!r} was first used for execution {holder.id} "
                f"of {definition.reactor_class.__qualname__} with different inputs; use a new "
                "key for a different request",
                execution_id=holder.id,
            ) from None
        return _replay(
            conflict.execution_id, wait=definition.background is None and not all_in_background
        )
    inputs = decode(stored_inputs)
    if definition.coordination:
        # Ordered locks order runs by when they are started, wherever they then run.
        with contextlib.suppress(CoordinationUnavailable):  # the run's entry fails closed
            coordination_runtime.enqueue(definition, owned.execution_id, inputs)
    if background:
        return Dispatched(execution_id=owned.execution_id)
    executor = Executor(
        definition,
        store.DatabaseJournal(owned),
        inputs=inputs,
        state=RunState(next_seq=2),
        max_retry_delay=float(reactor_settings.MAX_INLINE_RETRY_DELAY),
        hand_off=True,
        children=DatabaseChildRunner(owned.execution_id, owned.execution_id),
        issue_tokens=bool(reactor_settings.RESUME_TOKENS),
        observer=_observer_for(definition),
        coordinator=_coordinator(definition, owned.execution_id, None, inputs, in_worker=False),
    )
    try:
        with store.LeaseKeeper(owned):
            return after_pause(executor.run())
    except LeaseLost:
        logger.warning(
            "execution %s was taken over by another process; this process stopped",
            owned.execution_id,
        )
        return outcome_of(store.get_row(owned.execution_id))


def _coordinator(
    definition: ReactorDefinition,
    execution_id: uuid.UUID,
    row: Any,
    inputs: Any,
    *,
    in_worker: bool,
) -> Any:
    """The run's coordinator (None when nothing is declared). A composed child shares its
    root's locks; a root run or an async unit owns its own."""
    owner = execution_id
    if row is not None and row.parent_id is not None and not row.detached:
        owner = row.root_id or row.parent_id
    return coordination_runtime.coordinator_for(
        definition, execution_id=execution_id, owner_id=owner, inputs=inputs, in_worker=in_worker
    )


def _observer_for(definition: ReactorDefinition, *, parent_id: Any = None) -> Any:
    """Every execution's observers: REACTOR["MIDDLEWARE"], Meta.middleware, signals, logs."""
    return observer_for(definition, parent_id=parent_id)


def _validate_inputs(
    definition: ReactorDefinition, inputs: Mapping[str, Any]
) -> tuple[Any, ErrorInfo | None]:
    serializer_class = definition.inputs_serializer
    reactor = definition.reactor_class.__qualname__
    if serializer_class is None:
        data: Any = dict(inputs)
        errors: Any = None
    else:
        data, errors = validate(serializer_class, inputs)
    if not errors:
        try:
            return encode(data), None
        except ResultNotSerializable as exc:
            errors = {"non_field_errors": [f"the validated inputs cannot be stored: {exc}"]}
    summary = summarise_errors(errors)
    display = redact(
        {printable(str(k)): shown(v) for k, v in dict(inputs).items()},
        definition.input_secret_paths,
    )
    return None, ErrorInfo(
        kind=ErrorKind.INPUT_VALIDATION,
        message=f"the inputs of {reactor} are invalid: {summary}",
        reactor=definition.name,
        field_errors=errors,
        retryable=False,
        inputs=display,
    )


def _replay(execution_id: uuid.UUID, *, wait: bool = True) -> Outcome:
    """The outcome of the execution holding an idempotency key.

    For an inline reactor, waits briefly while another caller is still running it; a
    background run's replay returns at once (its outcome says it is dispatched).
    """
    if not wait:
        return outcome_of(store.get_row(execution_id), replay=True)
    deadline = time.monotonic() + float(reactor_settings.IDEMPOTENCY_WAIT_SECONDS)
    pause = 0.01
    while True:
        row = store.get_row(execution_id)
        outcome = outcome_of(row, replay=True)
        if not isinstance(outcome, InProgress) or time.monotonic() >= deadline:
            return outcome
        time.sleep(pause)
        pause = min(pause * 2, 0.25)


# ---------------------------------------------------------------------------- find


def find(execution_id: uuid.UUID | str, *, reactor: type[Reactor] | None = None) -> ExecutionHandle:
    """The stored execution ``execution_id`` (of ``reactor``, when given)."""
    row = store.get_row(execution_id)
    if reactor is not None and row.reactor != reactor.definition.name:
        raise ExecutionNotFound(
            f"execution {row.id} is a run of {row.reactor}, not of {reactor.definition.name}"
        )
    return ExecutionHandle(row)


# ---------------------------------------------------------------------------- cancel


# A running run qualifies only once its process is gone (lease expired); a live one is asked
# to stop after its current step.
CANCELLABLE = tuple(sorted(sources_of(ExecutionStatus.CANCELLED)))


def cancel(execution_id: uuid.UUID | str, *, reason: str = "") -> ExecutionHandle:
    """Stop a run without rolling anything back (use :func:`undo` to roll back).

    A run that a live process is executing is asked to stop after its current step.
    ``reason`` (shown in the trace, the admin and the API) must be text the database can store.
    """
    if not isinstance(reason, str) or (why := unstorable(reason)) is not None:
        detail = "it is not a string" if not isinstance(reason, str) else why
        raise ReactorError(f"cannot cancel with the reason {safe_repr(reason)}: {detail}")
    row = store.get_row(execution_id)
    _refuse_child(row, "cancel")
    store.request_cancel(row.id, reason=reason or "cancelled", cancellable=CANCELLABLE)
    handle = find(row.id)
    if handle.status == ExecutionStatus.CANCELLED:
        map_store.stop_all(row.id, "cancelled")  # its fanned-out elements not started never start
    return handle


# ---------------------------------------------------------------------------- undo


# Running and rolling-back runs qualify only when their process is gone: claim() refuses a live
# lease with ExecutionBusy.
UNDOABLE = tuple(sorted(sources_of(ExecutionStatus.ROLLING_BACK)))


def undo(execution_id: uuid.UUID | str) -> ExecutionHandle:
    """Roll back every completed step of a finished run, newest first; then it is cancelled.

    Works on completed, halted, aborted (a cut-off compensate runs first), cancelled and
    needs-attention runs (rollback steps that failed are tried again), and on running or
    rolling-back runs whose process died (their lease expired). Undoing a run with nothing left
    to undo changes nothing. A run that had a failing step ends ``failed``; others ``cancelled``.
    """
    row = store.get_row(execution_id)
    _refuse_child(row, "undo")
    reactor = registry.get(row.reactor)
    if row.status not in UNDOABLE:
        raise InvalidTransition(
            f"cannot undo execution {row.id}: it is {row.status}; undo works on "
            f"{', '.join(UNDOABLE)} runs",
            status=row.status,
        )
    state = _rollback_state(row, reactor.definition)
    abandoned = _abandoned_while_running(row)
    if not state.undo_stack and not state.pending_compensation and not abandoned:
        if row.status == ExecutionStatus.PAUSED:
            return cancel(row.id, reason="undone while paused (nothing to roll back)")
        return ExecutionHandle(row)
    problems = reactor.definition.incompatibilities(store.stored_shape(row), state.recorded)
    if problems:
        raise DefinitionChanged(
            f"cannot undo execution {row.id}: {reactor.__qualname__} changed since it ran "
            f"({'; '.join(problems)}); deploy the definition it ran with to undo it"
        )
    _refuse_open_transaction(f"undo execution {row.id}")
    owned = store.claim(
        row.id,
        allowed=UNDOABLE,
        new_status=ExecutionStatus.ROLLING_BACK,
        owner=store.lease_owner_token(),
        action="undo",
    )
    state = _rollback_state(row, reactor.definition)  # read again under ownership
    inputs = decode(row.inputs)
    executor = Executor(
        reactor.definition,
        store.DatabaseJournal(owned),
        inputs=inputs,
        state=state,
        children=DatabaseChildRunner(row.id, row.id),
        observer=_observer_for(reactor.definition, parent_id=row.parent_id),
        coordinator=_coordinator(reactor.definition, row.id, row, inputs, in_worker=False),
    )
    in_flight = row.current_step
    in_flight_spec = reactor.definition.by_name.get(in_flight)
    if (
        abandoned
        and in_flight_spec is not None
        and in_flight_spec.map is None  # a map's elements say themselves what they did
        and in_flight not in state.recorded
    ):
        executor.adopt_in_flight(
            in_flight, "the process running this step stopped before recording its outcome"
        )
    # While workers undo a map's elements the run parks; it finishes its rollback after.
    with store.LeaseKeeper(owned), contextlib.suppress(MapRollbackPending):
        finish_rollback(executor, row, "undo requested")
    return find(row.id)


def _rollback_state(row: Any, definition: ReactorDefinition) -> RunState:
    """What an undo must roll back: the run's state, plus a composed child or a map it stopped in.

    A parent that halted inside a child, or was parked (or stopped) while its child waited,
    has no record of the compose step; the child's own rollback undoes what it completed. The
    same holds for a map that halted, or that the run was waiting for: its completed elements
    are undone.
    """
    state = store.load_state(row.id)
    for name in store.halted_steps(row.id):
        spec = definition.by_name.get(name)
        if spec is not None and (spec.child is not None or spec.map is not None):
            state.undo_stack.append(UndoEntry(name, {}, None))
    current = row.current_step  # an undo's claim leaves the cursor where it was
    spec = definition.by_name.get(current)
    if (
        spec is not None
        and current not in state.recorded
        and (
            (spec.child is not None and store.find_child(row.id, current) is not None)
            or (spec.map is not None and map_store.find(row.id, current) is not None)
        )
    ):
        state.undo_stack.append(UndoEntry(current, {}, None))
    return state


def _refuse_child(row: Any, action: str) -> None:
    # Async units (detached) are executions of their own and may be steered; a composed child
    # is part of its parent's run. Retrying a unit would detach it from its reader.
    if row.parent_id is not None and (not row.detached or action == "retry"):
        raise InvalidTransition(
            f"cannot {action} execution {row.id}: it is the "
            f"{'async unit' if row.detached else 'composed child'} run by step "
            f"{row.parent_step!r} of execution {row.parent_id}; {action} that execution instead",
            status=row.status,
        )


def _abandoned_while_running(row: Any) -> bool:
    """Whether the step the run's cursor names may have started without recording an outcome.

    True for a run whose process died mid-step (still running or rolling back, cancelled while
    so, or parked after killing its workers too often), and for a step that made failed
    attempts and was waiting for its next one.
    """
    if row.status in (ExecutionStatus.RUNNING, ExecutionStatus.ROLLING_BACK):
        return True
    if row.current_attempt:
        return True
    if row.status == ExecutionStatus.NEEDS_ATTENTION:
        return bool(row.failure) and row.failure.get("kind") == ErrorKind.RECOVERY_LIMIT
    return row.status == ExecutionStatus.CANCELLED and store.cancelled_while_running(row.id)


# ---------------------------------------------------------------------------- workers

DATABASE_ERROR_RETRIES = 3


def resume(execution_id: uuid.UUID | str) -> Outcome | None:
    """Run an execution from its last checkpoint in this process (the worker's task).

    Takes the run only if nobody owns it: a duplicate delivery, a finished run or a retry that
    is not due yet does nothing. Completed steps are not run again; a step that was in flight
    when the previous owner died runs again (use its idempotency key for external calls).

    A broken database connection is reconnected (the claim and the run carry on from what the
    database holds); a stored run this code cannot read, and an error of the engine itself,
    park the run as ``needs_attention`` at once instead of failing every delivery.
    """
    try:
        key = execution_id if isinstance(execution_id, uuid.UUID) else uuid.UUID(str(execution_id))
    except ValueError:
        logger.warning("resume task for %r, which is not an execution id; ignored", execution_id)
        return None
    owner = store.lease_owner_token()
    claim = store.reconnecting(
        lambda: store.claim_for_worker(key, owner), what=f"claiming execution {key}"
    )
    if claim is None:
        if store.reconnecting(lambda: store.execution_exists(key), what="reading a run"):
            logger.info(
                "execution %s is running elsewhere, finished or not due; delivery ignored", key
            )
        else:
            logger.warning("resume task for unknown execution %s; ignored", key)
        return None
    row = claim.row
    owned = claim.owned
    try:
        reactor = registry.get(row.reactor)
    except ReactorNotRegistered as exc:
        return _park(owned, row, ErrorKind.REACTOR_MISSING, str(exc))
    definition = reactor.definition
    limit = int(reactor_settings.MAX_RECOVERY_ATTEMPTS)
    if claim.recovery_attempts > limit:
        return _park(
            owned,
            row,
            ErrorKind.RECOVERY_LIMIT,
            f"the run lost its worker {claim.recovery_attempts} times (limit {limit}, "
            f"REACTOR['MAX_RECOVERY_ATTEMPTS']) while at step {row.current_step!r}; it is parked "
            "instead of being resumed again. Fix what kills the process, then undo() or "
            "cancel() the run",
            step=row.current_step or None,
        )
    try:
        state = store.resume_state(row)
        problems = definition.incompatibilities(store.stored_shape(row), state.recorded)
        _readable_inputs(row)
    except StoredValueUnreadable as exc:
        return _park(owned, row, ErrorKind.UNREADABLE, _unreadable_message(row, exc))
    if problems:
        return _park(
            owned,
            row,
            ErrorKind.DEFINITION_CHANGED,
            f"{definition.reactor_class.__qualname__} changed under this run: "
            f"{'; '.join(problems)}. Deploy the previous definition to finish it or to undo() "
            "it, or cancel() it",
        )
    for attempt in range(1, DATABASE_ERROR_RETRIES + 1):
        try:
            if attempt > 1:
                # After a lost connection, fence out the old connection's statement first: its
                # server backend may still commit a checkpoint (a backend waiting for a lock
                # does not notice that its client went away). Taking the run again under a new
                # fence waits for that commit or makes it write nothing; only then does the
                # database say where the run stands.
                taken = store.reconnecting(
                    functools.partial(store.refence, owned, owner), what=f"taking {key} back"
                )
                if taken is None:
                    logger.warning(
                        "execution %s moved on while this process's connection was lost; "
                        "this process stopped",
                        key,
                    )
                    return None
                owned = taken
                row = store.get_row(key)
                state = store.resume_state(row)
            with store.LeaseKeeper(owned):
                return _run_claimed(definition, owned, row, state, claim, first=attempt == 1)
        except LeaseLost:
            logger.warning("execution %s was taken over by another process; stopped", key)
            return None
        except store.CONNECTION_ERRORS:
            # The connection died, perhaps while committing. Reconnect and carry on from what
            # the database holds: a step whose checkpoint did commit is not run again.
            if attempt == DATABASE_ERROR_RETRIES:
                raise
            logger.warning(
                "database error while running execution %s; reconnecting (attempt %d)",
                key,
                attempt,
                exc_info=True,
            )
            connections[store.USING].close()
        except StoredValueUnreadable as exc:
            return _park(owned, row, ErrorKind.UNREADABLE, _unreadable_message(row, exc))
        except MemoryError:
            raise  # handed back by the executor: another worker resumes the run
        except Exception as exc:
            # Not the step's code (its exceptions are failures the executor records): the
            # engine or the database refused something. It would fail the same way on every
            # delivery, so the run is parked for a person instead of recovered in a loop.
            logger.exception("execution %s: the engine failed while running it", key)
            return _park(
                owned,
                row,
                ErrorKind.ENGINE,
                f"the engine failed while running this run ({qualified_class_name(exc)}: "
                f"{printable(str(exc))[:500]}); its checkpoints are intact, but the step in "
                f"flight ({row.current_step!r}) may have run. Fix the cause, then undo() or "
                "cancel() the run",
                step=row.current_step or None,
            )
    return None  # pragma: no cover - the loop returns or raises


def _run_claimed(
    definition: ReactorDefinition,
    owned: store.Owned,
    row: Any,
    state: RunState,
    claim: store.WorkerClaim,
    *,
    first: bool,
) -> Outcome:
    executor = _worker_executor(definition, owned, row, state)
    if first:
        executor.note(
            EventKind.RESUME,
            {"recovery_attempts": claim.recovery_attempts} if claim.recovery_attempts else {},
        )
    if row.status == ExecutionStatus.ROLLING_BACK:
        with contextlib.suppress(MapRollbackPending):  # parked again: still undoing
            finish_rollback(executor, row, "rollback resumed")
        return outcome_of(store.get_row(row.id))
    return after_pause(executor.run())


def _readable_inputs(row: Any) -> Any:
    """The run's stored inputs, decoded; StoredValueUnreadable when they are not an object."""
    inputs = decode(row.inputs)
    if not isinstance(inputs, dict):
        raise StoredValueUnreadable(
            f"the stored inputs are a {type(inputs).__name__}, not a JSON object"
        )
    return inputs


def _unreadable_message(row: Any, exc: StoredValueUnreadable) -> str:
    return (
        f"the stored run cannot be read by this code: {exc}. Nothing ran. Repair the row or "
        "deploy the code that wrote it, then undo() or cancel() the run"
    )


def _worker_executor(
    definition: ReactorDefinition, owned: store.Owned, fresh: Any, state: RunState
) -> Executor:
    root = fresh.root_id or fresh.id
    inputs = decode(fresh.inputs)
    return Executor(
        definition,
        store.DatabaseJournal(owned, wakes=fresh.parent_id if fresh.detached else None),
        inputs=inputs,
        state=state,
        coordinator=_coordinator(definition, fresh.id, fresh, inputs, in_worker=True),
        retry_later=True,
        children=DatabaseChildRunner(owned.execution_id, root, in_worker=True),
        # The unit's completion wakes the parked run; this is only the net under a lost task.
        park_poll=float(reactor_settings.REDISPATCH_AFTER),
        issue_tokens=bool(reactor_settings.RESUME_TOKENS),
        observer=_observer_for(definition, parent_id=fresh.parent_id),
        hand_back_on_interruption=True,
    )


def _park(
    owned: store.Owned, row: Any, kind: str, message: str, *, step: str | None = None
) -> Outcome:
    failure = ErrorInfo(kind=kind, message=message, step=step, reactor=row.reactor)
    logger.error("execution %s needs attention: %s", row.id, message)
    store.park_for_attention(
        owned,
        failure=failure.to_dict(),
        event_kind=EventKind.ATTENTION,
        data={"kind": kind, "error": message},
    )
    return Failed(execution_id=row.id, error=failure, status=ExecutionStatus.NEEDS_ATTENTION)


def sweep() -> store.SweepReport:
    """Queue again the work that crashes and lost messages left behind (see ``reactor_sweep``).

    A sweep is safe to repeat: when the database connection broke (a restart, a failover, a
    pooler or an operator dropped it), it reconnects and sweeps again.
    """
    store.refresh_connections()
    return store.reconnecting(_sweep_once, what="sweeping")


def _sweep_once() -> store.SweepReport:
    report = store.sweep(
        limit=int(reactor_settings.SWEEP_BATCH),
        grace=float(reactor_settings.SWEEP_INTERVAL),
        redispatch_after=float(reactor_settings.REDISPATCH_AFTER),
        retention=float(reactor_settings.DISPATCH_RETENTION),
    )
    report.expired = expire_interrupts()
    report.maps = map_store.redispatch_stalled(
        after=float(reactor_settings.REDISPATCH_AFTER), limit=int(reactor_settings.SWEEP_BATCH)
    )
    report.deleted += request_keys.forget_expired(int(reactor_settings.SWEEP_BATCH))
    if any(report.as_dict().values()):
        logger.info("sweep: %s", report.as_dict())
    return report


# ---------------------------------------------------------------------------- retry


def retry(execution_id: uuid.UUID | str) -> Outcome:
    """Run a failed execution again as a new execution linked to it (``retry_of``).

    The new run starts from the first step with the stored inputs. A failed run is retried at
    most once; retry the retry to go again.
    """
    row = store.get_row(execution_id)
    _refuse_child(row, "retry")
    if row.status != ExecutionStatus.FAILED:
        raise InvalidTransition(
            f"cannot retry execution {row.id}: it is {row.status}; only failed runs are "
            "retried (use undo() to roll back others)",
            status=row.status,
        )
    failure = ErrorInfo.from_dict(row.failure) if row.failure else None
    if failure is not None and failure.kind == ErrorKind.INPUT_VALIDATION:
        raise InvalidTransition(
            f"cannot retry execution {row.id}: its inputs were invalid, so a retry would fail "
            "the same way; start a new run with corrected inputs",
            status=row.status,
        )
    existing = store.find_retry(row.id)
    if existing is not None:
        raise AlreadyRetried(
            f"execution {row.id} was already retried as {existing}; retry that one instead",
            retry_id=existing,
        )
    reactor = registry.get(row.reactor)
    background = reactor.definition.background
    if background is None or background.mode != "all":
        _refuse_open_transaction(f"retry execution {row.id}")
    outcome = _start(reactor.definition, row.inputs, retry_of=row.id)
    store.append_event(row.id, EventKind.RERUN, {"retried_as": str(outcome.execution_id)})
    return outcome


# ---------------------------------------------------------------------------- interrupts


def resume_interrupt(
    execution_id: uuid.UUID | str | None = None,
    *,
    step: str | None = None,
    payload: Any,
    correlation_id: str | None = None,
    reactor: str | None = None,
    token: str | None = None,
    background: bool | None = None,
    idempotency_key: str | None = None,
) -> Outcome:
    """Deliver ``payload`` to a paused run's interrupt; exactly one delivery wins.

    Name the interrupt by ``execution_id``, by ``correlation_id`` (and ``reactor`` when several
    reactors share correlation ids) or by a resume ``token``; ``step`` may be left out when one
    interrupt waits. The payload is validated by the interrupt's serializer before anything
    changes; an accepted payload becomes the step's result.

    ``background`` (default: the interrupt's ``resume=``): True hands the rest of the run to a
    worker and returns ``Dispatched`` at once; False runs it in this process and returns how it
    ended (``Completed``, ``Paused`` at a later interrupt...). When the run is already moving
    (another interrupt's payload came first) the payload is recorded and ``InProgress`` is
    returned.

    With ``idempotency_key``, a repeat of the same delivery (same key, same step and payload)
    changes nothing and returns the run's outcome with ``idempotent_replay=True``; the same key
    with another payload raises IdempotencyKeyReused.

    Raises InterruptNotFound, NotWaiting (the run has not reached an interrupt yet: deliver
    later), AlreadyResumed, InterruptClosed (expired, cancelled, failed) and InvalidPayload
    (field errors; with ``max_attempts``, the last allowed one also fails the run).
    """
    arguments = {
        "execution_id": execution_id,
        "step": step,
        "payload": payload,
        "correlation_id": correlation_id,
        "reactor": reactor,
        "token": token,
        "background": background,
    }
    if idempotency_key is None:
        return _resume_interrupt(**arguments)
    _check_key(idempotency_key)
    if token is not None:
        # The claim consumes the token: a repeat could not find the interrupt again.
        scope, target = f"resume-token:{interrupt_store.token_hash(token)}", execution_id
    else:
        found = interrupt_store.find(
            execution_id=execution_id, correlation_id=correlation_id, reactor=reactor, step=step
        )
        scope, target = f"resume:{found.execution_id}", found.execution_id
    reservation = request_keys.reserve(
        scope, idempotency_key, request_keys.fingerprint(step, payload)
    )
    if reservation.state == "mismatch":
        raise IdempotencyKeyReused(
            f"idempotency key {idempotency_key!r} was first used with another payload; use a "
            "new key for a different delivery",
            execution_id=target,
        )
    if reservation.state == "in_flight":
        raise ExecutionBusy(
            f"a delivery with idempotency key {idempotency_key!r} is still being processed; "
            "try again in a moment"
        )
    if reservation.state == "replay":
        stored = reservation.response or {}
        return outcome_of(store.get_row(stored["execution_id"]), replay=True)
    assert reservation.row_id is not None
    try:
        with request_keys.kept(reservation.row_id):  # an inline resume may outlast the lease
            outcome = _resume_interrupt(**arguments)
    except BaseException:
        request_keys.release(reservation.row_id)
        raise
    request_keys.finish(reservation.row_id, 200, {"execution_id": str(outcome.execution_id)})
    return outcome


def _resume_interrupt(
    *,
    execution_id: uuid.UUID | str | None,
    step: str | None,
    payload: Any,
    correlation_id: str | None,
    reactor: str | None,
    token: str | None,
    background: bool | None,
) -> Outcome:
    if token is not None:
        row = interrupt_store.find_by_token(token)
        if (execution_id is not None and str(row.execution_id) != str(execution_id)) or (
            step is not None and row.step != step
        ):
            raise InterruptNotFound("no interrupt has this resume token")
    else:
        row = find_interrupt(
            execution_id=execution_id, correlation_id=correlation_id, reactor=reactor, step=step
        )
    return deliver(row, payload, background=background)


def deliver(row: Any, payload: Any, *, background: bool | None = None) -> Outcome:
    """Deliver ``payload`` to the interrupt ``row`` (from :func:`find_interrupt`).

    What :func:`resume_interrupt` does once it has found the interrupt; the API calls it with
    the interrupt its credential check found, so the interrupt is read once per request.
    """
    interrupt_store.refuse_closed(row)
    definition = registry.get(row.reactor).definition
    spec = definition.by_name.get(row.step)
    if spec is None or spec.interrupt is None:
        raise DefinitionChanged(
            f"execution {row.execution_id} waits at {row.step!r}, which is no longer an "
            f"interrupt of {definition.name}; deploy the definition it ran with to resume it"
        )
    accepted, errors = _validate_payload(spec.interrupt.payload, payload)
    if errors is not None:
        _refuse_payload(row, store.get_row(row.execution_id), definition, spec.name, errors)
    in_background = background if background is not None else row.resume_mode == "background"
    if not in_background:
        _refuse_open_transaction(f"resume execution {row.execution_id} inline")
    claim = interrupt_store.claim(
        row, accepted, inline_owner=None if in_background else store.lease_owner_token()
    )
    if claim.dispatched:
        return Dispatched(execution_id=row.execution_id)
    if claim.owned is None:
        return InProgress(execution_id=row.execution_id, status=claim.execution_status)
    return _continue_inline(definition, claim.owned)


def find_interrupt(
    *,
    execution_id: uuid.UUID | str | None = None,
    correlation_id: str | None = None,
    reactor: str | None = None,
    step: str | None = None,
) -> Any:
    """The interrupt a delivery names (see ``resume_interrupt`` for how it is named)."""
    try:
        return interrupt_store.find(
            execution_id=execution_id, correlation_id=correlation_id, reactor=reactor, step=step
        )
    except InvalidTransition:  # NotWaiting too: a misspelt step never waits
        if execution_id is not None and step is not None:
            _require_interrupt_step(store.get_row(execution_id), step)
        raise


def _require_interrupt_step(execution: Any, step: str) -> None:
    """Refuse a step name that is not an interrupt of the run's reactor (a typo never waits)."""
    try:
        definition = registry.get(execution.reactor).definition
    except ReactorNotRegistered:
        return  # reported by the resume itself
    spec = definition.by_name.get(step)
    if spec is None or spec.interrupt is None:
        names = ", ".join(s.name for s in definition.interrupts) or "none"
        raise InterruptNotFound(
            f"{step!r} is not an interrupt of {definition.name} (its interrupts: {names})"
        )


def _validate_payload(serializer: type | None, payload: Any) -> tuple[Any, Any]:
    """The payload as stored (validated data), or the field errors."""
    if not isinstance(payload, Mapping):
        kind = type(payload).__name__
        return None, {"non_field_errors": [f"the payload must be a JSON object, got {kind}"]}
    if serializer is None:
        data: Any = dict(payload)
        errors: Any = None
    else:
        data, errors = validate(serializer, payload)
    if errors:
        return None, errors
    try:
        return encode(data), None
    except ResultNotSerializable as exc:
        return None, {"non_field_errors": [f"the validated payload cannot be stored: {exc}"]}


def _refuse_payload(
    row: Any, execution: Any, definition: ReactorDefinition, step: str, errors: Any
) -> None:
    """Count an invalid payload; fail the run on its last allowed attempt. Always raises."""
    attempts = interrupt_store.count_invalid(row, errors)
    limit = row.max_attempts
    summary = summarise_errors(errors)
    if limit is not None and attempts >= limit:
        message = (
            f"interrupt {step!r} received {attempts} invalid payload(s) (max_attempts={limit}); "
            f"the last one: {summary}"
        )
        _fail_paused(
            execution,
            definition,
            ErrorInfo(
                kind=ErrorKind.PAYLOAD,
                message=message,
                step=step,
                reactor=definition.name,
                field_errors=errors,
                retryable=False,
                attempts=attempts,
            ),
            interrupt=row,
            closing_status=InterruptStatus.FAILED,
        )
        raise InvalidPayload(
            f"{message}; the run was undone and failed",
            errors=errors,
            attempts=attempts,
            max_attempts=limit,
            run_failed=True,
        )
    left = f"; {limit - attempts} attempt(s) left" if limit is not None else ""
    raise InvalidPayload(
        f"the payload for interrupt {step!r} is invalid: {summary}{left}; the run stays paused",
        errors=errors,
        attempts=attempts,
        max_attempts=limit,
        run_failed=False,
    )


def _fail_paused(
    execution: Any,
    definition: ReactorDefinition,
    error: ErrorInfo,
    *,
    interrupt: Any,
    closing_status: str,
    event: str | None = None,
    data: dict[str, Any] | None = None,
) -> None:
    """Undo a paused run's completed steps and fail it with ``error``, closing ``interrupt``.

    Taking the run (paused to rolling back) comes first: it fails with ExecutionBusy or
    InvalidTransition, changing nothing, when a payload moved the run meanwhile.
    """
    owned = store.claim(
        execution.id,
        allowed=[ExecutionStatus.PAUSED],
        new_status=ExecutionStatus.ROLLING_BACK,
        owner=store.lease_owner_token(),
        action="fail",
    )
    interrupt_store.mark(interrupt, closing_status, closed=True)
    inputs = decode(execution.inputs)
    executor = Executor(
        definition,
        store.DatabaseJournal(owned),
        inputs=inputs,
        state=_rollback_state(execution, definition),
        children=DatabaseChildRunner(execution.id, execution.root_id or execution.id),
        observer=_observer_for(definition, parent_id=execution.parent_id),
        coordinator=_coordinator(definition, execution.id, execution, inputs, in_worker=False),
    )
    if event is not None:
        executor.note(event, {"step": interrupt.step, **(data or {})})
    with store.LeaseKeeper(owned):
        executor.rollback(final_status=ExecutionStatus.FAILED, reason=error.message, failure=error)


def _continue_inline(definition: ReactorDefinition, owned: store.Owned) -> Outcome:
    """Run the rest of a run this process just took from ``paused``."""
    row = store.get_row(owned.execution_id)
    inputs = decode(row.inputs)
    executor = Executor(
        definition,
        store.DatabaseJournal(owned, wakes=row.parent_id if row.detached else None),
        inputs=inputs,
        state=store.resume_state(row),
        coordinator=_coordinator(definition, row.id, row, inputs, in_worker=False),
        max_retry_delay=float(reactor_settings.MAX_INLINE_RETRY_DELAY),
        children=DatabaseChildRunner(row.id, row.root_id or row.id),
        issue_tokens=bool(reactor_settings.RESUME_TOKENS),
        observer=_observer_for(definition, parent_id=row.parent_id),
    )
    try:
        with store.LeaseKeeper(owned):
            outcome = executor.run()
    except LeaseLost:
        logger.warning("execution %s was taken over by another process", owned.execution_id)
        return outcome_of(store.get_row(owned.execution_id))
    return after_pause(outcome)


def after_pause(outcome: Outcome) -> Outcome:
    """A run that just paused: if a payload was accepted meanwhile, a worker takes it on.

    Otherwise the outcome lists every interrupt the run waits at, with its correlation id and
    expiry (also those reached before this process took the run), and the tokens issued now.
    """
    if not isinstance(outcome, Paused) or outcome.execution_id is None:
        return outcome
    if interrupt_store.reopen_if_claimed(outcome.execution_id):
        return Dispatched(execution_id=outcome.execution_id)
    tokens = {i.step: i.token for i in outcome.interrupts if i.token}
    return Paused(
        execution_id=outcome.execution_id,
        interrupts=tuple(
            PendingInterrupt(i.step, i.correlation_id, i.expires_at, tokens.get(i.step))
            for i in interrupt_store.waiting(outcome.execution_id)
        ),
        results=outcome.results,
    )


def issue_resume_token(execution_id: uuid.UUID | str, step: str) -> str:
    """A single-use resume token for the interrupt ``step`` of a paused run.

    Send it to whoever may resume the run (in an e-mail link, to a partner's system); they
    present it in the ``Reactor-Resume-Token`` header. Only its SHA-256 is stored, so it cannot
    be shown again; issuing a new one revokes the previous one. It dies with the interrupt.
    """
    _require_interrupt_step(store.get_row(execution_id), step)
    return interrupt_store.issue_token(execution_id, step)


def expire_interrupts(limit: int | None = None) -> int:
    """Apply ``on_timeout`` to every interrupt whose timeout passed; return how many.

    ``on_timeout="fail"`` undoes the run and fails it; ``ContinueWith(payload)`` resumes it in
    the background with that payload. Run by the sweeper.
    """
    expired = 0
    for row in interrupt_store.due(limit or int(reactor_settings.SWEEP_BATCH)):
        try:
            if _expire(row):
                expired += 1
        except (InvalidTransition, ExecutionBusy, ReactorNotRegistered) as exc:
            logger.warning(
                "could not expire interrupt %s of %s: %s", row.step, row.execution_id, exc
            )
    return expired


def _expire(row: Any) -> bool:
    execution = store.get_row(row.execution_id)
    definition = registry.get(execution.reactor).definition
    spec = definition.by_name.get(row.step)
    on_timeout = spec.interrupt.on_timeout if spec is not None and spec.interrupt else "fail"
    if isinstance(on_timeout, ContinueWith):
        try:
            payload = encode(on_timeout.payload)
        except ResultNotSerializable:
            payload = None
        if payload is not None:
            try:
                interrupt_store.claim(
                    row,
                    payload,
                    inline_owner=None,
                    closing_status=InterruptStatus.EXPIRED,
                    ignore_expiry=True,
                )
            except InvalidTransition:
                return False  # a payload won the race
            return True
    if execution.status != ExecutionStatus.PAUSED:
        return False  # the run is moving: expired when it pauses, at a later sweep
    expired_at = f"{row.expires_at:%Y-%m-%d %H:%M:%S %Z}"
    try:
        _fail_paused(
            execution,
            definition,
            ErrorInfo(
                kind=ErrorKind.TIMEOUT,
                message=f"interrupt {row.step!r} expired at {expired_at} without a payload "
                "(on_timeout='fail')",
                step=row.step,
                reactor=definition.name,
                retryable=False,
            ),
            interrupt=row,
            closing_status=InterruptStatus.EXPIRED,
            event=EventKind.EXPIRE,
            data={"expires_at": row.expires_at.isoformat()},
        )
    except (InvalidTransition, ExecutionBusy):
        return False  # a payload moved the run meanwhile
    return True


# ---------------------------------------------------------------------------- background run


def run_in_background(
    reactor: type[Reactor],
    inputs: Mapping[str, Any],
    *,
    idempotency_key: str | None = None,
) -> Outcome:
    """Validate ``inputs`` and hand the whole run to a Celery worker, whatever the reactor's
    ``Meta.background`` says; returns ``Dispatched`` at once.

    Invalid inputs are recorded as a failed run and returned as ``Failed``, as with
    :func:`run`. A reused ``idempotency_key`` returns the run holding it (``idempotent_replay``)
    when the inputs match, and raises IdempotencyKeyReused otherwise. Inside
    ``transaction.atomic()`` the run is created with your transaction and its task is published
    when it commits.
    """
    return _run(reactor, inputs, idempotency_key=idempotency_key, all_in_background=True)


# ---------------------------------------------------------------------------- prune


def prune(
    older_than_days: float,
    statuses: Any = None,
    batch_size: int = 1000,
    dry_run: bool = False,
    *,
    on_batch: Any = None,
) -> int:
    """Delete finished runs whose ``finished_at`` is more than ``older_than_days`` days ago.

    ``statuses`` (default: completed, failed, halted and cancelled) must all be finished
    statuses; runs that could still move (pending, running, paused, rolling back, aborted,
    needs attention) are never deleted. Only top-level runs are selected, and only when their
    whole tree (composed children, async units) has finished; children, step records, traces
    and interrupts go with them. Deletes ``batch_size`` runs per transaction, calling
    ``on_batch(count)`` after each; returns how many top-level runs were deleted, or with
    ``dry_run`` how many would be, deleting nothing.
    """
    import datetime as dt

    from .states import TERMINAL_STATUSES

    if isinstance(older_than_days, bool) or not isinstance(older_than_days, int | float):
        raise ReactorError(f"older_than_days must be a number, got {older_than_days!r}")
    if older_than_days < 0:
        raise ReactorError(f"older_than_days must be 0 or more, got {older_than_days}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ReactorError(f"batch_size must be a whole number of 1 or more, got {batch_size!r}")
    chosen = sorted(TERMINAL_STATUSES) if statuses is None else [str(s) for s in statuses]
    unfinished = [s for s in chosen if s not in TERMINAL_STATUSES]
    if unfinished or not chosen:
        raise ReactorError(
            f"prune deletes only finished runs ({', '.join(sorted(TERMINAL_STATUSES))}); "
            f"got {', '.join(unfinished) or 'no status'}"
        )
    cutoff = utcnow() - dt.timedelta(days=older_than_days)
    if dry_run:
        return store.count_prunable(cutoff, chosen)
    total = 0
    for count in store.prune_finished(cutoff, chosen, batch_size):
        total += count
        if on_batch is not None:
            on_batch(count)
    return total


# ---------------------------------------------------------------------------- ordered locks


def ordered_lock(key: str) -> Any:
    """Where the runs of an ordered lock stand: queue (head first), halt, skipped runs.

    ``key`` is the lock's key as the reactor computes it (``"account-7"``).
    """
    from .coordination import get_backend

    return get_backend().ordered_status(coordination_runtime.backend_key("ordered", key))


def skip_ordered_run(key: str, execution_id: uuid.UUID | str) -> bool:
    """Take a run out of an ordered lock's queue (a stuck head); False when it was not queued."""
    from .coordination import get_backend

    return get_backend().skip_ordered(
        coordination_runtime.backend_key("ordered", key), str(store.parse_id(execution_id))
    )


def reset_ordered_lock(key: str) -> int:
    """Empty an ordered lock's queue and lift its halt; the runs removed (they re-queue when
    a worker next takes them)."""
    from .coordination import get_backend

    return get_backend().reset_ordered(coordination_runtime.backend_key("ordered", key))
