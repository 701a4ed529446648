"""Tables and colours through rich: coloured on a terminal, plain text when piped or with
--no-color (no ANSI codes, no line drawing), the same columns either way."""

from __future__ import annotations

import datetime as dt
import os
import pty
import re
import shlex
import subprocess
import sys
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.color import color_style
from django.db import connection
from django.utils import timezone

from django_reactor.management.commands.reactor_list import Command as ListCommand
from django_reactor.management.terminal import colours, table_lines
from django_reactor.models import Execution
from django_reactor.states import ExecutionStatus
from tests.commands.tables import read_table

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parents[2]
ANSI = re.compile(r"\x1b\[[0-9;]*m")
BOX_DRAWING = re.compile("[\u2500-\u257f]")


def some_runs() -> list[Execution]:
    now = timezone.now()
    return Execution.objects.bulk_create(
        Execution(
            reactor="tests.integration.reactors.Transfer",
            status=status,
            definition_hash="x",
            current_step="credit",
            started_at=now - dt.timedelta(milliseconds=221),
            finished_at=now,
        )
        for status in (ExecutionStatus.COMPLETED, ExecutionStatus.FAILED, ExecutionStatus.PAUSED)
    )


def output(name: str, *args: Any, **options: Any) -> str:
    out = StringIO()
    call_command(name, *args, stdout=out, **options)
    return out.getvalue()


def test_a_command_writing_to_something_else_than_a_terminal_writes_no_colours() -> None:
    command = ListCommand(stdout=StringIO())
    command.style = color_style(force_color=True)  # as Django sets it up on a terminal
    assert not colours(command)  # ...but the command's own output is a buffer
    lines = table_lines(command, ["A", "B"], [["x", "failed"]])
    assert lines == ["A  B", "x  failed"]
    assert colours(ListCommand(stdout=StringIO(), force_color=True))


def test_plain_and_coloured_tables_have_the_same_text() -> None:
    (run, *_) = some_runs()
    for name, args in (("reactor_list", ()), ("reactor_show", (str(run.pk),))):
        plain = output(name, *args, no_color=True)
        coloured = output(name, *args, force_color=True)
        assert not ANSI.search(plain)
        assert not BOX_DRAWING.search(plain)
        assert ANSI.search(coloured)
        assert not BOX_DRAWING.search(coloured)
        assert ANSI.sub("", coloured) == plain, name


def test_a_long_table_is_never_wrapped_when_plain() -> None:
    long_name = "tests.reactors." + "VeryLong" * 30
    Execution.objects.create(reactor=long_name, status="completed", definition_hash="x")
    lines = output("reactor_list", no_color=True).splitlines()
    assert len(lines) == 2
    assert read_table(lines)[0]["REACTOR"] == long_name.rsplit(".", 1)[-1]


@pytest.mark.postgres
def test_colours_on_a_terminal_plain_through_a_pipe_or_with_no_color() -> None:
    """The real command in its own process: on a pseudo-terminal, through a pipe (grep), and
    on a terminal with --no-color."""
    some_runs()
    db = connection.settings_dict
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "testproject.settings",
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT'] or 5432}/{db['NAME']}",
        "COLUMNS": "200",
        "TERM": "xterm",
    }
    env.pop("NO_COLOR", None)
    env.pop("DJANGO_COLORS", None)
    command = [sys.executable, "manage.py", "reactor_list", "--skip-checks"]

    def on_a_terminal(*extra: str) -> str:
        leader, follower = pty.openpty()
        try:
            process = subprocess.Popen(
                [*command, *extra], cwd=ROOT, env=env, stdout=follower, stderr=follower
            )
            os.close(follower)
            chunks = []
            while True:
                try:
                    chunk = os.read(leader, 65536)
                except OSError:  # the terminal closed: the command exited
                    break
                if not chunk:
                    break
                chunks.append(chunk)
            assert process.wait(timeout=60) == 0, b"".join(chunks)
        finally:
            os.close(leader)
        return b"".join(chunks).decode().replace("\r\n", "\n")

    coloured = on_a_terminal()
    assert "\x1b[1;31mfailed" in coloured  # failures red
    assert "\x1b[1;36mpaused" in coloured  # waiting runs bold cyan, never red
    piped = subprocess.run(
        [*command], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=True
    ).stdout
    assert not ANSI.search(piped)
    assert ANSI.sub("", coloured) == piped
    assert on_a_terminal("--no-color") == piped
    rows = read_table(piped.splitlines())
    assert sorted(row["STATUS"] for row in rows) == ["completed", "failed", "paused"]
    assert {row["DURATION"] for row in rows} == {"221 ms"}


ROWS_PAST_A_PIPE = 3000  # about 300 KB of table: more than a pipe holds, so head closes it first


@pytest.mark.postgres
def test_a_command_piped_into_head_exits_quietly(tmp_path: Path) -> None:
    """``reactor_list | head -1`` through a real shell pipe: one line out, and the command
    ends without a word (Python would print a BrokenPipeError traceback, twice) with status 1."""
    Execution.objects.bulk_create(
        Execution(reactor="tests.integration.reactors.Transfer", definition_hash="x")
        for _ in range(ROWS_PAST_A_PIPE)
    )
    db = connection.settings_dict
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "testproject.settings",
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT'] or 5432}/{db['NAME']}",
    }
    listing = [
        sys.executable, "manage.py", "reactor_list", "--skip-checks", "--no-color",
        "--limit", str(ROWS_PAST_A_PIPE),
    ]  # fmt: skip
    errors, status = tmp_path / "command.err", tmp_path / "status"
    pipeline = f"{shlex.join(listing)} 2>{errors} | head -1; echo ${{PIPESTATUS[0]}} >{status}"
    result = subprocess.run(
        ["bash", "-c", pipeline], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    (line,) = result.stdout.splitlines()
    assert line.split()[0] == "ID", line
    assert errors.read_text() == ""  # no traceback, no "Exception ignored"
    assert status.read_text().strip() == "1"
