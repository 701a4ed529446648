"""A receive resumed in the background: a message sent over the API, consumed on a worker."""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.db import connection
from rest_framework.test import APIClient

import django_reactor
from django_reactor import Dispatched, InProgress, Paused, services
from django_reactor.models import Execution, Message
from django_reactor.states import ExecutionStatus
from tests.workers.harness import wait_until
from tests.workers.message_reactors import Mailboxed, RacingOnWorkers
from tests.workers.test_background import body_runs, finished

pytestmark = pytest.mark.django_db(transaction=True)


def sender() -> APIClient:
    user = User.objects.create_user("sender", password="pw")
    user.user_permissions.add(
        Permission.objects.get(
            content_type__app_label="django_reactor", codename="resume_interrupt"
        )
    )
    client = APIClient()
    client.force_authenticate(User.objects.get(pk=user.pk))
    return client


def completed(execution_id: Any) -> Execution | None:
    row = finished(execution_id)
    return row if row is not None and row.status == ExecutionStatus.COMPLETED else None


def kinds(execution_id: Any) -> list[tuple[str, str]]:
    return [(e.kind, e.step) for e in Execution.objects.get(pk=execution_id).events.order_by("seq")]


def test_a_message_kept_before_the_wait_is_consumed_on_a_worker_once(
    start_worker: Callable[..., Any],
) -> None:
    start_worker()
    paused = Mailboxed.run({})
    assert isinstance(paused, Paused)
    assert paused.step == "go"
    answer = sender().post(
        f"/reactor/executions/{paused.execution_id}/messages/payment/",
        {"amount": 5},
        format="json",
    )
    assert answer.status_code == 202, answer.content
    assert isinstance(
        django_reactor.send(paused.execution_id, "payment", {"amount": 6}), InProgress
    )

    resumed = services.resume_interrupt(paused.execution_id, step="go", payload={})

    assert isinstance(resumed, Dispatched)
    # A worker runs ``go``, pauses at ``paid``, finds the kept message and hands the run on.
    row = wait_until(lambda: completed(paused.execution_id), what="the workers to finish the run")
    assert row.steps.get(step="ship").result == {"step": "ship"}
    assert row.steps.get(step="paid").result == {"amount": 5}  # the first one sent
    assert body_runs(row.id) == {"first": 1, "ship": 1}
    events = kinds(row.id)
    assert events.count(("payload", "paid")) == 1
    assert events.index(("interrupt", "paid")) < events.index(("payload", "paid"))
    assert list(
        Message.objects.filter(execution_id=row.id).order_by("id").values_list("status", flat=True)
    ) == ["consumed", "unread"]


RACE_ROUNDS = int(os.environ.get("REACTOR_WORKER_RACE_ROUNDS", "15"))


def test_deliveries_racing_a_run_on_workers_to_its_waits_are_applied_exactly_once(
    start_worker: Callable[..., Any],
) -> None:
    start_worker(concurrency=2)
    chooser = random.Random(2029)
    answers: dict[str, int] = {}
    runs = []
    for number in range(RACE_ROUNDS):
        run_id = RacingOnWorkers.run({}).execution_id
        assert isinstance(services.resume_interrupt(run_id, step="go", payload={}), Dispatched)
        # A random number of round trips to the database spreads the moments the deliveries
        # land (before the worker wrote the waits, while it moves, after it paused); the
        # assertions hold for every one of them.
        with connection.cursor() as cursor:
            for _ in range(chooser.randrange(0, 400)):
                cursor.execute("SELECT 1")
        for outcome in (
            services.resume_interrupt(run_id, step="legal", payload={"n": number}),
            django_reactor.send(run_id, "payment", {"n": number}),
        ):
            answers[type(outcome).__name__] = answers.get(type(outcome).__name__, 0) + 1
        runs.append((run_id, number))
    for run_id, number in runs:
        row = wait_until(lambda run_id=run_id: completed(run_id), what="the workers to finish")
        assert row.steps.get(step="ship").result == {"step": "ship"}
        assert (row.steps.get(step="legal").result, row.steps.get(step="paid").result) == (
            {"n": number},
            {"n": number},
        )
        events = kinds(row.id)
        assert events.count(("payload", "legal")) == events.count(("payload", "paid")) == 1
        assert body_runs(row.id) == {"first": 1, "ship": 1}
        assert set(
            Message.objects.filter(execution_id=row.id).values_list("status", flat=True)
        ) <= {"consumed"}
    # Kept or recorded by the moving run (InProgress), or resumed on a worker (Dispatched).
    assert set(answers) <= {"InProgress", "Dispatched"}, answers
    assert sum(answers.values()) == 2 * RACE_ROUNDS
