"""Business attributes in the database: written with the run and with the checkpoint of the step
that set them, found with ``store.with_attributes``, newest first off their index."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_reactor import Completed, Failed, services, store
from django_reactor.exceptions import InvalidAttribute
from django_reactor.models import Execution, ExecutionAttribute
from django_reactor.states import ExecutionStatus
from tests.helpers import FAIL_AT
from tests.integration.attribute_reactors import Child, Order, Parent, Plain

pytestmark = pytest.mark.django_db(transaction=True)


def attributes_of(execution_id: Any) -> dict[str, str]:
    return dict(
        ExecutionAttribute.objects.filter(execution_id=execution_id).values_list("key", "value")
    )


def test_a_run_is_created_with_its_declared_attributes_and_its_steps_add_theirs() -> None:
    outcome = Order.run({"customer_id": 42, "tenant": "acme", "priority": True})

    assert isinstance(outcome, Completed)
    handle = services.find(outcome.execution_id)
    assert handle.attributes == {
        "channel": "web",
        "customer_id": "42",
        "priority": "true",
        "tenant": "acme",
        "payment_id": "pay-1",
        "stage": "shipped",
    }
    # The second step removed what the first set ("attempt").
    assert "attempt" not in handle.attributes
    created = Execution.objects.get(pk=outcome.execution_id).created_at
    rows = ExecutionAttribute.objects.filter(execution_id=outcome.execution_id)
    assert {row.run_created_at for row in rows} == {created}


def test_an_input_left_out_sets_no_attribute() -> None:
    outcome = Order.run({"customer_id": 7})

    assert set(services.find(outcome.execution_id).attributes) == {
        "channel",
        "customer_id",
        "priority",
        "payment_id",
        "stage",
    }


def test_a_failed_attempt_sets_nothing() -> None:
    FAIL_AT.add("charge")  # its first attempt sets "attempt" then fails
    outcome = Order.run({"customer_id": 1})
    assert isinstance(outcome, Completed)
    assert services.find(outcome.execution_id).attributes["payment_id"] == "pay-2"

    FAIL_AT.add("ship")  # sets "stage" then fails: the run fails and rolls back
    failed = Order.run({"customer_id": 2})
    assert isinstance(failed, Failed)
    kept = attributes_of(failed.execution_id)
    assert "stage" not in kept
    assert kept["attempt"] == "2"  # charge's second attempt succeeded; its checkpoint stands


def test_runs_whose_inputs_were_invalid_keep_the_attributes_that_resolve() -> None:
    outcome = Order.run({"customer_id": "not a number", "tenant": "acme", "card": "4242"})

    assert isinstance(outcome, Failed)
    assert Execution.objects.get(pk=outcome.execution_id).status == ExecutionStatus.FAILED
    assert attributes_of(outcome.execution_id) == {
        "customer_id": "not a number",
        "tenant": "acme",
        "channel": "web",
    }


def test_an_attribute_value_no_attribute_can_hold_refuses_the_run_and_writes_nothing() -> None:
    before = Execution.objects.count()
    with pytest.raises(InvalidAttribute, match=r"Order\.Meta\.attributes\['tenant'\]: an "
                       r"attribute value is at most 255 characters, got 300"):  # fmt: skip
        Order.run({"customer_id": 1, "tenant": "t" * 300})
    assert Execution.objects.count() == before
    assert not ExecutionAttribute.objects.exists()


def test_a_composed_childs_attributes_are_its_own() -> None:
    outcome = Parent.run({"customer_id": 9})

    assert isinstance(outcome, Completed)
    child = Execution.objects.get(parent_id=outcome.execution_id)
    assert attributes_of(outcome.execution_id) == {"customer_id": "9"}
    assert attributes_of(child.pk) == {"child_of": "9", "attempt": "1", "payment_id": "pay-1"}
    assert child.reactor == Child.definition.name


def test_a_run_in_the_background_gets_its_attributes_on_the_worker() -> None:
    outcome = services.run_in_background(Order, {"customer_id": 5})
    assert attributes_of(outcome.execution_id) == {
        "customer_id": "5",
        "priority": "false",
        "channel": "web",
    }

    services.resume(outcome.execution_id)  # as the worker that takes its task would

    assert services.find(outcome.execution_id).status == ExecutionStatus.COMPLETED
    assert attributes_of(outcome.execution_id)["payment_id"] == "pay-1"


def test_a_retry_gets_the_attributes_of_its_inputs_again() -> None:
    FAIL_AT.add("ship")
    failed = Order.run({"customer_id": 3})
    FAIL_AT.clear()

    again = services.retry(failed.execution_id)

    assert isinstance(again, Completed)
    assert attributes_of(again.execution_id)["customer_id"] == "3"
    assert attributes_of(again.execution_id)["stage"] == "shipped"


@pytest.mark.postgres
def test_a_reactor_without_attributes_sends_no_statement_about_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from django_reactor.store import sql

    sent: list[str] = []
    original = sql.execute

    def execute(statement: str, params: Any, connection: Any = None) -> Any:
        sent.append(statement)
        return original(statement, params, connection)

    monkeypatch.setattr(sql, "execute", execute)
    with CaptureQueriesContext(connection) as queries:
        outcome = Plain.run({})
    assert isinstance(outcome, Completed)
    statements = [*sent, *(q["sql"] for q in queries.captured_queries)]
    assert len(sent) >= 3, "the run's insert and its checkpoints, in one statement each"
    assert not [s for s in statements if "executionattribute" in s]
    # Nor does it return the run's creation time, which only attributes need.
    assert not [s for s in sent if "RETURNING id, created_at" in s or "reason, created_at" in s]
    assert attributes_of(outcome.execution_id) == {}


# ---------------------------------------------------------------------------- finding runs


def made(count: int, **inputs: Any) -> list[Any]:
    return [Order.run({"customer_id": 1, **inputs}).execution_id for _ in range(count)]


def found(attributes: dict[str, object], runs: Any = None) -> list[Any]:
    runs = Execution.objects.all() if runs is None else runs
    return list(store.with_attributes(runs, attributes).values_list("pk", flat=True))


def test_runs_are_found_by_attributes_newest_first() -> None:
    acme = made(3, tenant="acme")
    other = made(2, tenant="other", priority=True)

    assert found({"tenant": "acme"}) == acme[::-1]
    assert found({"tenant": "other"}) == other[::-1]
    # A whole number and its text find the same runs; so do a boolean and its text.
    assert found({"customer_id": 1}) == found({"customer_id": "1"}) == [*acme, *other][::-1]
    assert found({"priority": True}) == found({"priority": "true"}) == other[::-1]
    # Several attributes: runs with all of them.
    assert found({"tenant": "other", "priority": False}) == []
    assert found({"channel": "web", "tenant": "acme", "priority": False}) == acme[::-1]
    assert found({"tenant": "nobody"}) == []
    # With the other filters of a list, and narrowed twice.
    assert found({"tenant": "acme"}, Execution.objects.filter(pk__in=acme[:2])) == acme[1::-1]
    twice = store.with_attributes(
        store.with_attributes(Execution.objects.all(), {"tenant": "other"}), {"priority": True}
    )
    assert list(twice.values_list("pk", flat=True)) == other[::-1]
    assert found({}) == list(Execution.objects.order_by("-created_at").values_list("pk", flat=True))


def test_the_ordering_of_a_narrowed_list_pages_by_keyset() -> None:
    from django.db.models.fields.tuple_lookups import Tuple, TupleLessThan

    acme = made(5, tenant="acme")
    runs = store.with_attributes(Execution.objects.all(), {"tenant": "acme"})
    assert store.attributes.newest_first(runs) == ["-attribute_created_at", "-attribute_run_id"]
    assert store.attributes.newest_first(Execution.objects.all()) == ["-created_at", "-id"]
    first = list(runs[:2])
    last = first[-1]
    position = [getattr(last, store.attributes.CREATED_AT), getattr(last, store.attributes.RUN_ID)]
    assert position == [last.created_at, last.pk]
    columns = Tuple(store.attributes.CREATED_AT, store.attributes.RUN_ID)
    rest = runs.filter(TupleLessThan(columns, position))
    assert [r.pk for r in [*first, *rest]] == acme[::-1]


@pytest.mark.parametrize(
    ("attributes", "message"),
    [
        ({"bad key": 1}, r"a filter by attributes: an attribute key is a letter"),
        ({"customer_id": 1.5}, r"attribute 'customer_id': an attribute is a string"),
        ({"customer_id": None}, r"attribute 'customer_id' has no value to look for"),
    ],
)
def test_a_bad_filter_is_refused_saying_why(attributes: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidAttribute, match=message):
        store.with_attributes(Execution.objects.all(), attributes)


@pytest.mark.postgres
def test_a_page_of_runs_with_an_attribute_is_read_off_its_index() -> None:
    made(3, tenant="acme")
    runs = store.with_attributes(Execution.objects.all(), {"tenant": "acme"})
    with connection.cursor() as cursor:
        cursor.execute("SET enable_seqscan = off")  # a table this small is read whole otherwise
        try:
            plan = runs[:51].explain()
        finally:
            cursor.execute("RESET enable_seqscan")
    assert "reactor_attribute_find_idx" in plan
    assert "Sort" not in plan, plan


def test_attributes_go_with_their_run_when_it_is_deleted() -> None:
    outcome = Order.run({"customer_id": 4})
    Execution.objects.filter(pk=outcome.execution_id).delete()
    assert not ExecutionAttribute.objects.filter(execution_id=outcome.execution_id).exists()


def test_prune_deletes_the_attributes_of_the_runs_it_deletes() -> None:
    old = Order.run({"customer_id": 11}).execution_id
    kept = Order.run({"customer_id": 12}).execution_id
    Execution.objects.filter(pk=old).update(
        finished_at=Execution.objects.get(pk=old).finished_at - dt.timedelta(days=60)
    )

    assert services.prune(30) == 1

    assert not ExecutionAttribute.objects.filter(execution_id=old).exists()
    assert attributes_of(kept)["customer_id"] == "12"


def test_an_event_starts_runs_with_their_attributes_and_reports_one_that_cannot_be() -> None:
    import django_reactor
    from tests.integration.attribute_reactors import StartedByEvent

    emitted = django_reactor.emit("attr.order", {"customer": "c-7"}, event_id="e-1")
    (started,) = emitted.started
    assert attributes_of(started) == {"customer": "c-7"}

    refused = django_reactor.emit("attr.order", {"customer": "c" * 300}, event_id="e-2")
    assert refused.started == ()
    assert [e for e in refused.errors if "at most 255 characters" in e]
    assert Execution.objects.filter(reactor=StartedByEvent.definition.name).count() == 1
