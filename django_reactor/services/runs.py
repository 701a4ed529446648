"""Starting runs (inline or on a worker), finding them, and retrying a failed one as a new run."""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import time
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from django.utils import timezone

from .. import registry, store
from ..conf import reactor_settings
from ..coordination import coordinator as run_coordination
from ..coordination.exceptions import CoordinationUnavailable
from ..engine.constructs.events import cancel_keys
from ..engine.executor import utcnow
from ..engine.journal import Event
from ..engine.outcomes import (
    Dispatched,
    ErrorInfo,
    ErrorKind,
    Failed,
    InProgress,
    Outcome,
    Scheduled,
    Suspended,
)
from ..engine.redaction import redact
from ..engine.routing import Route
from ..engine.serialization import decode, encode, printable, shown
from ..engine.templates import ResolutionScope
from ..engine.validation import summarise_errors, validate
from ..exceptions import (
    AlreadyRetried,
    IdempotencyKeyReused,
    InvalidInputs,
    InvalidTransition,
    KeptVersion,
    LeaseLost,
    PatchRemoved,
    ReactorError,
    ResultNotSerializable,
)
from ..handle import ExecutionHandle
from ..runtime import executors
from ..states import EventKind, ExecutionStatus

if TYPE_CHECKING:
    from ..engine.actors import Steering
    from ..engine.definition import ReactorDefinition
    from ..reactor import Reactor


from . import audit, batches, flow
from .audit import check_reason
from .databases import across_databases, on_reactors_database
from .guards import check_key, reactor_named, refuse_child, refuse_open_transaction
from .handles import find
from .interrupts import after_pause
from .patches import park_removed
from .steering import cancel
from .timing import Timing

logger = logging.getLogger("django_reactor.services")


def run(
    reactor: type[Reactor] | str,
    inputs: Mapping[str, Any],
    *,
    idempotency_key: str | None = None,
    at: dt.datetime | None = None,
    delay: dt.timedelta | float | None = None,
    deadline: dt.timedelta | dt.datetime | None = None,
    queue: str | None = None,
    priority: int | None = None,
) -> Outcome:
    """Validate ``inputs`` and run ``reactor`` in this process. See ``Reactor.run``.

    ``reactor`` is the class or its name: the registered name, a dotted path or the class
    name of one registered reactor (ReactorNotRegistered, with close names, otherwise).
    """
    reactor = reactor_named(reactor)
    return _run(
        reactor,
        inputs,
        idempotency_key=idempotency_key,
        all_in_background=False,
        timing=Timing.of(reactor, at=at, delay=delay, deadline=deadline),
        queue=queue,
        priority=priority,
    )


def _run(
    reactor: type[Reactor],
    inputs: Mapping[str, Any],
    *,
    idempotency_key: str | None,
    all_in_background: bool,
    timing: Timing | None = None,
    refuse_invalid: bool = False,
    queue: str | None = None,
    priority: int | None = None,
) -> Outcome:
    """``run``, ``run_in_background`` and ``start``: check the call, record invalid inputs (or,
    with ``refuse_invalid``, raise InvalidInputs and write nothing), start (in the reactor's
    database, ``REACTOR["DATABASE"]``). A bad ``queue`` or ``priority`` raises InvalidRoute
    before anything is written; a version kept in code (``Meta.version_of``) raises
    KeptVersion."""
    if reactor.definition.kept:
        raise KeptVersion(
            f"{reactor.__qualname__} is version {reactor.definition.version!r} of "
            f"{reactor.definition.name}, kept in code to finish the runs that started on it; "
            f"new runs start on the current class ({registry.short_name(reactor.definition.name)})"
        )
    route = reactor.definition.route(queue=queue, priority=priority)
    with on_reactors_database(reactor.definition.name):
        return _run_here(
            reactor,
            inputs,
            idempotency_key=idempotency_key,
            all_in_background=all_in_background,
            timing=timing,
            refuse_invalid=refuse_invalid,
            route=route,
        )


def _run_here(
    reactor: type[Reactor],
    inputs: Mapping[str, Any],
    *,
    idempotency_key: str | None,
    all_in_background: bool,
    timing: Timing | None,
    refuse_invalid: bool,
    route: Route,
) -> Outcome:
    definition = reactor.definition
    method = "run_in_background" if all_in_background else "run"
    if not isinstance(inputs, Mapping):
        raise ReactorError(
            f"{reactor.__qualname__}.{method}() takes the inputs as a dict, got "
            f"{type(inputs).__name__}"
        )
    if idempotency_key is not None:
        check_key(idempotency_key)
    timing = timing or Timing.default(definition)
    background = definition.background
    if timing.start_at is not None:
        all_in_background = True  # a worker starts it at its time: no step code runs here
    if (
        not all_in_background
        and definition.batch is None
        and (background is None or background.mode != "all")
    ):
        # A fully background run (or a batch's) executes no step code here: inside a
        # transaction it simply commits (or rolls back) with the caller's work, and its task
        # is published on commit.
        refuse_open_transaction(f"run {reactor.__qualname__}")

    stored_inputs, error = validated_inputs(definition, inputs)
    if error is not None and refuse_invalid:
        raise InvalidInputs(error.message, errors=error.field_errors)
    if error is not None:
        # Recorded for operators, without the idempotency key: a corrected call may reuse it.
        created = store.create_execution(
            reactor=definition.name,
            definition_hash=definition.definition_hash,
            version=definition.version,
            inputs=error.inputs,
            secret_paths=[],
            status=ExecutionStatus.FAILED,
            owner=None,
            failure=error.to_dict(),
            # Found by the attributes its inputs give, however wrong the rest of them are.
            attributes=definition.attributes_of(inputs, strict=False),
            route=route,
            events=[
                Event(
                    1, EventKind.FAIL, utcnow(), data={"kind": error.kind, "error": error.message}
                ),
            ],
        )
        return Failed(execution_id=created.execution_id, error=error)

    if definition.batch is not None:
        return batches.add(
            definition, stored_inputs, idempotency_key=idempotency_key, timing=timing, route=route
        )
    return _start(
        definition,
        stored_inputs,
        idempotency_key=idempotency_key,
        all_in_background=all_in_background,
        timing=timing,
        route=route,
    )


def _start(
    definition: ReactorDefinition,
    stored_inputs: Any,
    *,
    idempotency_key: str | None = None,
    retry_of: uuid.UUID | None = None,
    all_in_background: bool = False,
    timing: Timing | None = None,
    steering: Steering | None = None,
    route: Route | None = None,
    locked: bool = False,
) -> Outcome:
    """Start a run of ``definition`` with ``stored_inputs``; ``steering``: the operator's
    action that starts it (a retry), recorded with the new run and on its ``start`` entry;
    ``route``: its queue and priority (None: the reactor's declared ones); ``locked``: decide
    on its concurrency key under the key's lock (after its insert found the key full)."""
    timing = timing or Timing.default(definition)
    first = definition.next_ready(frozenset())
    # A misconfigured coordination backend refuses the run before anything is written.
    run_coordination.check_backend(definition)
    background = all_in_background or (
        definition.background is not None and definition.background.mode == "all"
    )
    # A run of a paused reactor is stored and not started (a worker's claim stops a background
    # run the same way; one run inline asks here, before its first step).
    paused = None if background else store.pauses.reactor_pause(definition.name)
    inputs = decode(stored_inputs)
    subject = store.subject_keys.check_subject(
        definition.subject_of(inputs), f"this run of {definition.name}"
    )
    attributes = definition.attributes_of(inputs)
    key = flow.key_of(definition.concurrency, definition, inputs)
    throttle_key = flow.key_of(definition.throttle, definition, inputs)
    debounce_key = flow.key_of(definition.debounce, definition, inputs)
    why, cancelled = "", False
    status = (
        ExecutionStatus.SCHEDULED
        if timing.start_at is not None
        else ExecutionStatus.PENDING
        if background
        else ExecutionStatus.SUSPENDED
        if paused is not None
        else ExecutionStatus.RUNNING
    )
    # A run with only a concurrency key starts by its insert alone when the key has room (the
    # insert takes it, in its own statement); else, and for the other keys, a key's decisions
    # take its lock in turn: the decision and the new run are one transaction.
    held = (
        not locked
        and bool(key)
        and not throttle_key
        and not debounce_key
        and timing.start_at is None
        and not definition.cancel_on
        and steering is None
        and store.flow.holds_on_insert()
    )
    try:
        with store.flow.deciding(
            definition.name,
            concurrency_key="" if held else key,
            throttle_key=throttle_key,
            throttle_limit=definition.throttle.limit if definition.throttle else 0,
            debounce_key=debounce_key,
        ) as seen:
            now = timezone.now()
            if seen.debounced is not None:
                # A run of the key waits to start: this start collapses into it.
                waiting, latest = seen.debounced
                collapsed_at, _ = flow.debounce_start(definition, now, latest)
                if store.collapse_start(
                    waiting,
                    inputs=stored_inputs,
                    secret_paths=definition.input_secret_paths,
                    subject=subject,
                    has_secrets=definition.has_secrets,
                    attributes=attributes,
                    cancel_keys=cancel_keys(definition.cancel_on, ResolutionScope(inputs, {}))
                    if definition.cancel_on
                    else (),
                    wake_at=collapsed_at,
                    data={"key": debounce_key, "start_at": collapsed_at.isoformat()},
                ):
                    return Scheduled(execution_id=waiting, start_at=collapsed_at)
            decision = flow.decide(definition, seen.concurrency)
            if decision.action == "skip":
                assert decision.holder is not None
                return store.outcome_of(store.get_row(decision.holder), replay=True)
            events = [
                Event(
                    1,
                    EventKind.START,
                    utcnow(),
                    data={
                        **({"retry_of": str(retry_of)} if retry_of else {}),
                        **(steering.trace_data() if steering is not None else {}),
                    },
                ),
            ]
            starts = decision.action == "start"
            start_at: dt.datetime | None = timing.start_at
            debounce_latest: dt.datetime | None = None
            if starts and debounce_key:
                # The first start of its key: it waits until the key is quiet.
                start_at, debounce_latest = flow.debounce_start(definition, now, None)
                background, paused = True, None
                status = ExecutionStatus.SCHEDULED
            if starts and seen.throttle_slots is not None:
                wanted = start_at or timezone.now()
                slot = flow.throttle_slot(definition, seen.throttle_slots, wanted)
                if slot > wanted:
                    # Over the throttle: a worker starts it when its key has room.
                    start_at, background, paused = slot, True, None
                    status = ExecutionStatus.SCHEDULED
                    events.append(
                        Event(
                            len(events) + 1,
                            EventKind.THROTTLE,
                            utcnow(),
                            data={
                                "key": throttle_key,
                                "start_at": slot.isoformat(),
                                "reason": flow.throttled(definition, throttle_key),
                            },
                        )
                    )
            if starts:
                if paused is not None:
                    events.append(store.pauses.suspended_at_start(paused, len(events) + 1))
            else:
                why = flow.over_limit(definition, key, decision)
                cancelled = decision.action == "cancel_newest"
                status = ExecutionStatus.CANCELLED if cancelled else ExecutionStatus.QUEUED
                events.append(
                    Event(
                        len(events) + 1,
                        EventKind.CANCEL if cancelled else EventKind.QUEUE,
                        utcnow(),
                        data={"reason": why, "key": key},
                    )
                )
            owned = store.create_execution(
                reactor=definition.name,
                definition_hash=definition.definition_hash,
                version=definition.version,
                definition_shape=definition.shape,
                inputs=stored_inputs,
                secret_paths=definition.input_secret_paths,
                subject=subject,
                has_secrets=definition.has_secrets,
                # A background run is written pending with its dispatch; a worker takes it (a
                # run that starts later: scheduled, dispatched for its time; a run over its
                # key's limit: queued, or cancelled, without one).
                status=status,
                owner=store.lease_owner_token() if status == ExecutionStatus.RUNNING else None,
                dispatch="start" if starts and background else None,
                wake_at=start_at,
                deadline_at=timing.deadline_at,
                idempotency_key=idempotency_key,
                retry_of=retry_of,
                cancel_keys=cancel_keys(definition.cancel_on, ResolutionScope(inputs, {}))
                if definition.cancel_on and status != ExecutionStatus.CANCELLED
                else (),
                current_step=first.name if first is not None else "",
                attributes=attributes,
                route=route or definition.route(),
                concurrency_key=key,
                throttle_key=throttle_key,
                throttle_slot=(start_at or now) if throttle_key and starts else None,
                debounce_key=debounce_key if starts else "",
                debounce_latest=debounce_latest,
                cancel_reason=why if cancelled else "",
                events=events,
                steering=steering,
                hold_limit=definition.concurrency.limit
                if held and definition.concurrency
                else None,
            )
    except store.flow.KeyFull:
        return _start(
            definition,
            stored_inputs,
            idempotency_key=idempotency_key,
            retry_of=retry_of,
            all_in_background=all_in_background,
            timing=timing,
            steering=steering,
            route=route,
            locked=True,
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
    if definition.coordination and status != ExecutionStatus.CANCELLED:
        # Ordered locks order runs by when they are started, wherever they then run.
        with contextlib.suppress(CoordinationUnavailable):  # the run's entry fails closed
            run_coordination.enqueue(definition, owned.execution_id, inputs)
    if not starts:
        for holder_id in decision.cancelling:
            _cancel_superseded(holder_id, owned.execution_id, key)
        if status == ExecutionStatus.QUEUED:
            flow.queued_start(definition, key)
        return store.outcome_of(store.get_row(owned.execution_id))
    if start_at is not None:
        return Scheduled(execution_id=owned.execution_id, start_at=start_at)
    if background:
        return Dispatched(execution_id=owned.execution_id)
    if paused is not None:
        return Suspended(
            execution_id=owned.execution_id, reason=paused.reason or store.pauses.NO_REASON
        )
    executor = executors.for_caller(
        definition, owned, inputs, deadline=timing.deadline_at, subject=subject
    )
    try:
        with store.LeaseKeeper(owned):
            outcome = after_pause(executor.run())
    except PatchRemoved as removed:  # a fork that carried an old branch's decision
        outcome = park_removed(owned, definition.name, removed)
    except LeaseLost:
        logger.warning(
            "execution %s was taken over by another process; this process stopped",
            owned.execution_id,
        )
        return store.outcome_of(store.get_row(owned.execution_id))
    flow.ended(definition, key, outcome)
    return outcome


def _cancel_superseded(execution_id: uuid.UUID, newest: uuid.UUID, key: str) -> None:
    """``cancel_in_progress``: stop a run of ``key`` for the newest one (at once when nobody
    runs it, else after its current step); the newest is admitted when it ends (the cancel,
    or the worker that stops it, admits the key's next runs)."""
    try:
        cancel(execution_id, reason=f"superseded by execution {newest} (concurrency key {key!r})")
    except ReactorError as exc:  # it ended meanwhile: whoever ended it admitted the next
        logger.info("execution %s was not cancelled for %s: %s", execution_id, newest, exc)


def validated_inputs(
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
        return store.outcome_of(store.get_row(execution_id), replay=True)
    deadline = time.monotonic() + reactor_settings.IDEMPOTENCY_WAIT_SECONDS
    pause = 0.01
    while True:
        row = store.get_row(execution_id)
        outcome = store.outcome_of(row, replay=True)
        if not isinstance(outcome, InProgress) or time.monotonic() >= deadline:
            return outcome
        time.sleep(pause)
        pause = min(pause * 2, 0.25)


def find_by_correlation_id(correlation_id: str, *, reactor: type[Reactor] | str) -> ExecutionHandle:
    """The run of ``reactor`` (the class or its name, as :func:`run` takes it) waiting (or
    last waiting) under ``correlation_id``; raises InterruptNotFound."""
    reactor = reactor_named(reactor)
    with on_reactors_database(reactor.definition.name):
        row = store.interrupts.find(correlation_id=correlation_id, reactor=reactor.definition.name)
        # An interrupt of a composed child: the run of ``reactor`` at the top, which paused for it.
        return find(store.interrupts.nesting(row).top_id, reactor=reactor)


@across_databases
def retry(execution_id: uuid.UUID | str, *, reason: str = "") -> Outcome:
    """Run a failed execution again as a new execution linked to it (``retry_of``).

    The new run starts from the first step with the stored inputs. A failed run is retried at
    most once; retry the retry to go again. Recorded with who asked and ``reason``: in the
    steering history with the new run's creation, and on both runs' traces (the failed run's
    ``rerun`` entry, the new run's ``start``).
    """
    check_reason(reason, "retry")
    row = store.get_row(execution_id)
    refuse_child(row, "retry")
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
        refuse_open_transaction(f"retry execution {row.id}")
    steering = audit.steering("retry", reason=reason).on(row.id, row.reactor)
    # The new run seals its inputs again (a SubjectErased says the subject was forgotten).
    outcome = _start(
        reactor.definition,
        store.secrets.opened(row.inputs),
        retry_of=row.id,
        steering=steering,
        route=store.route_of_row(row),
    )
    store.append_event(
        row.id,
        EventKind.RERUN,
        {"retried_as": str(outcome.execution_id), **steering.trace_data()},
    )
    return outcome


def start(
    reactor: type[Reactor] | str,
    inputs: Mapping[str, Any],
    *,
    idempotency_key: str | None = None,
    queue: str | None = None,
    priority: int | None = None,
) -> Outcome:
    """Hand a run of ``reactor`` to a worker for a caller outside the project (the API's
    ``POST /reactors/{name}/runs/``); returns ``Dispatched`` at once.

    Unlike :func:`run_in_background`, inputs that fail the reactor's ``Inputs`` serializer
    raise InvalidInputs (with the field errors) and write nothing: the caller corrects and
    sends again. A reused ``idempotency_key`` returns the run holding it (``idempotent_replay``)
    when the inputs match, and raises IdempotencyKeyReused otherwise.
    """
    return _run(
        reactor_named(reactor),
        inputs,
        idempotency_key=idempotency_key,
        all_in_background=True,
        refuse_invalid=True,
        queue=queue,
        priority=priority,
    )


def run_in_background(
    reactor: type[Reactor] | str,
    inputs: Mapping[str, Any],
    *,
    idempotency_key: str | None = None,
    queue: str | None = None,
    priority: int | None = None,
) -> Outcome:
    """Validate ``inputs`` and hand the whole run to a Celery worker, whatever the reactor's
    ``Meta.background`` says; returns ``Dispatched`` at once.

    Invalid inputs are recorded as a failed run and returned as ``Failed``, as with
    :func:`run`. A reused ``idempotency_key`` returns the run holding it (``idempotent_replay``)
    when the inputs match, and raises IdempotencyKeyReused otherwise. Inside
    ``transaction.atomic()`` the run is created with your transaction and its task is published
    when it commits. ``reactor`` is the class or its name, as :func:`run` takes it.
    ``queue`` and ``priority`` override the reactor's ``Meta.queue`` and ``Meta.priority``
    (InvalidRoute, nothing written, for bad ones).
    """
    return _run(
        reactor_named(reactor),
        inputs,
        idempotency_key=idempotency_key,
        all_in_background=True,
        queue=queue,
        priority=priority,
    )
