"""Forks: a new run that takes over the records of the steps a stopped run completed before a
step, written in one transaction with what it changes in that run.

In the one transaction (the original's row locked): the plan is worked out from the records
as they are now (``engine.forks.plan_fork``); the original's carried records are marked
``carried`` (its own undo never undoes them again: they are the fork's now); the fork is
inserted, linked to the original (``retry_of``: a run is re-run at most once) with copies of
the carried records; and, when the original has effects past the cut to undo first, the
original is taken for that undo (rolling back, this process's lease) and the fork waits,
suspended under a pause that waits for the original (``Pause.waits_for``), released once the
undo has ended (by the caller, or the sweeper after a crash).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.utils import timezone

from ..engine.actors import Steering
from ..engine.forks import ForkPlan
from ..engine.journal import Event, RunRecords
from ..exceptions import AlreadyRetried, ExecutionNotFound, ForkNeedsUndo, InvalidTransition
from ..models import Execution, ExecutionEvent, Pause, StepRecord
from ..states import EventKind, ExecutionStatus, RollbackStatus
from . import audit, patches
from .claims import claim
from .db import using
from .executions import create_execution, find_retry
from .reads import last_seq, run_records
from .rows import Owned, route_of_row


@dataclass(frozen=True, slots=True)
class Forked:
    """What :func:`create_fork` wrote: the fork (``fork``: owned by this process when it runs
    it now), the plan it followed, and the original taken for its undo (None: nothing to
    undo)."""

    fork_id: uuid.UUID
    fork: Owned | None
    plan: ForkPlan
    original: Owned | None


def create_fork(
    original_id: uuid.UUID,
    *,
    plan_of: Callable[[RunRecords], ForkPlan],
    forkable: tuple[str, ...],
    undo_abandoned: bool,
    definition_hash: str,
    version: str,
    definition_shape: Mapping[str, object],
    inputs: Any,
    secret_paths: Any,
    subject: str,
    next_step: Callable[[frozenset[str]], str],
    background: bool,
    owner: str,
    steering: Steering,
) -> Forked:
    """Fork the run ``original_id`` as the plan ``plan_of`` its records says (see the module).

    Raises InvalidTransition (its status is not in ``forkable``, or another process owns it),
    AlreadyRetried (it was re-run already) and ForkNeedsUndo (it has effects past the cut and
    ``undo_abandoned`` is false), writing nothing. ``steering`` (who, why) goes on the trace
    entries and into the steering history, in the same transaction.
    """
    now = timezone.now()
    with transaction.atomic(using=using()):
        row = Execution.objects.using(using()).select_for_update().filter(pk=original_id).first()
        if row is None:
            raise ExecutionNotFound(f"no execution with id {original_id}")
        if row.status not in forkable:
            raise InvalidTransition(
                f"cannot fork execution {row.id}: it is {row.status}; fork works on runs that "
                f"ended ({', '.join(forkable)}): cancel or undo it first",
                status=row.status,
            )
        retried_as = find_retry(row.id)
        if retried_as is not None:
            raise AlreadyRetried(
                f"execution {row.id} was re-run already as {retried_as}; fork that one instead",
                retry_id=retried_as,
            )
        records = run_records(row)
        plan = plan_of(records)
        if plan.needs_undo and not undo_abandoned:
            raise ForkNeedsUndo(needs_undo_message(row.id, plan), plan=plan, status=row.status)
        original = (
            claim(
                row.id,
                allowed=[row.status],
                new_status=ExecutionStatus.ROLLING_BACK,
                owner=owner,
                action="fork",
            )
            if plan.needs_undo
            else None
        )
        carried = [r for r in records.steps if r.step in set(plan.carried)]
        StepRecord.objects.using(using()).filter(execution_id=row.id, step__in=plan.carried).update(
            rollback=RollbackStatus.CARRIED, rolled_back_at=now
        )
        waits = plan.needs_undo
        runs_here = not background and not waits
        # The carried records keep their order, before anything the fork writes.
        first = len(carried) + 1
        start = Event(
            first,
            EventKind.START,
            now,
            data={
                "forked_from": str(row.id),
                "fork_step": plan.from_step,
                "carried": list(plan.carried),
                **steering.trace_data(),
            },
        )
        events = [start]
        if waits:
            events.append(
                Event(
                    first + 1,
                    EventKind.SUSPEND,
                    now,
                    data={"reason": waiting_reason(row.id, plan), "waits_for": str(row.id)},
                )
            )
        with transaction.atomic(using=using()):  # a retry racing in: AlreadyRetried
            fork = create_execution(
                reactor=row.reactor,
                definition_hash=definition_hash,
                version=version,
                definition_shape=definition_shape,
                inputs=inputs,
                secret_paths=secret_paths,
                subject=subject,
                status=ExecutionStatus.SUSPENDED
                if waits
                else ExecutionStatus.RUNNING
                if runs_here
                else ExecutionStatus.PENDING,
                owner=owner if runs_here else None,
                dispatch="start" if background and not waits else None,
                retry_of=row.id,
                current_step=next_step(frozenset(plan.carried)),
                deadline_at=None,
                events=events,
                fork_step=plan.from_step,
                route=route_of_row(row),
            )
        StepRecord.objects.using(using()).bulk_create(
            [_copy(fork.execution_id, row.id, r.step, seq) for seq, r in enumerate(carried, 1)]
        )
        patches.copy_to_fork(row.id, fork.execution_id, plan.carried)
        if waits:
            Pause.objects.using(using()).create(
                reactor=row.reactor,
                execution_id=fork.execution_id,
                reason=waiting_reason(row.id, plan),
                paused_by=steering.actor.who,
                waits_for_id=row.id,
            )
        ExecutionEvent.objects.using(using()).create(
            execution_id=row.id,
            seq=last_seq(row.id) + 1,
            kind=EventKind.FORK,
            at=now,
            data={
                "forked_as": str(fork.execution_id),
                **plan.as_dict(),
                **steering.trace_data(),
            },
        )
        audit.write(
            steering.on(row.id, row.reactor),
            forked_as=str(fork.execution_id),
            **plan.as_dict(),
        )
    return Forked(fork.execution_id, fork if runs_here else None, plan, original)


def _copy(fork_id: uuid.UUID, original_id: uuid.UUID, step: str, seq: int) -> StepRecord:
    """The fork's copy of one carried record (sealed values as they are: same subject)."""
    source = StepRecord.objects.using(using()).get(execution_id=original_id, step=step)
    return StepRecord(
        execution_id=fork_id,
        step=step,
        status=source.status,
        seq=seq,
        attempts=source.attempts,
        arguments=source.arguments,
        secret_arguments=source.secret_arguments,
        result=source.result,
        error=None,
        compensable=False,
        rollback=RollbackStatus.NONE,
        started_at=source.started_at,
        finished_at=source.finished_at,
        traced=False,
        duration_ms=source.duration_ms,
    )


def needs_undo_message(original_id: uuid.UUID, plan: ForkPlan) -> str:
    return (
        f"forking execution {original_id} from {plan.from_step!r} abandons completed steps "
        f"whose effects stand: {', '.join(plan.undo)} (undone in this order, newest first, "
        "before the fork runs); fork again with undo_abandoned=True to undo them"
    )


def waiting_reason(original_id: uuid.UUID, plan: ForkPlan) -> str:
    return (
        f"waiting until execution {original_id} has undone its abandoned branch "
        f"({', '.join(plan.undo)})"
    )


def take_waiting_fork(fork_id: uuid.UUID, owner: str) -> Owned:
    """Take a fork whose original has ended its undo, to run it in this process."""
    with transaction.atomic(using=using()):
        Pause.objects.using(using()).filter(execution_id=fork_id, waits_for__isnull=False).delete()
        return claim(
            fork_id,
            allowed=[ExecutionStatus.SUSPENDED],
            new_status=ExecutionStatus.RUNNING,
            owner=owner,
            action="run the fork",
        )


def waiting_forks(limit: int) -> list[uuid.UUID]:
    """Forks still waiting for an original that has ended the undo of its abandoned branch
    (the sweeper releases them: the process that forked them stopped before it could)."""
    return list(
        Pause.objects.using(using())
        .filter(waits_for__isnull=False, waits_for__status__in=RELEASING)
        .values_list("execution_id", flat=True)[:limit]
    )


#: An original's status once the undo of its abandoned branch has ended cleanly: its fork may
#: go on. One whose undo failed (needs attention) keeps its fork waiting for a person.
RELEASING = (ExecutionStatus.CANCELLED, ExecutionStatus.FAILED)


def fork_release_due(original_status: str) -> bool:
    """Whether a fork may go on once its original is ``original_status`` (see
    :data:`RELEASING`)."""
    return original_status in RELEASING
