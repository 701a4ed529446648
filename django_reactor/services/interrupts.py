"""Payloads for paused runs: delivering one (exactly one wins), resume tokens, expiry."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .. import registry, store
from ..conf import reactor_settings
from ..engine.constructs.compose import interrupt_paths
from ..engine.constructs.interrupt import ContinueWith
from ..engine.constructs.receive import receive_paths
from ..engine.outcomes import (
    Dispatched,
    ErrorInfo,
    ErrorKind,
    InProgress,
    Outcome,
    Paused,
    PendingInterrupt,
)
from ..engine.serialization import decode, encode
from ..engine.state import RunState
from ..engine.validation import summarise_errors, validate
from ..exceptions import (
    DefinitionChanged,
    ExecutionBusy,
    IdempotencyKeyReused,
    InterruptNotFound,
    InvalidPayload,
    InvalidTransition,
    LeaseLost,
    NotWaiting,
    PatchRemoved,
    ReactorError,
    ReactorNotRegistered,
    ResultNotSerializable,
    SubjectErased,
    UnknownInterrupt,
)
from ..runtime import executors
from ..states import EventKind, ExecutionStatus, InterruptStatus, MessageKind

if TYPE_CHECKING:
    from ..engine.definition import ReactorDefinition
    from ..engine.spec import StepSpec
    from ..models import Execution, Interrupt


from . import audit
from .audit import check_reason
from .databases import across_databases
from .guards import check_key, refuse_open_transaction
from .patches import park_removed
from .secrets import fail_erased

#: How a delivery names an interrupt: its step, or its path through composed children, dotted
#: (``"checkout.approval"``) or as a sequence (``("checkout", "approval")``).
InterruptName = str | Sequence[str]

logger = logging.getLogger("django_reactor.services")


@across_databases
def resume_interrupt(
    execution_id: uuid.UUID | str | None = None,
    *,
    step: InterruptName | None = None,
    payload: Any,
    correlation_id: str | None = None,
    reactor: str | None = None,
    token: str | None = None,
    background: bool | None = None,
    idempotency_key: str | None = None,
    reason: str = "",
) -> Outcome:
    """Deliver ``payload`` to a paused run's interrupt; exactly one delivery wins.

    Name the interrupt by ``execution_id``, by ``correlation_id`` (and ``reactor`` when several
    reactors share correlation ids) or by a resume ``token``; ``step`` may be left out when one
    interrupt waits. An interrupt of a composed child is resumed through the run at the top,
    by its path: ``step="checkout.approval"`` or ``step=("checkout", "approval")`` (its
    correlation id and token find it too); the child's own execution id is refused. The
    payload is validated by the interrupt's serializer before anything changes; an accepted
    payload becomes the step's result.

    ``background`` (default: the interrupt's ``resume=``): True hands the rest of the run to a
    worker and returns ``Dispatched`` at once; False runs it in this process and returns how it
    ended (``Completed``, ``Paused`` at a later interrupt...). When the run is already moving
    (another interrupt's payload came first) the payload is recorded and ``InProgress`` is
    returned.

    With ``idempotency_key``, a repeat of the same delivery (same key, same step and payload)
    changes nothing and returns the run's outcome with ``idempotent_replay=True``; the same key
    with another payload raises IdempotencyKeyReused.

    A delivery by ``execution_id`` to a run that is still moving and has not reached the
    interrupt yet is validated and kept until it does (see :func:`keep_delivery`), and
    ``InProgress`` is returned; by correlation id, nothing names the run until it gets there.

    Raises InterruptNotFound (UnknownInterrupt, with the valid ``paths``, for a step or path
    the reactor does not declare), NotWaiting (the run has not reached an interrupt yet and
    ``step`` is left out while the reactor declares several), AlreadyResumed (another
    delivery came first, kept or accepted), InterruptClosed (expired, cancelled, failed) and
    InvalidPayload (field errors; with ``max_attempts``, the last allowed one also fails the
    run).

    The delivery is recorded with who made it and ``reason`` (storable text): in the steering
    history, and on the trace of the paused run as a ``steer`` entry.
    """
    check_reason(reason, "resume")
    step = interrupt_step(step)
    arguments = {
        "execution_id": execution_id,
        "step": step,
        "payload": payload,
        "correlation_id": correlation_id,
        "reactor": reactor,
        "token": token,
        "background": background,
        "reason": reason,
    }
    if idempotency_key is None:
        return _resume_interrupt(**arguments)
    check_key(idempotency_key)
    if token is not None:
        # The claim consumes the token: a repeat could not find the interrupt again.
        scope, target = f"resume-token:{store.interrupts.token_hash(token)}", execution_id
    else:
        try:
            found = find_interrupt(
                execution_id=execution_id, correlation_id=correlation_id, reactor=reactor, step=step
            )
            target = store.interrupts.nesting(found).top_id
        except NotWaiting:  # kept for the run (see keep_delivery): the run is the one named
            if execution_id is None:
                raise
            target = store.parse_id(execution_id)
        scope = f"resume:{target}"
    reservation = store.request_keys.reserve(
        scope, idempotency_key, store.request_keys.fingerprint(step, payload)
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
        return store.outcome_of(store.get_row(stored["execution_id"]), replay=True)
    assert reservation.row_id is not None
    try:
        with store.request_keys.kept(reservation.row_id):  # an inline resume may outlast the lease
            outcome = _resume_interrupt(**arguments)
    except BaseException:
        store.request_keys.release(reservation.row_id)
        raise
    store.request_keys.finish(reservation.row_id, 200, {"execution_id": str(outcome.execution_id)})
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
    reason: str,
) -> Outcome:
    if token is not None:
        row = store.interrupts.find_by_token(token)
        where = store.interrupts.nesting(row)
        if (execution_id is not None and str(where.top_id) != str(execution_id)) or (
            step is not None and step not in (row.step, where.path)
        ):
            raise InterruptNotFound("no interrupt has this resume token")
    else:
        try:
            row = find_interrupt(
                execution_id=execution_id, correlation_id=correlation_id, reactor=reactor, step=step
            )
        except NotWaiting:
            if execution_id is None:
                raise
            return keep_delivery(execution_id, step, payload, background=background, reason=reason)
    return deliver(row, payload, background=background, reason=reason)


def deliver(
    row: Interrupt, payload: Any, *, background: bool | None = None, reason: str = ""
) -> Outcome:
    """Deliver ``payload`` to the interrupt ``row`` (from :func:`find_interrupt`), in the
    database it was read from.

    What :func:`resume_interrupt` does once it has found the interrupt; the API calls it with
    the interrupt its credential check found, so the interrupt is read once per request. The
    run that resumes is the one that paused for it: for an interrupt of a composed child, the
    run at the top of the composition, which continues the child. Recorded with who delivered
    it and ``reason`` (see :func:`resume_interrupt`).
    """
    check_reason(reason, "resume")
    with store.bound_to(row):
        return _deliver_here(row, payload, background=background, reason=reason)


def _deliver_here(row: Interrupt, payload: Any, *, background: bool | None, reason: str) -> Outcome:
    store.interrupts.refuse_closed(row)
    where = store.interrupts.nesting(row)
    if store.messages.kept_delivery(where.top_id, where.path):
        # A payload delivered before the run reached the interrupt came first: it wins.
        deliver_kept(where.top_id, background=background)
        store.interrupts.refuse_closed(store.interrupts.at(where.top_id, where.path) or row)
    definition = _definition_of_interrupt(row)
    spec = definition.by_name.get(row.step)
    if spec is None or spec.interrupt is None:
        raise DefinitionChanged(
            f"execution {where.top_id} waits at {where.path!r}, which is no longer an "
            f"interrupt of {definition.name}; deploy the definition it ran with to resume it"
        )
    accepted, errors = _validate_payload(spec.interrupt.payload, payload)
    if errors is not None:
        _refuse_payload(row, where, errors)
    in_background = background if background is not None else row.resume_mode == "background"
    if not in_background:
        refuse_open_transaction(f"resume execution {where.top_id} inline")
    steering = audit.steering("resume", reason=reason, detail={"step": where.path}).on(
        where.top_id, where.reactor
    )
    claim = store.interrupts.claim(
        row,
        accepted,
        inline_owner=None if in_background else store.lease_owner_token(),
        secret_paths=spec.secret_result_paths,
        steering=steering,
    )
    if claim.dispatched:
        return Dispatched(execution_id=where.top_id)
    if claim.owned is None:
        return InProgress(execution_id=where.top_id, status=claim.execution_status)
    if where.top_id != row.execution_id:
        definition = registry.of_run(where.reactor, where.version).definition
    return _continue_inline(definition, claim.owned)


@across_databases
def _definition_of(execution: Execution) -> ReactorDefinition:
    """The definition of the code that runs ``execution``: its version's."""
    return registry.of_run(execution.reactor, execution.version).definition


def _definition_of_interrupt(row: Interrupt) -> ReactorDefinition:
    """The definition of the code that runs the run ``row`` is an interrupt of (its run's
    version is read only for a reactor with versions in code)."""
    if not registry.versions_of(row.reactor):
        return registry.get(row.reactor).definition
    return _definition_of(store.get_row(row.execution_id))


def find_interrupt(
    *,
    execution_id: uuid.UUID | str | None = None,
    correlation_id: str | None = None,
    reactor: str | None = None,
    step: InterruptName | None = None,
) -> Interrupt:
    """The interrupt a delivery names (see ``resume_interrupt`` for how it is named).

    Refuses (InvalidTransition) an execution id of a composed child, naming the run to resume
    instead and the interrupt's path there.
    """
    step = interrupt_step(step)
    try:
        row = store.interrupts.find(
            execution_id=execution_id, correlation_id=correlation_id, reactor=reactor, step=step
        )
    except InvalidTransition:  # NotWaiting too: a misspelt step never waits
        if execution_id is not None:
            execution = store.get_row(execution_id)
            _refuse_composed_child(execution, step)
            if step is not None:
                _require_interrupt_step(execution, step)
        raise
    if execution_id is not None:
        key = store.parse_id(execution_id)
        if store.interrupts.nesting(row).top_id != key:  # the run named is a composed child
            _refuse_composed_child(store.get_row(key), step, row)
    return row


def interrupt_step(step: Any) -> str | None:
    """A delivery's ``step`` as text: a path given as a sequence is dotted (``("checkout",
    "approval")`` is ``"checkout.approval"``). Whether it names an interrupt is checked
    against the run's reactor, which lists the valid ones when it does not."""
    if step is None or isinstance(step, str):
        return step
    if isinstance(step, Sequence) and all(isinstance(part, str) for part in step):
        return ".".join(step)
    raise ReactorError(
        "step must name an interrupt: its step name, or its path through composed children "
        f'("checkout.approval" or ("checkout", "approval")), got {step!r}'
    )


def _refuse_composed_child(
    execution: Execution, step: str | None, row: Interrupt | None = None
) -> None:
    """Refuse a delivery addressed to a composed child: its parent's run resumes it."""
    if execution.parent_id is None or execution.detached:
        return
    if row is not None:
        where = store.interrupts.nesting(row)
    else:
        where = store.interrupts.above(execution.id, step or "<interrupt>")
    raise InvalidTransition(
        f"cannot resume execution {execution.id} directly: it is the composed child run by "
        f"step {execution.parent_step!r} of execution {execution.parent_id}, and its "
        f"interrupts are resumed through execution {where.top_id}; resume that execution with "
        f"step={where.path!r}",
        status=execution.status,
    )


def _require_interrupt_step(execution: Execution, step: str) -> None:
    """Refuse a step or path that is not an interrupt of the run's reactor (a typo never
    waits), with the valid paths."""
    try:
        definition = registry.of_run(execution.reactor, execution.version).definition
    except ReactorNotRegistered:
        return  # reported by the resume itself
    paths = tuple(interrupt_paths(definition))
    if step not in paths:
        raise UnknownInterrupt(
            f"{step!r} is not an interrupt of {definition.name} (its interrupts: "
            f"{', '.join(paths) or 'none'})",
            paths=paths,
        )


def _validate_payload(
    serializer: type | None, payload: Any, *, any_json: bool = False
) -> tuple[Any, Any]:
    """The payload as stored (validated data), or the field errors. ``any_json``: without a
    serializer, any JSON value is accepted (a message), not only an object."""
    if serializer is None and any_json:
        data: Any = payload
        errors: Any = None
    elif not isinstance(payload, Mapping):
        kind = type(payload).__name__
        return None, {"non_field_errors": [f"the payload must be a JSON object, got {kind}"]}
    elif serializer is None:
        data = dict(payload)
        errors = None
    else:
        data, errors = validate(serializer, payload)
    if errors:
        return None, errors
    try:
        return encode(data), None
    except ResultNotSerializable as exc:
        return None, {"non_field_errors": [f"the validated payload cannot be stored: {exc}"]}


def _refuse_payload(row: Interrupt, where: store.interrupts.Nesting, errors: Any) -> None:
    """Count an invalid payload; fail the run on its last allowed attempt. Always raises."""
    attempts = store.interrupts.count_invalid(row, errors)
    limit = row.max_attempts
    summary = summarise_errors(errors)
    step = where.path
    if limit is not None and attempts >= limit:
        message = (
            f"interrupt {step!r} received {attempts} invalid payload(s) (max_attempts={limit}); "
            f"the last one: {summary}"
        )
        execution = store.get_row(where.top_id)
        definition = registry.of_run(execution.reactor, execution.version).definition
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
    execution: Execution,
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
    store.interrupts.mark(interrupt, closing_status, closed=True)
    state = RunState.restore(
        definition, store.run_records(execution, for_rollback=True), for_rollback=True
    )
    executor = executors.for_operation(definition, owned, execution, state)
    if event is not None:
        path = store.interrupts.nesting(interrupt).path
        executor.note(event, {"step": path, **(data or {})})
    with store.LeaseKeeper(owned):
        executor.rollback(final_status=ExecutionStatus.FAILED, reason=error.message, failure=error)


def _continue_inline(definition: ReactorDefinition, owned: store.Owned) -> Outcome:
    """Run the rest of a run this process just took from ``paused``; a run that needs a
    secret of a forgotten subject fails instead (``fail_erased``)."""
    row = store.get_row(owned.execution_id)
    try:
        state = RunState.restore(definition, store.run_records(row))
        executor = executors.for_deliverer(definition, owned, row, state)
    except SubjectErased as exc:
        return fail_erased(owned, row, exc)
    # Paused (the run, or its reactor) while it waited: the payload is kept (its record says
    # so), and the run stops before its next step.
    asked = store.pauses.pause_for(row.reactor, row.id, parent_id=row.parent_id)
    try:
        with store.LeaseKeeper(owned):
            outcome = executor.suspend(asked) if asked is not None else executor.run()
    except PatchRemoved as removed:
        return park_removed(owned, row.reactor, removed)
    except LeaseLost:
        logger.warning("execution %s was taken over by another process", owned.execution_id)
        return store.outcome_of(store.get_row(owned.execution_id))
    return after_pause(outcome)


def after_pause(outcome: Outcome) -> Outcome:
    """A run that just paused: if a payload was accepted meanwhile, a worker takes it on.

    Otherwise the outcome lists every interrupt the run waits at, with its correlation id and
    expiry (also those reached before this process took the run), and the tokens issued now.
    """
    if not isinstance(outcome, Paused) or outcome.execution_id is None:
        return outcome
    if store.interrupts.reopen_if_claimed(outcome.execution_id):
        return Dispatched(execution_id=outcome.execution_id)
    if store.messages.has_unread(outcome.execution_id):
        moved = deliver_kept(outcome.execution_id)
        if moved is not None:
            return moved
    tokens = {i.step: i.token for i in outcome.interrupts if i.token}
    return Paused(
        execution_id=outcome.execution_id,
        interrupts=tuple(
            PendingInterrupt(path, i.correlation_id, i.expires_at, tokens.get(path))
            for i in store.interrupts.waiting(outcome.execution_id)
            for path in [store.interrupts.path_of(i)]
        ),
        results=outcome.results,
    )


@across_databases
def issue_resume_token(execution_id: uuid.UUID | str, step: InterruptName) -> str:
    """A single-use resume token for the interrupt ``step`` of a paused run (a path such as
    ``"checkout.approval"`` for an interrupt of a composed child).

    Send it to whoever may resume the run (in an e-mail link, to a partner's system); they
    present it in the ``Reactor-Resume-Token`` header. Only its SHA-256 is stored, so it cannot
    be shown again; issuing a new one revokes the previous one. It dies with the interrupt.
    """
    path = interrupt_step(step)
    assert path is not None
    execution = store.get_row(execution_id)
    _refuse_composed_child(execution, path)
    _require_interrupt_step(execution, path)
    return store.interrupts.issue_token(execution.id, path)


def expire_interrupts(limit: int | None = None) -> int:
    """Apply ``on_timeout`` to every interrupt whose timeout passed; return how many.

    ``on_timeout="fail"`` undoes the run and fails it; ``ContinueWith(payload)`` resumes it in
    the background with that payload. Run by the sweeper.
    """
    expired = 0
    for row in store.interrupts.due(limit or reactor_settings.SWEEP_BATCH):
        try:
            if _expire(row):
                expired += 1
        except (InvalidTransition, ExecutionBusy, ReactorNotRegistered) as exc:
            logger.warning(
                "could not expire interrupt %s of %s: %s", row.step, row.execution_id, exc
            )
    return expired


def _expire(row: Interrupt) -> bool:
    where = store.interrupts.nesting(row)
    execution = store.get_row(where.top_id)
    spec = _definition_of_interrupt(row).by_name.get(row.step)
    on_timeout = spec.interrupt.on_timeout if spec is not None and spec.interrupt else "fail"
    if isinstance(on_timeout, ContinueWith):
        try:
            payload = encode(on_timeout.payload)
        except ResultNotSerializable:
            payload = None
        if payload is not None:
            try:
                store.interrupts.claim(
                    row,
                    payload,
                    inline_owner=None,
                    closing_status=InterruptStatus.EXPIRED,
                    ignore_expiry=True,
                    secret_paths=spec.secret_result_paths if spec is not None else (),
                )
            except InvalidTransition:
                return False  # a payload won the race
            return True
    if execution.status != ExecutionStatus.PAUSED:
        return False  # the run is moving: expired when it pauses, at a later sweep
    definition = registry.of_run(execution.reactor, execution.version).definition
    expired_at = f"{row.expires_at:%Y-%m-%d %H:%M:%S %Z}"
    try:
        _fail_paused(
            execution,
            definition,
            ErrorInfo(
                kind=ErrorKind.TIMEOUT,
                message=f"interrupt {where.path!r} expired at {expired_at} without a payload "
                "(on_timeout='fail')",
                step=where.path,
                reactor=definition.name,
                retryable=False,
            ),
            interrupt=row,
            closing_status=InterruptStatus.EXPIRED,
            event=EventKind.EXPIRE,
            data={"expires_at": row.expires_at.isoformat() if row.expires_at else None},
        )
    except (InvalidTransition, ExecutionBusy):
        return False  # a payload moved the run meanwhile
    return True


# ---------------------------------------------------------------------------- kept payloads


def keep_delivery(
    execution_id: uuid.UUID | str,
    step: str | None,
    payload: Any,
    *,
    background: bool | None,
    reason: str = "",
) -> Outcome:
    """Keep a payload for an interrupt the run has not reached yet; it is applied when the run
    gets there (the first one kept wins), and ``InProgress`` is returned. Recorded in the
    steering history (who, ``reason``) when it is kept.

    ``step`` may be left out when the reactor declares one interrupt. The payload is validated
    now (InvalidPayload, not counted: nothing waits yet). Raises NotWaiting as before when the
    interrupt cannot be told, AlreadyResumed when a payload is already kept for it.
    """
    check_reason(reason, "resume")
    execution = store.get_row(execution_id)
    definition = registry.of_run(execution.reactor, execution.version).definition
    receives = {path for path, _topic in receive_paths(definition)}
    if step is None:
        paths = [path for path in interrupt_paths(definition) if path not in receives]
        if len(paths) != 1:
            raise NotWaiting(
                f"execution {execution.id} has not reached an interrupt (yet); name the step "
                "to have the payload kept until it does",
                status=execution.status,
            )
        step = paths[0]
    spec = spec_at(definition, step)
    if spec is None or spec.interrupt is None or step in receives:
        raise NotWaiting(
            f"execution {execution.id} has not reached {step!r} (yet)"
            + (
                "; it is a receive(): send() a message to its topic instead"
                if step in receives
                else ""
            ),
            status=execution.status,
        )
    accepted, errors = _validate_payload(spec.interrupt.payload, payload)
    if errors is not None:
        raise InvalidPayload(
            f"the payload for interrupt {step!r} is invalid: {summarise_errors(errors)}; "
            "nothing was kept",
            errors=errors,
            attempts=0,
            max_attempts=spec.interrupt.max_attempts,
            run_failed=False,
        )
    sent = store.messages.send(
        execution.id,
        step,
        accepted,
        kind=MessageKind.DELIVERY,
        secret_paths=spec.secret_result_paths,
        steering=audit.steering("resume", reason=reason, detail={"step": step}).on(
            execution.id, execution.reactor
        ),
    )
    if sent.reached is not None:  # the run reached it meanwhile
        return deliver(sent.reached, payload, background=background, reason=reason)
    return InProgress(execution_id=execution.id, status=sent.status)


def spec_at(definition: ReactorDefinition, path: str) -> StepSpec | None:
    """The step at ``path`` (``"approval"``, ``"checkout.approval"``) of ``definition``."""
    head, _, rest = path.partition(".")
    spec = definition.by_name.get(head)
    if not rest or spec is None:
        return spec
    return spec_at(spec.child.definition, rest) if spec.child is not None else None


def deliver_kept(execution_id: uuid.UUID, *, background: bool | None = None) -> Outcome | None:
    """Give the run's waiting interrupts what its mailbox keeps for them: an early delivery,
    or, for a ``receive`` (a ``wait_for_event``), the first unread message of its topic (event
    given to it) the serializer accepts (the ones it refuses are marked invalid and skipped).

    Returns how the run went on when a payload moved it (``Dispatched``, or the outcome of the
    rest run inline per the interrupt's ``resume=``); None when nothing moved it.
    """
    for row in store.interrupts.waiting(execution_id):
        spec = _definition_of_interrupt(row).by_name.get(row.step)
        if spec is None or spec.interrupt is None:
            continue
        path = store.interrupts.path_of(row)
        topic = spec.interrupt.topic
        delivered = topic is None and spec.interrupt.event is None
        if spec.interrupt.event is not None:  # the events given to this wait
            kept = store.messages.unread(execution_id, topic=path, kind=MessageKind.EVENT)
        elif topic is None:
            kept = store.messages.unread(execution_id, topic=path, kind=MessageKind.DELIVERY)
        else:
            kept = store.messages.unread(execution_id, topic=topic, kind=MessageKind.MESSAGE)
        for message in kept:
            if delivered:
                accepted = encode(decode(message.payload))  # validated when it was kept
            else:
                accepted, errors = _validate_payload(
                    spec.interrupt.payload, decode(message.payload), any_json=True
                )
                if errors is not None:
                    store.messages.refuse(message, errors, top_id=execution_id, step=path)
                    continue
            in_background = (
                background if background is not None else row.resume_mode == "background"
            )
            if not in_background and store.inside_user_transaction():
                in_background = True
            try:
                claim = store.messages.consume(
                    message,
                    row,
                    accepted,
                    step=path,
                    inline_owner=None if in_background else store.lease_owner_token(),
                    secret_paths=spec.secret_result_paths,
                )
            except store.messages.MessageTaken:
                continue
            except InvalidTransition:  # another payload won, the interrupt or the run closed
                break
            if claim.dispatched:
                return Dispatched(execution_id=execution_id)
            if claim.owned is not None:
                top = _definition_of(store.get_row(execution_id))
                return _continue_inline(top, claim.owned)
            break  # the run is moving: it records the payload when it next pauses
    return None


def give_event(
    row: Interrupt, payload: Any, idempotency_key: str, *, background: bool | None = None
) -> tuple[uuid.UUID | None, Outcome | None]:
    """Give an event's ``payload`` (stored JSON) to the ``wait_for_event`` waiting at ``row``:
    kept in its run's mailbox as taken by the step, and the step's payload, in one transaction
    (a payload its serializer refuses is kept in the mailbox and refused there, as
    :func:`deliver_kept` does). Returns the run given it (None: it ended, or had the event
    already) and how it went on (None: it was moving, and takes it when it next pauses).
    """
    where = store.interrupts.nesting(row)
    definition = registry.of_run(where.reactor, where.version).definition
    spec = spec_at(definition, where.path)
    if spec is None or spec.interrupt is None:
        return None, None
    accepted, errors = _validate_payload(spec.interrupt.payload, decode(payload), any_json=True)
    if errors is not None:
        sent = store.messages.send(
            where.top_id,
            where.path,
            payload,
            kind=MessageKind.EVENT,
            idempotency_key=idempotency_key,
        )
        return (None, None) if sent.replay else (where.top_id, deliver_kept(where.top_id))
    in_background = background if background is not None else row.resume_mode == "background"
    if not in_background and store.inside_user_transaction():
        in_background = True
    taken = store.messages.give(
        row,
        where.top_id,
        where.path,
        accepted,
        kind=MessageKind.EVENT,
        idempotency_key=idempotency_key,
        inline_owner=None if in_background else store.lease_owner_token(),
        secret_paths=spec.secret_result_paths,
    )
    if taken is None:
        return None, None
    if taken.kept:  # behind earlier events for the step: the earliest first
        return where.top_id, deliver_kept(where.top_id, background=background)
    claim = taken.claim
    assert claim is not None
    if claim.dispatched:
        return where.top_id, Dispatched(execution_id=where.top_id)
    if claim.owned is not None:
        return where.top_id, _continue_inline(definition, claim.owned)
    return where.top_id, None


def deliver_kept_messages(limit: int | None = None) -> int:
    """For the sweeper: give paused runs what their mailboxes keep for them (a run whose
    process stopped between its pause and its look); return how many runs went on."""
    moved = 0
    for execution_id in store.messages.paused_with_unread(limit or reactor_settings.SWEEP_BATCH):
        try:
            if deliver_kept(execution_id, background=True) is not None:
                moved += 1
        except (ExecutionBusy, ReactorNotRegistered, DefinitionChanged) as exc:
            logger.warning("could not deliver the messages kept for %s: %s", execution_id, exc)
    return moved
