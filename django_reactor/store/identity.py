"""Which database this is, for the task messages: the identity ``DatabaseIdentity`` holds.

A web process and a worker configured with different databases would lose runs silently: the
worker finds no such execution and drops the task, the caller times out. So the publisher
stamps each message with the database its run was written to (:func:`this_database`, read once
per process), and a worker that cannot find a message's run or map asks :func:`refuse_foreign`
whether the message is for another database before it gives up on it. A run it can find is
this database's whatever the message says (its id is a UUID), so the comparison costs nothing
on the way of the tasks it runs, and a publisher's stale identity (a database recreated under
a running process) never stops one.

A message without the identity (published by an older version, or before the migration that
writes it ran) is taken as before.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

from django.db import DatabaseError, connections, transaction

from ..exceptions import WrongDatabase
from ..models import DatabaseIdentity
from .db import aliases, bound, bound_alias, default_alias, first_holding, using


@dataclass(frozen=True, slots=True)
class DatabaseMark:
    """A database as a task message names it: its identity, and a name for people."""

    identity: str
    #: ``NAME on HOST:PORT`` as the process that wrote it connects (never a password).
    name: str


_known: dict[str, DatabaseMark] = {}


def this_database(*, fresh: bool = False) -> DatabaseMark | None:
    """This process's database: read once per process (again with ``fresh``); None when its
    identity cannot be read (the migration that writes it has not run)."""
    if not fresh and using() in _known:
        return _known[using()]
    connection = connections[using()]
    # Inside a transaction (the sweeper's) a failed read must not break it: a savepoint.
    guard = transaction.atomic(using=using()) if connection.in_atomic_block else None
    try:
        with guard or contextlib.nullcontext():
            identity = (
                DatabaseIdentity.objects.using(using()).values_list("identity", flat=True).first()
            )
    except DatabaseError:
        return None
    if identity is None:
        return None
    mark = DatabaseMark(str(identity), database_name())
    _known[using()] = mark
    return mark


def database_name() -> str:
    """``NAME on HOST:PORT`` of this process's database, as its settings give it (``NAME``
    alone without a host: SQLite, a local socket)."""
    settings = connections[using()].settings_dict
    where = ":".join(str(part) for part in (settings.get("HOST"), settings.get("PORT")) if part)
    return f"{settings.get('NAME')} on {where}" if where else str(settings.get("NAME"))


def refuse_foreign(mark: DatabaseMark | None, what: str) -> None:
    """Raise WrongDatabase when ``mark`` (the database a message was published for, for work
    this database does not have) is another database than this process's.

    ``what`` names the message's work (``the task resuming execution ...``).
    """
    if mark is None:
        return
    here = this_database(fresh=True)
    if here is None or here.identity == mark.identity:
        return
    raise WrongDatabase(
        f"{what} was published for the database {mark.name} (identity {mark.identity}), but "
        f"this process is on {here.name} (identity {here.identity}): the web processes and "
        "the workers are configured with different DATABASES. The message is rejected, not "
        f"run: the run is safe in {mark.name}, whose sweeper publishes its work again (at its "
        "next sweep, then every REACTOR['REDISPATCH_AFTER'] seconds while no worker takes "
        "it). Point this worker's DATABASES at the database of the web processes."
    )


def alias_of(mark: DatabaseMark | None) -> str | None:
    """The configured database whose identity ``mark`` names (each database's identity read
    once per process); None without a mark, or when no configured database has it."""
    if mark is None:
        return None
    for alias in aliases():
        with bound(alias):
            here = this_database()
        if here is not None and here.identity == mark.identity:
            return alias
    return None


def database_of_message(mark: DatabaseMark | None, holds: Callable[[], bool]) -> str:
    """The database a task message's work is in: the one bound already (a nested call), the
    only one configured, the one the message's identity names, else the first that
    ``holds()`` it (asked bound to each, ``db.first_holding``), else the default."""
    already = bound_alias()
    if already is not None:
        return already
    known = aliases()
    if len(known) == 1:
        return known[0]
    return alias_of(mark) or first_holding(holds) or default_alias()
