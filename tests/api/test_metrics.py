"""GET /reactor/metrics/: the fleet's figures in Prometheus's format, the same as
``services.fleet_health()``'s, closed until ``REACTOR["METRICS_AUTH"]`` opens them, 501 without
``prometheus_client``, and capped queries whatever the number of runs."""

from __future__ import annotations

import datetime as dt
import sys
from typing import Any

import prometheus_client
import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from django_reactor import Reactor, services, sleep, step
from django_reactor.checks import check_metrics
from django_reactor.models import Execution
from django_reactor.services.health import beat_worker
from django_reactor.states import ExecutionStatus
from django_reactor.store import overview as store_overview
from tests.api.conftest import make_user
from tests.shapes import keep_shape

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

URL = "/reactor/metrics/"
TOKEN = "a-metrics-token-for-the-tests-0123456789"


class Nightly(Reactor):
    """One step, then a long sleep."""

    @step()
    def first() -> str:
        return "done"

    nap = sleep(dt.timedelta(hours=1), after=["first"])


def opened(settings: Any, *modes: str) -> None:
    settings.REACTOR = {**settings.REACTOR, "METRICS_AUTH": list(modes), "METRICS_TOKENS": [TOKEN]}


def scrape(client: Client | None = None, **headers: str) -> Any:
    return (client or Client()).get(URL, headers=headers)


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Each sample of an exposition by its name and labels."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def run_row(status: str, *, took: float | None = None) -> Execution:
    keep_shape(Nightly.definition)
    fields: dict[str, Any] = {}
    if took is not None:
        fields["finished_at"] = timezone.now() - dt.timedelta(minutes=1)
        fields["started_at"] = fields["finished_at"] - dt.timedelta(seconds=took)
    return Execution.objects.create(
        reactor=Nightly.definition.name,
        definition_hash=Nightly.definition.definition_hash,
        status=status,
        inputs={},
        **fields,
    )


def test_closed_until_the_setting_opens_them() -> None:
    answer = scrape()
    assert answer.status_code == 403
    assert answer.json()["code"] == "metrics_closed"
    assert "REACTOR['METRICS_AUTH'] accepts no credential" in answer.json()["detail"]


def test_a_bearer_token_is_asked_for_and_checked(settings: Any) -> None:
    opened(settings, "token")
    missing = scrape()
    assert missing.status_code == 401
    assert missing["WWW-Authenticate"] == 'Bearer realm="django_reactor metrics"'
    assert missing.json()["code"] == "not_authenticated"
    wrong = scrape(Authorization=f"Bearer {TOKEN}x")
    assert (wrong.status_code, wrong.json()["code"]) == (401, "bad_token")
    assert wrong["WWW-Authenticate"].startswith("Bearer ")
    # A signed-in user is not a token.
    client = Client()
    client.force_login(make_user("viewer", "view_execution"))
    assert scrape(client).status_code == 401

    answer = scrape(Authorization=f"Bearer {TOKEN}")
    assert answer.status_code == 200
    assert answer["Content-Type"].startswith("text/plain; version=0.0.4")
    assert answer["Cache-Control"] == "no-store"
    assert "# TYPE django_reactor_workers_alive gauge" in answer.content.decode()


def test_a_user_needs_the_view_permission(settings: Any) -> None:
    opened(settings, "user")
    assert scrape().status_code == 401
    client = Client()
    client.force_login(make_user("nobody"))
    refused = scrape(client)
    assert (refused.status_code, refused.json()["code"]) == (403, "permission_denied")
    assert "django_reactor.view_execution" in refused.json()["detail"]
    # Tokens are not accepted unless METRICS_AUTH says so.
    assert scrape(Authorization=f"Bearer {TOKEN}").status_code == 401
    client.force_login(make_user("viewer", "view_execution"))
    assert scrape(client).status_code == 200


def test_open_metrics_answer_anyone_and_only_get(settings: Any) -> None:
    opened(settings, "open")
    assert scrape().status_code == 200
    assert Client().head(URL).status_code == 200
    posted = Client().post(URL)
    assert (posted.status_code, posted["Allow"]) == (405, "GET, HEAD")
    # Prometheus asking for OpenMetrics gets it.
    answer = scrape(Accept="application/openmetrics-text; version=1.0.0")
    assert answer["Content-Type"].startswith("application/openmetrics-text")
    assert answer.content.decode().endswith("# EOF\n")


def test_a_wrong_setting_keeps_them_closed(settings: Any) -> None:
    settings.REACTOR = {**settings.REACTOR, "METRICS_AUTH": ["token"], "METRICS_TOKENS": ["short"]}
    answer = scrape(Authorization="Bearer short")
    assert (answer.status_code, answer.json()["code"]) == (403, "metrics_closed")
    assert "django_reactor.E016" in answer.json()["detail"]


def test_the_figures_are_fleet_healths(settings: Any) -> None:
    opened(settings, "open")
    beat_worker(
        name="w1@host", queues=["q"], concurrency=2, tasks_done=3, started_at=timezone.now()
    )
    services.sweep()
    for took in (1.0, 2.0, 10.0):
        run_row(ExecutionStatus.COMPLETED, took=took)
    run_row(ExecutionStatus.FAILED, took=0.5)
    run_row(ExecutionStatus.NEEDS_ATTENTION, took=0.5)
    run_row(ExecutionStatus.RUNNING)
    run_row(ExecutionStatus.PENDING)
    run_row(ExecutionStatus.PAUSED)

    got = samples(scrape().content.decode())
    report = services.fleet_health()

    def one(name: str, **labels: str) -> float:
        return got[(f"django_reactor_{name}", tuple(sorted(labels.items())))]

    assert report.healthy
    assert one("healthy") == 1
    assert one("workers_alive") == report.workers_alive == 1
    assert one("workers_seen") == len(report.workers) == 1
    assert one("sweeper_healthy") == 1
    assert report.sweeper is not None
    assert 0 <= one("sweeper_seconds_since_last_sweep") <= report.sweeper.age
    assert one("sweeper_last_sweep_duration_seconds") == report.sweeper.last_sweep_seconds
    assert one("overdue_wake_ups", database="default") == report.overdue.value == 0
    assert one("dispatches_not_taken", database="default") == report.not_taken.value == 0
    assert one("reactor_figures_complete", database="default") == 1
    [window] = report.reactors
    reactor = {"database": "default", "reactor": Nightly.definition.name}
    assert one("runs_started_last_hour", **reactor) == window.started == 8
    assert one("runs_completed_last_hour", **reactor) == window.completed == 3
    assert one("runs_failed_last_hour", **reactor) == window.failed == 2
    assert one("runs_in_flight", **reactor) == window.in_flight == 3
    assert one("run_duration_last_hour_seconds", quantile="0.5", **reactor) == window.p50
    assert one("run_duration_last_hour_seconds", quantile="0.95", **reactor) == window.p95
    by_status = {
        status: one("runs", database="default", status=status)
        for status in ("pending", "scheduled", "running", "paused", "rolling_back")
    }
    assert by_status == {"pending": 1, "scheduled": 0, "running": 1, "paused": 1, "rolling_back": 0}
    assert one("runs", database="default", status="needs_attention") == 1
    assert one("runs_lease_expired", database="default") == 0
    assert one("scrape_duration_seconds") >= 0


def test_a_stopped_fleet_shows_in_the_figures(settings: Any) -> None:
    opened(settings, "open")
    got = samples(scrape().content.decode())
    assert got[("django_reactor_healthy", ())] == 0
    assert got[("django_reactor_workers_alive", ())] == 0
    assert got[("django_reactor_sweeper_healthy", ())] == 0
    # Never swept: no age to give (an alert on sweeper_healthy catches it).
    assert not any(name == "django_reactor_sweeper_seconds_since_last_sweep" for name, _ in got)


def test_the_global_registry_is_left_alone(settings: Any) -> None:
    opened(settings, "open")
    before = prometheus_client.generate_latest(prometheus_client.REGISTRY)
    assert scrape().status_code == 200
    after = prometheus_client.generate_latest(prometheus_client.REGISTRY)
    assert b"django_reactor_" not in after
    assert len(after.splitlines()) == len(before.splitlines())


def test_without_prometheus_client_the_url_says_what_to_install(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # import fails
    assert check_metrics() == []  # closed metrics need nothing
    opened(settings, "token")
    refused = scrape()
    assert refused.status_code == 401  # credentials first: nothing said to strangers
    answer = scrape(Authorization=f"Bearer {TOKEN}")
    assert (answer.status_code, answer.json()["code"]) == (501, "metrics_unavailable")
    assert "pip install 'django-reactor[metrics]'" in answer.json()["detail"]
    [warning] = check_metrics()
    assert warning.id == "django_reactor.W006"
    assert "every scrape answers 501" in warning.msg


def test_the_check_is_quiet_when_the_package_is_there_or_the_url_is_not_routed(
    settings: Any,
) -> None:
    opened(settings, "open")
    assert check_metrics() == []  # installed
    settings.ROOT_URLCONF = "tests.api.urls_without_metrics"
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(sys.modules, "prometheus_client", None)
        assert check_metrics() == []


def test_a_scrape_costs_the_same_at_any_number_of_runs(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened(settings, "open")
    scrape()  # warm caches (content types, the definition's shape)
    for status in (ExecutionStatus.PENDING, ExecutionStatus.RUNNING):
        run_row(status)
    with CaptureQueriesContext(connection) as few:
        scrape()
    monkeypatch.setattr(store_overview, "COUNT_CAP", 5)
    many = [
        Execution(
            reactor=Nightly.definition.name,
            definition_hash=Nightly.definition.definition_hash,
            status=ExecutionStatus.PENDING,
            inputs={},
        )
        for _ in range(40)
    ]
    Execution.objects.bulk_create(many)
    with CaptureQueriesContext(connection) as lots:
        got = samples(scrape().content.decode())
    assert len(lots.captured_queries) == len(few.captured_queries)
    # Every read of the runs stops at a cap.
    reads = [q["sql"] for q in lots.captured_queries if '"django_reactor_execution"' in q["sql"]]
    assert reads
    assert all("LIMIT" in sql for sql in reads), [s for s in reads if "LIMIT" not in s]
    assert got[("django_reactor_runs", (("database", "default"), ("status", "pending")))] == 5


@pytest.mark.django_db(transaction=True, databases=["default", "shard"])
def test_a_sharded_fleet_has_its_figures_per_database(settings: Any) -> None:
    from tests.integration.routed_reactors import ROUTING, HomeNap, RoutedNap

    settings.REACTOR = {
        **settings.REACTOR,
        "DATABASE": ROUTING,
        "METRICS_AUTH": ["open"],
    }
    home = HomeNap.run({}).execution_id
    away = RoutedNap.run({}).execution_id
    assert Execution.objects.using("default").filter(pk=home).exists()
    # The shard's sleep ended an hour ago and no sweeper released it.
    Execution.objects.using("shard").filter(pk=away).update(
        wake_at=timezone.now() - dt.timedelta(hours=1)
    )
    got = samples(scrape().content.decode())
    assert got[("django_reactor_overdue_wake_ups", (("database", "default"),))] == 0
    assert got[("django_reactor_overdue_wake_ups", (("database", "shard"),))] == 1
    in_flight = {
        labels: value for (name, labels), value in got.items() if name.endswith("runs_in_flight")
    }
    assert in_flight == {
        (("database", "default"), ("reactor", "tests.HomeNap")): 1,
        (("database", "shard"), ("reactor", "tests.RoutedNap")): 1,
    }
    # The processes are the fleet's: one sample, unlabelled.
    assert [labels for name, labels in got if name == "django_reactor_workers_alive"] == [()]
