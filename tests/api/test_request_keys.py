"""Idempotency-Key reservations live as long as their request: a repeat of a request that
runs longer than ``LEASE_SECONDS`` gets 409 ``in_flight`` (``ExecutionBusy`` in Python), never
takes the reservation over; only a reservation nobody keeps (its process died) is taken over.

The first request runs in a thread and is held inside its step by ``GATE`` (events, so the
test knows where it is); the only wait is for the clock to pass the reservation's first lease,
which is what a long request does.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connections
from django.utils import timezone
from rest_framework.test import APIClient

from django_reactor import Completed, Paused, services, store
from django_reactor.conf import reactor_settings
from django_reactor.exceptions import ExecutionBusy
from django_reactor.models import ApiRequest, Execution
from django_reactor.store import Heartbeat, Kept
from tests.api.conftest import client_for, make_user, resume_body
from tests.api.reactors import GATE, ApiHeldRefund

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]

LEASE = 0.6  # seconds; the keeper extends every LEASE / 3


THREADS: list[threading.Thread] = []


class _ConnectionCloser(Kept):
    """A keeper that closes the heartbeat thread's database connections, then leaves.

    With a short lease the heartbeat beats during the test and opens a connection of its own;
    left open, it keeps the test database from being dropped at the end of the session.
    """

    label = "the test's connection closer"

    def __init__(self) -> None:
        super().__init__(interval=0.0)
        self.done = threading.Event()

    def extend(self) -> bool:
        connections.close_all()  # runs in the heartbeat thread: its own connections
        self.done.set()
        return False


@pytest.fixture
def short_lease(settings: Any) -> Iterator[None]:
    settings.REACTOR = {**settings.REACTOR, "LEASE_SECONDS": LEASE}
    GATE.reset()
    yield
    GATE.release.set()  # never leave a held step waiting, even when the test failed
    while THREADS:
        THREADS.pop().join(timeout=20)
    closer = _ConnectionCloser()
    Heartbeat.current().add(closer)
    assert closer.done.wait(timeout=10)


def held_run() -> uuid.UUID:
    outcome = ApiHeldRefund.run({})
    assert isinstance(outcome, Paused), outcome
    assert outcome.execution_id is not None
    return outcome.execution_id


def in_thread(call: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    """Start ``call`` in a thread; the list gets its result (or the exception it raised)."""
    result: list[Any] = []

    def target() -> None:
        try:
            result.append(call())
        except BaseException as exc:
            result.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=target)
    THREADS.append(thread)
    thread.start()
    return thread, result


def outlive_the_first_lease(row: ApiRequest) -> None:
    """Let the clock pass the lease the reservation was made with (and then some)."""
    deadline = row.created_at + dt.timedelta(seconds=LEASE * 1.5)
    remaining = (deadline - timezone.now()).total_seconds()
    if remaining > 0:
        time.sleep(remaining)  # time has to pass; the threads are synchronised by GATE


def finish(thread: threading.Thread, result: list[Any]) -> Any:
    GATE.release.set()
    thread.join(timeout=20)
    assert not thread.is_alive(), "the first request hung"
    (answer,) = result
    if isinstance(answer, BaseException):
        raise answer
    return answer


@pytest.mark.usefixtures("short_lease")
def test_a_repeat_while_a_long_resume_runs_is_409_in_flight_and_the_first_answer_stays() -> None:
    execution_id = held_run()
    user = make_user("slow-operator", "resume_interrupt")
    path = f"/reactor/executions/{execution_id}/resume/"
    raw = resume_body({"approved": True})

    def send() -> Any:
        client: APIClient = client_for(User.objects.get(pk=user.pk))
        return client.post(
            path, raw, content_type="application/json", headers={"Idempotency-Key": "slow"}
        )

    thread, first = in_thread(send)
    assert GATE.entered.wait(timeout=10), "the first request never reached its step"
    reserved = ApiRequest.objects.get(key="slow")
    assert reserved.status_code == 0
    outlive_the_first_lease(reserved)

    repeat = send()
    assert repeat.status_code == 409, repeat.content
    assert repeat.json()["code"] == "in_flight"
    assert repeat.headers["Retry-After"] == "1"
    kept = ApiRequest.objects.get(key="slow")
    assert kept.pk == reserved.pk  # the same reservation, extended, not taken over
    assert kept.created_at > reserved.created_at

    answer = finish(thread, first)
    assert answer.status_code == 200, answer.content
    assert answer.json()["status"] == "completed"
    assert Execution.objects.get(pk=execution_id).status == "completed"
    later = send()
    assert later.status_code == 200
    assert later.headers["Idempotent-Replayed"] == "true"
    assert later.json() == answer.json()


@pytest.mark.usefixtures("short_lease")
def test_a_python_delivery_repeated_while_the_first_runs_is_busy_not_a_takeover() -> None:
    execution_id = held_run()

    def deliver() -> Any:
        return services.resume_interrupt(
            execution_id, step="approval", payload={"approved": True}, idempotency_key="slow-py"
        )

    thread, first = in_thread(deliver)
    assert GATE.entered.wait(timeout=10), "the first delivery never reached its step"
    reserved = ApiRequest.objects.get(key="slow-py")
    outlive_the_first_lease(reserved)

    with pytest.raises(ExecutionBusy, match="still being processed"):
        deliver()
    assert ApiRequest.objects.get(key="slow-py").pk == reserved.pk

    outcome = finish(thread, first)
    assert isinstance(outcome, Completed), outcome
    again = deliver()
    assert again.idempotent_replay
    assert again.status == "completed"


@pytest.mark.usefixtures("short_lease")
def test_a_reservation_nobody_keeps_is_still_taken_over_after_the_lease() -> None:
    dead = store.request_keys.reserve("user:1", "crashed", "fp")  # its process died: no keeper
    assert dead.state == "new"
    assert store.request_keys.reserve("user:1", "crashed", "fp").state == "in_flight"
    outlive_the_first_lease(ApiRequest.objects.get(pk=dead.row_id))
    taken = store.request_keys.reserve("user:1", "crashed", "fp")
    assert taken.state == "new"
    assert taken.row_id != dead.row_id


def test_a_keeper_extends_its_reservation_until_the_request_is_answered() -> None:
    reservation = store.request_keys.reserve("user:1", "kept", "fp")
    assert reservation.row_id is not None
    old = timezone.now() - dt.timedelta(hours=1)
    ApiRequest.objects.filter(pk=reservation.row_id).update(created_at=old)
    keeper = store.request_keys.ReservationKeeper(reservation.row_id)
    assert keeper.extend() is True
    assert ApiRequest.objects.get(pk=reservation.row_id).created_at > old
    store.request_keys.finish(reservation.row_id, 200, {"ok": True})
    assert keeper.extend() is False  # answered: nothing left to keep
    assert ApiRequest.objects.get(pk=reservation.row_id).response == {"ok": True}
    store.request_keys.release(reservation.row_id)
    assert keeper.extend() is False


def test_kept_registers_the_keeper_with_the_heartbeat_only_while_the_request_runs() -> None:
    reservation = store.request_keys.reserve("user:1", "beat", "fp")
    assert reservation.row_id is not None
    heartbeat = Heartbeat.current()
    with store.request_keys.kept(reservation.row_id) as keeper:
        assert keeper in heartbeat.keepers
        assert keeper.interval == pytest.approx(float(reactor_settings.LEASE_SECONDS) / 3)
    assert keeper not in heartbeat.keepers
    with pytest.raises(RuntimeError), store.request_keys.kept(reservation.row_id) as failing:
        raise RuntimeError("the request failed")
    assert failing not in heartbeat.keepers


def test_an_answer_that_cannot_be_remembered_still_reaches_the_caller(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from django.db import DatabaseError

    from django_reactor.store import request_keys

    def unreachable(operation: Any, *, what: str) -> Any:
        raise DatabaseError(f"{what}: the server is gone")

    monkeypatch.setattr(request_keys, "reconnecting", unreachable)

    request_keys.finish(12345, 202, {"execution_id": "x"})  # the work is done: no error

    assert "could not remember the answer of request 12345" in caplog.text
