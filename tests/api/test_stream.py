"""GET /executions/{id}/stream/: a run's trace, published values and status as server-sent
events, ending when the run ends."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest
from django.db import connections
from rest_framework.test import APIClient

from django_reactor import Completed, Paused, Reactor, Step, Success, interrupt, services, step
from django_reactor.models import Execution
from tests.api.reactors import GATE, Held

pytestmark = pytest.mark.django_db(transaction=True)


class Publishes(Step):
    def run(self, **arguments: Any) -> Any:
        self.context.publish("stage", self.context.step)
        return Success(self.context.step)


class Packing(Reactor):
    pack = step(Publishes)
    approve = interrupt(after="pack")
    ship = step(Publishes, wait_for=["approve"])


class HeldPacking(Reactor):
    pack = step(Publishes)
    hold = step(Held, wait_for=["pack"])
    ship = step(Publishes, wait_for=["hold"])


def parse(body: str) -> list[tuple[str, Any, str | None]]:
    """(event, data, id) of each event of a stream's body."""
    events = []
    for block in body.split("\n\n"):
        fields: dict[str, str] = {}
        for line in block.splitlines():
            if line.startswith(":") or ":" not in line:
                continue
            name, _, value = line.partition(": ")
            fields[name] = value
        if "event" in fields:
            events.append((fields["event"], json.loads(fields["data"]), fields.get("id")))
    return events


def reader(client: APIClient, url: str, **headers: str) -> str:
    response = client.get(url, HTTP_ACCEPT="text/event-stream", **headers)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/event-stream")
    return b"".join(response.streaming_content).decode()


@pytest.fixture
def client(admin_user: Any) -> APIClient:
    api = APIClient()
    api.force_authenticate(admin_user)
    return api


def test_a_finished_runs_stream_sends_its_trace_what_it_published_and_ends(
    client: APIClient,
) -> None:
    paused = Packing.run({})
    assert isinstance(paused, Paused)
    done = services.resume_interrupt(paused.execution_id, step="approve", payload={})
    assert isinstance(done, Completed)

    events = parse(reader(client, f"/reactor/executions/{paused.execution_id}/stream/"))

    kinds = [name for name, _data, _id in events]
    assert kinds[-2:] == ["status", "end"]
    trace = [(data["kind"], data["step"]) for name, data, _id in events if name == "trace"]
    assert trace == [
        ("start", ""),
        ("run", "pack"),
        ("interrupt", "approve"),
        ("pause", ""),
        ("steer", ""),  # the delivery: who, via the API
        ("payload", "approve"),
        ("run", "ship"),
        ("complete", ""),
    ]
    ids = [int(event_id) for name, _data, event_id in events if name == "trace"]
    assert ids == sorted(ids)
    assert ("published", {"stage": "ship"}, None) in events
    assert events[-1] == ("end", {"status": "completed"}, None)


def test_a_stream_resumes_after_the_last_event_id(client: APIClient) -> None:
    paused = Packing.run({})
    services.resume_interrupt(paused.execution_id, step="approve", payload={})
    first = parse(reader(client, f"/reactor/executions/{paused.execution_id}/stream/"))
    third_id = [event_id for name, _d, event_id in first if name == "trace"][2]

    again = parse(
        reader(
            client,
            f"/reactor/executions/{paused.execution_id}/stream/",
            HTTP_LAST_EVENT_ID=third_id,
        )
    )

    trace = [int(event_id) for name, _d, event_id in again if name == "trace"]
    assert trace
    assert min(trace) > int(third_id)


def test_a_live_stream_follows_the_run_until_it_ends(client: APIClient, settings: Any) -> None:
    settings.REACTOR = {**settings.REACTOR, "STREAM_MAX_SECONDS": 60.0}
    GATE.entered.clear()
    GATE.release.clear()
    runner = threading.Thread(target=lambda: (HeldPacking.run({}), connections.close_all()))
    runner.start()
    try:
        assert GATE.entered.wait(timeout=30)
        run_id = Execution.objects.get(reactor=HeldPacking.definition.name).pk
        response = client.get(
            f"/reactor/executions/{run_id}/stream/", HTTP_ACCEPT="text/event-stream"
        )
        chunks = iter(response.streaming_content)
        seen = ""
        while '"step": "pack"' not in seen or "published" not in seen:
            seen += next(chunks).decode()  # the run is held in ``hold``: this is live
        assert "end" not in [name for name, _d, _i in parse(seen)]
        GATE.release.set()
        rest = b"".join(chunks).decode()
    finally:
        GATE.release.set()
        runner.join(timeout=30)
    events = parse(seen + rest)
    assert events[-1] == ("end", {"status": "completed"}, None)
    assert ("published", {"stage": "ship"}, None) in events


def test_a_stream_times_out_with_the_last_id_to_go_on_from(
    client: APIClient, settings: Any
) -> None:
    settings.REACTOR = {**settings.REACTOR, "STREAM_MAX_SECONDS": 0.2, "STREAM_POLL_SECONDS": 0.05}
    paused = Packing.run({})

    events = parse(reader(client, f"/reactor/executions/{paused.execution_id}/stream/"))

    assert events[-1][0] == "timeout"
    last = [int(i) for name, _d, i in events if name == "trace"][-1]
    assert events[-1][1] == {"last_event_id": last}


def test_a_stream_of_no_run_or_with_a_bad_last_id_is_refused(client: APIClient) -> None:
    paused = Packing.run({})
    missing = client.get(
        "/reactor/executions/00000000-0000-0000-0000-000000000000/stream/",
        HTTP_ACCEPT="text/event-stream",
    )
    assert missing.status_code == 404
    assert missing["Content-Type"] == "application/json"
    assert missing.json()["code"] == "not_found"
    bad = client.get(
        f"/reactor/executions/{paused.execution_id}/stream/",
        HTTP_LAST_EVENT_ID="seven",
        HTTP_ACCEPT="application/json",
    )
    assert bad.status_code == 400
    assert "sequence number" in bad.json()["detail"]
    anonymous = APIClient().get(f"/reactor/executions/{paused.execution_id}/stream/")
    assert anonymous.status_code in (401, 403)
