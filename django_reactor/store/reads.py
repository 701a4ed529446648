"""Reading runs back: rows by id, a run's step records and trace, and the engine's state
rebuilt from them."""

from __future__ import annotations

import json
import uuid
from typing import Any

from django.db import connections

from ..engine.executor import PendingCompensation, RunState, UndoEntry
from ..engine.outcomes import ErrorInfo, ErrorKind
from ..engine.serialization import decode
from ..exceptions import ExecutionNotFound, StoredValueUnreadable
from ..models import Definition, Execution, ExecutionEvent, StepRecord
from ..states import EventKind, ExecutionStatus, RollbackStatus, StepStatus
from . import sql
from .db import USING, db_id
from .rows import StepRow


def parse_id(execution_id: uuid.UUID | str) -> uuid.UUID:
    """An execution id as a UUID; raises ExecutionNotFound for anything else."""
    try:
        return execution_id if isinstance(execution_id, uuid.UUID) else uuid.UUID(str(execution_id))
    except ValueError:
        raise ExecutionNotFound(
            f"{execution_id!r} is not an execution id (expected a UUID such as "
            f"'{uuid.UUID(int=0)}')"
        ) from None


def ids_starting_with(prefix: str, *, limit: int = 2) -> list[uuid.UUID]:
    """Execution ids whose hex digits start with ``prefix`` (lowercase hex, no dashes), at
    most ``limit`` of them, in order: a range of the primary key, served by its index."""
    low = uuid.UUID(prefix.ljust(32, "0"))
    high = uuid.UUID(prefix.ljust(32, "f"))
    return list(
        Execution.objects.using(USING)
        .filter(pk__gte=low, pk__lte=high)
        .order_by("pk")
        .values_list("pk", flat=True)[:limit]
    )


def get_row(execution_id: uuid.UUID | str) -> Execution:
    """The execution row; raises ExecutionNotFound with the id in the message."""
    key = parse_id(execution_id)
    try:
        return Execution.objects.using(USING).get(pk=key)
    except Execution.DoesNotExist:
        raise ExecutionNotFound(f"no execution with id {key}") from None


def status_of(execution_id: uuid.UUID) -> str | None:
    """The run's status (one primary-key read), or None when there is no such run."""
    return (
        Execution.objects.using(USING)
        .filter(pk=execution_id)
        .values_list("status", flat=True)
        .first()
    )


def execution_exists(execution_id: uuid.UUID) -> bool:
    return Execution.objects.using(USING).filter(pk=execution_id).exists()


def find_child(parent_id: uuid.UUID, step: str) -> Execution | None:
    """The composed child a parent's step started, if any."""
    return Execution.objects.using(USING).filter(parent_id=parent_id, parent_step=step).first()


def find_retry(execution_id: uuid.UUID) -> uuid.UUID | None:
    return (
        Execution.objects.using(USING)
        .filter(retry_of_id=execution_id)
        .values_list("id", flat=True)
        .first()
    )


def step_rows(execution_id: uuid.UUID) -> list[StepRow]:
    """A run's step records in completion order (raw SQL: this runs on every resume)."""
    records = StepRecord.objects.using(USING).raw(sql.STEP_ROWS, [db_id(execution_id)])
    return [StepRow.from_model(record) for record in records]


def event_rows(execution_id: uuid.UUID) -> list[ExecutionEvent]:
    """A run's trace in sequence order (with the entries its step records stand for)."""
    return list(ExecutionEvent.objects.using(USING).raw(sql.TRACE, {"id": db_id(execution_id)}))


def last_seq(execution_id: uuid.UUID) -> int:
    """The highest trace sequence number of a run (0 for none)."""
    with connections[USING].cursor() as cursor:
        cursor.execute(sql.LAST_SEQ, {"id": db_id(execution_id)})
        row = cursor.fetchone()
    return int(row[0] or 0)


def load_state(execution_id: uuid.UUID) -> RunState:
    """Rebuild what a run has done from its step records, for undo (and later resume)."""
    state = RunState()
    for row in step_rows(execution_id):
        _fold_step(state, row)
    state.next_seq = last_seq(execution_id) + 1
    return state


def _fold_step(state: RunState, row: StepRow) -> None:
    state.recorded.add(row.step)
    arguments = decode(row.arguments)
    if row.status in (StepStatus.COMPLETED, StepStatus.SKIPPED):
        value = decode(row.result)
        state.results[row.step] = value
        state.done.add(row.step)
        if row.status == StepStatus.COMPLETED and row.rollback in (
            RollbackStatus.NONE,
            RollbackStatus.FAILED,
        ):
            state.undo_stack.append(UndoEntry(row.step, arguments, value))
    elif row.status == StepStatus.DISPATCHED:
        state.done.add(row.step)
        state.units.add(row.step)
    elif row.status == StepStatus.WAITING:
        state.waiting.add(row.step)
        if row.compensable and row.rollback in (RollbackStatus.NONE, RollbackStatus.FAILED):
            # A composed child paused at an interrupt: the child's rollback undoes what it
            # completed, in the step's place among the completed steps.
            state.undo_stack.append(UndoEntry(row.step, arguments, None))
    elif row.status == StepStatus.RESUMED:
        state.waiting.add(row.step)
        state.claimed[row.step] = decode(row.result)
    elif row.status == StepStatus.SLEEPING:
        state.sleeping[row.step] = str(decode(row.result))
    elif (
        row.status == StepStatus.FAILED
        and row.compensable
        and row.rollback in (RollbackStatus.NONE, RollbackStatus.FAILED)
    ):
        error = ErrorInfo.from_dict(row.error or {"kind": "step", "message": ""})
        state.pending_compensation.append(PendingCompensation(row.step, arguments, error))


def resume_state(row: Execution) -> RunState:
    """What a run has done, plus the attempts its current step already made (a retry waiting).

    A row from the worker's claim on PostgreSQL carries its step records and last trace
    sequence number already (read by the claim statement); any other row is read here.
    """
    claimed = getattr(row, "claimed_steps", None)
    if claimed is None:
        state = load_state(row.id)
    else:
        state = RunState()
        for item in json.loads(claimed) if isinstance(claimed, (str, bytes)) else claimed:
            _fold_step(state, StepRow(**item))
        state.next_seq = int(row.claimed_last_seq) + 1  # type: ignore[attr-defined]
    if row.current_attempt and row.current_step:
        state.attempts_done[row.current_step] = row.current_attempt
        # Steps that ran side by side may have parked for their retries together: the
        # attempts each made are in its retry entries.
        state.attempts_done.update(retry_attempts(row.id, exclude=state.done))
    return state


def retry_attempts(execution_id: uuid.UUID, *, exclude: set[str]) -> dict[str, int]:
    """The attempts made so far by each step of a run that recorded retries and is not done."""
    attempts: dict[str, int] = {}
    rows = (
        ExecutionEvent.objects.using(USING)
        .filter(execution_id=execution_id, kind=EventKind.RETRY)
        .exclude(step__in=exclude)
        .values_list("step", "attempt")
    )
    for step, attempt in rows:
        attempts[step] = max(attempts.get(step, 0), attempt)
    return attempts


def launched_steps(execution_id: uuid.UUID) -> list[str]:
    """Every step a ``launch`` entry of the run names (steps started side by side)."""
    names: list[str] = []
    for data in (
        ExecutionEvent.objects.using(USING)
        .filter(execution_id=execution_id, kind=EventKind.LAUNCH)
        .order_by("seq")
        .values_list("data", flat=True)
    ):
        steps = data.get("steps") if isinstance(data, dict) else None
        for name in steps if isinstance(steps, list) else ():
            if isinstance(name, str) and name not in names:
                names.append(name)
    return names


def stored_shape(row: Execution, *, strict: bool = True) -> dict[str, dict[str, Any]]:
    """The definition shape a run started under (see ``ReactorDefinition.shape``); empty when
    none was kept (a run refused at its inputs, or recorded before shapes were kept).

    Raises StoredValueUnreadable when the stored value is not a shape: an object mapping each
    step name to an object (``{"impl": "<dotted path>", "depends_on": [...]}``); with
    ``strict=False`` (for display) such a shape reads as empty instead.
    """
    shape = _kept_shape(row)
    if shape is None:
        return {}
    try:
        return _checked_shape(shape)
    except StoredValueUnreadable:
        if strict:
            raise
        return {}


def _checked_shape(shape: Any) -> dict[str, dict[str, Any]]:
    if not isinstance(shape, dict):
        raise StoredValueUnreadable(
            f"the stored definition shape is a {type(shape).__name__}, not an object of steps"
        )
    for name, entry in shape.items():
        if not isinstance(entry, dict):
            raise StoredValueUnreadable(
                f"the stored definition shape of step {name!r} is {ascii(entry)[:80]}, not an "
                'object such as {"impl": "<dotted path>", "depends_on": [<step names>]}'
            )
    return shape


def _kept_shape(row: Execution) -> Any:
    """The shape kept under the run's definition hash (the worker's claim reads it with the
    row, as ``claimed_shape``)."""
    if hasattr(row, "claimed_shape"):
        shape = row.claimed_shape
        return json.loads(shape) if isinstance(shape, (str, bytes)) else shape
    return (
        Definition.objects.using(USING)
        .filter(hash=row.definition_hash)
        .values_list("shape", flat=True)
        .first()
    )


def coordination_state(execution_id: uuid.UUID) -> dict[str, Any]:
    """The run's coordination bookkeeping (see ``Execution.coordination``)."""
    found = (
        Execution.objects.using(USING)
        .filter(pk=execution_id)
        .values_list("coordination", flat=True)
        .first()
    )
    return dict(found or {})


def halted_steps(execution_id: uuid.UUID) -> list[str]:
    return list(
        StepRecord.objects.using(USING)
        .filter(execution_id=execution_id, status=StepStatus.HALTED)
        .values_list("step", flat=True)
    )


def cancelled_while_running(execution_id: uuid.UUID) -> bool:
    """Whether the run's last cancellation abandoned it while running (its process gone)."""
    data = (
        ExecutionEvent.objects.using(USING)
        .filter(execution_id=execution_id, kind=EventKind.CANCEL)
        .order_by("-seq")
        .values_list("data", flat=True)
        .first()
    )
    return isinstance(data, dict) and data.get("previous_status") in (
        ExecutionStatus.RUNNING,
        ExecutionStatus.ROLLING_BACK,
    )


def had_step_failure(execution_id: uuid.UUID) -> bool:
    """Whether a step of the run failed (an interrupted step does not count)."""
    for error in (
        StepRecord.objects.using(USING)
        .filter(execution_id=execution_id, status=StepStatus.FAILED)
        .values_list("error", flat=True)
    ):
        if not error or error.get("kind") != ErrorKind.INTERRUPTED:
            return True
    return False


def unfinished_descendants(execution_id: uuid.UUID) -> list[uuid.UUID]:
    """The run's children (composed children, async units, their own children...) that have
    not finished, parents before their children."""
    unfinished = [
        ExecutionStatus.PENDING,
        ExecutionStatus.SCHEDULED,
        ExecutionStatus.RUNNING,
        ExecutionStatus.PAUSED,
    ]
    found: list[uuid.UUID] = []
    level = [execution_id]
    while level:
        rows = list(
            Execution.objects.using(USING).filter(parent_id__in=level).values_list("id", "status")
        )
        found.extend(i for i, status in rows if status in unfinished)
        level = [i for i, _ in rows]
    return found
