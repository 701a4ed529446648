"""Queues and priorities on real workers: a run's tasks go to its queue, and urgent runs overtake
a backlog on the Redis and RabbitMQ brokers."""

from __future__ import annotations

import os
import uuid
from typing import Any

import pytest
from django.conf import settings
from kombu import Connection

from django_reactor import services
from django_reactor.models import Execution
from django_reactor.states import ExecutionStatus
from tests.workers.conftest import missing_service
from tests.workers.harness import wait_until
from tests.workers.reactors import One, WithUnit

RABBITMQ = os.environ.get("REACTOR_TEST_RABBITMQ", "amqp://guest:guest@127.0.0.1:5672//")
#: The low-priority backlog the urgent runs must overtake (the issue's figure by default).
BACKLOG = int(os.environ.get("REACTOR_WORKER_BACKLOG", "1000"))
URGENT = 10


def all_ended(ids: list[uuid.UUID]) -> bool:
    return Execution.objects.filter(pk__in=ids, status=ExecutionStatus.COMPLETED).count() == len(
        ids
    )


def test_a_runs_tasks_go_to_its_queue_and_only_its_workers_take_them(start_worker: Any) -> None:
    payments = f"{settings.REACTOR['CELERY_QUEUE']}-payments"
    start_worker(queues=[payments])
    # A run with an async unit: its start, the unit's dispatch and the parent's wake-up all go
    # to the payments queue, which is the only one a worker consumes.
    routed = services.run_in_background(WithUnit, {}, queue=payments, priority=7).execution_id
    stays = services.run_in_background(One, {}).execution_id
    wait_until(lambda: all_ended([routed]), timeout=60, what="the routed run to complete")
    unit = Execution.objects.get(parent_id=routed)
    assert (unit.queue, unit.priority, unit.status) == (payments, 7, ExecutionStatus.COMPLETED)
    assert services.find(routed).outcome.value == {"doubled": 42}
    # Nobody consumes the default queue yet: the other run waits there, untouched.
    assert Execution.objects.get(pk=stays).status == ExecutionStatus.PENDING
    start_worker()
    wait_until(lambda: all_ended([stays]), timeout=60, what="the default queue's run")


def _rabbitmq_reachable() -> bool:
    try:
        with Connection(RABBITMQ, connect_timeout=3) as connection:
            connection.ensure_connection(max_retries=1)
    except Exception:
        return False
    return True


@pytest.mark.parametrize("broker", ["redis", "rabbitmq"])
def test_urgent_runs_overtake_a_backlog(
    broker: str, start_worker: Any, run_in_subprocess: Any
) -> None:
    url = None
    if broker == "rabbitmq":
        if not _rabbitmq_reachable():
            missing_service(f"RabbitMQ at {RABBITMQ} is not reachable")
        url = RABBITMQ
    queue = f"{settings.REACTOR['CELERY_QUEUE']}-{broker}"
    # Published by another process on the broker under test, before any worker runs: the
    # backlog at priority 1, then the urgent runs at 9.
    code = (
        "from django_reactor import services\n"
        "from tests.workers.reactors import One\n"
        f"for _ in range({BACKLOG}):\n"
        f"    services.run_in_background(One, {{}}, queue={queue!r}, priority=1)\n"
        f"for _ in range({URGENT}):\n"
        f"    services.run_in_background(One, {{}}, queue={queue!r}, priority=9)\n"
    )
    try:
        assert run_in_subprocess(code, broker=url) == 0
        runs = list(Execution.objects.filter(queue=queue).values_list("id", "priority"))
        assert len(runs) == BACKLOG + URGENT
        start_worker(queues=[queue], broker=url)
        ids = [run for run, _ in runs]
        wait_until(lambda: all_ended(ids), timeout=300, what="every run to complete")
    finally:
        if url is not None:
            with Connection(url) as connection:
                connection.default_channel.queue_delete(queue)
    ended = dict(Execution.objects.filter(pk__in=ids).values_list("id", "finished_at"))
    urgent = sorted(ended[run] for run, priority in runs if priority == 9)
    backlog = sorted(ended[run] for run, priority in runs if priority == 1)
    p5 = backlog[len(backlog) * 5 // 100]
    assert urgent[-1] <= p5, (
        f"the last urgent run ended at {urgent[-1]}, after the backlog's p5 at {p5}; "
        f"{sum(1 for at in backlog if at < urgent[-1])} backlog runs ended before it"
    )
