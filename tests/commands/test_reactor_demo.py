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
    assert "Stock after the rollback: MUG=8, TEE=4 (unchanged by order ord_" in text
    assert "3. The first order sent again with its idempotency key: nothing runs twice" in text
    assert "(the first run, replayed)" in text
    assert "Stock still: MUG=8, TEE=4; payments at the gateway: 2 before, 2 after" in text
    assert "attempt failed (attempt 1): gateway timed out" in text
    assert "halted at load" in text
    assert "6. A refund that waits for a person's approval" in text
    assert "paused at 'approval', correlation id 'refund-ord_" in text
    assert "a bad payload is refused, the run stays paused" in text
    assert "approval       payload" in text
    assert "7. Renewing every due subscription: a map" in text
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
    assert "5. A renewal of a cancelled subscription" in result.stdout
    assert "approved: the run goes on from where it paused" in result.stdout


def bare_project(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m django ARGS`` in a project of its own (``tests/bare_settings.py``):
    django_reactor installed, nothing else (no example app, no Redis, no Celery broker)."""
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.bare_settings",
        "REACTOR_DEMO_DATABASE": str(tmp_path / "project.sqlite3"),
        "PYTHONPATH": str(ROOT),
    }
    env.pop("CELERY_BROKER_URL", None)
    return subprocess.run(
        [sys.executable, "-m", "django", *args],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_the_demo_runs_in_a_project_without_the_example_app(tmp_path: Path) -> None:
    """Migrated, then the demo twice on the same database."""
    migrated = bare_project(tmp_path, "migrate", "--verbosity", "0")
    assert migrated.returncode == 0, migrated.stderr
    for _ in range(2):
        result = bare_project(tmp_path, "reactor_demo", "--no-migrate", "--no-color")
        assert result.returncode == 0, result.stderr
        assert "Traceback" not in result.stdout + result.stderr
        for number in range(1, 8):
            assert f"\n{number}. " in result.stdout
        assert "(the first run, replayed)" in result.stdout
        assert "approved: the run goes on from where it paused" in result.stdout
        assert "map renewals: 2 elements, 2 succeeded, 0 failed" in result.stdout
        assert "failed: step 'ship' failed (ShippingUnavailable)" in result.stdout
        assert result.stdout.count("completed; value:") == 5  # 1, 3, 4, 6 and 7


# Loads the command's module as Django does before running it, then lists the reactors.
LIST_REACTORS = (
    "from django.core.management import get_commands, load_command_class; "
    "load_command_class(get_commands()['reactor_demo'], 'reactor_demo'); "
    "from django_reactor.registry import all_reactors; print(sorted(all_reactors()))"
)


def test_the_demo_reactors_are_registered_only_when_the_demo_runs(tmp_path: Path) -> None:
    listed = bare_project(tmp_path, "shell", "-c", LIST_REACTORS)
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.strip().splitlines()[-1] == "[]"
