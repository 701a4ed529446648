"""Bad option values on the real command line: argparse's usage error, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.workers.harness import ROOT


def manage(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "testproject.settings"}
    env.pop("DATABASE_URL", None)  # parsing the options needs no database
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["reactor_sweep", "--loop", "--interval", "0"], "above 0"),
        (["reactor_sweep", "--loop", "--interval", "nan"], "above 0"),
        (["reactor_sweep", "--loop", "--interval", "inf"], "above 0"),
        (["reactor_sweep", "--loop", "--interval", "-1"], "above 0"),
        (["reactor_sweep", "--interval", "soon"], "not a number of seconds"),
        (["reactor_prune", "--older-than", "-5"], "0 or more"),
        (["reactor_prune", "--older-than", "3", "--batch-size", "0"], "1 or more"),
        (["reactor_list", "--days", "x"], "not a whole number"),
    ],
)
def test_a_bad_option_value_is_a_usage_error(args: list[str], message: str) -> None:
    result = manage(*args)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert "usage:" in result.stderr
    assert message in result.stderr


@pytest.mark.parametrize(
    ("args", "status", "message"),
    [
        (
            ["reactor_sweep", "--loop", "--interval", "1e15"],
            2,
            "--interval: the interval is 1e+15 s (about 31,688,088 years), longer than a date "
            "can hold",
        ),
        (
            ["reactor_prune", "--older-than", "99999999"],
            1,
            "cannot prune: older_than_days=99999999 is 8.64e+12 s (about 273,785 years) before ",
        ),
        (
            ["reactor_list", "--days", "99999999"],
            1,
            "--days 99999999 is 8.64e+12 s (about 273,785 years) before ",
        ),
        (
            ["reactor_list", "--since", "9999-12-31T23:59:59-05:00"],
            1,
            "--since is 9999-12-31T23:59:59-05:00, later than a date can hold",
        ),
    ],
)
def test_a_time_no_date_can_hold_is_refused_without_a_traceback(
    args: list[str], status: int, message: str
) -> None:
    """Refused before anything is read or written (the sweep loop never starts)."""
    result = manage(*args)
    assert result.returncode == status, result.stderr
    assert "Traceback" not in result.stderr
    assert message in result.stderr
    assert result.stdout == ""
