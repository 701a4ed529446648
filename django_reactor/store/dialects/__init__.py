"""The store's dialects: the database-dependent operations of the store, chosen once per
database alias from its vendor (the way DBOS subclasses its system database).

- :class:`Dialect` (``generic``) is the generic ORM store: what runs on SQLite, MariaDB and
  MySQL, any database Django supports;
- :class:`PostgreSQL` (``postgresql``) overrides the operations it does in hand-written SQL;
- :class:`MySQL` (``mysql``: MariaDB and MySQL) is the generic store with row locks where
  PostgreSQL takes advisory locks.

The rest of the package asks :func:`dialect` (the store's alias) or :func:`dialect_for` (an
alias of its own: coordination's database backend, the admin's lists) and never reads a
connection's vendor itself (``tests/test_architecture.py``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from django.db import connections

from ..db import using
from .generic import Dialect
from .mysql import MySQL
from .postgresql import PostgreSQL

__all__ = ["Dialect", "MySQL", "PostgreSQL", "dialect", "dialect_for", "forced", "generic"]

#: The dialect of each vendor that has one of its own; any other database gets the generic.
_BY_VENDOR: dict[str, type[Dialect]] = {"postgresql": PostgreSQL, "mysql": MySQL}

#: The dialect chosen for each alias, on first use.
_chosen: dict[str, Dialect] = {}


def dialect_for(alias: str) -> Dialect:
    """The dialect of the database ``alias`` (chosen on the first call, from its vendor)."""
    try:
        return _chosen[alias]
    except KeyError:
        kind = _BY_VENDOR.get(connections[alias].vendor, Dialect)
        return _chosen.setdefault(alias, kind(alias))


def dialect() -> Dialect:
    """The store's dialect (``db.using()``), which the store's operations go through."""
    try:
        return _chosen[using()]
    except KeyError:
        return dialect_for(using())


def generic(alias: str | None = None) -> Dialect:
    """The generic ORM store on ``alias``, whatever its database: for tests that compare it
    with PostgreSQL's on one database (with :func:`forced`, or ``DatabaseJournal(dialect=)``)."""
    return Dialect(alias or using())


@contextmanager
def forced(chosen: Dialect) -> Iterator[Dialect]:
    """Within the block, :func:`dialect_for` answers ``chosen`` for its alias in every thread
    of this process (for tests: the whole store on the generic path)."""
    before = _chosen.get(chosen.alias)
    _chosen[chosen.alias] = chosen
    try:
        yield chosen
    finally:
        if before is None:
            _chosen.pop(chosen.alias, None)
        else:
            _chosen[chosen.alias] = before
