"""Runs survive a database failover: the primary goes mid-run and its synchronous standby,
promoted, carries on.

The test starts a PostgreSQL primary and a streaming standby of its own
(``replicated_postgres.py``: ``synchronous_commit = remote_apply``, ``synchronous_standby_names
= '*'``), migrates a database on the primary (the standby gets it by streaming), and runs two
real Celery workers and the sweeper loop with the settings production uses in front of such a
pair: a multi-host DSN (``HOST = "127.0.0.1,127.0.0.1"``, ``PORT = "<primary>,<standby>"``),
``OPTIONS = {"target_session_attrs": "read-write"}``, persistent connections
(``CONN_MAX_AGE``) with ``CONN_HEALTH_CHECKS``.

Then, with runs in every state a failover can find them in (inside a step body, inside an
undo of a rollback, inside the step applying an interrupt's payload, inside an atomic step's
transaction, blocked in the middle of a checkpoint statement, queued, paused at an interrupt),
the standby takes over, in one of three ways:

- ``before the primary stops``: promoted, then the primary stopped (``pg_ctl stop -m
  immediate``) at once; the workers reconnect to the new primary and no task fails;
- ``after a gap``: the primary stopped first, and the standby promoted only once the workers
  gave up waiting for a server that takes writes (their tasks failed); the sweeper then sends
  the runs again;
- ``after fencing the primary read-only``: a switchover; the primary refuses writes from then on
  but stays up, its connections open and answering reads; the standby is promoted once it has
  applied everything. The workers drop the connections that refused their writes and find the
  new primary; no task fails.

Every run must end as its inputs decide, no action whose checkpoint had committed may run again
(the journal the step bodies write outside the database says so), the payload must be applied
once and the atomic steps' writes made once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.conf import settings

from tests.workers.conftest import WorkerDatabase, _process_env, missing_service
from tests.workers.failover_reactors import HOLD, JOURNAL
from tests.workers.harness import ROOT, Worker, start_sweeper, stop_process, wait_until
from tests.workers.replicated_postgres import ReplicatedPostgres, postgres_bindir
from tests.workers.test_pgbouncer import task_failures

pytestmark = pytest.mark.timeout(240)

DATABASE = "reactor_failover"
REACTORS = "tests.workers.failover_reactors"
CHAIN = ["s1", "s2", "s3", "s4", "s5"]
#: The gate of the free runs' ``s2``: opened once the step records are locked.
FREE_GATE = "free"
ENDED = ("completed", "failed", "halted", "cancelled", "aborted", "needs_attention", "paused")


@pytest.fixture
def cluster() -> Iterator[ReplicatedPostgres]:
    """A synchronous primary and its standby, with the test's (empty) database; skipped
    (failed with ``REACTOR_REQUIRE_SERVICES=1``) where PostgreSQL's server programs are not
    installed or there is no user to run them as."""
    bindir = postgres_bindir()
    if bindir is None:
        where = os.environ.get("POSTGRES_BIN")
        missing_service(
            "needs PostgreSQL's server programs (initdb, pg_basebackup, pg_ctl, postgres): "
            + (f"not all in POSTGRES_BIN={where}" if where else "none found")
            + " (apt-get install postgresql, or set POSTGRES_BIN to their directory)"
        )
    try:
        pair = ReplicatedPostgres(bindir)
    except RuntimeError as exc:  # root, and no postgres user
        missing_service(f"cannot run PostgreSQL here: {exc}")
    try:
        pair.start()
        pair.primary.query(f"CREATE DATABASE {DATABASE}")
        yield pair
    finally:
        pair.remove()


def failover_database(cluster: ReplicatedPostgres, *, lease_seconds: float) -> WorkerDatabase:
    """The workers' ``DATABASES["default"]``: both servers, whichever accepts writes; and
    leases of ``lease_seconds``."""
    primary, standby = cluster.ports
    return WorkerDatabase(
        f"postgres://postgres@127.0.0.1:{primary}/{DATABASE}",
        {
            "HOST": "127.0.0.1,127.0.0.1",
            "PORT": f"{primary},{standby}",
            "OPTIONS": {"target_session_attrs": "read-write", "connect_timeout": 3},
            "CONN_MAX_AGE": 300,
            "CONN_HEALTH_CHECKS": True,
        },
        {"LEASE_SECONDS": lease_seconds},
    )


def read_write(cluster: ReplicatedPostgres) -> str:
    """The test's own way to the database: the same multi-host DSN as the workers."""
    primary, standby = cluster.ports
    return (
        f"host=127.0.0.1,127.0.0.1 port={primary},{standby} dbname={DATABASE} user=postgres "
        "target_session_attrs=read-write connect_timeout=3"
    )


def rows(conninfo: str, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    """One query on a connection of its own (the failover breaks the ones it finds)."""
    with psycopg.connect(conninfo, autocommit=True) as conn:
        return conn.execute(sql.encode(), params or None).fetchall()


@pytest.fixture
def processes() -> Iterator[list[Worker | subprocess.Popen[bytes]]]:
    """The workers and the sweeper a test starts, stopped (by PID) when it ends, however."""
    started: list[Worker | subprocess.Popen[bytes]] = []
    yield started
    with ThreadPoolExecutor() as pool:  # each waits (bounded) for its process to exit
        stopping = [
            pool.submit(p.stop) if isinstance(p, Worker) else pool.submit(stop_process, p)
            for p in started
        ]
    for stopped in stopping:
        stopped.result()


def web(env: dict[str, str], code: str) -> Any:
    """Run ``code`` in a "web process" on the failover database; the JSON value it leaves in
    ``result``."""
    script = f"import json\nimport django\ndjango.setup()\n{code}\nprint(json.dumps(result))\n"
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, cwd=ROOT, capture_output=True, text=True,
        timeout=90,
    )  # fmt: skip
    assert done.returncode == 0, f"the web process failed:\n{done.stdout}\n{done.stderr}"
    return json.loads(done.stdout.strip().splitlines()[-1])


START_HELD = f"""
from decimal import Decimal
from testproject.example.models import Account
from {REACTORS} import FailoverApproval, FailoverChain, FailoverTransfer
for i in range(3):
    Account.objects.create(name=f"source-{{i}}", balance=Decimal("100"))
    Account.objects.create(name=f"target-{{i}}", balance=Decimal("0"))
held = {{"hold": ["s3"], "pause": 0.05}}
rollback = {{"hold": ["undo:s3"], "pause": 0.05, "fail_at": "s5"}}
transfer = {{"source": "source-0", "target": "target-0", "spec": {{"hold": ["credit"]}}}}
result = {{
    "held": [str(FailoverChain.run({{"spec": held}}).execution_id) for _ in range(2)],
    "rollback": [str(FailoverChain.run({{"spec": rollback}}).execution_id)],
    "approval": [str(FailoverApproval.run({{"spec": {{"hold": ["apply"]}}}}).execution_id)],
    "held_transfer": [str(FailoverTransfer.run(transfer).execution_id)],
}}
"""

DELIVER_AND_START_FREE = f"""
from django_reactor import services
from {REACTORS} import FailoverChain, FailoverTransfer
outcome = services.resume_interrupt(
    "{{approval}}", step="approval", payload={{"nonce": "first"}}, idempotency_key="delivery-1"
)
gated = {{"hold": ["s2"], "gate": "{FREE_GATE}", "pause": 0.1}}
free = [str(FailoverChain.run({{"spec": gated}}).execution_id) for _ in range(6)]
transfers = []
for i in (1, 2):
    inputs = {{"source": f"source-{{i}}", "target": f"target-{{i}}", "spec": {{"pause": 0.1}}}}
    transfers.append(str(FailoverTransfer.run(inputs).execution_id))
result = {{"delivered": outcome.status, "transfers": transfers, "free": free}}
"""

AFTERWARDS = """
from django_reactor import services
from django_reactor.exceptions import AlreadyResumed
replay = services.resume_interrupt(
    "{approval}", step="approval", payload={{"nonce": "first"}}, idempotency_key="delivery-1"
)
try:
    services.resume_interrupt(
        "{approval}", step="approval", payload={{"nonce": "second"}}, idempotency_key="delivery-2"
    )
    other = "accepted"
except AlreadyResumed as exc:
    other = type(exc).__name__
result = {{
    "again": {{"replayed": replay.idempotent_replay, "other": other}},
    "traces": {{
        execution_id: [[e.kind, e.step, e.data] for e in services.find(execution_id).trace]
        for execution_id in {ids!r}
    }},
}}
"""


def journal(folder: Path) -> list[dict[str, Any]]:
    """Every line of the journal, in the order written."""
    path = folder / JOURNAL
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def started(folder: Path, execution_id: str, action: str) -> int:
    """How many times ``action`` of the run started."""
    entries = journal(folder)
    return sum(1 for e in entries if e.get("execution") == execution_id and e["action"] == action)


def mark(folder: Path, what: str) -> None:
    """A line of the test's own in the journal: what happened between the bodies' lines."""
    with (folder / JOURNAL).open("a") as file:
        file.write(json.dumps({"marker": what}) + "\n")


def rerun_problems(entries: list[dict[str, Any]], execution_id: str) -> tuple[list[str], set[str]]:
    """What the journal shows against "a committed checkpoint is never run again", for a run
    whose actions happen one after the other; and the actions that started twice.

    An action that started again after a later action had started had its checkpoint
    committed (the later one waited for it). An action may start twice in a row only across
    the failover: once before the primary was gone, once after the standby took over.
    """
    begins = next(i for i, e in enumerate(entries) if e.get("marker") == "failover begins")
    ends = next(i for i, e in enumerate(entries) if e.get("marker") == "failover ends")
    mine = [(i, e["action"]) for i, e in enumerate(entries) if e.get("execution") == execution_id]
    groups: list[tuple[str, list[int]]] = []
    for index, action in mine:
        if groups and groups[-1][0] == action:
            groups[-1][1].append(index)
        else:
            groups.append((action, [index]))
    problems = []
    seen: set[str] = set()
    for action, at in groups:
        if action in seen:
            problems.append(f"{action} ran again after a later action started: {mine}")
        seen.add(action)
        if len(at) > 2:
            problems.append(f"{action} started {len(at)} times: {mine}")
        if len(at) == 2 and not (at[0] < ends and at[1] > begins):
            problems.append(f"{action} started twice, not across the failover: {mine}")
    return problems, {action for action, at in groups if len(at) > 1}


def last_before_failover(entries: list[dict[str, Any]], execution_id: str) -> set[str]:
    """The action the run had started last when the failover began (none, if it had not
    started)."""
    begins = next(i for i, e in enumerate(entries) if e.get("marker") == "failover begins")
    before = [e["action"] for e in entries[:begins] if e.get("execution") == execution_id]
    return set(before[-1:])


def steprecord_lock_waiters(conninfo: str) -> int:
    """Checkpoints (statements writing step records) waiting for a lock."""
    found = rows(
        conninfo,
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND wait_event_type = 'Lock' AND query LIKE '%%django_reactor_steprecord%%'",
    )
    return int(found[0][0])


def worker_logs(processes: list[Worker | subprocess.Popen[bytes]]) -> str:
    """The workers' logs, for failure messages."""
    return "\n".join(p.log() for p in processes if isinstance(p, Worker))[-20000:]


def gave_up(workers: list[Worker], held: list[str]) -> bool:
    """Whether the held runs' tasks retried in vain and as many tasks failed: the gap without
    a writable server outlasted what a worker waits for one."""
    logged = "\n".join(w.log() for w in workers)
    retried = all(
        f"database connection lost while running execution {i}; reconnecting (attempt 2 of 3)"
        in logged
        for i in held
    )
    return retried and len(task_failures(workers)) >= len(held)


@pytest.mark.parametrize(
    "promotion", ["before the primary stops", "after a gap", "after fencing the primary read-only"]
)
def test_runs_survive_a_failover_to_the_synchronous_standby(
    promotion: str,
    cluster: ReplicatedPostgres,
    processes: list[Worker | subprocess.Popen[bytes]],
    tmp_path: Path,
) -> None:
    """Every run ends as its inputs decide, once, whichever way the standby takes over (the
    module's docstring says how each ``promotion`` goes)."""
    # Leases outlast a switch of a second or so (nothing is recovered then); after a gap the
    # runs wait for theirs to expire.
    database = failover_database(cluster, lease_seconds=2 if promotion == "after a gap" else 8)
    env = _process_env(tmp_path, "", database)
    migrate = [sys.executable, "manage.py", "migrate", "-v0", "--skip-checks"]
    done = subprocess.run(migrate, env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    # The standby has the schema by streaming: nothing is created on it directly.
    standby = cluster.standby.conninfo(DATABASE)
    assert rows(standby, "SELECT pg_is_in_recovery()") == [(True,)]
    assert rows(standby, "SELECT count(*) FROM django_migrations")[0][0] > 0
    conninfo = read_write(cluster)
    primary = cluster.primary.conninfo(DATABASE)

    (tmp_path / HOLD).touch()
    (tmp_path / FREE_GATE).touch()
    workers = [
        Worker(
            env=env,
            queue=settings.REACTOR["CELERY_QUEUE"],
            log_dir=tmp_path,
            concurrency=4,
        )
        for _ in range(2)
    ]
    processes.extend(workers)
    with ThreadPoolExecutor() as pool:  # they start side by side
        list(pool.map(Worker.start, workers))
    processes.append(start_sweeper(env, tmp_path / "sweeper.log"))

    # Runs held inside a step, an undo and an atomic step, and one paused at its interrupt...
    runs: dict[str, list[str]] = web(env, START_HELD)
    (approval,) = runs["approval"]
    (rollback,) = runs["rollback"]
    (held_transfer,) = runs["held_transfer"]
    wait_until(
        lambda: (
            all(started(tmp_path, i, "s3") for i in runs["held"])
            and started(tmp_path, rollback, "undo:s3")
            and started(tmp_path, held_transfer, "credit")
            and rows(
                conninfo, "SELECT status FROM django_reactor_execution WHERE id = %s", approval
            )
            == [("paused",)]
        ),
        # Eight worker processes and a sweeper start first, on two cores the rest of the suite
        # shares (in CI this once took over 60 s).
        timeout=120,
        what="the held runs to be inside s3, undo:s3 and credit, and the approval to pause",
    )
    # ...its payload delivered (applied by a step held in turn), and more runs: six chains, of
    # which those the free worker processes take wait inside s2, and two transfers.
    delivered = web(env, DELIVER_AND_START_FREE.replace("{approval}", approval))
    assert delivered["delivered"] == "pending"  # handed to a worker
    runs.update(transfers=delivered["transfers"], free=delivered["free"])
    wait_until(
        lambda: (
            started(tmp_path, approval, "apply")
            and sum(started(tmp_path, i, "s2") for i in runs["free"]) >= 2
        ),
        timeout=30,
        what="the payload's step, and two free runs inside s2",
    )
    held = [*runs["held"], rollback, approval, held_transfer]
    fenced = promotion == "after fencing the primary read-only"
    gated = [i for i in runs["free"] if started(tmp_path, i, "s2")]

    # Checkpoints blocked in the middle of their statement when the primary goes: a lock on the
    # step records, taken on the primary itself (it dies with it); then s2 may end.
    locker = psycopg.connect(primary)
    try:
        locker.execute(b"LOCK TABLE django_reactor_steprecord IN EXCLUSIVE MODE")
        (tmp_path / FREE_GATE).unlink()
        wait_until(
            lambda: steprecord_lock_waiters(primary) >= len(gated),
            timeout=30,
            what="the free runs' checkpoints of s2 to wait for the lock",
        )
        mark(tmp_path, "failover begins")
        if promotion == "before the primary stops":
            cluster.failover()
        elif promotion == "after a gap":
            cluster.primary.stop_immediately()
            (tmp_path / HOLD).unlink()
            wait_until(
                lambda: gave_up(workers, held),
                timeout=60,
                what="the held runs' tasks to give up while no server accepts writes",
            )
            cluster.promote()
        else:
            # A switchover: the primary refuses writes from now on (its connections stay open),
            # the transactions begun before end (the lock's and the held atomic step's are
            # terminated, the checkpoints it blocked commit), the standby applies everything and
            # takes over. The old primary stays up, read-only.
            cluster.fence_primary(DATABASE)
            cluster.wait_until_replayed()
            cluster.promote()
        mark(tmp_path, "failover ends")
    finally:
        locker.close()
    (tmp_path / HOLD).unlink(missing_ok=True)
    everything = [i for ids in runs.values() for i in ids]

    def ended() -> list[tuple[Any, ...]] | None:
        found = rows(
            conninfo,
            "SELECT id::text, status, failure FROM django_reactor_execution WHERE id = ANY(%s)",
            [uuid.UUID(i) for i in everything],
        )
        return found if all(status in ENDED for _, status, _ in found) else None

    try:
        final = wait_until(ended, timeout=60, what="every run to end after the failover")
    except AssertionError:
        pytest.fail(f"runs did not end after the failover:\n{worker_logs(processes)}")
    statuses = {execution_id: (status, failure) for execution_id, status, failure in final}
    assert len(statuses) == len(everything)
    expected = {i: "completed" for i in everything} | {rollback: "failed"}
    assert {i: s for i, (s, _) in statuses.items()} == expected, worker_logs(processes)
    assert statuses[rollback][1]["message"].endswith("planned failure at s5")

    # Every action ran, and none whose checkpoint had committed ran again.
    entries = journal(tmp_path)
    actions = {
        **{i: CHAIN for i in [*runs["held"], *runs["free"]]},
        rollback: [*CHAIN, "undo:s4", "undo:s3", "undo:s2", "undo:s1"],
        approval: ["first", "apply"],
        **{i: ["debit", "credit"] for i in [held_transfer, *runs["transfers"]]},
    }
    repeated: dict[str, set[str]] = {}
    for execution_id, names in actions.items():
        problems, repeated[execution_id] = rerun_problems(entries, execution_id)
        assert problems == [], (execution_id, problems)
        ran = {e["action"] for e in entries if e.get("execution") == execution_id}
        assert ran == set(names), (execution_id, ran)
    # The held actions were in flight: their checkpoints went to the dead primary, so they ran
    # again on the new one, once. So did the checkpoints blocked by the lock.
    for execution_id in runs["held"]:
        assert repeated[execution_id] == {"s3"}
    assert repeated[rollback] == {"undo:s3"}
    assert repeated[approval] == {"apply"}
    assert repeated[held_transfer] == {"credit"}
    if not fenced:
        # Their checkpoints of s2 were blocked on the lock: lost with the primary. (A fenced
        # primary lets them go: they commit, or are refused as read-only when they come to the
        # server in a transaction of their own, after the fence.)
        for execution_id in gated:
            assert repeated[execution_id] == {"s2"}, execution_id
    # Nothing else ran twice but the action each run was in at the failover.
    for execution_id, again in repeated.items():
        assert again <= last_before_failover(entries, execution_id), (execution_id, again)

    # The trace: each step recorded once, in order. (First the payload delivered again after
    # the failover: the same delivery is a replay, a second one is refused.)
    afterwards = web(env, AFTERWARDS.format(approval=approval, ids=everything))
    assert afterwards["again"] == {"replayed": True, "other": "AlreadyResumed"}
    traces = afterwards["traces"]
    for execution_id in runs["held"] + runs["free"]:
        recorded = [step for kind, step, _ in traces[execution_id] if kind == "run"]
        assert recorded == CHAIN, traces[execution_id]
        assert traces[execution_id][-1][:2] == ["complete", ""]
    undone = [step for kind, step, _ in traces[rollback] if kind == "undo"]
    assert undone == ["s4", "s3", "s2", "s1"], traces[rollback]
    recovered = [i for i in held if any(data.get("recovery_attempts") for _, _, data in traces[i])]
    if promotion == "after a gap":
        # The workers gave up on them: the sweeper sent them again once their leases expired.
        assert recovered, traces
    else:
        # The workers reconnected to the new primary and carried on, failing no task.
        assert task_failures(workers) == [], worker_logs(processes)
    if promotion == "before the primary stops":
        assert recovered == [], traces  # nothing to recover

    # The payload was accepted once and applied once.
    assert [k for k, _, _ in traces[approval]].count("payload") == 1, traces[approval]
    applied = {e["nonce"] for e in entries if e.get("execution") == approval and "nonce" in e}
    assert applied == {"first"}

    # The atomic steps moved the money once each.
    for index, execution_id in enumerate([held_transfer, *runs["transfers"]]):
        ledger = rows(
            conninfo,
            "SELECT a.name, e.amount::text, e.step FROM example_ledgerentry e "
            "JOIN example_account a ON a.id = e.account_id WHERE e.execution_id = %s "
            "ORDER BY e.id",
            uuid.UUID(execution_id),
        )
        assert ledger == [
            (f"source-{index}", "-30.00", "debit"),
            (f"target-{index}", "30.00", "credit"),
        ]
    balances = dict(rows(conninfo, "SELECT name, balance::text FROM example_account"))
    assert balances == {
        **{f"source-{i}": "70.00" for i in range(3)},
        **{f"target-{i}": "30.00" for i in range(3)},
    }

    # The workers and the sweeper lived through it, on the new primary.
    assert all(process_alive(p) for p in processes), worker_logs(processes)
    assert rows(conninfo, "SELECT inet_server_port()") == [(cluster.standby.port,)]


def process_alive(process: Worker | subprocess.Popen[bytes]) -> bool:
    """Whether a worker's main process, or the sweeper, is still running."""
    popen = process.process if isinstance(process, Worker) else process
    return popen is not None and popen.poll() is None
