"""Real workers and a real sweeper on a fleet sharded by reactor (``REACTOR["DATABASE"]``):
runs routed to the second database are claimed, checkpointed, fanned out and woken there, and
nothing of theirs is written to the default database."""

from __future__ import annotations

import datetime as dt
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import connections

from django_reactor import Dispatched, store
from django_reactor.models import Dispatch, Execution, MapResult, MapRun, StepRecord
from django_reactor.states import ExecutionStatus
from tests.workers.conftest import WorkerDatabase, _process_env, direct_database
from tests.workers.harness import Worker, start_sweeper, stop_process, wait_until
from tests.workers.routed_reactors import ROUTING, ShardedFanOut, ShardedSleeper

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "shard"])


def _shard_url() -> str:
    db = settings.DATABASES["shard"]
    name = connections["shard"].settings_dict["NAME"]
    return f"postgres://{db['USER']}@{db['HOST']}:{db['PORT'] or 5432}/{name}"


@pytest.fixture
def routed(settings: Any) -> None:
    settings.REACTOR = {**settings.REACTOR, "DATABASE": ROUTING}


@pytest.fixture
def sharded_env(routed: None, tmp_path: Path) -> dict[str, str]:
    """The environment of a worker (or sweeper) process that knows both databases."""
    database = direct_database()
    env = _process_env(
        tmp_path, database=WorkerDatabase(database.url, reactor={"DATABASE": ROUTING})
    )
    return {**env, "SHARD_DATABASE_URL": _shard_url()}


@pytest.fixture
def sharded_worker(sharded_env: dict[str, str], tmp_path: Path) -> Iterator[Worker]:
    worker = Worker(
        env=sharded_env, queue=settings.REACTOR["CELERY_QUEUE"], log_dir=tmp_path
    ).start()
    yield worker
    worker.stop()


def _status(execution_id: Any) -> str | None:
    return (
        Execution.objects.using("shard")
        .filter(pk=execution_id)
        .values_list("status", flat=True)
        .first()
    )


def test_a_routed_run_with_a_fanned_out_map_completes_on_workers_in_its_database(
    sharded_worker: Worker,
) -> None:
    outcome = ShardedFanOut.run({"start": 1})
    assert isinstance(outcome, Dispatched)
    key = outcome.execution_id
    assert Execution.objects.using("default").filter(pk=key).count() == 0

    wait_until(lambda: _status(key) == ExecutionStatus.COMPLETED, timeout=60, what="the routed run")

    steps = dict(
        StepRecord.objects.using("shard").filter(execution_id=key).values_list("step", "status")
    )
    assert steps == {s: "completed" for s in ("first", "second", "lines", "total")}
    (fanned,) = MapRun.objects.using("shard").filter(execution_id=key)
    values = sorted(
        MapResult.objects.using("shard").filter(map_run=fanned).values_list("index", flat=True)
    )
    assert values == list(range(12))
    assert Dispatch.objects.using("shard").filter(execution_id=key).exists()
    for model in (StepRecord, Dispatch):
        assert not model.objects.using("default").filter(execution_id=key).exists()
    assert "WrongDatabase" not in sharded_worker.log()


def test_the_sweeper_wakes_a_routed_sleep_and_a_worker_finishes_it(
    sharded_worker: Worker, sharded_env: dict[str, str], tmp_path: Path
) -> None:
    outcome = ShardedSleeper.run({})
    key = outcome.execution_id
    wait_until(
        lambda: Execution.objects.using("shard").filter(pk=key, wake_at__isnull=False).exists(),
        timeout=30,
        what="the run asleep in the shard",
    )
    with store.bound("shard"):
        store.time_in_tests.shift_due_times(dt.timedelta(days=1, minutes=1))

    sweeper = start_sweeper(sharded_env, tmp_path / "sweeper.log")
    try:
        wait_until(
            lambda: _status(key) == ExecutionStatus.COMPLETED, timeout=60, what="the woken run"
        )
    finally:
        stop_process(sweeper, signal.SIGINT)
    # The sweeper woke it: its wake-up dispatch is in the shard (the sweeper may still be
    # reporting when it is stopped, so its log is not the witness).
    reasons = Dispatch.objects.using("shard").filter(execution_id=key)
    assert list(reasons.values_list("reason", flat=True)).count(Dispatch.Reason.WAKE) == 1
    assert not Dispatch.objects.using("default").filter(execution_id=key).exists()
