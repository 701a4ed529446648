"""The async API under a real ASGI server (uvicorn): 200 concurrent requests each start a
background run with ``await Reactor.arun`` and answer once ``await handle.await_outcome``
returns, the runs done by real workers. No ``SynchronousOnlyOperation``, every run completed,
and the server's database connections (counted in ``pg_stat_activity`` by the application
name it connects with) stay within ``ASYNC_DATABASE_CALLS`` (plus the poller's one, and the
backends of closed sessions not yet gone) and are all closed once the requests are
answered."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from django.db import connection

from django_reactor.models import Execution
from django_reactor.states import ExecutionStatus
from tests.workers.conftest import WorkerDatabase, _process_env
from tests.workers.harness import ROOT, stop_process, wait_until

REQUESTS = 200
CALLS = 8


def server_connections(application: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND application_name = %s",
            [application],
        )
        return int(cursor.fetchone()[0])


async def get(socket_path: Path, target: str) -> tuple[int, dict[str, Any]]:
    reader, writer = await asyncio.open_unix_connection(str(socket_path))
    writer.write(f"GET {target} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n".encode())
    await writer.drain()
    response = await reader.read()
    writer.close()
    head, _, body = response.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, json.loads(body)


async def all_at_once(socket_path: Path) -> list[tuple[int, dict[str, Any]]]:
    return await asyncio.gather(
        *(get(socket_path, f"/run-and-wait/?n={n}") for n in range(REQUESTS))
    )


def test_concurrent_asgi_requests_start_and_await_runs_without_leaking_connections(
    start_worker: Any, tmp_path: Path, worker_database: WorkerDatabase
) -> None:
    worker = start_worker(concurrency=2)
    application = f"reactor-asgi-{uuid.uuid4().hex[:8]}"
    socket_path = tmp_path / "asgi.sock"
    server = WorkerDatabase(
        worker_database.url,
        {**worker_database.options, "OPTIONS": {"application_name": application}},
        {**worker_database.reactor, "ASYNC_DATABASE_CALLS": CALLS},
    )
    env = {**_process_env(tmp_path, "", server), "REACTOR_ROOT_URLCONF": "tests.workers.asgi"}
    log_path = tmp_path / "uvicorn.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [
                sys.executable, "-m", "uvicorn", "testproject.asgi:application",
                "--uds", str(socket_path), "--lifespan", "off", "--log-level", "warning",
                "--backlog", str(REQUESTS * 2),
            ],
            env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        wait_until(
            lambda: socket_path.exists() or process.poll() is not None,
            timeout=30,
            what="uvicorn to listen",
        )
        assert process.poll() is None, log_path.read_text()
        before = server_connections(application)

        peak = 0
        sampling = threading.Event()

        def sample() -> None:
            nonlocal peak
            try:
                while not sampling.is_set():
                    peak = max(peak, server_connections(application))
                    sampling.wait(0.01)
            finally:
                connection.close()

        sampler = threading.Thread(target=sample)
        sampler.start()
        started = time.monotonic()
        try:
            answers = asyncio.run(asyncio.wait_for(all_at_once(socket_path), timeout=120))
        finally:
            sampling.set()
            sampler.join(timeout=10)
        took = time.monotonic() - started

        failures = [body for status, body in answers if status != 200]
        assert failures == [], failures[:3]
        assert sorted(body["value"] for _, body in answers) == [2 * n for n in range(REQUESTS)]
        ids = [body["execution_id"] for _, body in answers]
        assert (
            Execution.objects.filter(pk__in=ids, status=ExecutionStatus.COMPLETED).count()
            == REQUESTS
        )
        # Closed sessions leave pg_stat_activity once their backends exit: bounded wait.
        wait_until(
            lambda: server_connections(application) == 0,
            timeout=10,
            what="the server's connections to close",
        )
        after = server_connections(application)
        print(
            f"\n{REQUESTS} requests in {took:.2f} s; server connections before {before}, "
            f"at most {peak} during, after {after}"
        )
        assert before == 0
        # The calls' connections and the poller's; a closed session's backend may still be
        # listed for a moment after its client closed it, beside the next one: two more.
        assert 0 < peak <= CALLS + 1 + 2
        assert "SynchronousOnlyOperation" not in log_path.read_text()
        assert "SynchronousOnlyOperation" not in worker.log()  # the async def step bodies
    finally:
        stop_process(process)
    assert "SynchronousOnlyOperation" not in log_path.read_text()
