"""What the benchmark scripts share: the PostgreSQL server they use and creating databases on it."""

from __future__ import annotations

import os

#: The server every benchmark uses (``BENCH_PG`` overrides it); databases are named per script.
PG_SERVER = os.environ.get("BENCH_PG", "postgresql://postgres@127.0.0.1:5432").rstrip("/")


def ensure_database(name: str) -> None:
    """Create database ``name`` on the benchmark server if it does not exist."""
    import psycopg
    from psycopg import sql

    with psycopg.connect(f"{PG_SERVER}/postgres", autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
        if exists is None:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
