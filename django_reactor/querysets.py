"""Query helpers for executions, named after what they select."""

from __future__ import annotations

from django.db import models

from .states import TERMINAL_STATUSES, ExecutionStatus


class ExecutionQuerySet(models.QuerySet):
    """Intention-revealing filters over executions."""

    def for_reactor(self, name: str) -> ExecutionQuerySet:
        return self.filter(reactor=name)

    def finished(self) -> ExecutionQuerySet:
        return self.filter(status__in=TERMINAL_STATUSES)

    def active(self) -> ExecutionQuerySet:
        return self.exclude(status__in=TERMINAL_STATUSES)

    def failed(self) -> ExecutionQuerySet:
        return self.filter(status=ExecutionStatus.FAILED)

    def needing_attention(self) -> ExecutionQuerySet:
        return self.filter(status=ExecutionStatus.NEEDS_ATTENTION)


class ExecutionManager(models.Manager.from_queryset(ExecutionQuerySet)):  # type: ignore[misc]
    """The default manager of :class:`~django_reactor.models.Execution`."""
