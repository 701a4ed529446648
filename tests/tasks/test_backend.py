"""``ReactorBackend`` in this process: what the tasks framework asks of a backend (validation,
enqueue, results, statuses, errors, ``run_after``, priority, ``on_commit``), each run taken
the way a worker takes it (``services.resume``). The same on real workers:
``tests/workers/test_tasks.py``."""

from __future__ import annotations

import dataclasses
import datetime as dt
import subprocess
import sys
from importlib.util import find_spec
from io import StringIO
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.db import transaction
from django.test import override_settings
from django.urls import reverse
from django.utils import timezone

from django_reactor import Retry, services, store
from django_reactor.exceptions import IdempotencyKeyReused
from django_reactor.models import Dispatch, Execution
from django_reactor.states import ExecutionStatus
from django_reactor.store import outbox
from django_reactor.tasks import ReactorBackend, compat
from django_reactor.tasks.backend import route_for
from django_reactor.tasks.compat import (
    InvalidTaskError,
    TaskResultDoesNotExist,
    TaskResultStatus,
    task,
    task_backends,
    task_enqueued,
    task_finished,
    task_started,
)
from django_reactor.tasks.runs import is_task_reactor, policy_name, policy_of, reactor_for
from tests.integration.reactors import Transfer
from tests.tasks import functions

pytestmark = pytest.mark.django_db


def work(result_id: str) -> None:
    """Take the run as a worker would, until it stops moving (retries come due at once)."""
    for _ in range(10):
        services.resume(result_id)
        if not store.wake_now(result_id):
            return


def test_the_backend_is_the_configured_one_and_says_what_it_supports() -> None:
    backend = task_backends["default"]
    assert isinstance(backend, ReactorBackend)
    assert backend.supports_defer
    assert backend.supports_async_task
    assert backend.supports_get_result
    assert backend.supports_priority
    assert isinstance(functions.add, ReactorBackend.task_class)


def test_an_enqueued_task_is_ready_then_successful_with_its_return_value() -> None:
    seen: list[Any] = []

    def enqueued(sender: Any, task_result: Any, **kwargs: Any) -> None:
        seen.append(task_result.id)

    task_enqueued.connect(enqueued)
    try:
        result = functions.add.enqueue(2, b=3)
    finally:
        task_enqueued.disconnect(enqueued)
    assert seen == [result.id]
    assert result.status == TaskResultStatus.READY
    assert (result.args, result.kwargs) == ([2], {"b": 3})
    assert result.enqueued_at is not None
    assert result.started_at is None
    assert not result.is_finished
    with pytest.raises(ValueError, match="not finished"):
        result.return_value  # noqa: B018
    handle = services.find(result.id)
    assert handle.reactor == "django_reactor.tasks.runs.TaskRun"
    assert handle.status == ExecutionStatus.PENDING
    assert handle.inputs == {"task": "tests.tasks.functions.add", "args": [2], "kwargs": {"b": 3}}

    work(result.id)
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 5
    assert result.errors == []
    assert result.attempts == 1
    assert result.started_at
    assert result.finished_at
    assert result.last_attempted_at
    again = functions.add.get_result(result.id)
    assert (again.status, again.return_value) == (TaskResultStatus.SUCCESSFUL, 5)


def test_a_failing_task_is_failed_with_its_exception_class_and_traceback() -> None:
    result = functions.explode.enqueue("boom")
    work(result.id)
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    with pytest.raises(ValueError, match="failed"):
        result.return_value  # noqa: B018
    [error] = result.errors
    assert error.exception_class is ValueError
    assert "raise ValueError(message)" in error.traceback
    assert "boom" in error.traceback
    assert result.attempts == 1


def test_a_task_retries_under_its_policy_and_sees_its_attempt() -> None:
    result = functions.fails_twice.enqueue({"n": 1})
    assert services.find(result.id).reactor == (
        "django_reactor.tasks.runs.TaskRun_a3_fixed_d0_m300000_j0"
    )
    work(result.id)
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == {"value": {"n": 1}, "attempt": 3}
    assert result.attempts == 3
    assert [e.exception_class for e in result.errors] == [RuntimeError, RuntimeError]


def test_an_async_task_runs_in_an_event_loop() -> None:
    result = functions.add_async.enqueue(4, 5)
    work(result.id)
    assert functions.add_async.get_result(result.id).return_value == 9


def test_run_after_stores_a_scheduled_run_started_at_its_time() -> None:
    later = timezone.now() + dt.timedelta(hours=1)
    result = functions.add.using(run_after=later).enqueue(1, 1)
    assert result.status == TaskResultStatus.READY
    handle = services.find(result.id)
    assert handle.status == ExecutionStatus.SCHEDULED
    services.resume(result.id)  # not due: nothing runs
    assert functions.add.get_result(result.id).status == TaskResultStatus.READY
    # Time passes (the test's transaction reads one clock: its start).
    Execution.objects.filter(pk=result.id).update(wake_at=timezone.now() - dt.timedelta(minutes=1))
    work(result.id)
    assert functions.add.get_result(result.id).return_value == 2


def test_an_idempotency_key_enqueues_once() -> None:
    first = functions.add.with_idempotency_key("sum-1").enqueue(1, 2)
    again = functions.add.with_idempotency_key("sum-1").enqueue(1, 2)
    assert again.id == first.id
    with pytest.raises(IdempotencyKeyReused, match="different inputs"):
        functions.add.with_idempotency_key("sum-1").enqueue(2, 2)


def test_enqueue_in_a_transaction_publishes_when_it_commits(
    django_capture_on_commit_callbacks: Any,
) -> None:
    published: list[Any] = []

    class Capture:
        def publish(self, dispatches: Any) -> list[int]:
            published.extend(d.execution_id for d in dispatches)
            return []

    previous = outbox.register_publisher(Capture())
    try:
        with django_capture_on_commit_callbacks(execute=False) as callbacks:
            result = functions.add.enqueue(1, 2)
        assert published == []  # written with the transaction, not sent
        assert Dispatch.objects.filter(execution_id=result.id, sent_at=None).exists()
        for callback in callbacks:  # the commit
            callback()
    finally:
        outbox.register_publisher(previous[0], after_commit=previous[1])
    assert [str(p) for p in published] == [result.id]


def test_a_rolled_back_enqueue_leaves_nothing() -> None:
    ids: list[str] = []

    def view() -> None:
        with transaction.atomic():
            ids.append(functions.add.enqueue(1, 2).id)
            raise RuntimeError("the view failed")

    with pytest.raises(RuntimeError):
        view()
    [result_id] = ids
    with pytest.raises(TaskResultDoesNotExist):
        functions.add.get_result(result_id)


def test_arguments_that_are_not_json_are_refused_and_nothing_is_written() -> None:
    before = Dispatch.objects.count()
    with pytest.raises(TypeError, match=r"args of task tests\.tasks\.functions\.add must be JSON"):
        functions.add.enqueue(timezone.now(), 1)
    with pytest.raises(TypeError, match="kwargs of task"):
        functions.add.enqueue(1, b=float("nan"))
    assert Dispatch.objects.count() == before


def test_results_of_other_runs_and_unknown_ids_do_not_exist() -> None:
    backend = task_backends["default"]
    for missing in ("not-a-uuid", "6b0c6f5e-8d5b-4a3f-9c57-3e2a9d1f0a11"):
        with pytest.raises(TaskResultDoesNotExist):
            backend.get_result(missing)
    outcome = Transfer.run({"account": "acc-1", "amount": 1, "pin": "1"})
    with pytest.raises(TaskResultDoesNotExist):
        backend.get_result(str(outcome.execution_id))


def test_the_framework_validation_applies() -> None:
    with pytest.raises(InvalidTaskError, match="Queue 'nowhere' is not valid"):
        functions.add.using(queue_name="nowhere")
    with pytest.raises(InvalidTaskError, match="priority"):
        functions.add.using(priority=101)
    with pytest.raises(InvalidTaskError, match="aware"):
        functions.add.using(run_after=dt.datetime(2030, 1, 1))
    with pytest.raises(InvalidTaskError, match="module level"):

        @task()
        def inner() -> None: ...

    with pytest.raises(InvalidTaskError, match=r"on=\.\.\..*retryable = False"):
        dataclasses.replace(functions.add, retry=Retry(attempts=2, on=KeyError))


@override_settings(
    TASKS={"default": {"BACKEND": "django_reactor.tasks.ReactorBackend", "OPTIONS": {"RETRY": 3}}}
)
def test_a_retry_option_that_is_no_policy_is_refused() -> None:
    with pytest.raises(ImproperlyConfigured, match=r'OPTIONS"\]\["RETRY"\] must be a Retry'):
        task_backends["default"]


@override_settings(
    TASKS={
        "default": {
            "BACKEND": "django_reactor.tasks.ReactorBackend",
            "OPTIONS": {"RETRY": {"attempts": 2, "delay": 0}},
        }
    }
)
def test_the_backend_retry_option_is_the_default_policy() -> None:
    result = functions.explode.enqueue("again")
    work(result.id)
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.attempts == 2


def test_policies_are_named_and_read_back_from_their_names() -> None:
    for retry in (
        Retry(attempts=1),
        Retry(attempts=5, backoff="exponential", delay=1.5, max_delay=None, jitter=0.2),
        Retry(attempts=2, backoff="linear", delay=0.25, max_delay=10),
    ):
        expected = retry if retry.attempts > 1 else policy_of("TaskRun")
        assert policy_of(policy_name(retry)) == expected
        assert is_task_reactor(reactor_for(retry).definition.name)
    assert not is_task_reactor("django_reactor.tasks.runs.Elsewhere")
    assert policy_of("TaskRun_nonsense") is None


@pytest.mark.parametrize(
    ("priority", "ours"),
    [(-100, 0), (-60, 2), (-50, 3), (-1, 5), (0, 5), (1, 5), (13, 6), (50, 7), (100, 9)],
)
def test_route_for_maps_queue_and_priority(priority: int, ours: int) -> None:
    task_ = functions.add.using(queue_name="emails")
    task_ = task_.using(priority=priority)
    assert route_for(task_) == ("emails", ours)
    assert route_for(functions.add)[0] is None


def test_a_tasks_queue_and_priority_are_its_runs() -> None:
    result = functions.add.using(queue_name="emails", priority=100).enqueue(1, 2)
    run = services.find(result.id)
    assert (run.queue, run.priority) == ("emails", 9)
    plain = functions.add.enqueue(1, 2)
    run = services.find(plain.id)
    assert (run.queue, run.priority) == ("", 5)


def test_the_framework_signals_are_sent_for_each_attempt_and_the_last_one() -> None:
    heard: list[tuple[str, str, int]] = []

    def started(sender: Any, task_result: Any, **kwargs: Any) -> None:
        heard.append(("started", task_result.status, task_result.attempts))

    def finished(sender: Any, task_result: Any, **kwargs: Any) -> None:
        assert sender is ReactorBackend
        heard.append(("finished", task_result.status, task_result.attempts))

    task_started.connect(started)
    task_finished.connect(finished)
    try:
        work(functions.fails_twice.enqueue(1).id)
        work(functions.explode.enqueue("no").id)
    finally:
        task_started.disconnect(started)
        task_finished.disconnect(finished)
    assert heard == [
        ("started", TaskResultStatus.RUNNING, 1),
        ("started", TaskResultStatus.RUNNING, 2),
        ("started", TaskResultStatus.RUNNING, 3),
        ("finished", TaskResultStatus.SUCCESSFUL, 3),
        ("started", TaskResultStatus.RUNNING, 1),
        ("finished", TaskResultStatus.FAILED, 1),
    ]


def test_the_framework_comes_from_django_tasks_where_django_has_none() -> None:
    expected = "django.tasks" if find_spec("django.tasks") is not None else "django_tasks"
    assert compat.FRAMEWORK == expected
    assert compat.Task.__module__ == f"{expected}.base"


@pytest.mark.skipif(find_spec("django.tasks") is None, reason="Django 6's django.tasks")
def test_on_django_6_the_builtin_framework_is_used() -> None:
    import django.tasks  # type: ignore[import-not-found,unused-ignore]

    assert compat.task_backends is django.tasks.task_backends


def test_the_package_imports_without_the_framework_and_says_what_to_install() -> None:
    """Celery's autodiscover_tasks() imports ``django_reactor.tasks`` in every worker."""
    code = (
        "import sys; sys.modules['django_tasks'] = None\n"
        "import django_reactor.tasks\n"
        "try:\n"
        "    import django_reactor.tasks.compat\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    found = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    if find_spec("django.tasks") is None:
        assert "pip install 'django-reactor[tasks]'" in found.stdout


def test_a_task_is_a_run_in_the_admin_and_the_commands(admin_client: Any) -> None:
    result = functions.explode.enqueue("shown")
    work(result.id)
    page = admin_client.get(reverse("admin:django_reactor_execution_change", args=[result.id]))
    assert page.status_code == 200
    text = page.content.decode()
    assert "TaskRun" in text
    assert "tests.tasks.functions.explode" in text
    listed = StringIO()
    call_command("reactor_list", "--reactor", "django_reactor.tasks.runs.TaskRun", stdout=listed)
    assert str(result.id)[:8] in listed.getvalue()
    shown = StringIO()
    call_command("reactor_show", str(result.id), stdout=shown)
    assert "shown" in shown.getvalue()
    # Steered like any run: retried as a new run, whose result the framework reads too.
    call_command("reactor_retry", str(result.id), "--reason", "after the fix", stdout=StringIO())
    [retry] = Execution.objects.filter(retry_of_id=result.id).values_list("id", flat=True)
    assert functions.explode.get_result(str(retry)).status == TaskResultStatus.READY


def test_aenqueue_and_aget_result_work_from_async_code() -> None:
    result = async_to_sync(functions.add.aenqueue)(6, 7)
    work(result.id)
    found = async_to_sync(functions.add.aget_result)(result.id)
    assert (found.status, found.return_value) == (TaskResultStatus.SUCCESSFUL, 13)
