"""Exceptions raised by django_reactor.

Every error the app raises derives from :class:`ReactorError`. Errors about a reactor's
declaration derive from :class:`DefinitionError` and are raised when the class is defined, so a
malformed reactor fails at import time, naming the reactor and the step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.core.exceptions import ImproperlyConfigured


class ReactorError(Exception):
    """Base class of every django_reactor error. Do not raise it directly."""


class DefinitionError(ReactorError, ImproperlyConfigured):
    """A reactor or step declaration is invalid (raised at class definition).

    It is an ``ImproperlyConfigured`` too: a bad declaration is a configuration error of the
    project, found when the module defining the reactor is imported.
    """


class DependencyCycleError(DefinitionError):
    """Steps depend on each other in a cycle."""


class ReactorImproperlyConfigured(ReactorError, ImproperlyConfigured):
    """The ``REACTOR`` setting is invalid."""


class InvalidTime(ReactorError, ValueError):
    """A time given to django_reactor (a start time, a delay, a deadline, a timeout, a wait)
    is not one it accepts: not a datetime or a duration, without a time zone, not a number,
    infinite, negative, or further away than a date can hold (``engine.timevalues``). Raised
    before anything is written."""


class InvalidRoute(ReactorError, ValueError):
    """A queue or priority given to ``run()`` (``queue=``, ``priority=``) is not one django_reactor
    accepts: a queue is a non-empty name of at most 255 characters, a priority a whole number from
    0 to 9 (``engine.routing``). Raised before anything is written."""


class ExecutionNotFound(ReactorError, LookupError):
    """No execution has the given id (for the given reactor)."""


class ReactorNotRegistered(ReactorError, LookupError):
    """A name (an execution's, a caller's) names no reactor this process knows.

    ``matches``: the registered names a class name shared by several reactors could mean;
    ``suggestions``: registered names close to a misspelt one (both may be empty).
    """

    def __init__(
        self, message: str, *, matches: tuple[str, ...] = (), suggestions: tuple[str, ...] = ()
    ) -> None:
        super().__init__(message)
        self.matches = matches
        self.suggestions = suggestions


class VersionMissing(ReactorNotRegistered):
    """This process has the reactor of a stored run, but not the version the run started on
    (``Meta.version``): a worker hands the run back for a worker that has it."""

    def __init__(self, message: str, *, reactor: str, version: str, current: str) -> None:
        super().__init__(message)
        self.reactor = reactor
        self.version = version
        self.current = current


class KeptVersion(ReactorError):
    """A run was started with a reactor version kept in code only to finish its runs
    (``Meta.version_of``): new runs start on the current class."""


class InvalidTransition(ReactorError):
    """The requested operation is not allowed in the run's current status."""

    def __init__(self, message: str, *, status: str | None = None) -> None:
        super().__init__(message)
        self.status = status


class ExecutionBusy(ReactorError):
    """Another process owns the run right now (its lease is live)."""


class AlreadyRetried(InvalidTransition):
    """A failed run was already retried; the retry is its own execution."""

    def __init__(self, message: str, *, retry_id: Any) -> None:
        super().__init__(message, status="failed")
        self.retry_id = retry_id


class InvalidFilter(ReactorError, ValueError):
    """A filter of runs (a bulk operation's) or a bulk request that cannot be used: an unknown
    key, a bad value, no filter at all, an unknown action or a parameter it does not take.
    Nothing was written."""


class InvalidFork(ReactorError, ValueError):
    """A fork cannot be made as asked: the step names none of the reactor's steps, a step of
    the abandoned branch is gone from the code (it could not be undone), or its inputs or
    secrets cannot go with it. Nothing was written."""


class ForkNeedsUndo(InvalidTransition):
    """Forking the run abandons completed steps whose effects stand: they must be undone
    (newest first) before the fork runs. ``plan`` says which; fork again with
    ``undo_abandoned=True`` to do it. Nothing was written."""

    def __init__(self, message: str, *, plan: Any, status: str = "") -> None:
        super().__init__(message, status=status)
        self.plan = plan


class WaitTimedOut(ReactorError, TimeoutError):
    """``ExecutionHandle.wait`` gave up: the run was still moving when its timeout passed.

    ``warnings``: why it may not move (no worker alive to take it, no sweeper to wake it), in
    the words of the message; empty when nothing says it is held up."""

    def __init__(
        self,
        message: str,
        *,
        execution_id: Any,
        status: str,
        warnings: Sequence[str] = (),
    ) -> None:
        super().__init__(message)
        self.execution_id = execution_id
        self.status = status
        self.warnings = tuple(warnings)


class TransactionActive(ReactorError):
    """An inline run was started inside an open database transaction."""


class AtomicStepError(ReactorError):
    """An atomic step's body did something its transaction cannot contain (a query on another
    database, a coordination call): the attempt fails, its writes are rolled back, and it is
    not retried (it would do the same again)."""

    retryable = False


class AtomicStepTimeout(AtomicStepError):
    """An atomic step held its transaction longer than ``REACTOR["ATOMIC_STEP_TIMEOUT"]``: its
    writes are rolled back and the attempt fails (retried if its retry policy says so)."""

    retryable = True


class StepTimedOut(ReactorError):
    """A step's attempt ran longer than its ``timeout``, or went longer than its
    ``heartbeat_timeout`` without a heartbeat: the attempt failed (its retry policy decides) and
    was abandoned, though the thread running its body may still be going."""

    retryable = True


class LeaseLost(ReactorError):
    """This process no longer owns the run: another owner took it (fence moved on)."""


class WrongDatabase(ReactorError):
    """A task message was published for another database than this process's: the web
    processes and this worker are configured with different ``DATABASES``. The message is
    refused (never run, never taken as done); the message says which database is which."""


class IdempotencyKeyReused(ReactorError):
    """An idempotency key was reused with different inputs."""

    def __init__(self, message: str, *, execution_id: Any) -> None:
        super().__init__(message)
        self.execution_id = execution_id


class ArgumentResolutionError(ReactorError):
    """A step argument could not be resolved (bad path, raising transform)."""


class ResultNotSerializable(ReactorError):
    """A value cannot be stored as JSON in the database.

    Raised for types JSON cannot hold, and for values PostgreSQL refuses: NUL characters and
    lone surrogates in strings or keys, nesting deeper than ``serialization.MAX_DEPTH``, values
    that contain themselves and integers too long to write out.
    """


class StoredValueUnreadable(ReactorError):
    """A stored value cannot be read back by this code (an unknown type tag, a malformed
    tagged value): the row was written by other code or changed by hand."""


class SubjectErased(StoredValueUnreadable):
    """A secret the run needs was sealed with the key of a subject that was forgotten
    (``reactor_forget_subject``): it can never be read again."""

    def __init__(self, message: str, *, subject: str, erased_at: Any = None) -> None:
        super().__init__(message)
        self.subject = subject
        self.erased_at = erased_at


class UnitWaitTimeout(ReactorError):
    """An async unit did not finish within the time its reader may wait."""


class DefinitionChanged(ReactorError):
    """The reactor's code changed under a run in a way the run cannot follow."""


class CorrelationIdTaken(ReactorError):
    """Another waiting run of the reactor holds this correlation id."""

    def __init__(self, message: str, *, correlation_id: str, execution_id: Any) -> None:
        super().__init__(message)
        self.correlation_id = correlation_id
        self.execution_id = execution_id


class InterruptNotFound(ExecutionNotFound):
    """No interrupt matches (unknown execution, step, correlation id or token)."""


class UnknownInterrupt(InterruptNotFound):
    """The step or path named is not an interrupt the run's reactor declares (a typo, or a
    path through composed children that does not exist); ``paths`` lists the valid ones."""

    def __init__(self, message: str, *, paths: tuple[str, ...]) -> None:
        super().__init__(message)
        self.paths = paths


class InterruptClosed(InvalidTransition):
    """The interrupt no longer takes payloads: it expired, or its run was cancelled or failed.

    ``reason`` is ``"expired"``, ``"cancelled"`` or ``"failed"``.
    """

    def __init__(self, message: str, *, reason: str, status: str | None = None) -> None:
        super().__init__(message, status=status)
        self.reason = reason


class AlreadyResumed(InvalidTransition):
    """The interrupt already accepted a payload (exactly one delivery wins)."""


class NotWaiting(InvalidTransition):
    """The run has not reached the interrupt (yet): nothing waits for this payload.

    Retryable: deliver the payload again later.
    """


class UnknownTopic(ReactorError, LookupError):
    """The run's reactor takes no messages on this topic (no ``receive`` of it declares it);
    ``topics`` lists those it does."""

    def __init__(self, message: str, *, topics: tuple[str, ...]) -> None:
        super().__init__(message)
        self.topics = topics


class InvalidMessage(ReactorError, ValueError):
    """A message that cannot be sent: its topic is no topic name, or its payload cannot be
    stored (not JSON, too large). Nothing was written."""


class UnknownEvent(ReactorError, LookupError):
    """No registered reactor waits for, starts on or cancels on an event of this name;
    ``known`` lists the names they do."""

    def __init__(self, message: str, *, known: tuple[str, ...]) -> None:
        super().__init__(message)
        self.known = known


class InvalidEvent(ReactorError, ValueError):
    """An event that cannot be emitted: no event name, a key or event id that is no short
    text, a payload that cannot be stored (not JSON, too large), or an event id already used
    for another payload. Nothing was written."""


class PublishError(ReactorError, ValueError):
    """``context.publish(key, value)`` refused: the key is no short name, or the value cannot
    be stored or is too large. The step's attempt fails with it."""


class InvalidAttribute(ReactorError, ValueError):
    """A business attribute that cannot be kept: its key is no short name, or its value is not a
    string, a whole number, a boolean or a UUID of at most 255 characters
    (``Meta.attributes``, ``self.context.set_attribute``, an attribute filter)."""


class InvalidPayload(ReactorError):
    """A payload failed the interrupt's serializer; nothing changed but the attempt count.

    ``errors`` holds the field errors; ``run_failed`` is True when this was the last attempt
    allowed (``max_attempts``) and the run was undone and failed.
    """

    def __init__(
        self,
        message: str,
        *,
        errors: Any,
        attempts: int,
        max_attempts: int | None,
        run_failed: bool,
    ) -> None:
        super().__init__(message)
        self.errors = errors
        self.attempts = attempts
        self.max_attempts = max_attempts
        self.run_failed = run_failed


class InvalidInputs(ReactorError, ValueError):
    """The inputs of a run failed its reactor's ``Inputs`` serializer, and the caller asked for
    a refusal rather than a recorded failed run (``services.start``): nothing was written.
    ``errors`` holds the field errors."""

    def __init__(self, message: str, *, errors: Any) -> None:
        super().__init__(message)
        self.errors = errors


class InvalidSchedule(ReactorError, ValueError):
    """A schedule was refused (nothing was written): ``errors`` maps each field (``reactor``,
    ``cron``, ``every``, ``timezone``, ``inputs``, ``name``, ...) to its messages."""

    def __init__(self, errors: dict[str, list[str]]) -> None:
        super().__init__(
            "; ".join(f"{field}: {' '.join(messages)}" for field, messages in errors.items())
        )
        self.errors = errors


class ScheduleNotFound(ReactorError, LookupError):
    """No schedule has the given id or name."""


class PatchError(ReactorError, ValueError):
    """``self.context.patched(name)`` or ``deprecated_patch(name)`` refused: the name is no short
    name, or it was called where no run keeps decisions (a map's element). The step's attempt
    fails with it."""


class PatchRemoved(ReactorError):
    """``self.context.deprecated_patch(name)`` in a run that took the old branch of the patch
    (``patched(name)`` returned False for it), which this code no longer has.

    Not the step's failure: nothing is rolled back. The run is parked ``needs_attention``
    (``error.kind`` ``patch_removed``); deploy code that still has ``patched(name)`` and move it
    back with ``reactor_migrate`` to finish it, or undo() or cancel() it."""

    def __init__(self, message: str, *, patch: str, step: str) -> None:
        super().__init__(message)
        self.patch = patch
        self.step = step
