"""Admin lists, the API list and the map summary at 1,000,000 runs and 1,000,000 map elements.

Run from the repository root (PostgreSQL on 127.0.0.1:5432, user ``postgres``, trust auth)::

    .venv/bin/python benchmarks/scale.py [--runs 1000000] [--elements 1000000] [--repeat 9]

What it measures
----------------
The database ``reactor_scale`` (created and migrated if missing) is filled once by SQL
generation (``generate_series``) and reused by later runs (``--rebuild`` drops and rebuilds
it; a build of 1,000,000 runs takes a few minutes):

* ``--runs`` executions of the example project's reactors, created over the past 365 days,
  80 % completed and the rest spread over every other status; one in ten has an idempotency
  key, the paused ones a correlation id and a waiting interrupt, one in a hundred a resumed
  interrupt. One run in a hundred has a step record per step and a trace event per step.
* One dispatch for every second run (every reason, the pending runs' unsent).
* One map of ``--elements`` elements (one in 1,000 failed, the rest succeeded; its ``MapRun``
  counters agree with its elements), and 20,000 small maps of 5 elements.
* Two business attributes per run (``ExecutionAttribute``, issue 30): ``tenant`` (``acme`` for
  every second run, 500,000 of them; each other tenant has 1,000) and ``customer_id`` (10 runs
  each). A database built before attributes existed gets them added on the next run.

Then, with a logged-in superuser through Django's test ``Client`` (``DEBUG`` off), each page is
requested once untimed and ``--repeat`` times timed: every django_reactor admin change list
(first page, the last numbered page, pages reached by the "next" keyset link and deep keyset
pages, each filter, each allowed sort, search), a run's change form, the parked runs, the map
element list (first page and deep), the API's execution list (first page and a deep cursor),
the map summary (``store.maps.summary`` and the API's run detail), the overview (its last
hour and its last day), and the runs filtered by attribute in the admin (``?attr=``) and the
API (``?attr.tenant=acme``): a value half the runs have (first page, numbered, keyset and
cursor pages deep in it, with a status, oldest first), one of 1,000 runs, one of 10, both.
The script prints each page's median in ms beside the target, 100 ms, and PASS or MISS.
``--busy-day N`` then adds N runs that ended over the last day, times the overview again, and
deletes them.

Against the admin code before issue 15 (no ``django_reactor.admin.paging``), deep pages are
the numbered pages at the same depth (``?p=``) and the sorts it offered are timed instead.

Override the server with ``BENCH_PG`` (default ``postgresql://postgres@127.0.0.1:5432``) and
the database with ``SCALE_DATABASE`` (default ``reactor_scale``: a branch with migrations of its
own keeps its data apart). The exit code is 0 whatever the figures: this is a benchmark, not a
test.
"""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import itertools
import os
import re
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks.common import PG_SERVER, ensure_database

DATABASE = os.environ.get("SCALE_DATABASE", "reactor_scale")
TARGET_MS = 100.0
SMALL_MAPS = 20_000
SMALL_MAP_SIZE = 5
BIG_MAP_STEP = "scale_elements"

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
os.environ["DJANGO_DEBUG"] = "0"
os.environ["DATABASE_URL"] = f"{PG_SERVER}/{DATABASE}"

# Status by run number modulo 100: (first residue, status).
STATUS_BANDS = [
    (0, "completed"),
    (80, "failed"),
    (87, "cancelled"),
    (89, "halted"),
    (90, "pending"),
    (93, "running"),
    (95, "paused"),
    (97, "rolling_back"),
    (98, "needs_attention"),
    (99, "aborted"),
]


# ---------------------------------------------------------------------------- setup


def drop_database() -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(f"{PG_SERVER}/postgres", autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(DATABASE))
        )


def setup_django() -> None:
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)


def status_case(number: str, bands: list[tuple[int, str]] = STATUS_BANDS) -> str:
    """SQL: the status of run ``number`` (an expression), by its residue modulo 100, from
    ``bands`` (first residue, status)."""
    parts = ["CASE"]
    bands = [*bands, (100, "")]
    for (_start, status), (end, _) in itertools.pairwise(bands):
        parts.append(f"WHEN ({number}) % 100 < {end} THEN '{status}'")
    parts.append("END")
    return " ".join(parts)


def insert_select(model: Any, expressions: dict[str, str], source: str, params: list[Any]) -> int:
    """``INSERT INTO model (...) SELECT ... FROM source``: the given column expressions (no
    parameters in them; ``%`` is the modulo operator), each other column's default (a
    parameter) or NULL, so new columns of the models need no change here; ``params`` are the
    source's. Returns the rows inserted."""
    from django.db import connection
    from django.db.models import AutoField, BigAutoField

    columns, values, args = [], [], []
    for field in model._meta.concrete_fields:
        if field.column in expressions:
            columns.append(field.column)
            values.append(re.sub(r"%(?!s)", "%%", expressions[field.column]))
        elif isinstance(field, (AutoField, BigAutoField)):
            continue
        elif field.has_default():
            columns.append(field.column)
            values.append("%s")
            args.append(field.get_db_prep_save(field.get_default(), connection))
        elif field.null:
            continue
        else:
            raise RuntimeError(f"benchmarks/scale.py: give {model.__name__}.{field.name} a value")
    quoted = ", ".join(connection.ops.quote_name(c) for c in columns)
    statement = (
        f"INSERT INTO {connection.ops.quote_name(model._meta.db_table)} ({quoted}) "
        f"SELECT {', '.join(values)} FROM {re.sub(r'%(?!s)', '%%', source)}"
    )
    with connection.cursor() as cursor:
        cursor.execute(statement, args + params)
        return cursor.rowcount


def add_attributes(runs: int) -> bool:
    """Give the runs of a database built before attributes existed theirs (once)."""
    from django.db import connection, transaction

    from django_reactor import models

    if getattr(models, "ExecutionAttribute", None) is None:
        return False
    with transaction.atomic():
        if not models.ExecutionAttribute.objects.exists():
            build_attributes(runs)
        with connection.cursor() as cursor:
            cursor.execute("INSERT INTO scale_meta VALUES ('attributes', 'yes')")
    connection.ensure_connection()
    raw = connection.connection
    raw.autocommit = True
    with raw.cursor() as cursor:
        cursor.execute(f"VACUUM ANALYZE {models.ExecutionAttribute._meta.db_table}")
    return True


def built() -> dict[str, str]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE IF NOT EXISTS scale_meta (key text PRIMARY KEY, value text)")
        cursor.execute("SELECT key, value FROM scale_meta")
        return dict(cursor.fetchall())


def build(runs: int, elements: int) -> None:
    """Fill the scale database by SQL generation (one statement per table)."""
    from django.db import connection, transaction

    from django_reactor import models, registry

    reactors = sorted(registry.all_reactors().items())
    if not reactors:
        raise RuntimeError("no registered reactor to name the runs after")
    reactors = reactors[:5]
    definition_model = getattr(models, "Definition", None)
    if definition_model is not None:
        for _name, cls in reactors:
            definition_model.objects.get_or_create(
                hash=cls.definition.definition_hash, defaults={"shape": cls.definition.shape}
            )
    names = [name for name, _ in reactors]
    hashes = [cls.definition.definition_hash for _, cls in reactors]
    steps = {name: [getattr(s, "name", s) for s in cls.definition.steps] for name, cls in reactors}
    k = len(reactors)
    started = time.perf_counter()

    def reactor_of(number: str) -> str:
        return f"(ARRAY[{', '.join(repr(n) for n in names)}])[({number}) % {k} + 1]"

    def hash_of(number: str) -> str:
        return f"(ARRAY[{', '.join(repr(h) for h in hashes)}])[({number}) % {k} + 1]"

    status = status_case("i")
    created = f"now() - interval '365 days' * (1 - i::float8 / {runs})"
    run_id = "md5('run-' || i)::uuid"
    with transaction.atomic():
        n = insert_select(
            models.Execution,
            {
                "id": run_id,
                "reactor": reactor_of("i"),
                "definition_hash": hash_of("i"),
                "status": status,
                "inputs": "jsonb_build_object('order', i)",
                "secret_paths": "'[]'::jsonb",
                "correlation_id": f"CASE WHEN {status} = 'paused' THEN 'corr-' || i END",
                "idempotency_key": "CASE WHEN i % 10 = 0 THEN 'key-' || i END",
                "current_step": f"CASE WHEN {status} IN ('completed') THEN '' ELSE 'step' END",
                "result": f"CASE WHEN {status} = 'completed' THEN '{{\"ok\": true}}'::jsonb END",
                "failure": (
                    f"CASE WHEN {status} = 'failed' THEN "
                    '\'{"kind": "error", "message": "boom"}\'::jsonb END'
                ),
                "handed_off": "i % 3 = 0",
                "fence": "1",
                "created_at": created,
                "started_at": created,
                "updated_at": f"{created} + interval '2 seconds'",
                "finished_at": (
                    f"CASE WHEN {status} IN ('completed', 'failed', 'cancelled', 'halted', "
                    f"'aborted') THEN {created} + interval '2 seconds' END"
                ),
                "wake_at": (
                    f"CASE WHEN {status} = 'pending' AND i % 2 = 0 "
                    "THEN now() + interval '1 minute' * (i % 600) END"
                ),
                "lease_owner": f"CASE WHEN {status} IN ('running', 'rolling_back') THEN 'w' END",
                "lease_expires_at": (
                    f"CASE WHEN {status} IN ('running', 'rolling_back') "
                    "THEN now() + interval '30 seconds' END"
                ),
            },
            "generate_series(1, %s) AS i",
            [runs],
        )
        print(f"  {n:,} executions", flush=True)

        for index, (name, _cls) in enumerate(reactors):
            names_steps = steps[name]
            if not names_steps:
                continue
            array = f"ARRAY[{', '.join(repr(s) for s in names_steps)}]"
            source = (
                f"generate_series(1, %s) AS i, "
                f"generate_series(1, {len(names_steps)}) AS s "
                f"WHERE i % 100 = 1 AND i % {k} = {index}"
            )
            n = insert_select(
                models.StepRecord,
                {
                    "execution_id": run_id,
                    "step": f"({array})[s]",
                    "status": "'completed'",
                    "seq": "s",
                    "attempts": "1",
                    "arguments": "jsonb_build_object('order', i)",
                    "secret_arguments": "'[]'::jsonb",
                    "result": "jsonb_build_object('ok', s)",
                    "started_at": "now() - interval '1 day'",
                    "finished_at": "now() - interval '1 day'",
                },
                source,
                [runs],
            )
            m = insert_select(
                models.ExecutionEvent,
                {
                    "execution_id": run_id,
                    "seq": "s",
                    "kind": "'run'",
                    "step": f"({array})[s]",
                    "attempt": "1",
                    "at": "now() - interval '1 day'",
                    "duration_ms": "1.5",
                    "data": "'{}'::jsonb",
                },
                source,
                [runs],
            )
            print(f"  {n:,} step records, {m:,} events ({name})", flush=True)

        n = insert_select(
            models.Interrupt,
            {
                "execution_id": run_id,
                "reactor": reactor_of("i"),
                "step": "'approval'",
                "status": f"CASE WHEN {status} = 'paused' THEN 'waiting' ELSE 'resumed' END",
                "correlation_id": "'corr-' || i",
                "created_at": created,
                "closed_at": f"CASE WHEN {status} = 'paused' THEN NULL ELSE {created} END",
            },
            f"generate_series(1, %s) AS i WHERE {status} = 'paused' OR i % 100 = 2",
            [runs],
        )
        print(f"  {n:,} interrupts", flush=True)

        reasons = [r for r, _ in models.Dispatch.Reason.choices]
        reason_list = ", ".join(repr(r) for r in reasons)
        n = insert_select(
            models.Dispatch,
            {
                "execution_id": run_id,
                "reason": f"(ARRAY[{reason_list}])[(i / 2) % {len(reasons)} + 1]",
                "created_at": created,
                "sent_at": f"CASE WHEN {status} = 'pending' THEN NULL ELSE {created} END",
            },
            "generate_series(1, %s) AS i WHERE i % 2 = 0",
            [runs],
        )
        print(f"  {n:,} dispatches", flush=True)

        # The big map on run 1 (completed), the small ones on runs 100 * j + 3 (completed).
        big = insert_select(
            models.MapRun,
            {
                "id": "md5('map-big')::uuid",
                "execution_id": "md5('run-1')::uuid",
                "step": f"'{BIG_MAP_STEP}'",
                "status": "'settled'",
                "fan_out": "true",
                "size": str(elements),
                "batch_size": "100",
                "chunk_size": "50",
                "atomic": "false",
                "settled": str(elements),
                "succeeded": str(elements - elements // 1000),
                "failed": str(elements // 1000),
                "first_failure": "7",
                "collected": "true",
                "created_at": "now() - interval '365 days'",
                "updated_at": "now() - interval '364 days'",
            },
            "(SELECT 1) AS one",
            [],
        )
        small = insert_select(
            models.MapRun,
            {
                "id": "md5('map-' || j)::uuid",
                "execution_id": "md5('run-' || (100 * j + 3))::uuid",
                "step": "'lines'",
                "status": "'settled'",
                "fan_out": "j % 2 = 0",
                "size": str(SMALL_MAP_SIZE),
                "batch_size": "100",
                "chunk_size": "50",
                "atomic": "true",
                "settled": str(SMALL_MAP_SIZE),
                "succeeded": str(SMALL_MAP_SIZE),
                "failed": "0",
                "collected": "true",
                "created_at": f"now() - interval '365 days' * (1 - (100 * j + 3)::float8 / {runs})",
                "updated_at": f"now() - interval '365 days' * (1 - (100 * j + 3)::float8 / {runs})",
            },
            "generate_series(0, %s) AS j",
            [min(SMALL_MAPS, runs // 100) - 1],
        )
        print(f"  {big + small:,} maps", flush=True)
        # Element i of the big map fails when i % 1000 = 7 (so the map's first failure is 7).
        n = insert_select(
            models.MapResult,
            {
                "map_run_id": "md5('map-big')::uuid",
                "index": "i",
                "status": "CASE WHEN i % 1000 = 7 THEN 'failed' ELSE 'succeeded' END",
                "item": "to_jsonb(i)",
                "value": "CASE WHEN i % 1000 = 7 THEN NULL ELSE to_jsonb(i) END",
                "error": (
                    "CASE WHEN i % 1000 = 7 THEN jsonb_build_object('message', 'boom ' || i, "
                    "'exception_class', 'ValueError', 'kind', 'error') END"
                ),
                "attempts": "1",
                "finished_at": "now() - interval '364 days'",
            },
            "generate_series(0, %s) AS i",
            [elements - 1],
        )
        m = insert_select(
            models.MapResult,
            {
                "map_run_id": "md5('map-' || j)::uuid",
                "index": "i",
                "status": "'succeeded'",
                "item": "to_jsonb(i)",
                "value": "to_jsonb(i)",
                "attempts": "1",
                "finished_at": "now() - interval '300 days'",
            },
            f"generate_series(0, %s) AS j, generate_series(0, {SMALL_MAP_SIZE - 1}) AS i",
            [min(SMALL_MAPS, runs // 100) - 1],
        )
        print(f"  {n + m:,} map elements", flush=True)
        build_attributes(runs)
        with connection.cursor() as cursor:
            cursor.execute("DELETE FROM scale_meta")
            cursor.execute(
                "INSERT INTO scale_meta VALUES ('runs', %s), ('elements', %s), "
                "('attributes', 'yes')",
                [str(runs), str(elements)],
            )
    connection.ensure_connection()
    raw = connection.connection
    raw.autocommit = True
    with raw.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE")
    print(f"  built in {time.perf_counter() - started:.0f} s", flush=True)


#: The tenant half the runs have, and the customer whose 10 runs are all that tenant's.
TENANT = "acme"
CUSTOMER = "4242"


def build_attributes(runs: int) -> int:
    """Run ``i``'s attributes (when the models have them): ``tenant`` ``acme`` for an even
    ``i``, else ``tenant-<i % 1000>``; ``customer_id`` ``i % 100000``. Each keeps its run's
    creation time, read from the run's row."""
    from django.db import connection

    from django_reactor import models

    model = getattr(models, "ExecutionAttribute", None)
    if model is None:
        return 0
    table = connection.ops.quote_name(models.Execution._meta.db_table)
    source = (
        f"generate_series(1, %s) AS i JOIN {table} AS e ON e.id = md5('run-' || i)::uuid, "
        "(VALUES ('tenant'), ('customer_id')) AS k(name)"
    )
    n = insert_select(
        model,
        {
            "execution_id": "e.id",
            "key": "k.name",
            "value": (
                f"CASE WHEN k.name = 'customer_id' THEN (i % 100000)::text "
                f"WHEN i % 2 = 0 THEN '{TENANT}' ELSE 'tenant-' || (i % 1000) END"
            ),
            "run_created_at": "e.created_at",
        },
        source,
        [runs],
    )
    print(f"  {n:,} attributes", flush=True)
    return n


# ---------------------------------------------------------------------------- pages


@dataclass
class Page:
    name: str
    url: str
    call: Callable[[], Any] | None = None


def client() -> Any:
    from django.contrib.auth.models import User
    from django.test import Client

    user = User.objects.filter(username="scale").first()
    if user is None:
        user = User.objects.create_superuser("scale", "scale@example.com", "pw")
    c = Client()
    c.force_login(user)
    return c


def keyset_url(
    base: str,
    ordering_row: Any,
    fields: list[str],
    *,
    after: bool = True,
    annotations: dict[str, Any] | None = None,
) -> str:
    """A keyset page's URL from the row it follows (the new admin's cursor format)."""
    from django_reactor.admin.paging import Keyset

    keyset = (
        Keyset.of(type(ordering_row), fields, annotations)
        if annotations
        else Keyset.of(type(ordering_row), fields)
    )
    assert keyset is not None
    sep = "&" if "?" in base else "?"
    name = "after" if after else "before"
    return f"{base}{sep}{name}={keyset.encode(ordering_row)}"


def sort_link(html: str, column: str) -> str | None:
    """The query string of a column's sort link in a change list, if it sorts."""
    for css, cell in re.findall(r'<th scope="col" class="([^"]*)">(.*?)</th>', html, re.S):
        if f"column-{column}" in css.split():
            match = re.search(r'<a href="(\?o=[^"]*)"', cell)
            return match.group(1).replace("&amp;", "&") if match else None
    return None


def next_link(html: str) -> str | None:
    match = re.search(r'<a class="reactor-next" href="([^"]*)"', html)
    return match.group(1).replace("&amp;", "&") if match else None


def pages(c: Any, after_code: bool, runs: int) -> list[Page]:
    """Every page to time, with the URLs found from the data (untimed)."""
    from django.utils import timezone

    from django_reactor import registry
    from django_reactor.models import Dispatch, Execution, Interrupt, MapResult, MapRun

    admin = "/admin/django_reactor"
    result: list[Page] = []
    per_page = 50
    deep = min(runs // 2, 500_000)
    deep_page = deep // per_page
    newest = Execution.objects.order_by("-created_at", "-id")
    deep_row = newest.only("id", "created_at")[deep]

    ex = f"{admin}/execution/"
    result.append(Page("executions: page 1", ex))
    result.append(Page("executions: page 2", f"{ex}?p=2"))
    if after_code:
        result.append(Page("executions: page 20 (last numbered)", f"{ex}?p=20"))
        html = c.get(f"{ex}?p=20").content.decode()
        link = next_link(html)
        if link:
            result.append(Page("executions: 'older' link from page 20", f"{ex}{link}"))
        result.append(
            Page(
                f"executions: keyset page at row {deep:,}",
                keyset_url(ex, deep_row, ["-created_at", "-pk"]),
            )
        )
        result.append(
            Page(
                f"executions: 'newer' page at row {deep:,}",
                keyset_url(ex, deep_row, ["-created_at", "-pk"], after=False),
            )
        )
    else:
        result.append(Page("executions: page 20", f"{ex}?p=20"))
        result.append(Page(f"executions: page {deep_page:,} (row {deep:,})", f"{ex}?p={deep_page}"))
    for status in ("completed", "paused", "needs_attention"):
        result.append(Page(f"executions: status={status}", f"{ex}?status__exact={status}"))
    reactor = sorted(registry.all_reactors())[0]
    result.append(Page("executions: reactor filter", f"{ex}?{urlencode({'reactor': reactor})}"))
    result.append(
        Page(
            "executions: reactor + status=failed",
            f"{ex}?{urlencode({'reactor': reactor, 'status__exact': 'failed'})}",
        )
    )
    today = timezone.localdate()
    week = today - timezone.timedelta(days=7)
    tomorrow = today + timezone.timedelta(days=1)
    result.append(
        Page(
            "executions: created past 7 days",
            f"{ex}?created_at__gte={week}+00:00:00%2B00:00&created_at__lt={tomorrow}+00:00:00%2B00:00",
        )
    )
    if after_code:
        row = (
            Execution.objects.filter(status="completed")
            .order_by("-created_at", "-id")
            .only("id", "created_at")[deep // 2]
        )
        result.append(
            Page(
                f"executions: status=completed keyset at row {deep // 2:,}",
                keyset_url(f"{ex}?status__exact=completed", row, ["-created_at", "-pk"]),
            )
        )
    else:
        result.append(
            Page(
                f"executions: status=completed page {deep // 2 // per_page:,}",
                f"{ex}?status__exact=completed&p={deep // 2 // per_page}",
            )
        )
    html = c.get(ex).content.decode()
    # The creation and change times are "created" and "updated" since issue 18 (before: the
    # fields' names).
    for column in (
        "created",
        "created_at",
        "status_badge",
        "reactor_name",
        "updated",
        "updated_at",
    ):
        link = sort_link(html, column)
        if link:
            result.append(Page(f"executions: sort by {column}", f"{ex}{link}"))
            flipped = c.get(f"{ex}{link}").content.decode()
            again = sort_link(flipped, column)
            if again and again != link:
                result.append(Page(f"executions: sort by {column}, reversed", f"{ex}{again}"))
    key = Execution.objects.filter(idempotency_key__isnull=False).values_list(
        "idempotency_key", flat=True
    )[1000]
    result.append(Page("executions: search an idempotency key", f"{ex}?q={key}"))
    result.append(Page("executions: search a correlation id", f"{ex}?q=corr-{100 * 500 + 95}"))
    result.append(Page("executions: search a run id", f"{ex}?q={deep_row.id}"))
    stepped = Execution.objects.filter(pk=uuid.UUID(bytes=_md5("run-101"))).first()
    if stepped is not None:
        result.append(Page("execution change form (steps and trace)", f"{ex}{stepped.pk}/change/"))
    big_map = MapRun.objects.filter(step=BIG_MAP_STEP).only("id", "execution_id").first()
    assert big_map is not None
    result.append(
        Page("execution change form (the 1M-element map)", f"{ex}{big_map.execution_id}/change/")
    )
    result.append(Page("parked executions", f"{ex}parked/"))
    result.extend(overview_pages())

    it = f"{admin}/interrupt/"
    result.append(Page("interrupts: page 1", it))
    result.append(Page("interrupts: status=waiting", f"{it}?status__exact=waiting"))
    result.append(Page("interrupts: status=expired (none)", f"{it}?status__exact=expired"))
    result.append(Page("interrupts: reactor filter", f"{it}?{urlencode({'reactor': reactor})}"))
    result.append(Page("interrupts: search a correlation id", f"{it}?q=corr-{100 * 500 + 95}"))
    count = Interrupt.objects.count()
    if after_code:
        row = Interrupt.objects.order_by("-created_at", "-id").only("id", "created_at")[count // 2]
        result.append(
            Page(
                f"interrupts: keyset at row {count // 2:,}",
                keyset_url(it, row, ["-created_at", "-pk"]),
            )
        )
    else:
        result.append(
            Page(f"interrupts: page {count // 2 // 100:,}", f"{it}?p={count // 2 // 100}")
        )

    di = f"{admin}/dispatch/"
    result.append(Page("dispatches: page 1", di))
    result.append(Page("dispatches: reason=map_undo", f"{di}?reason__exact=map_undo"))
    result.append(Page("dispatches: not sent", f"{di}?sent=no"))
    result.append(Page("dispatches: search a run id", f"{di}?q={deep_row.id}"))
    count = Dispatch.objects.count()
    if after_code:
        row = Dispatch.objects.order_by("-id").only("id")[count // 2]
        result.append(
            Page(f"dispatches: keyset at row {count // 2:,}", keyset_url(di, row, ["-id"]))
        )
    else:
        result.append(
            Page(f"dispatches: page {count // 2 // 100:,}", f"{di}?p={count // 2 // 100}")
        )

    mr = f"{admin}/maprun/"
    result.append(Page("maps: page 1", mr))
    result.append(Page("maps: status=running (none)", f"{mr}?status__exact=running"))
    result.append(Page("maps: search a run id", f"{mr}?q={big_map.execution_id}"))
    count = MapRun.objects.count()
    if after_code:
        row = MapRun.objects.order_by("-created_at", "-id").only("id", "created_at")[count // 2]
        result.append(
            Page(f"maps: keyset at row {count // 2:,}", keyset_url(mr, row, ["-created_at", "-pk"]))
        )
    else:
        result.append(Page(f"maps: page {count // 2 // 100:,}", f"{mr}?p={count // 2 // 100}"))

    el = f"{admin}/mapresult/"
    of_map = f"{el}?map_run__id__exact={big_map.pk}"
    size = MapResult.objects.filter(map_run_id=big_map.pk).count()
    result.append(Page("map elements: page 1 (all maps)", el))
    result.append(Page("map elements of the big map: page 1", of_map))
    result.append(Page("map elements of the big map: page 10", f"{of_map}&p=10"))
    result.append(
        Page("map elements of the big map: status=failed", f"{of_map}&status__exact=failed")
    )
    for index in sorted({min(90_000, size // 10), size // 2, size - 150}):
        if after_code:
            row = MapResult.objects.filter(map_run_id=big_map.pk, index=index).only(
                "id", "map_run_id", "index"
            )[0]
            result.append(
                Page(
                    f"map elements of the big map: keyset at index {index:,}",
                    keyset_url(of_map, row, ["map_run_id", "index"]),
                )
            )
        else:
            result.append(
                Page(
                    f"map elements of the big map: page {index // 100:,} (index {index:,})",
                    f"{of_map}&p={index // 100}",
                )
            )
    if after_code:
        failed = MapResult.objects.filter(
            map_run_id=big_map.pk, status="failed", index__gte=size // 2
        )
        row = failed.order_by("index").only("id", "map_run_id", "index")[0]
        result.append(
            Page(
                "map elements: status=failed keyset at the middle",
                keyset_url(f"{of_map}&status__exact=failed", row, ["map_run_id", "index"]),
            )
        )

    api = "/reactor/executions/"
    result.append(Page("API executions: first page", api))
    result.append(Page("API executions: status=paused", f"{api}?status=paused"))
    cursor = base64.b64encode(urlencode({"p": str(deep_row.created_at)}).encode()).decode()
    result.append(
        Page(f"API executions: cursor at row {deep:,}", f"{api}?{urlencode({'cursor': cursor})}")
    )
    result.append(
        Page(
            f"API executions: status=completed, cursor at row {deep:,}",
            f"{api}?{urlencode({'status': 'completed', 'cursor': cursor})}",
        )
    )
    result.append(
        Page("API execution detail (the 1M-element map)", f"{api}{big_map.execution_id}/")
    )

    from django_reactor import store

    result.append(
        Page("store.maps.summary (1M elements)", "", call=lambda: store.maps.summary(big_map.pk))
    )
    result.extend(attribute_pages(c, ex, api))
    return result


def attribute_pages(c: Any, ex: str, api: str) -> list[Page]:
    """The runs list and the API filtered by attribute (issue 30; absent from older code)."""
    from django.utils import timezone

    from django_reactor import models, store

    if getattr(models, "ExecutionAttribute", None) is None:
        return []
    acme = store.with_attributes(models.Execution.objects.all(), {"tenant": TENANT})
    count = acme.count()
    deep = min(100_000, count // 2)
    row = acme.only("id", "created_at")[deep]
    tenant = urlencode({"attr": f"tenant={TENANT}"})
    both = urlencode({"attr": f"tenant={TENANT} customer_id={CUSTOMER}"})
    result = [
        Page(f"executions: attr tenant ({count:,} runs), page 1", f"{ex}?{tenant}"),
        Page("executions: attr tenant, page 20 (last numbered)", f"{ex}?{tenant}&p=20"),
    ]
    link = next_link(c.get(f"{ex}?{tenant}&p=20").content.decode())
    if link:
        result.append(Page("executions: attr tenant, 'older' link from page 20", f"{ex}{link}"))
    ordering = store.attributes.newest_first(acme)
    result += [
        Page(
            f"executions: attr tenant, keyset at its row {deep:,}",
            keyset_url(f"{ex}?{tenant}", row, ordering, annotations=acme.query.annotations),
        ),
        Page("executions: attr tenant + status=failed", f"{ex}?{tenant}&status__exact=failed"),
        Page(
            "executions: attr tenant + status=needs_attention (1 %)",
            f"{ex}?{tenant}&status__exact=needs_attention",
        ),
        Page("executions: attr tenant, oldest first", f"{ex}?{tenant}&o=6"),
        Page(
            "executions: attr tenant of 1,000 runs",
            f"{ex}?{urlencode({'attr': 'tenant=tenant-7'})}",
        ),
        Page(
            "executions: attr customer_id (10 runs)",
            f"{ex}?{urlencode({'attr': f'customer_id={CUSTOMER}'})}",
        ),
        Page("executions: attr tenant + customer_id", f"{ex}?{both}"),
    ]
    old = (timezone.now() - dt.timedelta(days=300)).isoformat()
    position = getattr(row, store.attributes.CREATED_AT)
    cursor = base64.b64encode(urlencode({"p": str(position)}).encode()).decode()
    result += [
        Page(f"API executions: attr.tenant ({count:,} runs)", f"{api}?attr.tenant={TENANT}"),
        Page(
            f"API executions: attr.tenant, cursor at its row {deep:,}",
            f"{api}?{urlencode({'attr.tenant': TENANT, 'cursor': cursor})}",
        ),
        Page(
            "API executions: attr.tenant + status=failed",
            f"{api}?attr.tenant={TENANT}&status=failed",
        ),
        Page(
            "API executions: attr.tenant, created_before 300 days ago",
            f"{api}?{urlencode({'attr.tenant': TENANT, 'created_before': old})}",
        ),
        Page("API executions: attr.tenant of 1,000 runs", f"{api}?attr.tenant=tenant-7"),
        Page("API executions: attr.customer_id (10 runs)", f"{api}?attr.customer_id={CUSTOMER}"),
        Page(
            "API executions: attr.tenant + attr.customer_id",
            f"{api}?attr.tenant={TENANT}&attr.customer_id={CUSTOMER}",
        ),
    ]
    return result


def overview_pages() -> list[Page]:
    """The overview, both windows (issue 18; absent from older admin code)."""
    from django.urls import NoReverseMatch, reverse

    try:
        url = reverse("admin:django_reactor_execution_overview")
    except NoReverseMatch:
        return []
    return [Page("overview, last hour", url), Page("overview, last day", f"{url}?window=day")]


# Statuses of the busy day's runs by number modulo 20: mostly completed, some failed, one
# needing attention, one cancelled.
BUSY_STATUSES = "(ARRAY['failed', 'needs_attention', 'cancelled'])[i % 20 - 16]"


def busy_day(runs: int) -> int:
    """Add ``runs`` runs that ended over the last 24 hours (ids ``md5('busy-' || i)``), as a
    busy day would leave them: the overview's windows then hold more than its cap."""
    from django_reactor import models, registry

    name, cls = sorted(registry.all_reactors().items())[0]
    ended = f"now() - interval '24 hours' * (i::float8 / {runs})"
    return insert_select(
        models.Execution,
        {
            "id": "md5('busy-' || i)::uuid",
            "reactor": repr(name),
            "definition_hash": repr(cls.definition.definition_hash),
            "status": f"CASE WHEN i % 20 < 17 THEN 'completed' ELSE {BUSY_STATUSES} END",
            "inputs": "jsonb_build_object('order', i)",
            "secret_paths": "'[]'::jsonb",
            "fence": "1",
            "created_at": f"{ended} - interval '2 seconds'",
            "started_at": f"{ended} - interval '2 seconds'",
            "updated_at": ended,
            "finished_at": ended,
        },
        "generate_series(1, %s) AS i",
        [runs],
    )


def drop_busy_day(runs: int) -> None:
    from django.db import connection

    from django_reactor import models

    table = connection.ops.quote_name(models.Execution._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(
            f"DELETE FROM {table} WHERE id IN "
            "(SELECT md5('busy-' || i)::uuid FROM generate_series(1, %s) AS i)",
            [runs],
        )


def analyse_runs() -> None:
    """``VACUUM ANALYZE`` the runs' table: its statistics and visibility map as autovacuum
    keeps them (after a bulk insert or delete the planner would work from stale ones)."""
    from django.db import connection

    from django_reactor import models

    connection.ensure_connection()
    raw = connection.connection
    autocommit = raw.autocommit
    raw.autocommit = True
    try:
        with raw.cursor() as cursor:
            cursor.execute(
                f"VACUUM ANALYZE {connection.ops.quote_name(models.Execution._meta.db_table)}"
            )
    finally:
        raw.autocommit = autocommit


def _md5(text: str) -> bytes:
    import hashlib

    return hashlib.md5(text.encode()).digest()


def measure(c: Any, page: Page, repeat: int) -> tuple[float, int]:
    def once() -> int:
        if page.call is not None:
            page.call()
            return 200
        response = c.get(page.url)
        return response.status_code

    code = once()
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        once()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times), code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=1_000_000)
    parser.add_argument("--elements", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=9, help="timed requests per page")
    parser.add_argument("--rebuild", action="store_true", help="drop and rebuild the data")
    parser.add_argument("--only", default="", help="time only the pages whose name contains this")
    parser.add_argument(
        "--busy-day",
        type=int,
        default=0,
        metavar="N",
        help="then add N runs that ended over the last day, time the overview again, and "
        "delete them",
    )
    args = parser.parse_args(argv)

    if args.rebuild:
        drop_database()
    ensure_database(DATABASE)
    setup_django()
    meta = built()
    if meta.get("runs") != str(args.runs) or meta.get("elements") != str(args.elements):
        if meta:
            print(f"the data holds {meta}; run with --rebuild for {args.runs:,} runs")
            return 0
        print(f"building {args.runs:,} runs and a map of {args.elements:,} elements in {DATABASE}")
        build(args.runs, args.elements)
        meta = built()
    if "attributes" not in meta and add_attributes(args.runs):
        print(f"added the runs' attributes to {DATABASE}")

    try:
        import django_reactor.admin.paging

        after_code = True
    except ImportError:
        after_code = False
    import django_reactor

    code = "with" if after_code else "before"
    print(
        f"{DATABASE}: {args.runs:,} runs, {args.elements:,} map elements; admin code {code} "
        f"keyset pages ({Path(django_reactor.__file__).parent})"
    )
    c = client()
    rows = []
    for page in pages(c, after_code, args.runs):
        if args.only and args.only not in page.name:
            continue
        median, code = measure(c, page, args.repeat)
        verdict = "PASS" if median < TARGET_MS and code == 200 else "MISS"
        note = "" if code == 200 else f" (HTTP {code})"
        rows.append((page.name, median, verdict + note))
        print(f"  {page.name:<62} {median:8.1f} ms  {verdict}{note}", flush=True)
    if args.busy_day and overview_pages():
        started = time.perf_counter()
        added = busy_day(args.busy_day)
        analyse_runs()  # what autovacuum does as such a day goes by
        print(
            f"  (added {added:,} runs that ended in the last day, in "
            f"{time.perf_counter() - started:.0f} s)",
            flush=True,
        )
        try:
            for page in overview_pages():
                page.name += f", {added:,} more runs ended in the last day"
                median, code = measure(c, page, args.repeat)
                verdict = "PASS" if median < TARGET_MS and code == 200 else "MISS"
                note = "" if code == 200 else f" (HTTP {code})"
                rows.append((page.name, median, verdict + note))
                print(f"  {page.name:<62} {median:8.1f} ms  {verdict}{note}", flush=True)
        finally:
            drop_busy_day(args.busy_day)
            analyse_runs()

    width = max(len(r[0]) for r in rows)
    print()
    print(f"| {'page':<{width}} | median ms (n={args.repeat}) | target ms | result |")
    print(f"|{'-' * (width + 2)}|-----------------:|----------:|--------|")
    for name, median, verdict in rows:
        print(f"| {name:<{width}} | {median:16.1f} | {TARGET_MS:9.0f} | {verdict} |")
    misses = sum(1 for r in rows if not r[2].startswith("PASS"))
    print(f"\n{len(rows) - misses} of {len(rows)} pages under {TARGET_MS:.0f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
