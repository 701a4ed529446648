"""``pg_stat`` figures for the benchmarks: snapshots of one database's counters, and their diff.

A :class:`Probe` watches one database on the benchmark server. :meth:`Probe.snapshot` reads:

* ``pg_stat_database`` of that database: ``xact_commit``, ``xact_rollback``, ``tup_inserted``,
  ``tup_updated`` (every transaction counts, read-only ones included);
* ``pg_stat_wal``: ``wal_records``, ``wal_fpi``, ``wal_bytes``. **Server-wide**: anything else
  writing on the server during a window counts too, so the snapshot also keeps the transaction
  count of every *other* database, and :class:`Delta` says how many ran in the window;
* ``pg_stat_user_tables`` of that database: ``n_tup_upd`` and ``n_tup_hot_upd`` per table;
* ``pg_stat_statements`` (``sum(calls)`` for the database) when the extension is loaded
  (``shared_preload_libraries``) and created; otherwise statements come from an in-process
  :class:`StatementCounter` (driver level: psycopg ``Cursor.execute`` / ``executemany``, so
  statements that bypass Django's cursor count too) when one is given, else they are unknown;
* the WAL flush position, so that when the ``pg_walinspect`` extension is available (contrib,
  PostgreSQL 15) :meth:`Probe.diff` also counts the WAL records of **this database only**: the
  records that touch one of its relations (``block_ref`` names ``<tablespace>/<db oid>/...``)
  and the commit records of the transactions that wrote them. Read straight from the WAL, these
  are exact and immune to other databases' traffic and to the statistics lag below.

The statistics lag (PostgreSQL 15). A backend keeps its counters to itself and adds them to
shared memory at most once a second (``PGSTAT_MIN_INTERVAL``): at the end of a transaction if
the last flush was at least 1 s ago, else 10 s after it went idle (``PGSTAT_IDLE_INTERVAL``),
and always when it exits. There is no ``pg_stat_force_next_flush()`` before PostgreSQL 16, so
:meth:`Probe.settle`, called before every snapshot, waits (bounded) until the counters of the
work before it are in: every other backend of the database has either exited, or ended a
transaction at least 1.1 s after the settle began, or been idle for 10.5 s; then, when no other
backend is left, until two reads of the database's counters 0.2 s apart agree. Each read
starts with ``pg_stat_clear_snapshot()`` (``stats_fetch_consistency = cache`` would otherwise
keep serving the first read of a transaction). So: close your own connections to the database
before the snapshot that ends a window (they flush on exit), and expect a window that ends with
workers still connected and idle to take about 10 s to settle.

The probe's own reads of ``pg_stat_user_tables`` need a connection to the database (opened and
closed per snapshot); its transactions are measured once with an empty window
(:meth:`Probe.calibrate`) and taken off every :meth:`Probe.diff`. Everything else is read
through a connection to the ``postgres`` database.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

IDLE_FLUSH = 10.5  # s: PGSTAT_IDLE_INTERVAL (10 s) and a margin
MIN_FLUSH = 1.1  # s: PGSTAT_MIN_INTERVAL (1 s) and a margin


# ---------------------------------------------------------------------------- statements


class StatementCounter:
    """Counts the statements this process sends through psycopg 3, per database (all threads).

    ``install()`` wraps ``psycopg.Cursor.execute`` and ``executemany`` (Django's client-side
    cursor and server-binding cursors both go through them, so does SQLAlchemy's psycopg
    dialect); ``uninstall()`` puts them back.
    """

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}  # database name -> statements
        self._lock = threading.Lock()
        self._saved: tuple[Any, Any] | None = None

    def install(self) -> StatementCounter:
        import psycopg

        if self._saved is not None:
            return self
        execute, executemany = psycopg.Cursor.execute, psycopg.Cursor.executemany
        self._saved = (execute, executemany)
        counter = self

        @functools.wraps(execute)
        def counted_execute(cursor: Any, *args: Any, **kwargs: Any) -> Any:
            counter.add(cursor, 1)
            return execute(cursor, *args, **kwargs)

        @functools.wraps(executemany)
        def counted_executemany(cursor: Any, query: Any, params_seq: Any, **kwargs: Any) -> Any:
            params_seq = list(params_seq)
            counter.add(cursor, len(params_seq))
            return executemany(cursor, query, params_seq, **kwargs)

        psycopg.Cursor.execute = counted_execute  # type: ignore[method-assign]
        psycopg.Cursor.executemany = counted_executemany  # type: ignore[method-assign]
        return self

    def add(self, cursor: Any, n: int) -> None:
        try:
            database = cursor.connection.info.dbname
        except Exception:  # a closed connection: its statement fails anyway
            return
        with self._lock:
            self.counts[database] = self.counts.get(database, 0) + n

    def count(self, database: str) -> int:
        with self._lock:
            return self.counts.get(database, 0)

    def uninstall(self) -> None:
        import psycopg

        if self._saved is not None:
            psycopg.Cursor.execute, psycopg.Cursor.executemany = self._saved  # type: ignore[method-assign]
            self._saved = None


# ---------------------------------------------------------------------------- snapshots


@dataclass(frozen=True)
class Snapshot:
    """The counters of one database (and the server's WAL counters) at one moment."""

    at: float  # time.monotonic()
    xact_commit: int
    xact_rollback: int
    tup_inserted: int
    tup_updated: int
    # commits + rollbacks of every other database but ``postgres`` (where the probe's own
    # queries run): the server-wide WAL counters are shared with them
    other_xacts: int
    wal_records: int
    wal_fpi: int
    wal_bytes: int
    flush_lsn: str
    tables: dict[str, tuple[int, int]]  # table -> (n_tup_upd, n_tup_hot_upd)
    statements: int | None  # pg_stat_statements, or the in-process counter, or None


@dataclass(frozen=True)
class Delta:
    """What happened between two snapshots (or that divided by a number of runs or steps)."""

    seconds: float
    commits: float  # pg_stat_database.xact_commit, read-only transactions included
    rollbacks: float
    tup_inserted: float
    tup_updated: float
    other_xacts: float
    wal_records: float  # pg_stat_wal: server-wide
    wal_fpi: float
    wal_bytes: float
    tables: dict[str, tuple[float, float]] = field(default_factory=dict)
    statements: float | None = None
    db_wal_records: float | None = None  # pg_walinspect: this database's records only
    db_wal_bytes: float | None = None
    db_wal_commits: float | None = None  # commit records: transactions that wrote something

    def _map(self, fn: Any, other: Delta | None = None) -> Delta:
        def one(name: str) -> Any:
            mine = getattr(self, name)
            theirs = getattr(other, name) if other is not None else None
            if mine is None or (other is not None and theirs is None):
                return None
            return fn(mine, theirs)

        names = [
            "seconds", "commits", "rollbacks", "tup_inserted", "tup_updated", "other_xacts",
            "wal_records", "wal_fpi", "wal_bytes", "statements", "db_wal_records",
            "db_wal_bytes", "db_wal_commits",
        ]  # fmt: skip
        tables: dict[str, tuple[float, float]] = {}
        for name, (upd, hot) in self.tables.items():
            if other is None:
                tables[name] = (fn(upd, None), fn(hot, None))
            else:
                upd2, hot2 = other.tables.get(name, (0, 0))
                tables[name] = (fn(upd, upd2), fn(hot, hot2))
        return Delta(**{name: one(name) for name in names}, tables=tables)

    def per(self, n: float) -> Delta:
        """Every figure divided by ``n`` (runs, steps), ``seconds`` included."""
        return self._map(lambda v, _: v / n)

    def minus(self, other: Delta) -> Delta:
        return self._map(lambda a, b: a - b, other)

    def scaled(self, factor: float) -> Delta:
        return self._map(lambda v, _: v * factor)

    def hot_share(self, table: str) -> float | None:
        """Share of the table's updates that were HOT (None when it had no update)."""
        upd, hot = self.tables.get(table, (0, 0))
        return hot / upd if upd > 0 else None

    def wal(self) -> tuple[float, float, str]:
        """(records, bytes, source): this database's WAL when known, else the server's."""
        if self.db_wal_records is not None and self.db_wal_bytes is not None:
            return self.db_wal_records, self.db_wal_bytes, "db"
        return self.wal_records, self.wal_bytes, "server"


class Probe:
    """Snapshots of one database's ``pg_stat`` counters (see the module docstring)."""

    def __init__(
        self, server: str, database: str, *, statements: StatementCounter | None = None
    ) -> None:
        import psycopg

        self.server = server.rstrip("/")
        self.database = database
        self.counter = statements
        self.overhead: Delta | None = None
        self.errors: list[str] = []
        self._admin = psycopg.connect(f"{self.server}/postgres", autocommit=True)
        row = self._admin.execute(
            "SELECT oid FROM pg_database WHERE datname = %s", (database,)
        ).fetchone()
        if row is None:
            raise LookupError(f"no database {database!r}")
        self.oid = int(row[0])
        self.walinspect = False
        self.pg_stat_statements = False
        with self._connect() as conn:
            available = {
                name
                for (name,) in conn.execute(
                    "SELECT name FROM pg_available_extensions "
                    "WHERE name IN ('pg_walinspect', 'pg_stat_statements')"
                )
            }
            if "pg_walinspect" in available:
                with contextlib.suppress(psycopg.Error):
                    conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
                    self.walinspect = True
            preload = conn.execute("SHOW shared_preload_libraries").fetchone()[0]
            if "pg_stat_statements" in available and "pg_stat_statements" in preload:
                with contextlib.suppress(psycopg.Error):
                    conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
                    conn.execute("SELECT 1 FROM pg_stat_statements LIMIT 1")
                    self.pg_stat_statements = True

    def close(self) -> None:
        self._admin.close()

    def __enter__(self) -> Probe:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _connect(self) -> Any:
        import psycopg

        return psycopg.connect(f"{self.server}/{self.database}", autocommit=True)

    @property
    def statement_source(self) -> str:
        if self.pg_stat_statements:
            return "pg_stat_statements"
        return "driver (this process)" if self.counter is not None else "n/a"

    def _db_counters(self) -> tuple[Any, ...]:
        self._admin.execute("SELECT pg_stat_clear_snapshot()")
        row = self._admin.execute(
            "SELECT xact_commit, xact_rollback, tup_inserted, tup_updated, "
            "(SELECT coalesce(sum(xact_commit + xact_rollback), 0) FROM pg_stat_database o "
            " WHERE o.datid <> d.datid AND o.datname IS DISTINCT FROM 'postgres') "
            "FROM pg_stat_database d WHERE datid = %s",
            (self.oid,),
        ).fetchone()
        return tuple(int(v) for v in row)

    def settle(self, *, timeout: float = 20.0) -> float:
        """Wait until the counters of the work done so far are in (see the module docstring).

        Returns the seconds waited. Gives up quietly after ``timeout`` seconds.
        """
        started = time.monotonic()
        began = self._admin.execute("SELECT clock_timestamp()").fetchone()[0]
        deadline = started + timeout
        flushed: set[int] = set()  # backends seen past a flush point since ``began``
        while True:
            rows = self._admin.execute(
                "SELECT pid, state = 'idle' AND ("
                "  state_change >= %s + make_interval(secs => %s) "
                "  OR clock_timestamp() - state_change >= make_interval(secs => %s)) "
                "FROM pg_stat_activity "
                "WHERE datid = %s AND backend_type = 'client backend' AND pid <> pg_backend_pid()",
                (began, MIN_FLUSH, IDLE_FLUSH, self.oid),
            ).fetchall()
            flushed |= {int(pid) for pid, ok in rows if ok}
            others = len(rows)
            if all(int(pid) in flushed for pid, _ in rows):
                break
            if time.monotonic() > deadline:
                return time.monotonic() - started
            time.sleep(0.1)
        if others == 0:  # nobody left to add anything: wait for the exits' flushes to land
            previous = self._db_counters()
            while time.monotonic() < deadline:
                time.sleep(0.2)
                current = self._db_counters()
                if current == previous:
                    break
                previous = current
        return time.monotonic() - started

    def snapshot(self, *, settle: bool = True) -> Snapshot:
        if settle:
            self.settle()
        with self._connect() as conn:
            conn.execute("SELECT pg_stat_clear_snapshot()")
            tables = {
                (name if schema == "public" else f"{schema}.{name}"): (int(upd), int(hot))
                for schema, name, upd, hot in conn.execute(
                    "SELECT schemaname, relname, n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables"
                )
            }
            statements: int | None = None
            if self.pg_stat_statements:
                statements = int(
                    conn.execute(
                        "SELECT coalesce(sum(calls), 0) FROM pg_stat_statements WHERE dbid = %s",
                        (self.oid,),
                    ).fetchone()[0]
                )
        if statements is None and self.counter is not None:
            statements = self.counter.count(self.database)
        commit, rollback, inserted, updated, others = self._db_counters()
        wal = self._admin.execute(
            "SELECT wal_records, wal_fpi, wal_bytes, pg_current_wal_flush_lsn()::text "
            "FROM pg_stat_wal"
        ).fetchone()
        return Snapshot(
            at=time.monotonic(),
            xact_commit=commit,
            xact_rollback=rollback,
            tup_inserted=inserted,
            tup_updated=updated,
            other_xacts=others,
            wal_records=int(wal[0]),
            wal_fpi=int(wal[1]),
            wal_bytes=int(wal[2]),
            flush_lsn=wal[3],
            tables=tables,
            statements=statements,
        )

    def _db_wal(self, start: str, end: str) -> tuple[int, int, int] | None:
        """(records, bytes, commit records) of this database between two LSNs (pg_walinspect)."""
        import psycopg

        if not self.walinspect:
            return None
        if start == end:  # nothing written (pg_walinspect refuses a start at the flush point)
            return 0, 0, 0
        pattern = f"% rel %/{self.oid}/%"
        try:
            with self._connect() as conn:
                row = conn.execute(
                    "WITH r AS (SELECT xid, resource_manager, record_type, record_length, "
                    "  coalesce(block_ref, '') LIKE %s AS ours "
                    "  FROM pg_get_wal_records_info(%s::pg_lsn, %s::pg_lsn)), "
                    "x AS (SELECT DISTINCT xid FROM r WHERE ours AND xid::text <> '0') "
                    "SELECT count(*), coalesce(sum(record_length), 0), "
                    "  count(*) FILTER (WHERE resource_manager = 'Transaction' "
                    "                   AND record_type LIKE 'COMMIT%%') "
                    "FROM r WHERE ours OR (xid::text <> '0' AND xid IN (SELECT xid FROM x))",
                    (pattern, start, end),
                ).fetchone()
        except psycopg.Error as exc:
            self.errors.append(f"pg_walinspect {start}..{end}: {exc}")
            return None
        return int(row[0]), int(row[1]), int(row[2])

    def diff(self, before: Snapshot, after: Snapshot, *, raw: bool = False) -> Delta:
        """``after - before``, less the probe's own footprint (unless ``raw``)."""
        tables = {}
        for name, (upd, hot) in after.tables.items():
            upd0, hot0 = before.tables.get(name, (0, 0))
            tables[name] = (upd - upd0, hot - hot0)
        statements = None
        if before.statements is not None and after.statements is not None:
            statements = float(after.statements - before.statements)
        db_wal = self._db_wal(before.flush_lsn, after.flush_lsn)
        delta = Delta(
            seconds=after.at - before.at,
            commits=after.xact_commit - before.xact_commit,
            rollbacks=after.xact_rollback - before.xact_rollback,
            tup_inserted=after.tup_inserted - before.tup_inserted,
            tup_updated=after.tup_updated - before.tup_updated,
            other_xacts=after.other_xacts - before.other_xacts,
            wal_records=after.wal_records - before.wal_records,
            wal_fpi=after.wal_fpi - before.wal_fpi,
            wal_bytes=after.wal_bytes - before.wal_bytes,
            tables={k: (float(u), float(h)) for k, (u, h) in tables.items()},
            statements=statements,
            db_wal_records=None if db_wal is None else float(db_wal[0]),
            db_wal_bytes=None if db_wal is None else float(db_wal[1]),
            db_wal_commits=None if db_wal is None else float(db_wal[2]),
        )
        if raw or self.overhead is None:
            return delta
        return replace(
            delta,
            commits=delta.commits - self.overhead.commits,
            rollbacks=delta.rollbacks - self.overhead.rollbacks,
        )

    def calibrate(self) -> Delta:
        """Measure the probe's own transactions in the database with an empty window."""
        before = self.snapshot()
        after = self.snapshot()
        self.overhead = self.diff(before, after, raw=True)
        return self.overhead

    @contextlib.contextmanager
    def window(self) -> Iterator[list[Delta]]:
        """``with probe.window() as got: ...``: settle, snapshot, run the body, settle, snapshot;
        ``got[0]`` is the diff afterwards."""
        got: list[Delta] = []
        before = self.snapshot()
        yield got
        got.append(self.diff(before, self.snapshot()))


# ---------------------------------------------------------------------------- printing


COLUMNS = (
    f"{'':22}{'statements':>11}{'commits':>9}{'WAL commits':>12}{'WAL records':>12}"
    f"{'WAL bytes':>11}{'HOT share':>11}  run table"
)


def row(name: str, delta: Delta, table: str) -> str:
    """One line of figures (already divided per run or per step) under :data:`COLUMNS`."""

    def num(value: float | None, fmt: str = "{:.1f}") -> str:
        return "n/a" if value is None else fmt.format(value)

    records, size, source = delta.wal()
    hot = delta.hot_share(table)
    upd = delta.tables.get(table, (0.0, 0.0))[0]
    return (
        f"{name:22}{num(delta.statements):>11}{num(delta.commits):>9}"
        f"{num(delta.db_wal_commits):>12}{num(records):>12}{num(size, '{:.0f}'):>11}"
        f"{num(hot, '{:.0%}'):>11}  {table} ({upd:.1f} updates)"
        + ("" if source == "db" else "  [WAL: server-wide]")
    )


def legend(probes: list[Probe]) -> str:
    """How the columns were taken, for the footer of a report."""
    walinspect = all(p.walinspect for p in probes)
    statements = sorted({f"{p.database}: {p.statement_source}" for p in probes})
    return (
        "statements: "
        + "; ".join(statements)
        + ". commits: pg_stat_database.xact_commit (read-only transactions too, less the "
        "harness's own). "
        + (
            "WAL commits / records / bytes: pg_walinspect, this database's records only "
            "(commit records = transactions that wrote WAL)."
            if walinspect
            else "WAL records / bytes: pg_stat_wal, server-wide (pg_walinspect unavailable)."
        )
        + " HOT share: pg_stat_user_tables n_tup_hot_upd / n_tup_upd of the run table."
    )


def interference(delta: Delta) -> str | None:
    """A warning when other databases ran transactions during a window (server-wide WAL)."""
    if delta.other_xacts > 0:
        return (
            f"{delta.other_xacts:.0f} transaction(s) ran in other databases during the window "
            "(pg_stat_wal is server-wide; the per-database WAL columns are not affected)"
        )
    return None
