"""Reading runs back: rows by id, a run's step records and trace, and what the journal holds
about a run (``run_records``), from which the engine restores its state. What a record means
is the engine's to say, never the store's."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from django.db import connections

from ..engine.journal import RecordedStep, RunRecords
from ..engine.routing import Route
from ..exceptions import ExecutionNotFound, StoredValueUnreadable
from ..models import Definition, Execution, ExecutionEvent, MapRun, StepRecord
from ..states import EventKind, ExecutionStatus
from . import sql
from .db import db_id, using


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
        Execution.objects.using(using())
        .filter(pk__gte=low, pk__lte=high)
        .order_by("pk")
        .values_list("pk", flat=True)[:limit]
    )


def get_row(execution_id: uuid.UUID | str) -> Execution:
    """The execution row; raises ExecutionNotFound with the id in the message."""
    key = parse_id(execution_id)
    try:
        return Execution.objects.using(using()).get(pk=key)
    except Execution.DoesNotExist:
        raise ExecutionNotFound(f"no execution with id {key}") from None


def status_of(execution_id: uuid.UUID) -> str | None:
    """The run's status (one primary-key read), or None when there is no such run."""
    return (
        Execution.objects.using(using())
        .filter(pk=execution_id)
        .values_list("status", flat=True)
        .first()
    )


def statuses_of(execution_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, str]:
    """The status of each of the runs ``execution_ids`` that exists, in one read."""
    return dict(
        Execution.objects.using(using())
        .filter(pk__in=list(execution_ids))
        .values_list("pk", "status")
    )


def subject_of(execution_id: uuid.UUID) -> str:
    """The run's subject (``Execution.subject``: whose key seals its secrets), ``""`` for none."""
    return str(
        Execution.objects.using(using())
        .filter(pk=execution_id)
        .values_list("subject", flat=True)
        .get()
    )


def route_of(execution_id: uuid.UUID) -> Route:
    """Where the run's tasks go and how urgent they are (``Execution.queue``, ``priority``)."""
    queue, priority = (
        Execution.objects.using(using())
        .filter(pk=execution_id)
        .values_list("queue", "priority")
        .get()
    )
    return Route(queue, priority)


def execution_exists(execution_id: uuid.UUID) -> bool:
    return Execution.objects.using(using()).filter(pk=execution_id).exists()


def find_child(parent_id: uuid.UUID, step: str) -> Execution | None:
    """The composed child a parent's step started, if any."""
    return Execution.objects.using(using()).filter(parent_id=parent_id, parent_step=step).first()


def find_retry(execution_id: uuid.UUID) -> uuid.UUID | None:
    return (
        Execution.objects.using(using())
        .filter(retry_of_id=execution_id)
        .values_list("id", flat=True)
        .first()
    )


def step_rows(execution_id: uuid.UUID) -> list[RecordedStep]:
    """A run's step records in completion order (raw SQL: this runs on every resume)."""
    records = StepRecord.objects.using(using()).raw(sql.STEP_ROWS, [db_id(execution_id)])
    return [recorded_step(record) for record in records]


def recorded_step(record: StepRecord) -> RecordedStep:
    """A ``StepRecord`` row as the journal's read half gives it."""
    return RecordedStep(
        step=record.step,
        status=record.status,
        arguments=record.arguments,
        result=record.result,
        error=record.error,
        compensable=record.compensable,
        rollback=record.rollback,
        attempts=record.attempts,
        seq=record.seq,
        secret_arguments=record.secret_arguments,
        rollback_error=record.rollback_error,
        started_at=record.started_at,
        finished_at=record.finished_at,
    )


def event_rows(execution_id: uuid.UUID) -> list[ExecutionEvent]:
    """A run's trace in sequence order (with the entries its step records stand for)."""
    return list(ExecutionEvent.objects.using(using()).raw(sql.TRACE, {"id": db_id(execution_id)}))


def last_seq(execution_id: uuid.UUID) -> int:
    """The highest trace sequence number of a run (0 for none)."""
    with connections[using()].cursor() as cursor:
        cursor.execute(sql.LAST_SEQ, {"id": db_id(execution_id)})
        row = cursor.fetchone()
    return int(row[0] or 0)


def run_records(
    run: Execution,
    *,
    steps: Sequence[RecordedStep] | None = None,
    seq: int | None = None,
    for_rollback: bool = False,
    taken_over: bool = False,
) -> RunRecords:
    """What the store holds about the run ``run`` (its row as read): its step records, last
    trace sequence number and cursor, for the engine's ``RunState.restore``.

    ``steps`` and ``seq``: read already (the worker's claim reads them with the row). With
    ``for_rollback``, and for a run rolling back, also what a rollback needs: the steps
    ``launch`` entries named, whether the cursor's step started a composed child or a map, and
    whether the last cancellation abandoned the run while it was running. ``taken_over``: the
    caller took the run over from a process that stopped mid-run (a worker's claim that counted
    a recovery): the steps ``launch`` entries named are read too (the steps it had in flight).
    """
    execution_id = run.id
    if steps is None:
        steps = step_rows(execution_id)
    nested: frozenset[str] = frozenset()
    launched: list[str] = []
    abandoned = False
    if taken_over:
        launched = launched_steps(execution_id)
    if for_rollback or run.status == ExecutionStatus.ROLLING_BACK:
        launched = launched if taken_over else launched_steps(execution_id)
        abandoned = cancelled_while_running(execution_id)
        cursor = run.current_step
        if (
            cursor
            and cursor not in {s.step for s in steps}
            and nested_work_started(execution_id, cursor)
        ):
            nested = frozenset([cursor])
    return RunRecords(
        steps=tuple(steps),
        last_seq=last_seq(execution_id) if seq is None else seq,
        status=run.status,
        current_step=run.current_step,
        current_attempt=run.current_attempt,
        failure=run.failure,
        retry_attempts=retry_attempts(execution_id) if run.current_attempt else {},
        launched=tuple(launched),
        nested_work=nested,
        cancelled_while_running=abandoned,
        taken_over=taken_over,
    )


def nested_work_started(execution_id: uuid.UUID, step: str) -> bool:
    """Whether the run's ``step`` started work of its own: a composed child or a map."""
    return (
        Execution.objects.using(using()).filter(parent_id=execution_id, parent_step=step).exists()
        or MapRun.objects.using(using()).filter(execution_id=execution_id, step=step).exists()
    )


def retry_attempts(execution_id: uuid.UUID) -> dict[str, int]:
    """The attempts each step of a run made so far, as its retry entries recorded them."""
    attempts: dict[str, int] = {}
    rows = (
        ExecutionEvent.objects.using(using())
        .filter(execution_id=execution_id, kind=EventKind.RETRY)
        .values_list("step", "attempt")
    )
    for step, attempt in rows:
        attempts[step] = max(attempts.get(step, 0), attempt)
    return attempts


def launched_steps(execution_id: uuid.UUID) -> list[str]:
    """Every step a ``launch`` entry of the run names (steps started side by side)."""
    names: list[str] = []
    for data in (
        ExecutionEvent.objects.using(using())
        .filter(execution_id=execution_id, kind=EventKind.LAUNCH)
        .order_by("seq")
        .values_list("data", flat=True)
    ):
        steps = data.get("steps") if isinstance(data, dict) else None
        for name in steps if isinstance(steps, list) else ():
            if isinstance(name, str) and name not in names:
                names.append(name)
    return names


def stored_shape(
    row: Execution, *, strict: bool = True, kept: Any = None
) -> dict[str, dict[str, Any]]:
    """The definition shape a run started under (see ``ReactorDefinition.shape``); empty when
    none was kept (a run refused at its inputs, or recorded before shapes were kept).
    ``kept``: the stored shape, read already (the worker's claim reads it with the row).

    Raises StoredValueUnreadable when the stored value is not a shape: an object mapping each
    step name to an object (``{"impl": "<dotted path>", "depends_on": [...]}``); with
    ``strict=False`` (for display) such a shape reads as empty instead.
    """
    shape = kept if kept is not None else _kept_shape(row)
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
    """The shape kept under the run's definition hash."""
    return (
        Definition.objects.using(using())
        .filter(hash=row.definition_hash)
        .values_list("shape", flat=True)
        .first()
    )


def coordination_state(execution_id: uuid.UUID) -> dict[str, Any]:
    """The run's coordination bookkeeping (see ``Execution.coordination``)."""
    found = (
        Execution.objects.using(using())
        .filter(pk=execution_id)
        .values_list("coordination", flat=True)
        .first()
    )
    return dict(found or {})


def cancelled_while_running(execution_id: uuid.UUID) -> bool:
    """Whether the run's last cancellation abandoned it while running (its process gone)."""
    data = (
        ExecutionEvent.objects.using(using())
        .filter(execution_id=execution_id, kind=EventKind.CANCEL)
        .order_by("-seq")
        .values_list("data", flat=True)
        .first()
    )
    return isinstance(data, dict) and data.get("previous_status") in (
        ExecutionStatus.RUNNING,
        ExecutionStatus.ROLLING_BACK,
    )


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
            Execution.objects.using(using()).filter(parent_id__in=level).values_list("id", "status")
        )
        found.extend(i for i, status in rows if status in unfinished)
        level = [i for i, _ in rows]
    return found
