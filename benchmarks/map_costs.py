"""Where a fanned-out map's database work goes: its fixed costs apart from its per-chunk costs.

``map_fanout.py`` times a map through real workers; this script runs the same map
(``benchmarks.map_reactors.Map_b100_c50``) in one process, phase by phase, with the tasks a
worker would run called directly (``django_reactor.testing.run_reactor(background="none")``),
and prints for each phase the statements sent (by kind), the commits and the WAL records and
bytes of the benchmark database (``benchmarks/pgstats.py``: ``pg_stat_database`` and
``pg_walinspect``), and the wall time:

* **create**: ``run()`` up to ``Dispatched``: the run's row, the map's row, its source written as
  chunks, its element tasks queued;
* **elements**: the first element task, which claims and settles every chunk in turn (one task,
  so no concurrency: the per-chunk figures are per chunk of ``chunk_size`` elements) and, with
  the last settle, fans the map in and queues the run's wake-up;
* **idle task**: the second element task queued at the start, which finds nothing to claim;
* **resume**: the wake-up task, which resumes the run past the map and completes it.

``--contention ROUNDS`` instead times two processes claiming and settling the chunks of one map
(no element run), against two processes each on a map of its own: whether the tasks of one map
wait for each other. It also prints the durable chunks chord's statement per chunk
(``chunks_anchor.store_chunk``)
measured the same way, called directly. Database ``reactor_bench_mapcosts`` (its own;
``BENCH_MAPCOSTS_DB`` names another, to compare two trees); no broker is used::

    .venv/bin/python benchmarks/map_costs.py [--elements 10000]
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks.common import PG_SERVER, backend_cpu, ensure_database

DATABASE = os.environ.get("BENCH_MAPCOSTS_DB", "reactor_bench_mapcosts")
os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.bg_settings"
os.environ["DATABASE_URL"] = f"{PG_SERVER}/{DATABASE}"
os.environ["CELERY_BROKER_URL"] = "memory://"
os.environ["REACTOR_BENCH_QUEUE"] = "django_reactor_bench_mapcosts"
os.environ["CHUNKS_DSN"] = f"{PG_SERVER}/{DATABASE}"


def kind(sql: str) -> str:
    """A statement's kind: its verb and first table (enough to tell the map's statements)."""
    words = sql.replace('"', "").split()
    head = words[0].upper() if words else "?"
    if head in ("SAVEPOINT", "RELEASE", "ROLLBACK"):
        return head
    for marker in ("INTO", "UPDATE", "FROM"):
        for at, word in enumerate(words[1:], 1):
            if word.upper() == marker and at + 1 < len(words) and head != "UPDATE":
                return f"{head} {words[at + 1].removeprefix('django_reactor_')}"
    if head == "UPDATE" and len(words) > 1:
        return f"UPDATE {words[1].removeprefix('django_reactor_')}"
    if head == "WITH":
        return "WITH " + " ".join(words[1:4])[:40]
    return head


class Phase:
    """One phase's statements (by kind), database counters and wall time."""

    def __init__(self, probe: Any, name: str) -> None:
        self.probe = probe
        self.name = name
        self.kinds: Counter[str] = Counter()
        self.seconds = 0.0
        self.delta: Any = None

    def __enter__(self) -> Phase:
        from django.db import connection, connections
        from django.test.utils import CaptureQueriesContext

        connections.close_all()
        self.before = self.probe.snapshot()
        self.capture = CaptureQueriesContext(connection)
        self.capture.__enter__()
        self.started = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        from django.db import connections

        self.seconds = time.perf_counter() - self.started
        self.capture.__exit__(*exc)
        self.kinds.update(kind(q["sql"]) for q in self.capture.captured_queries)
        connections.close_all()  # its backend flushes its counters as it exits
        self.delta = self.probe.diff(self.before, self.probe.snapshot())

    def report(self, per: int = 1, label: str = "") -> str:
        d = self.delta
        lines = [
            f"{self.name}{label}: {self.seconds * 1000 / per:.2f} ms, "
            f"{sum(self.kinds.values()) / per:.2f} statements, {d.commits / per:.2f} commits, "
            f"{(d.db_wal_records or 0) / per:.1f} WAL records, "
            f"{(d.db_wal_bytes or 0) / per:.0f} WAL bytes"
        ]
        for name, n in self.kinds.most_common():
            lines.append(f"    {n / per:8.2f}  {name}")
        return "\n".join(lines)


def _settle_all(map_id: uuid.UUID, barrier: Any, out: Any) -> None:
    """A process claiming and settling chunks of ``map_id`` (every element succeeded, none
    run) until none is left; puts ``(chunks, seconds)``."""
    from django.db import connections

    from django_reactor.store import maps as store_maps

    connections.close_all()  # the parent's connection is not this process's
    token = uuid.uuid4().hex
    claim, _ = store_maps.claim(map_id, forward=True, token=token)
    barrier.wait()
    started, chunks = time.perf_counter(), 0
    while claim is not None:
        writes = [store_maps.SlotWrite(s.index, "succeeded", value=s.item) for s in claim.slots]
        _, (claim, _) = store_maps.settle(
            map_id,
            claim.chunk,
            writes,
            tolerated=None,
            token=token,
            claim_next=True,
            retaken=claim.retaken,
        )
        chunks += 1
    out.put((chunks, time.perf_counter() - started))


def contention(elements: int, rounds: int) -> None:
    """Two processes settling chunks of one map, against two each settling a map of its own:
    chunks per second (how much the tasks of one map slow each other down)."""
    import multiprocessing

    from django.db import connections

    from benchmarks.map_reactors import DEFAULT, REACTORS
    from django_reactor.models import MapRun
    from django_reactor.testing import run_reactor

    def new_map(count: int) -> uuid.UUID:
        result = run_reactor(REACTORS[DEFAULT], {"count": count}, background="none")
        return MapRun.objects.get(execution_id=result.execution_id).pk

    context = multiprocessing.get_context("fork")
    for _ in range(rounds):
        rates = []
        for maps in ([new_map(2 * elements)] * 2, [new_map(elements), new_map(elements)]):
            connections.close_all()
            barrier, out = context.Barrier(2), context.Queue()
            workers = [context.Process(target=_settle_all, args=(m, barrier, out)) for m in maps]
            for worker in workers:
                worker.start()
            done = [out.get(timeout=600) for _ in workers]
            for worker in workers:
                worker.join()
            rates.append(sum(n for n, _ in done) / max(s for _, s in done))
        print(f"chunks/s, two processes: one map {rates[0]:.0f}, a map each {rates[1]:.0f}")


def server_cpu(elements: int, rounds: int) -> None:
    """The server's CPU per chunk: the backend's own CPU time while this process claims and
    settles every chunk of a map (no element run), against the durable chunks chord's
    ``store_chunk`` for as many chunks; medians of ``rounds``. The server must run on this
    machine (its processes' times are read from /proc)."""
    import statistics

    from django.db import connection

    from benchmarks import chunks_anchor
    from benchmarks.map_reactors import DEFAULT, REACTORS
    from django_reactor.models import MapRun
    from django_reactor.store import maps as store_maps
    from django_reactor.testing import run_reactor

    chunks_anchor.create_table()
    per_map: list[float] = []
    per_anchor: list[float] = []
    for _ in range(rounds):
        result = run_reactor(REACTORS[DEFAULT], {"count": elements}, background="none")
        map_id = MapRun.objects.get(execution_id=result.execution_id).pk
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            pid = cursor.fetchone()[0]
        token, settles = uuid.uuid4().hex, 0
        before = backend_cpu(pid) or 0.0
        claim, _ = store_maps.claim(map_id, forward=True, token=token)
        while claim is not None:
            writes = [store_maps.SlotWrite(s.index, "succeeded", value=s.item) for s in claim.slots]
            _, (claim, _) = store_maps.settle(
                map_id,
                claim.chunk,
                writes,
                tolerated=None,
                token=token,
                claim_next=True,
                retaken=claim.retaken,
            )
            settles += 1
        per_map.append(((backend_cpu(pid) or 0.0) - before) / settles)
        chunks_anchor.empty_table()
        anchor_pid = chunks_anchor.connection().info.backend_pid
        batch = uuid.uuid4().hex
        before = backend_cpu(anchor_pid) or 0.0
        for start in range(0, settles * chunks_anchor.CHUNK, chunks_anchor.CHUNK):
            chunks_anchor.store_chunk(batch, start, start + chunks_anchor.CHUNK)
        per_anchor.append(((backend_cpu(anchor_pid) or 0.0) - before) / settles)
    print(
        f"server CPU per chunk of {DEFAULT[1]} (claim and settle; medians of {rounds}): map "
        f"{statistics.median(per_map) * 1000:.3f} ms, anchor "
        f"{statistics.median(per_anchor) * 1000:.3f} ms "
        f"(map {', '.join(f'{x * 1000:.3f}' for x in per_map)}; "
        f"anchor {', '.join(f'{x * 1000:.3f}' for x in per_anchor)})"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--elements", type=int, default=10000)
    parser.add_argument(
        "--contention",
        type=int,
        default=0,
        metavar="ROUNDS",
        help="only time two processes settling one map against a map each, ROUNDS times",
    )
    parser.add_argument(
        "--cprofile",
        type=int,
        default=0,
        metavar="N",
        help="profile the elements phase (the Python of the element task): function calls per "
        "element and the N functions of most own time",
    )
    parser.add_argument(
        "--server-cpu",
        type=int,
        default=0,
        metavar="ROUNDS",
        help="only measure the server's CPU per chunk settled, against the anchor's, ROUNDS times",
    )
    args = parser.parse_args(argv)
    ensure_database(DATABASE)
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    if args.contention:
        contention(args.elements, args.contention)
        return 0
    if args.server_cpu:
        server_cpu(args.elements, args.server_cpu)
        return 0
    from benchmarks import chunks_anchor
    from benchmarks.map_reactors import DEFAULT, REACTORS
    from benchmarks.pgstats import Probe
    from django_reactor.models import MapRun
    from django_reactor.runtime import maps
    from django_reactor.testing import run_reactor

    reactor = REACTORS[DEFAULT]
    n = args.elements
    chunks = -(-n // DEFAULT[1])
    run_reactor(reactor, {"count": 100}, background="none").drain()  # warm-up
    with Probe(PG_SERVER, DATABASE) as probe:
        probe.calibrate()
        with Phase(probe, "create") as create:
            result = run_reactor(reactor, {"count": n}, background="none")
        queue = result._queue
        tasks = [target for task, target in queue.pending if task == "map"]
        queue.pending.clear()
        map_id = MapRun.objects.get(execution_id=result.execution_id).pk
        profiler = cProfile.Profile() if args.cprofile else None
        with queue.capturing(), Phase(probe, "elements") as elements:
            if profiler is not None:
                profiler.enable()
            maps.work(map_id, forward=True)
            if profiler is not None:
                profiler.disable()
        with queue.capturing(), Phase(probe, "idle task") as idle:
            for _ in tasks[1:]:
                maps.work(map_id, forward=True)
        with Phase(probe, "resume") as resume:
            result.drain()
        assert result.status == "completed", result.status
        chunks_anchor.create_table()
        chunks_anchor.empty_table()
        chunks_anchor.connection().close()
        with Phase(probe, "anchor chunks") as anchor:
            batch = uuid.uuid4().hex
            for start in range(0, n, chunks_anchor.CHUNK):
                chunks_anchor.store_chunk(batch, start, min(start + chunks_anchor.CHUNK, n))
            chunks_anchor.count_stored([], batch)
            chunks_anchor.connection().close()
    print(f"map of {n} elements, {chunks} chunks of {DEFAULT[1]} ({len(tasks)} element tasks)")
    print(create.report())
    print(elements.report())
    print(elements.report(chunks, " per chunk"))
    print(idle.report())
    print(resume.report())
    print("anchor (statements through psycopg directly, not counted):")
    print(anchor.report(chunks, " per chunk"))
    fixed = create.delta.commits + idle.delta.commits + resume.delta.commits
    print(
        f"per element: map {(fixed + elements.delta.commits) / n:.4f} commits, "
        f"{(create.delta.db_wal_records + elements.delta.db_wal_records) / n:.2f} WAL records "
        f"(create + elements); anchor {anchor.delta.commits / n:.4f} commits, "
        f"{anchor.delta.db_wal_records / n:.2f} WAL records"
    )
    if profiler is not None:
        stats = pstats.Stats(profiler)
        calls = stats.total_calls  # type: ignore[attr-defined]
        print(f"elements phase, cProfile: {calls / n:.1f} function calls per element")
        stats.sort_stats("tottime").print_stats(args.cprofile)
    return 0


if __name__ == "__main__":
    sys.exit(main())
