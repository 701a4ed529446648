"""The one place that builds executors (``runtime.executors``): each process gets the policy,
journal and child runner of its place, the same way every time."""

from __future__ import annotations

import pytest

from django_reactor import store
from django_reactor.engine.state import RunState
from django_reactor.models import Execution
from django_reactor.runtime import executors
from django_reactor.states import ExecutionStatus
from tests.integration.reactors import Transfer

pytestmark = pytest.mark.django_db


def stored_run(**fields: object) -> Execution:
    return Execution.objects.create(
        reactor=Transfer.definition.name,
        definition_hash=Transfer.definition.definition_hash,
        status=ExecutionStatus.RUNNING,
        inputs={"account": "a", "amount": 1, "pin": "0000"},
        **fields,
    )


def test_the_caller_hands_off_and_waits_in_the_process() -> None:
    run = stored_run()
    executor = executors.for_caller(
        Transfer.definition, store.Owned(run.id, 1), {"account": "a"}, deadline=None
    )
    policy = executor.policy
    assert policy.hand_off
    assert not policy.retry_later
    assert not policy.attached
    assert policy.max_retry_delay is not None  # REACTOR["MAX_INLINE_RETRY_DELAY"]
    assert executor.journal.recorded == set()  # a new run: its steps are plain inserts


def test_a_worker_parks_instead_of_waiting_and_hands_the_run_back_when_interrupted() -> None:
    run = stored_run()
    state = RunState(recorded={"debit"})
    executor = executors.for_worker(Transfer.definition, store.Owned(run.id, 1), run, state)
    policy = executor.policy
    assert policy.retry_later
    assert policy.hand_back_on_interruption
    assert not policy.hand_off
    assert policy.max_retry_delay is None
    assert executor.journal.recorded == {"debit"}
    assert executor.inputs == {"account": "a", "amount": 1, "pin": "0000"}


@pytest.mark.parametrize("in_worker", [True, False])
def test_a_composed_child_waits_as_the_process_of_its_parent_does(in_worker: bool) -> None:
    parent = stored_run()
    child = stored_run(parent=parent, root=parent, parent_step="checkout")
    executor = executors.for_child(
        Transfer.definition,
        store.Owned(child.id, 1),
        child.inputs,
        RunState(),
        parent_id=parent.id,
        root_id=parent.id,
        in_worker=in_worker,
        deadline=None,
    )
    policy = executor.policy
    assert policy.attached
    assert policy.retry_later is in_worker
    # On a worker its backoffs park it with its parent, whole (it used to be capped as inline).
    assert (policy.max_retry_delay is None) is in_worker


def test_an_undone_async_unit_wakes_the_parent_that_may_wait_for_it() -> None:
    parent = stored_run()
    unit = stored_run(parent=parent, root=parent, parent_step="quote", detached=True)
    operation = executors.for_operation(
        Transfer.definition, store.Owned(unit.id, 1), unit, RunState()
    )
    assert operation.journal.wakes == parent.id
    assert operation.policy.deadline is None
    root = executors.for_operation(
        Transfer.definition, store.Owned(parent.id, 1), parent, RunState()
    )
    assert root.journal.wakes is None
