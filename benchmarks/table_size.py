"""A worker's claim, a checkpoint, a sweep and the admin's main pages at 10,000 and at
10,000,000 runs in the table: the cost must not grow with the table (issue 28).

Run from the repository root (PostgreSQL on 127.0.0.1:5432, user ``postgres``, trust auth)::

    .venv/bin/python benchmarks/table_size.py [--rounds 3] [--rebuild] [--sizes 10k,10m]

What it measures
----------------
Two databases, ``reactor_size_10k`` and ``reactor_size_10m``, are built once by SQL generation
(``generate_series``, one ``INSERT ... SELECT`` per table, the secondary indexes dropped during
the load and built after it, then ``VACUUM ANALYZE``) and reused by later runs (``--rebuild``
rebuilds them; the 10,000,000-run build takes about half an hour on 2 cores):

* the history: N runs of the example project's reactors, 90 % completed, 7 % failed, 2 %
  cancelled, 1 % halted. The same traffic at both sizes: the last 10,000 ended over the last
  day (each with a dispatch sent an hour ago, within ``DISPATCH_RETENTION``), the others
  (none at 10,000) over the 365 days before, their dispatches long forgotten. One in a hundred
  has five step records, their trace events and a resumed interrupt, one in ten an
  idempotency key, one in a thousand a settled map of five elements;
* the same live runs at both sizes (what is moving depends on the traffic, not on the
  history): 500 sleeping runs (the sweep's batch), 200 pending runs with three step records
  (the claims' pool), 50 running runs with a live lease, 100 paused at an interrupt, 20
  needing attention.

Then, for each of ``--rounds`` rounds, each size is measured in a process of its own (the
sizes alternate, and so does their order), through the project's own code:

* ``claim``: ``store.claim_for_worker`` of a due pending run (each of the pool once);
* ``checkpoint``: the per-step cost of an inline run, ``(T(10 steps) - T(1 step)) / 9`` for
  each pair of runs, one after the other (``Chain.run({})``, as
  ``benchmarks/step_overhead.py``), i.e. one checkpoint of a running run with what the engine
  does around it;
* ``sweep, nothing due`` and ``sweep, a batch due``: ``services.sweep()`` (the whole sweep:
  outbox, wake-ups, recoveries, deadlines, interrupts, maps, request keys, schedules) with
  nothing to do, and with ``SWEEP_BATCH`` sleeping runs due (set due by SQL before each sweep
  and put back to sleep after; the publisher is a stub that sends nothing);
* the admin, through Django's test ``Client`` as a logged-in superuser with ``DEBUG`` off: the
  execution change list's first page, filtered by status and by reactor, a run's change form
  (steps and trace), the overview (last hour).

It prints each operation's median at both sizes, the ratio 10M / 10k and PASS when the ratio
is at most 1.10 (MISS otherwise). Override the server with ``BENCH_PG`` (default
``postgresql://postgres@127.0.0.1:5432``). The exit code is 0 whatever the figures: this is a
benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks import scale
from benchmarks.common import PG_SERVER, ensure_database

SIZES = {"10k": 10_000, "10m": 10_000_000}
TARGET_RATIO = 1.10
RECENT = 10_000  # runs that ended over the last day, at every size
TABLES = [
    "django_reactor_execution",
    "django_reactor_steprecord",
    "django_reactor_executionevent",
    "django_reactor_interrupt",
    "django_reactor_dispatch",
    "django_reactor_maprun",
    "django_reactor_mapresult",
]
ENDED_BANDS = [(0, "completed"), (90, "failed"), (97, "cancelled"), (99, "halted")]
SLEEPING, CLAIMABLE, RUNNING, PAUSED, ATTENTION = 500, 200, 50, 100, 20
OWNER = "table-size-bench"

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
os.environ["DJANGO_DEBUG"] = "0"


def database(label: str) -> str:
    return f"reactor_size_{label}"


# ---------------------------------------------------------------------------- build


def execute(statement: str, params: list[Any] | None = None) -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(statement, params or [])
        return cursor.rowcount


def autocommit(statement: str) -> None:
    """Run ``statement`` outside a transaction (``VACUUM``, ``CREATE INDEX``)."""
    from django.db import connection

    connection.ensure_connection()
    raw = connection.connection
    raw.autocommit = True
    with raw.cursor() as cursor:
        cursor.execute(statement)


def secondary_indexes() -> list[tuple[str, str]]:
    """(name, definition) of the indexes of the big tables that back no constraint."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT i.relname, pg_get_indexdef(i.oid) FROM pg_index x "
            "JOIN pg_class i ON i.oid = x.indexrelid JOIN pg_class t ON t.oid = x.indrelid "
            "WHERE t.relname = ANY(%s) AND NOT EXISTS "
            "(SELECT 1 FROM pg_constraint c WHERE c.conindid = x.indexrelid)",
            [TABLES],
        )
        return list(cursor.fetchall())


def build(runs: int, *, recent: int = 0, age_days: int = 0, children: bool = False) -> None:
    """Fill the database: ``runs`` ended runs by SQL generation, then the live runs.

    The last ``recent`` runs ended over the last day (each with a dispatch), the others over
    the 365 days before (one in ten with a dispatch); with ``recent`` 0, all of them over 365
    days. The newest ended ``age_days`` ago. With ``children``, one run in a hundred has a
    composed child."""
    from django.db import transaction

    from django_reactor import models, registry

    started = time.perf_counter()
    reactors = sorted(registry.all_reactors().items())[:5]
    for _name, cls in reactors:
        models.Definition.objects.get_or_create(
            hash=cls.definition.definition_hash, defaults={"shape": cls.definition.shape}
        )
    names = ", ".join(repr(name) for name, _ in reactors)
    hashes = ", ".join(repr(cls.definition.definition_hash) for _, cls in reactors)
    k = len(reactors)
    reactor = f"(ARRAY[{names}])[i % {k} + 1]"
    definition = f"(ARRAY[{hashes}])[i % {k} + 1]"
    indexes = secondary_indexes()
    for name, _ in indexes:
        execute(f'DROP INDEX "{name}"')
    execute("SET synchronous_commit = off")
    status = scale.status_case("i", ENDED_BANDS)
    old = runs - min(recent, runs)
    created = f"now() - interval '{age_days} days' - interval '365 days' * (1 - i::float8 / {runs})"
    if recent:
        created = (
            f"now() - interval '{age_days} days' - CASE WHEN i > {old} "
            f"THEN interval '1 day' * (({runs} - i)::float8 / {runs - old}) "
            f"ELSE interval '1 day' + interval '365 days' * (1 - i::float8 / {max(old, 1)}) END"
        )
    run_id = "md5('run-' || i)::uuid"
    with transaction.atomic():
        n = scale.insert_select(
            models.Execution,
            {
                "id": run_id,
                "reactor": reactor,
                "definition_hash": definition,
                "status": status,
                "inputs": "jsonb_build_object('order', i)",
                "secret_paths": "'[]'::jsonb",
                "idempotency_key": "CASE WHEN i % 10 = 0 THEN 'key-' || i END",
                "result": f"CASE WHEN {status} = 'completed' THEN '{{\"ok\": true}}'::jsonb END",
                "failure": (
                    f"CASE WHEN {status} = 'failed' THEN "
                    '\'{"kind": "error", "message": "boom"}\'::jsonb END'
                ),
                "fence": "1",
                "created_at": created,
                "started_at": created,
                "updated_at": f"{created} + interval '2 seconds'",
                "finished_at": f"{created} + interval '2 seconds'",
            },
            "generate_series(1, %s) AS i",
            [runs],
        )
        print(f"  {n:,} ended runs ({time.perf_counter() - started:.0f} s)", flush=True)
        dispatched = f"i > {old}" if recent else "i % 10 = 0"
        history(runs, run_id, reactor, created, status, dispatched)
        if children:
            composed_children(runs, run_id, reactor, definition, created)
    print(f"  history loaded ({time.perf_counter() - started:.0f} s)", flush=True)
    execute("SET maintenance_work_mem = '1GB'")
    for name, statement in indexes:
        autocommit(statement)
        print(f"  index {name} ({time.perf_counter() - started:.0f} s)", flush=True)
    with transaction.atomic():
        live(reactors)
        execute("DELETE FROM scale_meta")
        execute("INSERT INTO scale_meta VALUES ('runs', %s)", [str(runs)])
    autocommit("VACUUM ANALYZE")
    print(f"  built in {time.perf_counter() - started:.0f} s", flush=True)


def history(
    runs: int, run_id: str, reactor: str, created: str, status: str, dispatched: str
) -> None:
    """The ended runs' step records, trace, interrupts, dispatches (of the runs where
    ``dispatched`` holds) and maps."""
    from django_reactor import models

    stepped = "generate_series(1, %s) AS i, generate_series(1, 5) AS s WHERE i % 100 = 1"
    n = scale.insert_select(
        models.StepRecord,
        {
            "execution_id": run_id,
            "step": "'step_' || s",
            "status": "'completed'",
            "seq": "s",
            "attempts": "1",
            "arguments": "jsonb_build_object('order', i)",
            "secret_arguments": "'[]'::jsonb",
            "result": "jsonb_build_object('ok', s)",
            "started_at": created,
            "finished_at": created,
        },
        stepped,
        [runs],
    )
    m = scale.insert_select(
        models.ExecutionEvent,
        {
            "execution_id": run_id,
            "seq": "s",
            "kind": "'run'",
            "step": "'step_' || s",
            "attempt": "1",
            "at": created,
            "duration_ms": "1.5",
            "data": "'{}'::jsonb",
        },
        stepped,
        [runs],
    )
    print(f"  {n:,} step records, {m:,} events", flush=True)
    n = scale.insert_select(
        models.Interrupt,
        {
            "execution_id": run_id,
            "reactor": reactor,
            "step": "'approval'",
            "status": "'resumed'",
            "correlation_id": "'corr-' || i",
            "created_at": created,
            "closed_at": created,
        },
        "generate_series(1, %s) AS i WHERE i % 100 = 1",
        [runs],
    )
    m = scale.insert_select(
        models.Dispatch,
        {
            "execution_id": run_id,
            "reason": "'start'",
            "created_at": "now() - interval '1 hour'",
            "sent_at": "now() - interval '1 hour'",
        },
        f"generate_series(1, %s) AS i WHERE {dispatched}",
        [runs],
    )
    print(f"  {n:,} interrupts, {m:,} dispatches", flush=True)
    maps = "generate_series(1, %s) AS i WHERE i % 1000 = 1"
    n = scale.insert_select(
        models.MapRun,
        {
            "id": "md5('map-' || i)::uuid",
            "execution_id": run_id,
            "step": "'lines'",
            "status": "'settled'",
            "fan_out": "false",
            "size": "5",
            "batch_size": "100",
            "chunk_size": "50",
            "atomic": "true",
            "settled": "5",
            "succeeded": "5",
            "failed": "0",
            "collected": "true",
            "created_at": created,
            "updated_at": created,
        },
        maps,
        [runs],
    )
    m = scale.insert_select(
        models.MapResult,
        {
            "map_run_id": "md5('map-' || i)::uuid",
            "index": "e",
            "status": "'succeeded'",
            "item": "to_jsonb(e)",
            "value": "to_jsonb(e)",
            "attempts": "1",
            "finished_at": created,
        },
        "generate_series(1, %s) AS i, generate_series(0, 4) AS e WHERE i % 1000 = 1",
        [runs],
    )
    print(f"  {n:,} maps, {m:,} map elements", flush=True)


def composed_children(runs: int, run_id: str, reactor: str, definition: str, created: str) -> None:
    """One run in a hundred gets an ended composed child, with a step record."""
    from django_reactor import models

    child = "md5('child-' || i)::uuid"
    source = "generate_series(1, %s) AS i WHERE i % 100 = 3"
    n = scale.insert_select(
        models.Execution,
        {
            "id": child,
            "reactor": reactor,
            "definition_hash": definition,
            "status": "'completed'",
            "inputs": "'{}'::jsonb",
            "secret_paths": "'[]'::jsonb",
            "parent_id": run_id,
            "root_id": run_id,
            "parent_step": "'child'",
            "fence": "1",
            "created_at": created,
            "started_at": created,
            "updated_at": created,
            "finished_at": created,
        },
        source,
        [runs],
    )
    scale.insert_select(
        models.StepRecord,
        {
            "execution_id": child,
            "step": "'inner'",
            "status": "'completed'",
            "seq": "1",
            "attempts": "1",
            "arguments": "'{}'::jsonb",
            "secret_arguments": "'[]'::jsonb",
            "result": "'1'::jsonb",
            "started_at": created,
            "finished_at": created,
        },
        source,
        [runs],
    )
    print(f"  {n:,} composed children", flush=True)


def live(reactors: list[tuple[str, Any]]) -> None:
    """The live runs, the same at every size."""
    from django_reactor import models

    name, cls = reactors[0]
    kinds = [
        ("sleep", SLEEPING, "pending", "now() + interval '30 days'", None),
        ("claim", CLAIMABLE, "pending", "now() + interval '30 days'", None),
        ("running", RUNNING, "running", None, "now() + interval '30 days'"),
        ("paused", PAUSED, "paused", None, None),
        ("attention", ATTENTION, "needs_attention", None, None),
    ]
    for kind, count, status, wake_at, lease in kinds:
        scale.insert_select(
            models.Execution,
            {
                "id": f"md5('{kind}-' || i)::uuid",
                "reactor": repr(name),
                "definition_hash": repr(cls.definition.definition_hash),
                "status": f"'{status}'",
                "inputs": "jsonb_build_object('order', i)",
                "secret_paths": "'[]'::jsonb",
                "correlation_id": f"'{kind}-' || i" if kind == "paused" else "NULL",
                "current_step": "'step_4'",
                "fence": "1",
                "created_at": "now() - interval '1 minute'",
                "started_at": "now() - interval '1 minute'",
                "updated_at": "now() - interval '1 minute'",
                "wake_at": wake_at or "NULL",
                "lease_owner": "'w'" if lease else "NULL",
                "lease_expires_at": lease or "NULL",
            },
            "generate_series(1, %s) AS i",
            [count],
        )
    scale.insert_select(
        models.StepRecord,
        {
            "execution_id": "md5('claim-' || i)::uuid",
            "step": "'step_' || s",
            "status": "'completed'",
            "seq": "s",
            "attempts": "1",
            "arguments": "jsonb_build_object('order', i)",
            "secret_arguments": "'[]'::jsonb",
            "result": "jsonb_build_object('ok', s)",
            "started_at": "now() - interval '1 minute'",
            "finished_at": "now() - interval '1 minute'",
        },
        "generate_series(1, %s) AS i, generate_series(1, 3) AS s",
        [CLAIMABLE],
    )
    scale.insert_select(
        models.Interrupt,
        {
            "execution_id": "md5('paused-' || i)::uuid",
            "reactor": repr(name),
            "step": "'approval'",
            "status": "'waiting'",
            "correlation_id": "'paused-' || i",
            "created_at": "now() - interval '1 minute'",
        },
        "generate_series(1, %s) AS i",
        [PAUSED],
    )


# ---------------------------------------------------------------------------- measure


class StubPublisher:
    """Sends nothing and says every dispatch went out (the sweep's publish, without Celery)."""

    def publish(self, dispatches: Any) -> list[int]:
        return [d.dispatch_id for d in dispatches]


def pool(kind: str, count: int) -> str:
    """SQL: the ids of the live runs of ``kind``."""
    return f"(SELECT md5('{kind}-' || i)::uuid FROM generate_series(1, {count}) AS i)"


def timed(fn: Callable[[], Any]) -> float:
    started = time.perf_counter()
    fn()
    return (time.perf_counter() - started) * 1000


def measure_claims(samples: dict[str, list[float]]) -> None:
    import uuid

    from django_reactor import store

    def reset() -> None:
        execute(
            "UPDATE django_reactor_execution SET status = 'pending', lease_owner = NULL, "
            "lease_expires_at = NULL, wake_at = now() + interval '30 days', fence = 1 "
            f"WHERE id IN {pool('claim', CLAIMABLE)}"
        )

    execute(
        f"UPDATE django_reactor_execution SET wake_at = NULL WHERE id IN {pool('claim', CLAIMABLE)}"
    )
    try:
        ids = [uuid.UUID(scale._md5(f"claim-{i}").hex()) for i in range(1, CLAIMABLE + 1)]
        store.claim_for_worker(ids[0], OWNER)  # warm (prepared statement)
        for run_id in ids[1:]:
            ms = timed(lambda run_id=run_id: store.claim_for_worker(run_id, OWNER))
            samples["claim (store.claim_for_worker)"].append(ms)
    finally:
        reset()


def measure_checkpoints(samples: dict[str, list[float]], runs: int) -> None:
    from benchmarks.step_overhead import reactor_chain
    from django_reactor import models

    one, ten = reactor_chain(1), reactor_chain(10)
    one(), ten()
    for _ in range(runs):
        t1 = timed(one)
        samples["checkpoint (per step of an inline run)"].append((timed(ten) - t1) / 9)
    models.Execution.objects.filter(reactor__startswith="benchmarks.step_overhead.").delete()


def measure_sweeps(samples: dict[str, list[float]], repeat: int) -> None:
    from django_reactor import services
    from django_reactor.conf import reactor_settings

    services.sweep()
    for _ in range(repeat):
        samples["sweep, nothing due"].append(timed(services.sweep))
    batch = min(SLEEPING, reactor_settings.SWEEP_BATCH)
    sleepers = pool("sleep", batch)
    for _ in range(max(3, repeat // 3)):
        execute(
            "UPDATE django_reactor_execution SET wake_at = now() - interval '1 second' "
            f"WHERE id IN {sleepers}"
        )
        started = time.perf_counter()
        report = services.sweep()
        samples[f"sweep, {batch} runs due"].append((time.perf_counter() - started) * 1000)
        if report.woken != batch:
            raise RuntimeError(f"the sweep woke {report.woken} runs, not {batch}")
        execute(f"DELETE FROM django_reactor_dispatch WHERE execution_id IN {sleepers}")
        execute(
            "UPDATE django_reactor_execution SET wake_at = now() + interval '30 days' "
            f"WHERE id IN {sleepers}"
        )


def measure_pages(samples: dict[str, list[float]], repeat: int) -> None:
    from urllib.parse import urlencode

    from django.urls import reverse

    from django_reactor import registry

    c = scale.client()
    ex = "/admin/django_reactor/execution/"
    reactor = sorted(registry.all_reactors())[0]
    stepped = scale._md5("run-101").hex()
    import uuid

    pages = [
        ("admin: executions, first page", ex),
        ("admin: executions, status=failed", f"{ex}?status__exact=failed"),
        ("admin: executions, reactor filter", f"{ex}?{urlencode({'reactor': reactor})}"),
        ("admin: a run's page (steps, trace)", f"{ex}{uuid.UUID(stepped)}/change/"),
        ("admin: overview, last hour", reverse("admin:django_reactor_execution_overview")),
    ]
    for name, url in pages:
        page = scale.Page(name, url)
        median, code = scale.measure(c, page, repeat)
        if code != 200:
            raise RuntimeError(f"{name}: HTTP {code}")
        samples[name].append(median)


def child(action: str, label: str, args: argparse.Namespace) -> int:
    import collections

    os.environ["DATABASE_URL"] = f"{PG_SERVER}/{database(label)}"
    ensure_database(database(label))
    scale.setup_django()
    meta = scale.built()
    if action == "build":
        if meta.get("runs") != str(SIZES[label]):
            print(f"building {SIZES[label]:,} runs in {database(label)}", flush=True)
            build(SIZES[label], recent=RECENT)
        return 0
    from django_reactor.store import outbox

    outbox.register_publisher(StubPublisher())
    samples: dict[str, list[float]] = collections.defaultdict(list)
    measure_claims(samples)
    measure_checkpoints(samples, args.chain_runs)
    measure_sweeps(samples, args.repeat)
    measure_pages(samples, args.repeat)
    print(json.dumps(samples))
    return 0


# ---------------------------------------------------------------------------- main


def spawn(action: str, label: str, args: argparse.Namespace) -> str:
    command = [
        sys.executable,
        __file__,
        f"--child={action}",
        f"--sizes={label}",
        f"--repeat={args.repeat}",
        f"--chain-runs={args.chain_runs}",
    ]
    if action == "build":
        subprocess.run(command, check=True)
        return ""
    return subprocess.run(command, check=True, capture_output=True, text=True).stdout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="10k,10m", help="sizes to measure (10k, 10m)")
    parser.add_argument("--rounds", type=int, default=3, help="measuring processes per size")
    parser.add_argument("--repeat", type=int, default=15, help="timed sweeps and page requests")
    parser.add_argument("--chain-runs", type=int, default=30, help="inline runs of each chain")
    parser.add_argument("--rebuild", action="store_true", help="drop and rebuild the databases")
    parser.add_argument("--child", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    labels = [s for s in args.sizes.split(",") if s]
    if args.child:
        return child(args.child, labels[0], args)

    for label in labels:
        if args.rebuild:
            scale.DATABASE = database(label)
            scale.drop_database()
        spawn("build", label, args)
    results: dict[str, dict[str, list[float]]] = {label: {} for label in labels}
    for r in range(args.rounds):
        for label in labels if r % 2 == 0 else labels[::-1]:
            out = json.loads(spawn("measure", label, args).strip().splitlines()[-1])
            for name, values in out.items():
                results[label].setdefault(name, []).extend(values)
            print(f"  round {r + 1}: {label} measured", flush=True)
    names = list(results[labels[0]])
    print()
    header = " | ".join(f"{label} ms" for label in labels)
    print(f"| operation | {header} | ratio | result |")
    print(f"|---|{'---:|' * len(labels)}---:|---|")
    for name in names:
        medians = [statistics.median(results[label][name]) for label in labels]
        cells = " | ".join(f"{m:.3f}" if m < 10 else f"{m:.1f}" for m in medians)
        if len(medians) == 2:
            ratio = medians[1] / medians[0]
            verdict = "PASS" if ratio <= TARGET_RATIO else "MISS"
            print(f"| {name} | {cells} | {ratio:.2f} | {verdict} |")
        else:
            print(f"| {name} | {cells} | | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
