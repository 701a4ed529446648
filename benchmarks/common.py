"""What the benchmark scripts share: the PostgreSQL server, databases, CPU load, quantiles."""

from __future__ import annotations

import os
import time
from pathlib import Path

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


def cpu_busy(seconds: float) -> float:
    """The share of all CPUs busy (not idle or iowait) over ``seconds``, from /proc/stat."""

    def sample() -> tuple[int, int]:
        try:
            fields = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
        except (OSError, ValueError):
            return 0, 0
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
        return sum(fields), idle

    total0, idle0 = sample()
    time.sleep(seconds)
    total1, idle1 = sample()
    if total1 <= total0:
        return 0.0
    return 1.0 - (idle1 - idle0) / (total1 - total0)


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) by the nearest-rank method."""
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 1))  # ceil(n * q)
    return ordered[int(rank) - 1]


#: Clock ticks a second, the unit of ``/proc/<pid>/stat``'s CPU times.
TICK = float(os.sysconf("SC_CLK_TCK"))


def backend_cpu(pid: int) -> float | None:
    """CPU seconds PostgreSQL backend ``pid`` ran so far (None once it is gone).

    ``/proc/<pid>/schedstat`` (nanoseconds on the CPU) when the kernel has it: ``stat``'s
    user + system time counts in clock ticks (10 ms), coarse for a backend's share of a
    200-run burst. A backend is one thread, which is all ``schedstat`` counts.
    """
    try:
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) / 1e9
    except (OSError, IndexError, ValueError):
        pass
    return process_cpu(pid)


def process_cpu(pid: int) -> float | None:
    """User + system CPU seconds of process ``pid``, every thread of it, ended ones included."""
    try:
        rest = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(rest[11]) + int(rest[12])) / TICK
