"""State a run publishes: self.context.publish(key, value), durable with the step's checkpoint."""

from __future__ import annotations

from typing import Any

import pytest

from django_reactor import Completed, Reactor, Retry, Step, Success, services, step
from django_reactor.exceptions import PublishError
from django_reactor.models import Execution

pytestmark = pytest.mark.django_db(transaction=True)

ATTEMPTS: list[int] = []


class Progress(Step):
    def run(self, **arguments: Any) -> Any:
        self.context.publish("progress", {"done": 1, "of": 2})
        self.context.publish("stage", "packing")
        return Success("packed")


class Finish(Step):
    def run(self, **arguments: Any) -> Any:
        self.context.publish("progress", {"done": 2, "of": 2})
        return Success("shipped")


class FlakyPublisher(Step):
    retry = Retry(attempts=2, backoff="fixed", delay=0)

    def run(self, **arguments: Any) -> Any:
        ATTEMPTS.append(self.context.attempt)
        self.context.publish("attempt", self.context.attempt)
        if self.context.attempt == 1:
            raise RuntimeError("first attempt fails")
        return Success("ok")


class TooBig(Step):
    def run(self, **arguments: Any) -> Any:
        self.context.publish("blob", "x" * 20000)
        return Success("never")


class Shipment(Reactor):
    pack = step(Progress)
    ship = step(Finish, wait_for=["pack"])


class Flaky(Reactor):
    only = step(FlakyPublisher)


class Oversized(Reactor):
    only = step(TooBig)


def test_published_values_are_kept_with_the_run_the_latest_by_key() -> None:
    outcome = Shipment.run({})

    assert isinstance(outcome, Completed)
    handle = services.find(outcome.execution_id)
    assert handle.published == {"progress": {"done": 2, "of": 2}, "stage": "packing"}
    assert Execution.objects.get(pk=outcome.execution_id).published == handle.published


def test_a_failed_attempt_publishes_nothing() -> None:
    ATTEMPTS.clear()
    outcome = Flaky.run({})

    assert isinstance(outcome, Completed)
    assert ATTEMPTS == [1, 2]
    assert services.find(outcome.execution_id).published == {"attempt": 2}


def test_a_value_too_large_to_publish_fails_the_step_saying_why() -> None:
    outcome = Oversized.run({})

    assert outcome.error is not None
    assert "PUBLISH_MAX_BYTES" in outcome.error.message
    assert outcome.error.exception_class.endswith("PublishError")
    assert services.find(outcome.execution_id).published == {}
    assert issubclass(PublishError, ValueError)


def test_the_api_and_the_admin_show_what_the_run_published(admin_client: Any) -> None:
    outcome = Shipment.run({})

    answer = admin_client.get(f"/reactor/executions/{outcome.execution_id}/")
    assert answer.status_code == 200, answer.content
    assert answer.json()["published"] == {"progress": {"done": 2, "of": 2}, "stage": "packing"}
    page = admin_client.get(f"/admin/django_reactor/execution/{outcome.execution_id}/change/")
    assert page.status_code == 200
    assert b"packing" in page.content


def test_reactor_show_lists_what_the_run_published() -> None:
    from io import StringIO

    from django.core.management import call_command

    outcome = Shipment.run({})
    out = StringIO()
    call_command("reactor_show", str(outcome.execution_id), stdout=out)

    assert "published:" in out.getvalue()
    assert '  stage: "packing"' in out.getvalue()
