"""Statements, commits and connections counted at the psycopg driver, so that statements which
bypass Django's cursor (the store's checkpoints and claims) count too (``bg_profile.py``,
``wake_profile.py``)."""

from __future__ import annotations

import collections
import functools
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


class Counters:
    """Driver-level counts: statements sent, commits, connections opened."""

    def __init__(self) -> None:
        self.statements: collections.Counter[str] = collections.Counter()
        self.commits = 0
        self.connects = 0
        self.active = False

    def reset(self) -> None:
        self.statements.clear()
        self.commits = 0
        self.connects = 0

    @contextmanager
    def counting(self) -> Iterator[Counters]:
        self.reset()
        self.active = True
        try:
            yield self
        finally:
            self.active = False

    def install(self) -> None:
        import psycopg

        counters = self
        execute = psycopg.Cursor.execute
        commit = psycopg.Connection.commit
        connect = psycopg.connect

        @functools.wraps(execute)
        def counted_execute(cursor: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
            if counters.active:
                counters.statements[_kind(query)] += 1
            return execute(cursor, query, *args, **kwargs)

        @functools.wraps(commit)
        def counted_commit(conn: Any) -> Any:
            if counters.active:
                counters.commits += 1
            return commit(conn)

        def counted_connect(*args: Any, **kwargs: Any) -> Any:
            if counters.active:
                counters.connects += 1
            return connect(*args, **kwargs)

        psycopg.Cursor.execute = counted_execute  # type: ignore[method-assign]
        psycopg.Connection.commit = counted_commit  # type: ignore[method-assign]
        psycopg.connect = counted_connect  # Django connects through psycopg.connect


def _kind(query: Any) -> str:
    text = query if isinstance(query, str) else str(getattr(query, "_obj", query))
    words = text.lstrip("( ").split(None, 3)
    head = " ".join(words[:1]).upper()
    if head == "WITH":
        return "WITH ... (checkpoint)"
    if not head.startswith(("SELECT", "UPDATE", "INSERT", "DELETE")):
        return text[:60]
    table = next((w.strip('"') for w in text.split() if "django_reactor_" in w), "")
    return f"{head} {table.split('.')[0].strip(chr(34)) or text[:60]}"
