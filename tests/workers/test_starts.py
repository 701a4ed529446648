"""A run started with ``POST /reactors/{name}/runs/`` is run by a real worker, once."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import Permission, User
from rest_framework.test import APIClient

from django_reactor.states import ExecutionStatus
from tests.workers.harness import wait_until
from tests.workers.reactors import Five
from tests.workers.test_background import body_runs, finished


def test_a_run_started_over_http_is_completed_by_a_worker(start_worker: Any, settings: Any) -> None:
    name = Five.definition.name
    settings.REACTOR = {**settings.REACTOR, "START_AUTH": {"default": [], name: ["user"]}}
    user = User.objects.create_user("starter")
    user.user_permissions.add(Permission.objects.get(codename="start_execution"))
    client = APIClient()
    client.force_authenticate(User.objects.get(pk=user.pk))
    start_worker()
    answers = [
        client.post(
            f"/reactor/reactors/{name}/runs/", {}, format="json", HTTP_IDEMPOTENCY_KEY="five-1"
        )
        for _ in range(2)
    ]
    assert [a.status_code for a in answers] == [202, 202], answers[0].content
    key = answers[0].json()["execution_id"]
    assert answers[1].json()["execution_id"] == key
    done = wait_until(lambda: finished(key), timeout=60, what="the started run to complete")
    assert done.status == ExecutionStatus.COMPLETED
    assert body_runs(key) == {"s1": 1, "s2": 1, "s3": 1, "s4": 1, "s5": 1}
    shown = client.get(answers[0].json()["url"])
    assert shown.status_code == 403  # the starter may start, not read
    assert [e.kind for e in done.events.order_by("seq")][:2] == ["start", "resume"]
