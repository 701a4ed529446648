"""The MariaDB and MySQL store: the generic ORM store, and what takes turns on them without
PostgreSQL's advisory locks."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from django.db import connections

from ...coordination.models import CoordinationKey
from ..db import using
from .generic import Dialect


class MySQL(Dialect):
    """The store on MariaDB (10.6 and later) and MySQL (8.0.1 and later): Django's vendor
    ``mysql``. See :class:`~.generic.Dialect` for each operation."""

    def lock_event_keys(self, keys: Sequence[str], *, shared: bool) -> None:
        """Row locks on one ``CoordinationKey`` row per key (kind ``event``, the key's SHA-256,
        created on first use), in the keys' order, in one statement each way: an emit's insert
        leaves a row that was there locked shared (its duplicate key check), a wait's upsert
        locks it exclusive. A lock is never upgraded, so two emits never deadlock each other.
        """
        digests = sorted({hashlib.sha256(key.encode()).hexdigest() for key in keys})
        table = CoordinationKey._meta.db_table
        rows = ", ".join(["(%s, %s)"] * len(digests))
        params: list[str] = []
        for digest in digests:
            params += [CoordinationKey.Kind.EVENT, digest]
        statement = (
            f"INSERT IGNORE INTO {table} (kind, `key`) VALUES {rows}"
            if shared
            else f"INSERT INTO {table} (kind, `key`) VALUES {rows} "
            "ON DUPLICATE KEY UPDATE `key` = `key`"
        )
        with connections[using()].cursor() as cursor:
            cursor.execute(statement, params)
