"""reactor_ordered_lock: see and unblock the runs of an ordered lock."""

from __future__ import annotations

import json
import uuid
from io import StringIO
from typing import Any

import pytest
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings

from django_reactor.coordination import get_backend
from tests.commands.tables import read_table

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def database_backend() -> Any:
    reactor = {
        **settings.REACTOR,
        "COORDINATION_BACKEND": "django_reactor.coordination.backends.database.DatabaseBackend",
    }
    with override_settings(REACTOR=reactor):
        yield get_backend()


def ordered(*args: Any, **options: Any) -> str:
    out = StringIO()
    call_command("reactor_ordered_lock", *args, stdout=out, **options)
    return out.getvalue()


def test_it_lists_the_queue_head_first(database_backend: Any) -> None:
    first, second = str(uuid.uuid4()), str(uuid.uuid4())
    database_backend.enqueue_ordered("ordered:account-7", first)
    database_backend.enqueue_ordered("ordered:account-7", second)
    text = ordered("account-7", no_color=True)
    assert read_table([line[2:] for line in text.splitlines() if line.startswith("  ")]) == [
        {"POSITION": "head", "EXECUTION": first},
        {"POSITION": "1", "EXECUTION": second},
    ]
    data = json.loads(ordered("account-7", json=True))
    assert data == {
        "key": "account-7",
        "head": first,
        "queue": [first, second],
        "halted_after": None,
        "skipped": [],
    }


def test_skip_takes_a_stuck_head_out_and_reset_lifts_a_halt(database_backend: Any) -> None:
    first, second = str(uuid.uuid4()), str(uuid.uuid4())
    database_backend.enqueue_ordered("ordered:k", first)
    database_backend.enqueue_ordered("ordered:k", second)
    assert f"  head      {second}\n" in ordered("k", skip=first)
    database_backend.complete_ordered("ordered:k", second, True, True)
    assert "halted: ordered lock" in ordered("k")
    assert "reset: 0 run(s) removed" in ordered("k", reset=True)
    assert "no run queued" in ordered("k")


def test_skipping_a_run_that_is_not_queued_is_an_error() -> None:
    with pytest.raises(CommandError, match="is not queued on ordered lock 'k'"):
        ordered("k", skip=str(uuid.uuid4()))
    with pytest.raises(CommandError, match="Give an execution id"):
        ordered("k", skip="not-an-id")
