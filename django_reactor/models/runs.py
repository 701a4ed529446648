"""The tables of runs: executions, their kept definitions, step records, trace entries,
dispatches (the outbox), interrupts and remembered API requests.

The database is the source of truth for every run. Rows are written by ``django_reactor.store``
on the engine's behalf; nothing else should change them.
"""

from __future__ import annotations

import uuid

from django.db import models
from django.db.models import Q
from django.utils.translation import gettext_lazy as _

from ..states import (
    EventKind,
    ExecutionStatus,
    InterruptStatus,
    RollbackStatus,
    StepStatus,
)
from .choices import max_length_of
from .routing import RoutedManager


class Execution(models.Model):
    """One run of a reactor."""

    id = models.UUIDField(_("id"), primary_key=True, default=uuid.uuid4, editable=False)
    reactor = models.CharField(
        _("reactor"), max_length=255, help_text=_("Registered name of the reactor class.")
    )
    definition_hash = models.CharField(
        _("definition hash"),
        max_length=64,
        help_text=_(
            "Fingerprint of the reactor's steps and edges when the run started; the steps "
            "themselves are kept once per fingerprint (see Definition)."
        ),
    )
    version = models.CharField(
        _("version"),
        max_length=64,
        blank=True,
        default="",
        db_default="",
        help_text=_(
            "The reactor's Meta.version the run started on; only code of that version runs "
            "it. Blank when the reactor declares none: its fingerprint is its version."
        ),
    )
    status = models.CharField(
        _("status"),
        max_length=max_length_of(ExecutionStatus),
        choices=ExecutionStatus.choices,
        default=ExecutionStatus.PENDING,
    )
    inputs = models.JSONField(
        _("inputs"),
        default=dict,
        help_text=_(
            "Validated inputs. Secret fields are stored sealed (encrypted) and redacted on display."
        ),
    )
    inputs_digest = models.CharField(
        _("inputs digest"),
        max_length=64,
        blank=True,
        default="",
        help_text=_("SHA-256 of the stored inputs: a reused idempotency key must match it."),
    )
    secret_paths = models.JSONField(
        _("secret input paths"),
        default=list,
        help_text=_("Paths into the inputs whose values are redacted wherever shown."),
    )
    subject = models.CharField(
        _("subject"),
        max_length=255,
        blank=True,
        default="",
        # Also the database's: code of the previous version inserts runs without it.
        db_default="",
        help_text=_(
            "Whose secrets the run holds (the reactor's Meta.subject): they are sealed with "
            "that subject's key, which reactor_forget_subject deletes. Empty: the configured "
            "keys seal them."
        ),
    )
    parent = models.ForeignKey(
        "self",
        verbose_name=_("parent"),
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="children",
        db_index=False,  # reactor_exec_child_uniq (parent, parent_step) serves lookups
    )
    root = models.ForeignKey(
        "self",
        verbose_name=_("root"),
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="descendants",
        db_index=False,  # reactor_exec_root_idx, for children only
    )
    detached = models.BooleanField(
        _("detached"),
        default=False,
        help_text=_(
            "A child dispatched to workers (async_step, async_reactor): it runs and recovers on "
            "its own, and its parent never undoes it."
        ),
    )
    parent_step = models.CharField(
        _("parent step"),
        max_length=255,
        blank=True,
        default="",
        help_text=_("For a composed child: the parent's step that runs it."),
    )
    retry_of = models.OneToOneField(
        "self",
        verbose_name=_("retry of"),
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="retried_as",
        help_text=_(
            "The execution this one re-runs: a retry, from the first step, or a fork, from "
            "its fork step. A run is re-run at most once (re-run the new one to go again)."
        ),
    )
    fork_step = models.CharField(
        _("forked from step"),
        max_length=255,
        blank=True,
        default="",
        db_default="",
        help_text=_(
            "For a fork: the step it ran again from, the steps before it carried from the run "
            "it re-runs (their results reused, their bodies not run again). Empty for a retry."
        ),
    )
    continued_from = models.OneToOneField(
        "self",
        verbose_name=_("continued from"),
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="continued_as",
        help_text=_(
            "The run this one continues: its last step returned ContinueAsNew, and this run was "
            "created with its final checkpoint. A run has at most one successor."
        ),
    )
    generation = models.PositiveIntegerField(
        _("generation"),
        default=0,
        db_default=0,
        help_text=_(
            "How many runs came before this one in its continue-as-new lineage (0: the first)."
        ),
    )
    queue = models.CharField(
        _("queue"),
        max_length=255,
        blank=True,
        default="",
        db_default="",
        help_text=_(
            "The Celery queue the run's tasks go to (Meta.queue or run(queue=...)); empty for "
            "the default queue (CELERY_QUEUE)."
        ),
    )
    priority = models.PositiveSmallIntegerField(
        _("priority"),
        default=5,
        db_default=5,
        help_text=_(
            "0 (lowest) to 9 (highest), 5 by default (Meta.priority or run(priority=...)): "
            "where runs wait, higher priorities go first."
        ),
    )
    concurrency_key = models.CharField(
        _("concurrency key"),
        max_length=255,
        blank=True,
        default="",
        db_default="",
        help_text=_(
            "For a reactor with Meta.concurrency: the run's key, which at most the declared "
            "limit of runs in flight share."
        ),
    )
    throttle_key = models.CharField(
        _("throttle key"),
        max_length=255,
        blank=True,
        default="",
        db_default="",
        help_text=_("For a reactor with Meta.throttle: the run's key."),
    )
    throttle_slot = models.DateTimeField(
        _("throttle slot"),
        null=True,
        blank=True,
        help_text=_(
            "For a reactor with Meta.throttle: the time the run's start counts at (now, or "
            "later when its key had no room)."
        ),
    )
    debounce_key = models.CharField(
        _("debounce key"),
        max_length=255,
        blank=True,
        default="",
        db_default="",
        help_text=_(
            "For a reactor with Meta.debounce: the key whose starts collapse into this run "
            "while it waits to start."
        ),
    )
    debounce_latest = models.DateTimeField(
        _("debounce latest start"),
        null=True,
        blank=True,
        help_text=_(
            "For a debounced run with max_wait: the latest it starts, however often its key "
            "is started again."
        ),
    )
    batch_key = models.CharField(
        _("batch key"),
        max_length=255,
        blank=True,
        default="",
        db_default="",
        help_text=_(
            "For a reactor with Meta.batch: the key whose starts this run collects as its "
            "items while it waits to start."
        ),
    )
    batch_size = models.PositiveIntegerField(
        _("batch size"),
        default=0,
        db_default=0,
        help_text=_("For a batched run: how many items it holds."),
    )
    correlation_id = models.CharField(_("correlation id"), max_length=255, null=True, blank=True)
    idempotency_key = models.CharField(_("idempotency key"), max_length=255, null=True, blank=True)
    current_step = models.CharField(_("current step"), max_length=255, blank=True, default="")
    current_attempt = models.PositiveIntegerField(
        _("current attempt"),
        default=0,
        help_text=_("Attempts of the current step so far (a retry waiting for its wake-up)."),
    )
    coordination = models.JSONField(
        _("coordination"),
        default=dict,
        blank=True,
        help_text=_(
            "What the run's declared coordination holds across processes: locks and slots it "
            "took, its period bucket, whether its rate limit was charged, its reschedules."
        ),
    )
    handed_off = models.BooleanField(
        _("handed off"),
        default=False,
        help_text=_("The run passed its background hand-off point; workers run the rest."),
    )
    result = models.JSONField(_("result"), null=True, blank=True)
    failure = models.JSONField(_("failure"), null=True, blank=True)
    published = models.JSONField(
        _("published"),
        null=True,
        blank=True,
        help_text=_("What its steps published (context.publish), the latest value by key."),
    )
    lease_owner = models.CharField(_("lease owner"), max_length=255, null=True, blank=True)
    lease_expires_at = models.DateTimeField(_("lease expires at"), null=True, blank=True)
    fence = models.PositiveBigIntegerField(
        _("fence"),
        default=0,
        help_text=_("Raised on every change of owner; writes from an older owner are refused."),
    )
    recovery_attempts = models.PositiveIntegerField(_("recovery attempts"), default=0)
    cancel_requested_at = models.DateTimeField(_("cancel requested at"), null=True, blank=True)
    cancel_reason = models.TextField(_("cancel reason"), blank=True, default="")
    created_at = models.DateTimeField(_("created at"), auto_now_add=True)
    started_at = models.DateTimeField(_("started at"), null=True, blank=True)
    updated_at = models.DateTimeField(_("updated at"), auto_now=True)
    finished_at = models.DateTimeField(_("finished at"), null=True, blank=True)
    wake_at = models.DateTimeField(_("next wake-up"), null=True, blank=True)
    deadline_at = models.DateTimeField(
        _("deadline"),
        null=True,
        blank=True,
        help_text=_(
            "Past it the run starts no more steps and rolls back (or halts, as its reactor "
            "says), wherever it waits."
        ),
    )
    heartbeat = models.JSONField(
        _("last heartbeat"),
        null=True,
        blank=True,
        help_text=_(
            "The last heartbeat of the step in flight: its name, when, and the details it gave."
        ),
    )

    objects = RoutedManager()

    class Meta:
        verbose_name = _("execution")
        verbose_name_plural = _("executions")
        ordering = ["-created_at"]
        permissions = [
            ("resume_interrupt", _("Can resume a paused execution")),
            ("cancel_execution", _("Can cancel an execution")),
            ("undo_execution", _("Can undo an execution")),
            ("retry_execution", _("Can retry or fork an execution")),
            ("pause_execution", _("Can pause and unpause executions and reactors")),
            ("start_execution", _("Can start an execution over the API")),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["reactor", "idempotency_key"],
                condition=Q(idempotency_key__isnull=False),
                name="reactor_exec_idempotency_uniq",
            ),
            models.UniqueConstraint(
                fields=["parent", "parent_step"],
                condition=Q(parent__isnull=False),
                name="reactor_exec_child_uniq",
            ),
        ]
        indexes = [
            # No index holds a column a routine checkpoint writes (updated_at, current_step,
            # current_attempt, wake_at): those updates stay HOT, one heap write and no index
            # write each. The lease index changes only when the heartbeat extends a lease.
            models.Index(fields=["status", "created_at", "id"], name="reactor_exec_by_status_idx"),
            models.Index(
                fields=["reactor", "created_at", "id"], name="reactor_exec_by_reactor_idx"
            ),
            # The admin's and the API's newest-first pages.
            models.Index(fields=["created_at", "id"], name="reactor_exec_created_idx"),
            models.Index(
                fields=["idempotency_key"],
                name="reactor_exec_idem_idx",
                condition=Q(idempotency_key__isnull=False),
            ),
            models.Index(
                fields=["correlation_id"],
                name="reactor_exec_corr_idx",
                condition=Q(correlation_id__isnull=False),
            ),
            models.Index(
                fields=["root"],
                name="reactor_exec_root_idx",
                condition=Q(root__isnull=False),
            ),
            models.Index(
                fields=["lease_expires_at"],
                name="reactor_exec_lease_idx",
                condition=Q(status__in=["running", "rolling_back"]),
            ),
            # The sweeper's due wake-ups (sleeps, retries' backoffs, scheduled starts) and runs
            # past their deadline, found without reading the runs that wait longer; the admin's
            # parked runs (rolling back too: parked on a map's undo), in wake-up order.
            models.Index(
                fields=["wake_at"],
                name="reactor_exec_wake_idx",
                condition=Q(
                    status__in=["pending", "scheduled", "rolling_back"], wake_at__isnull=False
                ),
            ),
            # A concurrency key's runs in flight and its queue, in arrival order.
            models.Index(
                fields=["reactor", "concurrency_key", "status", "created_at"],
                name="reactor_exec_flow_idx",
                condition=Q(
                    status__in=[
                        "queued",
                        "pending",
                        "scheduled",
                        "running",
                        "paused",
                        "rolling_back",
                        "suspended",
                    ]
                )
                & ~Q(concurrency_key=""),
            ),
            # A debounce key's run waiting to start.
            models.Index(
                fields=["reactor", "debounce_key"],
                name="reactor_exec_debounce_idx",
                condition=Q(status="scheduled") & ~Q(debounce_key=""),
            ),
            # A batch key's run collecting items.
            models.Index(
                fields=["reactor", "batch_key"],
                name="reactor_exec_batch_idx",
                condition=Q(status="scheduled") & ~Q(batch_key=""),
            ),
            # A throttle key's latest starts.
            models.Index(
                fields=["reactor", "throttle_key", "throttle_slot"],
                name="reactor_exec_throttle_idx",
                condition=~Q(throttle_key=""),
            ),
            models.Index(
                fields=["deadline_at"],
                name="reactor_exec_deadline_idx",
                condition=Q(deadline_at__isnull=False),
            ),
            # The admin's overview: runs that ended in a time window, by status (throughput,
            # failure rate, its chart). Only ended runs are in it, and a run's last checkpoint
            # (which sets finished_at) already changes its status and lease, indexed columns:
            # it adds one index entry per ended run and leaves the routine checkpoints HOT.
            models.Index(
                fields=["finished_at", "status"],
                name="reactor_exec_finished_idx",
                condition=Q(finished_at__isnull=False),
            ),
            # A subject's runs (reactor_forget_subject counts them); runs without one are not
            # in it.
            models.Index(
                fields=["subject"], name="reactor_exec_subject_idx", condition=~Q(subject="")
            ),
        ]

    def __str__(self) -> str:
        return f"{self.reactor.rsplit('.', 1)[-1]} {self.id} ({self.status})"


class Definition(models.Model):
    """A reactor's steps and their dependencies, kept once per definition fingerprint.

    Every run names its definition by ``Execution.definition_hash``; a resumed run is refused
    when a step it already ran has changed since (see ``ReactorDefinition.incompatibilities``).
    Rows are written with the first run of each fingerprint and never change.
    """

    hash = models.CharField(_("definition hash"), max_length=64, primary_key=True)
    shape = models.JSONField(
        _("shape"),
        default=dict,
        help_text=_("Each step's implementation and dependencies."),
    )
    created_at = models.DateTimeField(_("first run at"), auto_now_add=True)

    objects = RoutedManager()

    class Meta:
        verbose_name = _("reactor definition")
        verbose_name_plural = _("reactor definitions")

    def __str__(self) -> str:
        return self.hash


#: The unique constraint of a run's step records, one per step (the checkpoint names it).
STEP_RECORD_UNIQUE = "reactor_step_uniq"


class StepRecord(models.Model):
    """The checkpointed outcome of one step in one execution."""

    id = models.BigAutoField(primary_key=True)
    execution = models.ForeignKey(
        Execution,
        verbose_name=_("execution"),
        on_delete=models.CASCADE,
        related_name="steps",
        db_index=False,  # the unique constraint on (execution, ...) serves lookups
    )
    step = models.CharField(_("step"), max_length=255)
    status = models.CharField(
        _("status"), max_length=max_length_of(StepStatus), choices=StepStatus.choices
    )
    seq = models.PositiveIntegerField(
        _("sequence"), help_text=_("Completion order within the execution (undo runs backwards).")
    )
    attempts = models.PositiveIntegerField(_("attempts"), default=0)
    arguments = models.JSONField(_("arguments"), default=dict)
    secret_arguments = models.JSONField(_("secret argument paths"), default=list)
    result = models.JSONField(_("result"), null=True, blank=True)
    error = models.JSONField(_("error"), null=True, blank=True)
    compensable = models.BooleanField(
        _("compensable"),
        default=False,
        help_text=_("The step failed after its body started, so its compensate applies."),
    )
    rollback = models.CharField(
        _("rollback"),
        max_length=max_length_of(RollbackStatus),
        choices=RollbackStatus.choices,
        default=RollbackStatus.NONE,
        blank=True,
    )
    rollback_error = models.JSONField(_("rollback error"), null=True, blank=True)
    rolled_back_at = models.DateTimeField(_("rolled back at"), null=True, blank=True)
    started_at = models.DateTimeField(_("started at"), null=True, blank=True)
    finished_at = models.DateTimeField(_("finished at"), null=True, blank=True)
    traced = models.BooleanField(
        _("stands for its trace entry"),
        default=False,
        db_default=False,
        help_text=_(
            "The step's run or skip entry of the trace is this record (sequence number, "
            "attempt, finished at, duration), not an event row of its own."
        ),
    )
    duration_ms = models.FloatField(_("duration (ms)"), null=True, blank=True)

    objects = RoutedManager()

    class Meta:
        verbose_name = _("step record")
        verbose_name_plural = _("step records")
        ordering = ["execution_id", "seq"]
        constraints = [
            models.UniqueConstraint(fields=["execution", "step"], name=STEP_RECORD_UNIQUE),
        ]

    def __str__(self) -> str:
        return f"{self.step} ({self.status})"


class ExecutionEvent(models.Model):
    """One entry of an execution's append-only trace."""

    id = models.BigAutoField(primary_key=True)
    execution = models.ForeignKey(
        Execution,
        verbose_name=_("execution"),
        on_delete=models.CASCADE,
        related_name="events",
        db_index=False,  # the unique constraint on (execution, ...) serves lookups
    )
    seq = models.PositiveIntegerField(_("sequence"))
    kind = models.CharField(
        _("kind"), max_length=max_length_of(EventKind), choices=EventKind.choices
    )
    step = models.CharField(_("step"), max_length=255, blank=True, default="")
    attempt = models.PositiveIntegerField(_("attempt"), default=0)
    at = models.DateTimeField(_("at"))
    duration_ms = models.FloatField(_("duration (ms)"), null=True, blank=True)
    data = models.JSONField(_("data"), default=dict, blank=True)

    objects = RoutedManager()

    class Meta:
        verbose_name = _("execution event")
        verbose_name_plural = _("execution events")
        ordering = ["execution_id", "seq"]
        constraints = [
            models.UniqueConstraint(fields=["execution", "seq"], name="reactor_event_seq_uniq"),
        ]

    def __str__(self) -> str:
        return f"#{self.seq} {self.kind} {self.step}".rstrip()


class Dispatch(models.Model):
    """Outbox: a Celery task that must be published for an execution.

    Written in the same transaction as the state change that needs it and published after the
    commit; the sweeper republishes rows a crash left unsent.
    """

    class Reason(models.TextChoices):
        START = "start", _("Start in the background")
        HANDOFF = "handoff", _("Background hand-off")
        RETRY = "retry", _("Retry after backoff")
        RECOVER = "recover", _("Recover a run whose worker stopped")
        WAKE = "wake", _("Wake-up time reached")
        RESUME = "resume", _("Resume after a payload")
        MAP = "map", _("Run map elements")
        MAP_UNDO = "map_undo", _("Undo map elements")
        ROLLBACK = "rollback", _("Roll back a run an event cancelled")
        UNPAUSE = "unpause", _("Go on after a pause")
        ADMIT = "admit", _("Admitted by its concurrency key")

    id = models.BigAutoField(primary_key=True)
    execution = models.ForeignKey(
        Execution, verbose_name=_("execution"), on_delete=models.CASCADE, related_name="dispatches"
    )
    reason = models.CharField(_("reason"), max_length=16, choices=Reason.choices)
    map_run = models.ForeignKey(
        "MapRun",
        verbose_name=_("map"),
        on_delete=models.CASCADE,
        related_name="dispatches",
        null=True,
        blank=True,
        help_text=_("For map work: the map whose elements the task runs or undoes."),
    )
    not_before = models.DateTimeField(
        _("not before"), null=True, blank=True, help_text=_("Publish with this countdown.")
    )
    created_at = models.DateTimeField(_("created at"), auto_now_add=True)
    sent_at = models.DateTimeField(_("sent at"), null=True, blank=True)

    objects = RoutedManager()

    class Meta:
        verbose_name = _("dispatch")
        verbose_name_plural = _("dispatches")
        ordering = ["id"]
        indexes = [
            models.Index(
                fields=["created_at"],
                name="reactor_dispatch_unsent_idx",
                condition=Q(sent_at__isnull=True),
            ),
            # The admin's list filtered by reason, newest first.
            models.Index(fields=["reason", "id"], name="reactor_dispatch_reason_idx"),
            # The sweep's forgetting of dispatches sent before DISPATCH_RETENTION: without it,
            # every sweep reads every dispatch kept (a day's traffic), whether any is old.
            models.Index(
                fields=["sent_at"],
                name="reactor_dispatch_sent_idx",
                condition=Q(sent_at__isnull=False),
            ),
        ]

    def __str__(self) -> str:
        state = "sent" if self.sent_at else "unsent"
        return f"{self.reason} {self.execution_id} ({state})"


class Interrupt(models.Model):
    """An interrupt a run reached: it waits for one validated payload, delivered once.

    Written by the run when it reaches the interrupt; resumed (claimed) by a conditional update
    from ``waiting``, so exactly one delivery wins. Only the SHA-256 of a resume token is kept.
    """

    id = models.BigAutoField(primary_key=True)
    execution = models.ForeignKey(
        Execution,
        verbose_name=_("execution"),
        on_delete=models.CASCADE,
        related_name="interrupts",
        db_index=False,  # the unique constraint on (execution, ...) serves lookups
    )
    reactor = models.CharField(_("reactor"), max_length=255)
    step = models.CharField(_("step"), max_length=255)
    status = models.CharField(
        _("status"),
        max_length=max_length_of(InterruptStatus),
        choices=InterruptStatus.choices,
        default=InterruptStatus.WAITING,
    )
    correlation_id = models.CharField(_("correlation id"), max_length=255, null=True, blank=True)
    expires_at = models.DateTimeField(_("expires at"), null=True, blank=True)
    invalid_attempts = models.PositiveIntegerField(_("invalid payloads"), default=0)
    max_attempts = models.PositiveIntegerField(
        _("max invalid payloads"),
        null=True,
        blank=True,
        help_text=_("The run fails after this many invalid payloads; empty: it stays paused."),
    )
    resume_mode = models.CharField(_("resume"), max_length=16, default="inline")
    payload = models.JSONField(_("payload"), null=True, blank=True)
    token_hash = models.CharField(
        _("resume token hash"), max_length=64, null=True, blank=True, editable=False
    )
    # A ``wait_for_event`` step: the event's name and the key an event must carry to match.
    event_name = models.CharField(_("event"), max_length=255, null=True, blank=True)
    event_key = models.CharField(_("event key"), max_length=255, null=True, blank=True)
    created_at = models.DateTimeField(_("reached at"), auto_now_add=True)
    closed_at = models.DateTimeField(_("closed at"), null=True, blank=True)

    objects = RoutedManager()

    class Meta:
        verbose_name = _("interrupt")
        verbose_name_plural = _("interrupts")
        ordering = ["execution_id", "id"]
        constraints = [
            models.UniqueConstraint(fields=["execution", "step"], name="reactor_interrupt_uniq"),
            models.UniqueConstraint(
                fields=["reactor", "correlation_id"],
                condition=Q(status="waiting", correlation_id__isnull=False),
                name="reactor_interrupt_corr_uniq",
            ),
            models.UniqueConstraint(
                fields=["token_hash"],
                condition=Q(token_hash__isnull=False),
                name="reactor_interrupt_token_uniq",
            ),
        ]
        indexes = [
            models.Index(
                fields=["expires_at"],
                name="reactor_interrupt_expiry_idx",
                condition=Q(status="waiting", expires_at__isnull=False),
            ),
            models.Index(fields=["correlation_id"], name="reactor_interrupt_corr_idx"),
            # An event emitted finds the runs waiting for it by name and key.
            models.Index(
                fields=["event_name", "event_key"],
                name="reactor_interrupt_event_idx",
                condition=Q(status="waiting", event_name__isnull=False),
            ),
            # The admin's list, newest first: whole, by status, by reactor.
            models.Index(fields=["created_at", "id"], name="reactor_interrupt_created_idx"),
            models.Index(
                fields=["status", "created_at", "id"], name="reactor_interrupt_status_idx"
            ),
            models.Index(
                fields=["reactor", "created_at", "id"], name="reactor_interrupt_reactor_idx"
            ),
        ]

    #: Not a column: the interrupt's path from the run the store listed or looked it up for
    #: (``"checkout.approval"`` for a composed child's; "" when the store did not say, and
    #: then its step is its path). Set by ``store.interrupts``; read with ``path_of``.
    listed_path: str = ""

    def __str__(self) -> str:
        return f"{self.step} of {self.execution_id} ({self.status})"


class ApiRequest(models.Model):
    """A request the API answered under an ``Idempotency-Key`` or a webhook id.

    A retry with the same key and the same body gets the stored response; a retry with a
    different body is refused. ``status_code`` is 0 while the first request is in flight.
    """

    id = models.BigAutoField(primary_key=True)
    scope = models.CharField(
        _("scope"), max_length=255, help_text=_("Whose key it is: a user, a webhook secret.")
    )
    key = models.CharField(_("key"), max_length=255)
    fingerprint = models.CharField(_("body fingerprint"), max_length=64)
    status_code = models.PositiveSmallIntegerField(_("response status"), default=0)
    response = models.JSONField(_("response body"), null=True, blank=True)
    created_at = models.DateTimeField(_("received at"), auto_now_add=True)

    objects = RoutedManager()

    class Meta:
        verbose_name = _("API request")
        verbose_name_plural = _("API requests")
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(fields=["scope", "key"], name="reactor_apirequest_uniq"),
        ]
        indexes = [models.Index(fields=["created_at"], name="reactor_apirequest_age_idx")]

    def __str__(self) -> str:
        return f"{self.scope}:{self.key} ({self.status_code or 'in flight'})"
