"""The demo command a new user runs first."""

from __future__ import annotations

import os
import subprocess
import sys
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.django_db
def test_demo_runs_every_scenario_and_prints_a_readable_summary() -> None:
    out = StringIO()
    call_command("reactor_demo", "--no-migrate", stdout=out, no_color=True)
    text = out.getvalue()
    assert "1. An order that completes" in text
    assert "completed; value:" in text
    assert "2. An order the carrier refuses: it fails and rolls back" in text
    assert "charge         undone" in text
    assert "(every completed step was undone)" in text
    assert "attempt failed (attempt 1): gateway timed out" in text
    assert "halted at load" in text
    assert "5. A refund that waits for a person's approval" in text
    assert "paused at 'approval', correlation id 'refund-" in text
    assert "a bad payload is refused, the run stays paused" in text
    assert "approval       payload" in text
    assert "6. Renewing every due subscription: a map" in text
    assert "acquired lock 'customer-ada@example.com' (fence " in text
    assert "map renewals: 2 elements, 2 succeeded, 0 failed" in text
    assert "Traceback" not in text
    assert "tok_visa_4242" not in text
    assert "[REDACTED]" in text


def test_the_readme_demo_works_on_a_fresh_sqlite_database(tmp_path: Path) -> None:
    """What a new user runs first: SQLite, no services, a database that does not exist yet."""
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "testproject.settings",
        "DATABASE_URL": f"sqlite:///{tmp_path / 'demo.sqlite3'}",
        "CELERY_BROKER_URL": "memory://",
    }
    result = subprocess.run(
        [sys.executable, "manage.py", "reactor_demo"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    assert "4. A renewal of a cancelled subscription" in result.stdout
    assert "approved: the run goes on from where it paused" in result.stdout
