"""Statuses shared by the engine and the models, and the legal execution transitions."""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _


class ExecutionStatus(models.TextChoices):
    """Where one saga run stands."""

    # Created, not started yet (background runs waiting for a worker).
    PENDING = "pending", _("Pending")
    # Created to start later (run(..., at=...) or delay=...): a worker starts it then.
    SCHEDULED = "scheduled", _("Scheduled")
    # A process owns the run and is executing steps.
    RUNNING = "running", _("Running")
    # Waiting at an interrupt for an external payload.
    PAUSED = "paused", _("Paused")
    # Every step finished; the value is stored.
    COMPLETED = "completed", _("Completed")
    # A step failed and the completed steps were rolled back.
    FAILED = "failed", _("Failed")
    # A step halted the run cleanly; nothing was rolled back.
    HALTED = "halted", _("Halted")
    # Stopped by an operator (after an undo, or without rollback).
    CANCELLED = "cancelled", _("Cancelled")
    # The process was interrupted (SIGTERM, Ctrl-C); completed steps wait for undo().
    ABORTED = "aborted", _("Aborted")
    # Completed steps are being undone.
    ROLLING_BACK = "rolling_back", _("Rolling back")
    # A poison run or a rollback that failed: a person must look at it.
    NEEDS_ATTENTION = "needs_attention", _("Needs attention")
    # Stopped between steps by an operator's pause (of the run or of its reactor): it holds
    # no worker and goes on where it stopped when it is unpaused. ("Paused" has meant waiting
    # at an interrupt since the first release.)
    SUSPENDED = "suspended", _("Suspended")
    # Over its reactor's concurrency limit for its key (Meta.concurrency): it holds no worker
    # and becomes pending, in arrival order within its key, when a run of the key ends.
    QUEUED = "queued", _("Queued")


#: Statuses a run leaves by itself: a worker (or the sweeper) takes it further.
MOVING_STATUSES = frozenset(
    {
        ExecutionStatus.PENDING,
        ExecutionStatus.SCHEDULED,
        ExecutionStatus.RUNNING,
        ExecutionStatus.ROLLING_BACK,
    }
)

#: Statuses ``ExecutionHandle.wait()`` (and ``await_outcome()``) wait through: the run moves on
#: by itself (``queued``: once its concurrency key has room).
WAITED_THROUGH = MOVING_STATUSES | {ExecutionStatus.QUEUED}

#: Statuses of a run that has started its life and not ended it: counted as in flight (the
#: health figures) and as holding its concurrency key's slot (``queued`` runs wait for one).
IN_FLIGHT_STATUSES = (
    ExecutionStatus.PENDING,
    ExecutionStatus.SCHEDULED,
    ExecutionStatus.RUNNING,
    ExecutionStatus.PAUSED,
    ExecutionStatus.ROLLING_BACK,
    ExecutionStatus.SUSPENDED,
)

TERMINAL_STATUSES = frozenset(
    {
        ExecutionStatus.COMPLETED,
        ExecutionStatus.FAILED,
        ExecutionStatus.HALTED,
        ExecutionStatus.CANCELLED,
    }
)

# The one table of legal status changes. Services and the store refuse anything else.
TRANSITIONS: dict[str, frozenset[str]] = {
    ExecutionStatus.SCHEDULED: frozenset(
        {
            # Its start time came (or an operator started it now).
            ExecutionStatus.RUNNING,
            ExecutionStatus.CANCELLED,
            # Its deadline passed before it started.
            ExecutionStatus.FAILED,
            ExecutionStatus.HALTED,
            ExecutionStatus.NEEDS_ATTENTION,
            # Paused before it started.
            ExecutionStatus.SUSPENDED,
        }
    ),
    ExecutionStatus.PENDING: frozenset(
        {
            ExecutionStatus.RUNNING,
            ExecutionStatus.FAILED,
            ExecutionStatus.CANCELLED,
            # The reactor class is gone or its definition changed under the run.
            ExecutionStatus.NEEDS_ATTENTION,
            # Paused while nobody ran it (waiting for a worker, a wake-up, a retry's backoff).
            ExecutionStatus.SUSPENDED,
        }
    ),
    ExecutionStatus.RUNNING: frozenset(
        {
            ExecutionStatus.RUNNING,
            # Handed off to a worker, or waiting for a retry's wake-up time.
            ExecutionStatus.PENDING,
            ExecutionStatus.PAUSED,
            ExecutionStatus.COMPLETED,
            ExecutionStatus.FAILED,
            ExecutionStatus.HALTED,
            ExecutionStatus.CANCELLED,
            ExecutionStatus.ABORTED,
            ExecutionStatus.ROLLING_BACK,
            ExecutionStatus.NEEDS_ATTENTION,
            # A pause found at a step boundary.
            ExecutionStatus.SUSPENDED,
        }
    ),
    ExecutionStatus.PAUSED: frozenset(
        {
            # Resumed inline by the caller that delivered the payload, or handed to a worker.
            ExecutionStatus.RUNNING,
            ExecutionStatus.PENDING,
            ExecutionStatus.CANCELLED,
            # Undone, failed by too many invalid payloads, or by an expired interrupt.
            ExecutionStatus.ROLLING_BACK,
        }
    ),
    ExecutionStatus.COMPLETED: frozenset({ExecutionStatus.ROLLING_BACK}),
    ExecutionStatus.HALTED: frozenset({ExecutionStatus.ROLLING_BACK}),
    ExecutionStatus.ABORTED: frozenset({ExecutionStatus.ROLLING_BACK, ExecutionStatus.CANCELLED}),
    ExecutionStatus.ROLLING_BACK: frozenset(
        {
            # An operator may take over a rollback whose process died (its lease expired).
            ExecutionStatus.ROLLING_BACK,
            ExecutionStatus.FAILED,
            ExecutionStatus.CANCELLED,
            ExecutionStatus.ABORTED,
            ExecutionStatus.NEEDS_ATTENTION,
        }
    ),
    ExecutionStatus.NEEDS_ATTENTION: frozenset(
        {
            ExecutionStatus.ROLLING_BACK,
            ExecutionStatus.CANCELLED,
            # Parked definition_changed, then migrated onto the code's definition
            # (reactor_migrate): a worker takes it again.
            ExecutionStatus.PENDING,
        }
    ),
    ExecutionStatus.SUSPENDED: frozenset(
        {
            # Unpaused: a worker takes it (at its wake-up time, when it has one).
            ExecutionStatus.PENDING,
            ExecutionStatus.CANCELLED,
            # Undone, or stopped at its deadline.
            ExecutionStatus.ROLLING_BACK,
            ExecutionStatus.RUNNING,
        }
    ),
    ExecutionStatus.QUEUED: frozenset(
        {
            # Admitted: a run of its key ended (a worker takes it now).
            ExecutionStatus.PENDING,
            ExecutionStatus.CANCELLED,
            # Its deadline passed while it waited.
            ExecutionStatus.FAILED,
            ExecutionStatus.HALTED,
        }
    ),
    ExecutionStatus.FAILED: frozenset(),
    ExecutionStatus.CANCELLED: frozenset({ExecutionStatus.ROLLING_BACK}),
}


def can_transition(current: str, new: str) -> bool:
    """Return True when a run may move from ``current`` to ``new``."""
    return new in TRANSITIONS.get(current, frozenset())


def sources_of(new: str) -> frozenset[str]:
    """Every status from which a run may move to ``new``."""
    return frozenset(s for s, targets in TRANSITIONS.items() if new in targets)


def is_terminal(status: str) -> bool:
    """Return True for statuses a run never leaves on its own."""
    return status in TERMINAL_STATUSES


class StepStatus(models.TextChoices):
    """The forward outcome of one step in one run."""

    # The step's body returned Success (or a plain value).
    COMPLETED = "completed", _("Completed")
    # The step returned Skip: it did nothing and is never undone.
    SKIPPED = "skipped", _("Skipped")
    # The step returned Halt: the run stopped cleanly here.
    HALTED = "halted", _("Halted")
    # The step failed after its last attempt (or before it could start).
    FAILED = "failed", _("Failed")
    # An async unit handed to workers; its outcome lives in its own execution.
    DISPATCHED = "dispatched", _("Dispatched")
    # An interrupt reached: the run waits for its payload.
    WAITING = "waiting", _("Waiting for a payload")
    # An interrupt's payload was accepted; the run has not recorded it as the step's result yet.
    RESUMED = "resumed", _("Payload accepted")
    # A sleep() or sleep_until() reached: the run waits until the time its result holds.
    SLEEPING = "sleeping", _("Sleeping")


class RollbackStatus(models.TextChoices):
    """What rollback did to one step."""

    # Nothing yet (or nothing to do).
    NONE = "", _("None")
    # undo() ran and succeeded.
    UNDONE = "undone", _("Undone")
    # compensate() ran and succeeded.
    COMPENSATED = "compensated", _("Compensated")
    # The step has no undo/compensate; nothing ran.
    NO_HANDLER = "no_handler", _("No handler")
    # undo() or compensate() raised or returned Failure; see the rollback error.
    FAILED = "failed", _("Rollback failed")
    # A fork of the run took the step over (its result carried, its undo the fork's): this
    # run never undoes it.
    CARRIED = "carried", _("Carried into a fork")


class EventKind(models.TextChoices):
    """Entries of the append-only execution trace."""

    START = "start", _("Run started")
    RUN = "run", _("Step ran")
    RETRY = "retry", _("Step attempt failed, retrying")
    FAIL = "fail", _("Failed")
    SKIP = "skip", _("Step skipped")
    HALT = "halt", _("Halted")
    COMPENSATE = "compensate", _("Step compensated")
    COMPENSATE_FAILED = "compensate_failed", _("Compensation failed")
    COMPENSATE_SKIPPED = "compensate_skipped", _("No compensation defined")
    UNDO = "undo", _("Step undone")
    UNDO_FAILED = "undo_failed", _("Undo failed")
    UNDO_SKIPPED = "undo_skipped", _("No undo defined")
    COMPLETE = "complete", _("Run completed")
    ABORT = "abort", _("Run aborted")
    HAND_BACK = "hand_back", _("Worker interrupted, run handed back")
    CANCEL = "cancel", _("Run cancelled")
    ROLLBACK = "rollback", _("Rollback started")
    RERUN = "rerun", _("Run retried as a new execution")
    HANDOFF = "handoff", _("Handed off to a worker")
    RESUME = "resume", _("Resumed by a worker")
    ATTENTION = "attention", _("Needs attention")
    DISPATCH = "dispatch", _("Async unit dispatched")
    PARK = "park", _("Waiting for an async result")
    INTERRUPT = "interrupt", _("Interrupt reached")
    PAUSE = "pause", _("Paused for a payload")
    PAYLOAD = "payload", _("Payload accepted")
    INVALID_PAYLOAD = "invalid_payload", _("Invalid payload refused")
    EXPIRE = "expire", _("Interrupt expired")
    MAP = "map", _("Map elements started")
    ACQUIRE = "acquire", _("Coordination acquired")
    LAUNCH = "launch", _("Steps started side by side")
    SLEEP = "sleep", _("Sleeping until a time")
    DEADLINE = "deadline", _("Deadline passed")
    TIMEOUT = "timeout", _("Step attempt timed out")
    RECONNECT = "reconnect", _("Connection lost, attempt run again")
    SUSPEND = "suspend", _("Suspended by a pause")
    UNPAUSE = "unpause", _("Unpaused")
    FORK = "fork", _("Forked as a new run")
    # A step returned ContinueAsNew: the run completed and its successor was created with it.
    CONTINUE = "continue", _("Continued as a new run")
    # Over its concurrency limit: queued behind the runs in flight with its key, then admitted.
    QUEUE = "queue", _("Queued for its concurrency key")
    ADMIT = "admit", _("Admitted by its concurrency key")
    THROTTLE = "throttle", _("Delayed by its throttle")
    DEBOUNCE = "debounce", _("Start collapsed into the run waiting for its debounce key")
    BATCH = "batch", _("Start added to the run collecting its batch key's items")
    # An operator's action that changes the run without an entry of its own (wake now, a
    # payload delivered to a paused run): ``data["action"]``, with ``by``, ``via``, ``reason``.
    STEER = "steer", _("Steered")


class MessageStatus(models.TextChoices):
    """Where one message of a run's mailbox stands."""

    # Kept: the run has not taken it yet.
    UNREAD = "unread", _("Unread")
    # Taken by a step (a ``receive``, or the interrupt it was delivered to), exactly once.
    CONSUMED = "consumed", _("Consumed")
    # Refused by the serializer of the ``receive`` that took it; skipped, with the errors.
    INVALID = "invalid", _("Invalid")


class MessageKind(models.TextChoices):
    """What a message of a run's mailbox is for."""

    # Sent with ``send()`` to a topic, taken by a ``receive(topic)`` step.
    MESSAGE = "message", _("Message")
    # A payload delivered to an interrupt the run had not reached yet; its topic is the path.
    DELIVERY = "delivery", _("Early delivery")
    # An event emitted with ``emit()`` that a ``wait_for_event`` of the run matched; its topic
    # is the waiting step's path.
    EVENT = "event", _("Event")


class InterruptStatus(models.TextChoices):
    """Where one interrupt of one run stands."""

    # Reached; the run waits for a payload.
    WAITING = "waiting", _("Waiting")
    # A valid payload was accepted (exactly one per interrupt).
    RESUMED = "resumed", _("Resumed")
    # The timeout passed before a payload came; ``on_timeout`` was applied.
    EXPIRED = "expired", _("Expired")
    # The run was cancelled or undone while it waited.
    CANCELLED = "cancelled", _("Cancelled")
    # Too many invalid payloads (``max_attempts``): the run was failed and rolled back.
    FAILED = "failed", _("Failed")


class MapStatus(models.TextChoices):
    """Where a map step's elements are."""

    #: The source is being read into element rows.
    MATERIALISING = "materialising", _("Reading the source")
    #: Elements are running (inline, or on workers).
    RUNNING = "running", _("Running elements")
    #: Every element settled; the map's run has taken (or will take) the outcome.
    SETTLED = "settled", _("Settled")
    #: Completed elements are being undone.
    ROLLING_BACK = "rolling_back", _("Rolling back elements")
    #: Every completed element was undone (or reported in rollback failures).
    ROLLED_BACK = "rolled_back", _("Rolled back")


class ElementStatus(models.TextChoices):
    """One map element's slot."""

    PENDING = "pending", _("Pending")
    RUNNING = "running", _("Running")
    SUCCEEDED = "succeeded", _("Succeeded")
    FAILED = "failed", _("Failed")
    HALTED = "halted", _("Halted")
    #: Never started: an atomic map stopped at an earlier failure.
    NOT_STARTED = "not_started", _("Not started")
    UNDOING = "undoing", _("Being undone")
    UNDONE = "undone", _("Undone")
    UNDO_FAILED = "undo_failed", _("Undo failed")


class CatchUp(models.TextChoices):
    """What a schedule does with ticks missed while nothing swept (downtime, a stopped beat)."""

    # Record the missed ticks as skipped; only ticks still to come fire.
    SKIP = "skip", _("Skip missed ticks")
    # One run for all the missed ticks, at the latest of them.
    ONCE = "once", _("Run once for the missed ticks")
    # One run per missed tick, the most recent ones up to SCHEDULE_CATCH_UP_LIMIT.
    ALL = "all", _("Run every missed tick")


class Overlap(models.TextChoices):
    """What a schedule's tick does while the schedule's previous run has not finished."""

    # Start another run anyway.
    ALLOW = "allow", _("Start another run")
    # Record the tick as skipped.
    SKIP = "skip", _("Skip the tick")
    # Keep the tick (at most one) and start it when the previous run finishes.
    QUEUE = "queue", _("Queue one tick")


class FireOutcome(models.TextChoices):
    """What became of one tick of a schedule (a ``ScheduleFire``)."""

    # A run was started for it.
    STARTED = "started", _("Run started")
    # It waits for the schedule's previous run to finish (overlap policy "queue").
    QUEUED = "queued", _("Queued")
    # No run: missed by the catch-up policy, or refused by the overlap policy.
    SKIPPED = "skipped", _("Skipped")
    # No run: the reactor refused the inputs, or is not known to the sweeper's code.
    REFUSED = "refused", _("Refused")
