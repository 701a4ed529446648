"""Queues and priorities: where a run's tasks go and which waiting runs go first."""

from __future__ import annotations

import datetime as dt
import json
import re
import uuid
from io import StringIO
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import CommandError, call_command
from django.utils import timezone

from django_reactor import Reactor, Step, async_reactor, compose, services, step
from django_reactor.celery import router
from django_reactor.celery.priorities import _scale_for, broker_priority_scale
from django_reactor.engine.routing import DEFAULT_ROUTE, Route
from django_reactor.exceptions import DefinitionError, InvalidRoute
from django_reactor.models import Dispatch, Execution
from django_reactor.states import ExecutionStatus
from django_reactor.store import outbox
from django_reactor.store.outbox import QueuedDispatch
from tests.integration.reactors import Tracked

pytestmark = pytest.mark.django_db


class Plain(Reactor):
    only = step(Tracked)


class Payments(Reactor):
    only = step(Tracked)

    class Meta:
        queue = "payments"
        priority = 8


class PaymentsInBackground(Reactor):
    only = step(Tracked)

    class Meta:
        background = "all"
        queue = "payments"
        priority = 8


class Urgent(Reactor):
    """Declares a priority only: its queue is its caller's or its parent's."""

    only = step(Tracked)

    class Meta:
        priority = 9


class Parent(Reactor):
    plain = compose(Plain)
    urgent = compose(Urgent, wait_for=["plain"])
    payments = compose(Payments, wait_for=["urgent"])


class ParentOfUnit(Reactor):
    unit = async_reactor(Plain)


class Fails(Step):
    def run(self) -> Any:
        raise RuntimeError("declined")


class FailsOnce(Reactor):
    first = step(Tracked)
    charge = step(Fails, wait_for=["first"])


def route_of(execution_id: uuid.UUID) -> Route:
    row = Execution.objects.get(pk=execution_id)
    return Route(row.queue, row.priority)


# ---------------------------------------------------------------------------- choosing a route


def test_a_run_goes_to_the_default_queue_at_the_default_priority() -> None:
    handle = services.find(Plain.run({}).execution_id)
    assert (handle.queue, handle.priority) == ("", 5)


def test_a_reactor_declares_its_queue_and_priority_and_a_call_overrides_them() -> None:
    declared = Payments.run({})
    assert route_of(declared.execution_id) == Route("payments", 8)
    overridden = Payments.run({}, queue="payments-eu", priority=1)
    assert route_of(overridden.execution_id) == Route("payments-eu", 1)
    only_priority = services.run_in_background(Payments, {}, priority=0)
    assert route_of(only_priority.execution_id) == Route("payments", 0)
    started = services.start(Plain, {}, queue="bulk")
    assert route_of(started.execution_id) == Route("bulk", 5)
    handle = services.find(overridden.execution_id)
    assert (handle.queue, handle.priority) == ("payments-eu", 1)


@pytest.mark.parametrize(
    ("arguments", "says"),
    [
        ({"priority": 10}, "priority must be a whole number from 0 (lowest) to 9 (highest)"),
        ({"priority": -1}, "priority must be a whole number from 0"),
        ({"priority": True}, "priority must be a whole number from 0"),
        ({"priority": "9"}, "Got '9'"),
        ({"queue": ""}, "queue must be a Celery queue name"),
        ({"queue": " payments"}, "without surrounding spaces"),
        ({"queue": 7}, "queue must be a Celery queue name"),
        ({"queue": "q" * 256}, "is 256 characters long; a queue name has at most 255"),
    ],
)
def test_a_bad_queue_or_priority_is_refused_and_nothing_is_written(
    arguments: dict[str, Any], says: str
) -> None:
    for start in (Plain.run, lambda i, **kw: services.run_in_background(Plain, i, **kw)):
        with pytest.raises(InvalidRoute, match=re.escape(says)) as raised:
            start({}, **arguments)
        assert isinstance(raised.value, ValueError)
    assert Execution.objects.count() == 0
    assert Dispatch.objects.count() == 0


@pytest.mark.parametrize(
    ("meta", "says"),
    [
        ({"priority": 11}, "Bad.Meta.priority must be a whole number from 0"),
        ({"priority": 2.5}, "Bad.Meta.priority must be a whole number"),
        ({"queue": ""}, "Bad.Meta.queue must be a Celery queue name"),
        ({"queue": ["a"]}, "Bad.Meta.queue must be a Celery queue name"),
    ],
)
def test_a_bad_declaration_is_refused_at_class_definition(meta: dict[str, Any], says: str) -> None:
    with pytest.raises(DefinitionError, match=re.escape(says)) as raised:
        type("Bad", (Reactor,), {"only": step(Tracked), "Meta": type("Meta", (), meta)})
    assert isinstance(raised.value, ImproperlyConfigured)


def test_composed_children_go_where_their_parent_goes_unless_their_reactor_says() -> None:
    outcome = Parent.run({}, queue="orders", priority=3)
    assert outcome.ok
    children = {
        row.parent_step: Route(row.queue, row.priority)
        for row in Execution.objects.filter(parent_id=outcome.execution_id)
    }
    assert children == {
        "plain": Route("orders", 3),  # declares nothing: all its parent's
        "urgent": Route("orders", 9),  # its own priority, its parent's queue
        "payments": Route("payments", 8),  # its own queue and priority
    }


def test_an_async_unit_is_dispatched_on_its_parents_route() -> None:
    captured = Captured()
    previous = outbox.register_publisher(captured, after_commit=False)
    try:
        outcome = ParentOfUnit.run({}, queue="units", priority=7)
    finally:
        outbox.register_publisher(previous[0], after_commit=previous[1])
    unit = Execution.objects.get(parent_id=outcome.execution_id)
    assert Route(unit.queue, unit.priority) == Route("units", 7)
    assert (unit.id, Route("units", 7)) in captured.sent


def test_a_retry_and_a_fork_keep_the_route_of_the_run_they_re_run() -> None:
    failed = FailsOnce.run({}, queue="billing", priority=2)
    assert failed.status == ExecutionStatus.FAILED
    retried = services.retry(failed.execution_id)
    assert route_of(retried.execution_id) == Route("billing", 2)
    forked = services.fork(retried.execution_id, "charge")
    assert route_of(forked.execution_id) == Route("billing", 2)


# ---------------------------------------------------------------------------- the outbox


class Captured:
    """A publisher that keeps what it is handed, in order, with each dispatch's route."""

    def __init__(self) -> None:
        self.sent: list[tuple[uuid.UUID, Route | None]] = []

    def publish(self, dispatches: Any) -> list[int]:
        self.sent += [(d.execution_id, d.route) for d in dispatches]
        return [d.dispatch_id for d in dispatches]


def test_the_outbox_publishes_each_dispatch_with_its_runs_route_most_urgent_first() -> None:
    low = services.run_in_background(Plain, {}, priority=1).execution_id
    mid = services.run_in_background(Plain, {}).execution_id
    high = services.run_in_background(Payments, {}).execution_id
    also_low = services.run_in_background(Plain, {}, priority=1, queue="other").execution_id
    captured = Captured()
    previous = outbox.register_publisher(captured)
    try:
        # Without routes (the sweeper's republish, a woken parent): read in one query.
        dispatches = [
            QueuedDispatch(index, run)
            for index, run in enumerate([low, mid, high, also_low], start=1)
        ]
        sent = outbox.publish(dispatches)
    finally:
        outbox.register_publisher(previous[0], after_commit=previous[1])
    assert sorted(sent) == [1, 2, 3, 4]
    assert captured.sent == [
        (high, Route("payments", 8)),
        (mid, Route("", 5)),
        (low, Route("", 1)),  # within a priority, in the order given
        (also_low, Route("other", 1)),
    ]


def test_a_run_created_in_the_background_hands_its_route_to_the_publisher() -> None:
    captured = Captured()
    previous = outbox.register_publisher(captured, after_commit=False)
    try:
        outcome = PaymentsInBackground.run({})
    finally:
        outbox.register_publisher(previous[0], after_commit=previous[1])
    assert captured.sent == [(outcome.execution_id, Route("payments", 8))]


def test_the_sweeper_wakes_the_most_urgent_due_runs_first(settings: Any) -> None:
    settings.REACTOR = {**settings.REACTOR, "SWEEP_BATCH": 2}
    due = timezone.now() - dt.timedelta(seconds=1)
    order = [1, 9, 5, 9, 1]
    runs = []
    for index, priority in enumerate(order):
        run = services.run_in_background(Plain, {}, priority=priority).execution_id
        Execution.objects.filter(pk=run).update(
            wake_at=due - dt.timedelta(seconds=len(order) - index)
        )
        runs.append(run)
    Dispatch.objects.update(sent_at=timezone.now() - dt.timedelta(minutes=10))
    captured = Captured()
    previous = outbox.register_publisher(captured, after_commit=False)
    try:
        assert services.sweep().woken == 5
    finally:
        outbox.register_publisher(previous[0], after_commit=previous[1])
    woken = [run for run, _ in captured.sent]
    # Highest priority first; the most overdue first within a priority.
    assert woken == [runs[1], runs[3], runs[2], runs[0], runs[4]]
    assert [route.priority for _, route in captured.sent if route] == [9, 9, 5, 1, 1]


# ---------------------------------------------------------------------------- Celery


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("redis://127.0.0.1:6379/0", [9, 4, 0]),
        ("rediss://cache:6380/1", [9, 4, 0]),
        ("sentinel://a:26379;sentinel://b:26379", [9, 4, 0]),
        ("amqp://guest:guest@127.0.0.1:5672//", [0, 5, 9]),
        ("pyamqp://127.0.0.1//", [0, 5, 9]),
        ("memory://", [0, 5, 9]),
        ("", [0, 5, 9]),
    ],
)
def test_a_runs_priority_becomes_the_brokers_message_priority(
    url: str, expected: list[int]
) -> None:
    scale = _scale_for(url)
    assert [scale(p) for p in (0, 5, 9)] == expected


def test_the_scale_follows_the_celery_apps_broker() -> None:
    class App:
        class conf:
            broker_url = "redis://127.0.0.1:6379/3"

    assert broker_priority_scale(App())(9) == 0


def test_the_celery_publisher_sends_each_task_to_its_queue_with_its_priority(
    monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    settings.REACTOR = {**settings.REACTOR, "CELERY_QUEUE": "fallback"}
    sent: list[tuple[str, object, dict[str, object]]] = []

    def send(task: Any, argument: object, options: dict[str, object], what: str) -> bool:
        sent.append((task.name, argument, {k: v for k, v in options.items() if k != "headers"}))
        return True

    monkeypatch.setattr(router, "_send", send)
    monkeypatch.setattr(router, "broker_priority_scale", lambda app: lambda p: p)
    a, b, c, d = (uuid.uuid4() for _ in range(4))
    ids = router.CeleryPublisher().publish(
        [
            QueuedDispatch(1, a, route=Route("payments", 8)),
            QueuedDispatch(2, b, route=Route("payments", 8)),
            QueuedDispatch(3, c, route=DEFAULT_ROUTE),
            QueuedDispatch(4, d, 30.0, route=Route("later", 2)),
        ]
    )
    assert sorted(ids) == [1, 2, 3, 4]
    assert sent == [
        ("django_reactor.resume_many", [str(a), str(b)], {"priority": 8, "queue": "payments"}),
        ("django_reactor.resume_many", [str(c)], {"priority": 5, "queue": "fallback"}),
        (
            "django_reactor.resume",
            str(d),
            {"priority": 2, "queue": "later", "countdown": 30.0},
        ),
    ]


# ---------------------------------------------------------------------------- faces


def test_reactor_run_takes_a_queue_and_a_priority() -> None:
    out = StringIO()
    call_command(
        "reactor_run",
        "tests.integration.test_routes.Plain",
        "--background",
        "--queue",
        "reports",
        "--priority",
        "2",
        "--json",
        stdout=out,
    )
    run = uuid.UUID(json.loads(out.getvalue())["execution_id"])
    assert route_of(run) == Route("reports", 2)
    with pytest.raises(CommandError, match="priority must be a whole number from 0"):
        call_command("reactor_run", "tests.integration.test_routes.Plain", "--priority", "12")
    assert Execution.objects.count() == 1


def test_reactor_show_says_where_a_run_waits() -> None:
    run = Payments.run({}).execution_id
    out = StringIO()
    call_command("reactor_show", str(run), stdout=out)
    assert "queue: payments, priority 8" in out.getvalue()
    out = StringIO()
    call_command("reactor_show", str(run), "--json", stdout=out)
    shown = json.loads(out.getvalue())
    assert (shown["queue"], shown["priority"]) == ("payments", 8)
    plain = Plain.run({}).execution_id
    out = StringIO()
    call_command("reactor_show", str(plain), stdout=out)
    assert "queue:" not in out.getvalue()
