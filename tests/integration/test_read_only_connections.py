"""A connection whose server stopped taking writes (a primary fenced read-only for a switchover,
a standby reached without ``target_session_attrs``) is dropped and the write sent again on a
new one, as for a connection that broke: it answers ``SELECT 1``, so nothing else would drop it,
and every task of the worker would fail on it (``tests/workers/test_failover.py`` shows it on a
real switchover).

The test's own session is made to refuse writes with ``SET default_transaction_read_only``: a
new connection is a read-write one again, as the writable server would be.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

import pytest
from django.db import ProgrammingError, connection

from django_reactor import Reactor, Step, Success, services, step, store
from django_reactor.models import Execution
from django_reactor.states import ExecutionStatus
from tests.helpers import ledger

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def refuse_writes() -> None:
    """From now on this session's server refuses writes, as a primary fenced read-only does."""
    with connection.cursor() as cursor:
        cursor.execute("SET default_transaction_read_only = on")


def backend_pid() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return int(cursor.fetchone()[0])


def test_a_write_refused_as_read_only_is_sent_again_on_a_new_connection(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="django_reactor.store")
    refuse_writes()
    refused_on = backend_pid()
    sent_on: list[int] = []

    def write() -> int:
        sent_on.append(backend_pid())
        return Execution.objects.filter(pk=uuid.uuid4()).update(current_step="nowhere")

    assert store.reconnecting(write, what="writing") == 0
    assert sent_on[0] == refused_on
    assert len(sent_on) == 2
    assert sent_on[1] != refused_on
    assert (
        "the database server refused a write as read-only while writing (cannot execute UPDATE "
        "in a read-only transaction); reconnecting (attempt 2 of 3)"
    ) in caplog.text


def test_other_refusals_are_not_sent_again() -> None:
    sent: list[int] = []

    def refused() -> None:
        sent.append(backend_pid())
        with connection.cursor() as cursor:
            cursor.execute("SELECT * FROM no_table_of_that_name")

    with pytest.raises(ProgrammingError):
        store.reconnecting(refused, what="reading")
    assert len(sent) == 1


class FencesItsServer(Step):
    """The first run of ``one`` leaves its server refusing writes, before its checkpoint."""

    def run(self) -> Any:
        ledger("run", self.context.step)
        if self.context.step == "one" and ledger.calls.count(("run", "one")) == 1:
            refuse_writes()
        return Success(self.context.step)


class FencedMidRun(Reactor):
    one = step(FencesItsServer)
    two = step(FencesItsServer, wait_for=["one"])

    class Meta:
        background = "all"


def test_a_run_whose_checkpoint_was_refused_as_read_only_goes_on_on_a_new_connection(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="django_reactor")
    execution_id = FencedMidRun.run({}).execution_id
    outcome = services.resume(execution_id)
    assert outcome is not None
    assert outcome.status == ExecutionStatus.COMPLETED
    # The checkpoint of one was refused: one ran again, on the new connection; the run was
    # not parked, nor counted as recovered.
    assert ledger.calls == [("run", "one"), ("run", "one"), ("run", "two")]
    trace = [(e.kind, e.step) for e in services.find(execution_id).trace]
    assert [entry for entry in trace if entry[1]] == [("run", "one"), ("run", "two")]
    assert trace[-1] == ("complete", "")
    assert Execution.objects.get(pk=execution_id).recovery_attempts == 0
    assert (
        f"database connection lost while running execution {execution_id}; reconnecting"
        in caplog.text
    )
    assert "the engine failed" not in caplog.text
