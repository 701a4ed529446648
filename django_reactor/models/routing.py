"""Which database django_reactor's rows are read from and written to in this context.

A fleet may shard reactors across databases (``REACTOR["DATABASE"]``): while an entry point
works on a run (a worker's task, a caller's ``run()``, an operator's page), the run's database
is *bound* in its context (``store.bound``). The store passes that alias to every query; the
models' default manager does the same for the queries the faces make themselves (the admin's
lists and forms, the API's filters), so they never need a ``using`` of their own. Nothing
bound: Django's routers decide, as for any model (the ``default`` database without one).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Generic, TypeVar

from django.db import models

M = TypeVar("M", bound=models.Model)

_bound: ContextVar[str | None] = ContextVar("django_reactor_database", default=None)


def bound_alias() -> str | None:
    """The database alias bound in this context (:func:`bound`); None when nothing is."""
    return _bound.get()


@contextlib.contextmanager
def bound(alias: str) -> Iterator[str]:
    """Within the block, django_reactor's rows are read and written in the database ``alias``
    (in this context, and in the threads a run starts for its steps, which copy it)."""
    token = _bound.set(alias)
    try:
        yield alias
    finally:
        _bound.reset(token)


@contextlib.contextmanager
def unbound() -> Iterator[None]:
    """Within the block, no database is bound: each operation finds its own (a bulk
    operation, kept in one database, steering runs of several)."""
    token = _bound.set(None)
    try:
        yield
    finally:
        _bound.reset(token)


class RoutedQuerySet(models.QuerySet[M], Generic[M]):
    """A queryset that, unless told ``using``, goes to the database bound in its context."""

    @property
    def db(self) -> str:
        if getattr(self, "_db", None) is None:
            alias = _bound.get()
            if alias is not None:
                return alias
        return str(super().db)


class RoutedManager(models.Manager[M]):
    """The default manager of django_reactor's models (see :class:`RoutedQuerySet`)."""

    def get_queryset(self) -> RoutedQuerySet[M]:
        return RoutedQuerySet(self.model, using=self._db, hints=getattr(self, "_hints", None))

    @property
    def db(self) -> str:
        alias = _bound.get() if self._db is None else None
        return alias or str(super().db)
