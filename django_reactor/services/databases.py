"""Which database an operation on a run works in, when reactors are routed to several.

``REACTOR["DATABASE"]`` may route reactors to different databases (a fleet sharded by
reactor). An operation that names a run by its id (cancel, undo, retry, resume, a delivery, a
handle's reads) finds it in the database that holds it: :func:`across_databases` runs the
operation bound to each database in turn (the default first) until one has the run. The
lookups come before any change, so an operation that does not find its run in one database has
changed nothing there. With one database (the usual case) it costs nothing.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import ParamSpec, TypeVar

from .. import store
from ..exceptions import ExecutionNotFound, UnknownInterrupt

P = ParamSpec("P")
T = TypeVar("T")


def across_databases(operation: Callable[P, T]) -> Callable[P, T]:
    """``operation`` run in the database that holds the run it names: as it is when a database
    is bound already (a worker's task, a nested call) or only one is configured; otherwise in
    each configured database in turn until it does not raise ExecutionNotFound (the first
    database's error is raised when none has the run)."""

    @functools.wraps(operation)
    def in_the_runs_database(*args: P.args, **kwargs: P.kwargs) -> T:
        if store.bound_alias() is not None:
            return operation(*args, **kwargs)
        aliases = store.aliases()
        if len(aliases) == 1:
            with store.bound(aliases[0]):
                return operation(*args, **kwargs)
        first: ExecutionNotFound | None = None
        for alias in aliases:
            with store.bound(alias):
                try:
                    return operation(*args, **kwargs)
                except UnknownInterrupt:
                    raise  # the run is here; its interrupt is not
                except ExecutionNotFound as exc:
                    first = first or exc
        assert first is not None
        raise first

    return in_the_runs_database


def on_reactors_database(reactor_name: str) -> AbstractContextManager[str]:
    """A context binding the database the runs of ``reactor_name`` are written to, whatever is
    bound now (a step body that starts another reactor's run starts it there; a composed child
    is created by its parent's run, in its parent's database, and never comes here)."""
    return store.bound(store.alias_for(reactor_name))


def in_each_database(operation: Callable[[], T]) -> list[T]:
    """``operation`` run once in each database runs are written to (only in the bound one when
    a database is bound: ``reactor_prune --database``), in order; what each returned."""
    bound = store.bound_alias()
    results = []
    for alias in (bound,) if bound is not None else store.aliases():
        with store.bound(alias):
            results.append(operation())
    return results
