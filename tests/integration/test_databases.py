"""A fleet sharded by reactor: ``REACTOR["DATABASE"]`` routes reactors to other databases, and
every row of a run (steps, trace, interrupts, maps, dispatches) lives in its database; the
operations, the sweeper, the API, the admin and the commands find it there."""

from __future__ import annotations

import json
from io import StringIO
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client

import django_reactor
from django_reactor import Completed, Paused, services, store
from django_reactor.checks import check_settings
from django_reactor.exceptions import ExecutionNotFound
from django_reactor.models import Execution, ExecutionEvent, Interrupt, Message, StepRecord
from django_reactor.states import EventKind, ExecutionStatus
from tests.integration.routed_reactors import (
    ROUTING,
    HomeNap,
    RoutedMailbox,
    RoutedNap,
    RoutedOrder,
    StartsElsewhere,
    StaysHome,
)

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True, databases=["default", "shard"]),
]


@pytest.fixture(autouse=True)
def routed(settings: Any) -> None:
    settings.REACTOR = {**settings.REACTOR, "DATABASE": ROUTING}


def rows_in(alias: str, model: Any, **lookup: Any) -> list[Any]:
    return list(model.objects.using(alias).filter(**lookup))


def paused_order(order_id: str = "o-1") -> Paused:
    outcome = RoutedOrder.run({"order_id": order_id})
    assert isinstance(outcome, Paused), outcome
    return outcome


def test_the_setting_names_each_reactors_database() -> None:
    assert store.aliases() == ("default", "shard")
    assert store.alias_for("tests.RoutedOrder") == "shard"
    assert store.alias_for("tests.StaysHome") == "default"
    assert store.default_alias() == "default"


def test_every_row_of_a_routed_run_is_in_its_database() -> None:
    paused = paused_order()
    run_id = paused.execution_id
    assert rows_in("default", Execution, pk=run_id) == []
    assert [r.status for r in rows_in("shard", Execution, pk=run_id)] == [ExecutionStatus.PAUSED]
    assert [i.step for i in rows_in("shard", Interrupt, execution_id=run_id)] == ["approval"]

    outcome = services.resume_interrupt(run_id, step="approval", payload={"approved": True})

    assert isinstance(outcome, Completed)
    assert list(outcome.value) == [2, 4, 6]
    steps = {r.step: r.status for r in rows_in("shard", StepRecord, execution_id=run_id)}
    # The side-by-side steps ran in threads of their own and still wrote to the shard.
    assert set(steps) >= {"reserve", "audit", "notify", "approval", "lines", "ship"}
    assert set(steps.values()) == {"completed"}
    kinds = [e.kind for e in rows_in("shard", ExecutionEvent, execution_id=run_id)]
    assert kinds[0] == EventKind.START
    assert kinds[-1] == EventKind.COMPLETE
    assert EventKind.PAUSE in kinds
    assert EventKind.PAYLOAD in kinds
    for model in (StepRecord, ExecutionEvent, Interrupt):
        assert rows_in("default", model, execution_id=run_id) == []


def test_an_unrouted_reactor_stays_in_the_default_database() -> None:
    outcome = StaysHome.run({})
    assert isinstance(outcome, Completed)
    assert outcome.value == "home"
    assert len(rows_in("default", Execution, pk=outcome.execution_id)) == 1
    assert rows_in("shard", Execution, pk=outcome.execution_id) == []


def test_a_handle_reads_and_steers_its_run_in_its_database() -> None:
    run_id = paused_order().execution_id
    handle = services.find(run_id)
    assert handle.status == ExecutionStatus.PAUSED
    assert [s.name for s in handle.steps if s.name == "reserve"] == ["reserve"]
    assert [p.step for p in handle.interrupts] == ["approval"]
    assert handle.trace[0].kind == EventKind.START

    cancelled = handle.cancel(reason="customer changed their mind")

    assert cancelled.status == ExecutionStatus.CANCELLED
    assert rows_in("shard", Execution, pk=run_id)[0].status == ExecutionStatus.CANCELLED


def test_a_delivery_by_correlation_id_finds_the_run_in_its_database() -> None:
    run_id = paused_order("o-7").execution_id
    found = services.find_by_correlation_id("routed-o-7", reactor=RoutedOrder)
    assert found.id == run_id

    outcome = services.resume_interrupt(correlation_id="routed-o-7", payload={"approved": True})

    assert isinstance(outcome, Completed)
    assert outcome.execution_id == run_id


def test_an_unknown_run_is_not_found_in_any_database() -> None:
    with pytest.raises(ExecutionNotFound):
        services.find("00000000-0000-4000-8000-000000000000")


def test_the_sweeper_and_the_clock_wake_due_runs_in_every_database(reactor_clock: Any) -> None:
    routed = RoutedNap.run({})
    home = HomeNap.run({})
    assert rows_in("shard", Execution, pk=routed.execution_id)[0].wake_at is not None
    assert rows_in("default", Execution, pk=home.execution_id)[0].wake_at is not None

    woken = reactor_clock.advance(days=1, hours=1)

    results = {o.execution_id: o.value for o in woken if isinstance(o, Completed)}
    assert results == {routed.execution_id: "woke", home.execution_id: "woke at home"}
    assert rows_in("shard", Execution, pk=routed.execution_id)[0].status == "completed"
    assert rows_in("default", Execution, pk=home.execution_id)[0].status == "completed"


def test_a_sweep_queues_due_work_in_the_database_that_has_it(reactor_clock: Any) -> None:
    routed = RoutedNap.run({})
    reactor_clock.advance(days=2, run=False)

    report = services.sweep()

    assert report.woken == 1
    woken = rows_in("shard", Execution, pk=routed.execution_id)[0]
    assert woken.dispatches.using("shard").count() == 1
    assert store.due_now() == []  # nothing due in the default database


def test_the_check_reports_a_database_that_is_not_configured(settings: Any) -> None:
    settings.REACTOR = {**settings.REACTOR, "DATABASE": {"tests.RoutedOrder": "nowhere"}}
    messages = [m for m in check_settings() if m.id == "django_reactor.E013"]
    assert len(messages) == 1
    assert "'nowhere', which is not in DATABASES" in messages[0].msg
    assert "runs of 'tests.RoutedOrder'" in messages[0].msg

    settings.REACTOR = {**settings.REACTOR, "DATABASE": ["shard"]}
    (shape,) = [m for m in check_settings() if m.id == "django_reactor.E013"]
    assert "must be a database alias" in shape.msg


@pytest.fixture
def operator_client(client: Client) -> Client:
    client.force_login(User.objects.create_superuser("op", "op@example.com", "pw"))
    return client


def test_the_api_finds_a_routed_run_and_lists_each_database(operator_client: Client) -> None:
    run_id = str(paused_order("o-9").execution_id)
    home_id = str(StaysHome.run({}).execution_id)

    detail = operator_client.get(f"/reactor/executions/{run_id}/")
    assert detail.status_code == 200, detail.content
    assert detail.json()["status"] == "paused"

    def listed(query: str) -> set[str]:
        response = operator_client.get(f"/reactor/executions/{query}")
        assert response.status_code == 200, response.content
        return {row["id"] for row in response.json()["results"]}

    assert listed("") == {home_id}
    assert listed("?database=shard") == {run_id}
    assert listed("?reactor=tests.RoutedOrder") == {run_id}
    refused = operator_client.get("/reactor/executions/?database=nowhere")
    assert refused.status_code == 400
    assert "not a database runs are written to" in refused.json()["detail"]

    resumed = operator_client.post(
        f"/reactor/executions/{run_id}/resume/",
        data=json.dumps({"step": "approval", "payload": {"approved": True}}),
        content_type="application/json",
    )
    assert resumed.status_code == 200, resumed.content
    assert rows_in("shard", Execution, pk=run_id)[0].status == ExecutionStatus.COMPLETED


def test_the_admin_shows_each_database_and_a_runs_page_finds_it(
    operator_client: Client,
) -> None:
    run_id = str(paused_order("o-11").execution_id)
    home_id = str(StaysHome.run({}).execution_id)
    changelist = "/admin/django_reactor/execution/"

    home = operator_client.get(changelist)
    assert home.status_code == 200
    assert home_id in home.content.decode()
    assert run_id not in home.content.decode()
    assert "?database=shard" in home.content.decode()  # the filter offers the other database

    shard = operator_client.get(changelist + "?database=shard")
    assert shard.status_code == 200
    assert run_id in shard.content.decode()
    assert home_id not in shard.content.decode()

    page = operator_client.get(f"{changelist}{run_id}/change/")
    assert page.status_code == 200
    assert "approval" in page.content.decode()

    wrong = operator_client.get(changelist + "?database=nowhere")
    assert wrong.status_code == 302
    assert "e=1" in wrong["Location"]


def test_the_commands_find_routed_runs_and_take_a_database() -> None:
    run_id = str(paused_order("o-13").execution_id)

    shown = StringIO()
    call_command("reactor_show", run_id, stdout=shown, no_color=True)
    assert "paused" in shown.getvalue()

    listed = StringIO()
    call_command("reactor_list", "--database", "shard", stdout=listed, no_color=True)
    assert run_id[:8] in listed.getvalue()
    home = StringIO()
    call_command("reactor_list", stdout=home, no_color=True)
    assert run_id[:8] not in home.getvalue()

    with pytest.raises(CommandError, match="--database 'nowhere' is not a database"):
        call_command("reactor_list", "--database", "nowhere")


def test_pruning_covers_every_database() -> None:
    routed = RoutedNap.run({})
    services.cancel(routed.execution_id)
    home = StaysHome.run({})

    assert services.prune(0, dry_run=True) == 2
    assert services.prune(0) == 2

    assert rows_in("shard", Execution, pk=routed.execution_id) == []
    assert rows_in("default", Execution, pk=home.execution_id) == []


def test_messages_to_a_routed_run_are_kept_and_taken_in_its_database(
    operator_client: Client,
) -> None:
    early = RoutedMailbox.run({})
    assert isinstance(early, Paused)
    run_id = early.execution_id

    sent = django_reactor.send(run_id, "payment", {"amount": 5})

    assert isinstance(sent, Completed)
    assert sent.value == {"amount": 5}
    assert [m.status for m in rows_in("shard", Message, execution_id=run_id)] == ["consumed"]
    assert rows_in("default", Message, execution_id=run_id) == []

    second = str(RoutedMailbox.run({}).execution_id)
    response = operator_client.post(
        f"/reactor/executions/{second}/messages/payment/",
        data=json.dumps({"amount": 7}),
        content_type="application/json",
    )
    assert response.status_code == 200, response.content
    assert rows_in("shard", Execution, pk=second)[0].status == ExecutionStatus.COMPLETED


def test_a_step_that_starts_another_reactors_run_starts_it_in_that_reactors_database() -> None:
    outcome = StartsElsewhere.run({})

    assert isinstance(outcome, Completed)
    started = outcome.value
    assert rows_in("shard", Execution, pk=started) == []
    assert [r.reactor for r in rows_in("default", Execution, pk=started)] == ["tests.StaysHome"]
    assert len(rows_in("shard", Execution, pk=outcome.execution_id)) == 1
