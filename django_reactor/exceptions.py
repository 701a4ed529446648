"""Exceptions raised by django_reactor.

Every error the app raises derives from :class:`ReactorError`. Errors about a reactor's
declaration derive from :class:`DefinitionError` and are raised when the class is defined, so a
malformed reactor fails at import time, naming the reactor and the step.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ImproperlyConfigured


class ReactorError(Exception):
    """Base class of every django_reactor error. Do not raise it directly."""


class DefinitionError(ReactorError):
    """A reactor or step declaration is invalid (raised at class definition)."""


class DependencyCycleError(DefinitionError):
    """Steps depend on each other in a cycle."""


class ReactorImproperlyConfigured(ReactorError, ImproperlyConfigured):
    """The ``REACTOR`` setting is invalid."""


class ExecutionNotFound(ReactorError, LookupError):
    """No execution has the given id (for the given reactor)."""


class ReactorNotRegistered(ReactorError, LookupError):
    """An execution names a reactor this process cannot find."""


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


class TransactionActive(ReactorError):
    """An inline run was started inside an open database transaction."""


class LeaseLost(ReactorError):
    """This process no longer owns the run: another owner took it (fence moved on)."""


class IdempotencyKeyReused(ReactorError):
    """An idempotency key was reused with different inputs."""

    def __init__(self, message: str, *, execution_id: Any) -> None:
        super().__init__(message)
        self.execution_id = execution_id


class ArgumentResolutionError(ReactorError):
    """A step argument could not be resolved (bad path, raising transform)."""


class ResultNotSerializable(ReactorError):
    """A step returned a value that cannot be stored as JSON."""


class UnitWaitTimeout(ReactorError):
    """An async unit did not finish within the time its reader may wait."""


class DefinitionChanged(ReactorError):
    """The reactor's code changed under a run in a way the run cannot follow."""
