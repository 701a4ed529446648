"""run(..., idempotency_key=...): at most one execution per key and reactor."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from django.db import connection

from django_reactor import Reactor, Step, step
from django_reactor.exceptions import IdempotencyKeyReused
from django_reactor.models import Execution
from django_reactor.states import ExecutionStatus
from tests.integration.reactors import FAIL_AT, Transfer, ledger

INPUTS = {"account": "acc-1", "amount": 25, "pin": "1234"}


@pytest.fixture(params=["in-a-transaction", "in-autocommit"])
def database(request: pytest.FixtureRequest) -> None:
    """The run is created inside the caller's transaction (a savepoint around its insert), or
    on its own in autocommit (one statement, which commits by itself)."""
    request.getfixturevalue("db" if request.param == "in-a-transaction" else "transactional_db")


@pytest.mark.usefixtures("database")
def test_a_repeat_replays_the_original_outcome_and_runs_nothing() -> None:
    first = Transfer.run(INPUTS, idempotency_key="order-1")
    ledger.clear()
    again = Transfer.run(dict(INPUTS), idempotency_key="order-1")
    assert again.idempotent_replay is True
    assert first.idempotent_replay is False
    assert again.execution_id == first.execution_id
    assert again.value == first.value == {"step": "credit", "amount": 25}
    assert ledger.calls == []
    assert Execution.objects.count() == 1


@pytest.mark.usefixtures("database")
def test_reusing_a_key_with_different_inputs_is_refused() -> None:
    first = Transfer.run(INPUTS, idempotency_key="order-1")
    ledger.clear()
    with pytest.raises(
        IdempotencyKeyReused, match=f"first used for execution {first.execution_id}"
    ):
        Transfer.run({**INPUTS, "amount": 999}, idempotency_key="order-1")
    assert ledger.calls == []
    assert Execution.objects.count() == 1


@pytest.mark.django_db
def test_a_failed_run_replays_its_failure() -> None:
    FAIL_AT.add("credit")
    first = Transfer.run(INPUTS, idempotency_key="k")
    FAIL_AT.clear()
    again = Transfer.run(INPUTS, idempotency_key="k")
    assert again.status == ExecutionStatus.FAILED
    assert again.error == first.error
    assert again.idempotent_replay


@pytest.mark.django_db
def test_keys_are_per_reactor() -> None:
    class Other(Reactor):
        @step
        def only() -> int:
            return 1

    a = Transfer.run(INPUTS, idempotency_key="shared")
    b = Other.run({}, idempotency_key="shared")
    assert a.execution_id != b.execution_id
    assert not b.idempotent_replay


@pytest.mark.django_db
def test_invalid_inputs_do_not_consume_the_key() -> None:
    bad = Transfer.run({**INPUTS, "amount": -1}, idempotency_key="k2")
    assert bad.status == ExecutionStatus.FAILED
    good = Transfer.run(INPUTS, idempotency_key="k2")
    assert good.ok
    assert not good.idempotent_replay


gate = threading.Event()
entered = threading.Event()
body_runs: list[int] = []


class Slow(Step):
    def run(self) -> str:
        body_runs.append(1)
        entered.set()
        assert gate.wait(timeout=20), "test gate never opened"
        return "charged once"


class Charge(Reactor):
    charge = step(Slow)

    class Meta:
        returns = "charge"


@pytest.mark.postgres
@pytest.mark.mariadb
@pytest.mark.django_db(transaction=True)
def test_eight_concurrent_callers_get_one_execution_and_the_same_outcome() -> None:
    assert connection.vendor in ("postgresql", "mysql")  # a server: callers side by side
    gate.clear()
    entered.clear()
    body_runs.clear()
    barrier = threading.Barrier(8, timeout=20)

    def call() -> Any:
        from django.db import connections

        try:
            barrier.wait()
            return Charge.run({}, idempotency_key="pay-42")
        finally:
            connections.close_all()

    with ThreadPoolExecutor(max_workers=8) as pool:
        futures = [pool.submit(call) for _ in range(8)]
        # One caller is inside the step body; the others find its key and wait on its outcome.
        assert entered.wait(timeout=20)
        gate.set()
        outcomes = [f.result(timeout=30) for f in futures]

    assert len(body_runs) == 1
    assert {o.execution_id for o in outcomes} == {outcomes[0].execution_id}
    assert all(o.ok and o.value == "charged once" for o in outcomes)
    assert sorted(o.idempotent_replay for o in outcomes) == [False] + [True] * 7
    assert Execution.objects.filter(idempotency_key="pay-42").count() == 1
