"""A process killed in the middle of a step: the run is taken over and rolled back correctly."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection

from django_reactor import services
from django_reactor.models import Execution
from django_reactor.states import ExecutionStatus
from testproject.example.models import Payment, Product

ROOT = Path(__file__).resolve().parents[2]

CHILD = """
import django
django.setup()
from tests.integration.crash_reactors import CrashSaga
CrashSaga.run({})
"""


def wait_until(condition, timeout: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    """Wait for a condition observed in the database, bounded in time."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.05)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_sigkill_mid_step_then_undo_compensates_the_step_in_flight() -> None:
    Product.objects.create(sku="CRASH", name="Crash", price=1, stock=5)
    db = settings.DATABASES["default"]
    test_database = connection.settings_dict["NAME"]
    url = f"postgres://{db['USER']}@{db['HOST']}:{db['PORT'] or 5432}/{test_database}"
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "testproject.settings",
        "DATABASE_URL": url,
        "PYTHONPATH": str(ROOT),
    }
    child = subprocess.Popen([sys.executable, "-c", CHILD], env=env, cwd=ROOT)
    try:
        wait_until(lambda: Payment.objects.filter(reference="pay_crash").exists())
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=10)
    finally:
        if child.poll() is None:
            child.kill()

    run = Execution.objects.get(reactor="tests.integration.crash_reactors.CrashSaga")
    assert run.status == ExecutionStatus.RUNNING
    assert run.current_step == "charge"  # the cursor names the step in flight
    assert Product.objects.get(sku="CRASH").stock == 4
    # The process is gone; once its lease runs out, an operator may take the run over.
    Execution.objects.filter(pk=run.pk).update(lease_expires_at="2000-01-01T00:00Z")

    handle = services.undo(run.id)
    # Interrupted, not failed by its own step: an operator's undo ends it cancelled.
    assert handle.status == ExecutionStatus.CANCELLED
    assert [(e.kind, e.step) for e in handle.trace if e.step] == [
        ("run", "take"),
        ("fail", "charge"),
        ("compensate", "charge"),
        ("undo", "take"),
    ]
    assert handle.step("charge").error.kind == "interrupted"
    assert Payment.objects.get(reference="pay_crash").status == Payment.Status.REFUNDED
    assert Product.objects.get(sku="CRASH").stock == 5
