"""Interrupts resumed through the API and finished by real Celery workers.

A run of the example ``ApproveRefund`` pauses at ``approval`` (``resume="background"``); a
signed webhook POSTed through Django's test client claims the interrupt and answers 202, and a
worker process runs ``settle``. The crash tests kill the process that is carrying the run after
the claim committed (the worker inside ``settle``, or the web process between the commit of
the claim and its Dispatch row and the publish) and check that the run still finishes, once.
"""

from __future__ import annotations

import json
import signal
import uuid
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from rest_framework.test import APIClient

from django_reactor import Paused
from django_reactor.api.signatures import sign
from django_reactor.models import Dispatch, Execution, Interrupt
from django_reactor.states import ExecutionStatus, InterruptStatus
from testproject.example.models import Order
from testproject.example.reactors import ApproveRefund
from tests.workers.harness import wait_until
from tests.workers.test_background import finished
from tests.workers.test_crashes import sweep_until_finished

SECRET = "whsec_" + "d29ya2VyLXRlc3RzLXdlYmhvb2stc2VjcmV0LTAxMjM="
APPROVAL = {"approved": True, "approver": "grace@example.com", "note": "damaged in transit"}
SETTLED_VALUE = {"amount_cents": 1500, "status": "settled", "approved_by": "grace@example.com"}


@pytest.fixture(autouse=True)
def _webhook_secret(settings: Any) -> None:
    """This (web) process verifies webhooks with ``SECRET``; no rate limit."""
    settings.REACTOR = {**settings.REACTOR, "WEBHOOK_SECRETS": [SECRET], "API_RESUME_RATE": None}


@pytest.fixture
def order(transactional_db: Any) -> Order:
    return Order.objects.create(customer_email="ada@example.com", total=Decimal("38.00"))


def paused_refund(order: Order) -> Paused:
    outcome = ApproveRefund.run({"order_id": order.pk, "amount_cents": 1500})
    assert isinstance(outcome, Paused), outcome
    assert outcome.step == "approval"
    return outcome


def resume_url(execution_id: Any) -> str:
    return f"/reactor/executions/{execution_id}/resume/"


def signed_resume(execution_id: Any, payload: dict[str, Any]) -> Any:
    """POST a signed webhook delivering ``payload`` to the run's ``approval`` interrupt."""
    raw = json.dumps({"step": "approval", "payload": payload}).encode()
    headers = sign(SECRET, f"msg_{uuid.uuid4().hex}", raw)
    return APIClient().post(
        resume_url(execution_id), raw, content_type="application/json", headers=headers
    )


def viewer() -> APIClient:
    user, _ = User.objects.get_or_create(username="viewer")
    user.user_permissions.add(
        Permission.objects.get(content_type__app_label="django_reactor", codename="view_execution")
    )
    client = APIClient()
    client.force_authenticate(User.objects.get(pk=user.pk))
    return client


def kinds(trace: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(event["kind"], event["step"]) for event in trace]


def assert_settled_once(execution_id: Any) -> dict[str, Any]:
    """The run completed, ``settle`` ran (and was checkpointed) once; returns the API's view."""
    response = viewer().get(f"/reactor/executions/{execution_id}/")
    assert response.status_code == 200, response.data
    data = response.data
    assert data["status"] == "completed"
    assert {k: data["result"][k] for k in SETTLED_VALUE} == SETTLED_VALUE
    events = kinds(data["trace"])
    assert events.count(("payload", "approval")) == 1
    assert events.count(("run", "settle")) == 1
    assert events.count(("run", "hold")) == 1
    assert [k for k, _ in events].count("complete") == 1
    assert events.index(("payload", "approval")) < events.index(("run", "settle"))
    assert [(i["step"], i["status"]) for i in data["interrupts"]] == [
        ("approval", InterruptStatus.RESUMED)
    ]
    assert {s["name"]: s["status"] for s in data["steps"]} == {
        "hold": "completed",
        "approval": "completed",
        "settle": "completed",
    }
    return data


@pytest.mark.behind_pgbouncer
def test_a_signed_webhook_resumes_a_paused_run_and_a_worker_completes_it(
    start_worker: Callable[..., Any], order: Order
) -> None:
    start_worker()
    paused = paused_refund(order)

    response = signed_resume(paused.execution_id, APPROVAL)

    assert response.status_code == 202, response.data
    assert response.data["execution_id"] == str(paused.execution_id)
    assert response.data["status"] == ExecutionStatus.PENDING
    row = wait_until(lambda: finished(paused.execution_id), what="the worker to finish the run")
    assert row.status == ExecutionStatus.COMPLETED
    data = assert_settled_once(row.id)
    assert data["result"]["note"] == "damaged in transit"
    events = kinds(data["trace"])
    # The caller ran ``hold`` and paused; the worker took the payload and ran ``settle``.
    assert events == [
        ("start", ""), ("run", "hold"), ("interrupt", "approval"), ("pause", ""),
        ("steer", ""), ("resume", ""), ("payload", "approval"), ("run", "settle"),
        ("complete", ""),
    ]  # fmt: skip
    steer = next(e for e in data["trace"] if e["kind"] == "steer")
    assert steer["data"]["via"] == "api"
    assert steer["data"]["by"] == "webhook signed with the 'default' secrets"
    assert row.dispatches.get().sent_at is not None
    assert row.recovery_attempts == 0
    again = signed_resume(row.id, APPROVAL)  # a second delivery (another webhook id)
    assert again.status_code == 409
    assert again.data["code"] == "already_resumed"


def test_a_worker_killed_inside_the_step_after_the_claim_still_settles_once(
    start_worker: Callable[..., Any], order: Order
) -> None:
    # The worker dies after running ``settle``'s body, before its checkpoint commits: the run
    # was claimed (payload accepted, interrupt closed) and its lease is held by a dead process.
    start_worker(faults="before_step_commit@settle=kill:once")
    paused = paused_refund(order)

    response = signed_resume(paused.execution_id, APPROVAL)

    assert response.status_code == 202, response.data
    row = sweep_until_finished(paused.execution_id)
    assert row.status == ExecutionStatus.COMPLETED
    assert row.recovery_attempts == 1
    assert_settled_once(row.id)
    assert Interrupt.objects.get(execution_id=row.id).status == InterruptStatus.RESUMED


def test_a_web_process_killed_between_the_claim_commit_and_the_publish(
    start_worker: Callable[..., Any], order: Order, run_in_subprocess: Callable[..., int]
) -> None:
    # Another "web process" answers the webhook and dies after the claim and its Dispatch row
    # committed together, before the task reached the broker: the sweeper publishes it.
    start_worker()
    paused = paused_refund(order)
    code = (
        "import json, uuid\n"
        "from django.conf import settings\n"
        "from django.test import Client, override_settings\n"
        "from django_reactor.api.signatures import sign\n"
        f"raw = json.dumps({{'step': 'approval', 'payload': {APPROVAL!r}}}).encode()\n"
        f"headers = sign({SECRET!r}, 'msg_web_crash', raw)\n"
        f"reactor = {{**settings.REACTOR, 'WEBHOOK_SECRETS': [{SECRET!r}], "
        "'API_RESUME_RATE': None}\n"
        "with override_settings(REACTOR=reactor):\n"
        f"    Client().post({resume_url(paused.execution_id)!r}, raw,\n"
        "                  content_type='application/json', headers=headers)\n"
        "raise SystemExit(3)  # not reached: the process is killed before the 202\n"
    )

    assert run_in_subprocess(code, faults="before_publish=kill") == -signal.SIGKILL

    row = Execution.objects.get(pk=paused.execution_id)
    assert row.status == ExecutionStatus.PENDING  # claimed: no longer paused
    assert Interrupt.objects.get(execution_id=row.id).status == InterruptStatus.RESUMED
    dispatch = Dispatch.objects.get(execution=row)
    assert (dispatch.reason, dispatch.sent_at) == (Dispatch.Reason.RESUME, None)
    row = sweep_until_finished(row.id)
    assert row.status == ExecutionStatus.COMPLETED
    assert_settled_once(row.id)
    # The sender retries the same delivery (same webhook id): nothing runs again.
    raw = json.dumps({"step": "approval", "payload": APPROVAL}).encode()
    retried = APIClient().post(
        resume_url(row.id),
        raw,
        content_type="application/json",
        headers=sign(SECRET, "msg_web_crash", raw),
    )
    assert retried.status_code in (202, 409), retried.data
    assert finished(row.id) is not None
    assert_settled_once(row.id)
