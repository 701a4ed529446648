"""Run a tutorial page as its reader would: every block, in order, in real processes.

- ``console`` blocks: each ``$`` command runs in bash, in the tutorial's directory, with the
  environment and the shell variables its earlier commands left, as in one terminal. Its
  output, with stderr, must match the lines the page shows under it, if any (``...`` matches
  anything; ids, times and durations are replaced on both sides: ``tests.docs.normalise``),
  and it must exit 0.
  A command that keeps running (a worker, a web server) is started in the background instead,
  and its output is compared once it says it is ready.
- ``pycon`` blocks run in one Python shell of the project (``tests/docs/session.py``), as
  doctests whose namespace is kept from block to block.
- A ``python`` block with a ``title="path"`` is written to that file of the tutorial's
  directory, as the reader does: a new file is created, a file that exists (the project's
  ``settings.py``, ``urls.py``, ``__init__.py``) gets the block added at its end. A block of
  ``INSTALLED_APPS`` goes to the project's settings (``Translation.settings``). Pages show code
  as it is, never an include of another file: what they show is what runs.
- A block the page marks ``<!-- docs-test: not run: <reason> -->`` is not run.

What the test changes, and only that (``Translation``): names it substitutes in commands, in
the files the page has the reader write and in the outputs the page shows (the database's
name, the broker, the web server's port, so that parallel runs never meet), the options it adds
to a background command (the web server's address, no autoreloader), what it adds after a file
the page writes (``appended``: the test's own Celery queue after the settings) and the
settings module of the Python shell (``shell_settings``, as ``manage.py shell`` finds it).
"""

from __future__ import annotations

import contextlib
import doctest
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from tests.docs.normalise import normalise
from tests.docs.pages import Block, Command, blocks, commands

ROOT = Path(__file__).resolve().parents[2]
MARKER = re.compile(r"\n@@docs-test rc=(\d+)@@\n")
COMMAND_TIMEOUT = 120


@dataclass(frozen=True)
class Background:
    """A command that keeps running: how to recognise it, start it and know it is ready."""

    pattern: re.Pattern[str]
    ready: str
    rewrite: Callable[[str], str] = lambda command: command


@dataclass
class Translation:
    substitutions: dict[str, str]
    background: list[Background] = field(default_factory=list)
    #: What to do with a Python block of settings the page tells the reader to add (the page's
    #: own words, given the tutorial's directory); None: the page has none.
    settings: Callable[[str, Path], None] | None = None
    #: Text added after a file the page writes, by its path (the test's own Celery queue).
    appended: dict[str, str] = field(default_factory=dict)
    #: The settings module of the page's Python shell (``manage.py shell`` reads it from
    #: ``manage.py``); None: the environment's.
    shell_settings: str | None = None

    def apply(self, text: str) -> str:
        for old, new in self.substitutions.items():
            text = text.replace(old, new)
        return text


class DocsFailure(AssertionError):
    pass


@dataclass
class TutorialRun:
    page: Path
    workdir: Path
    env: dict[str, str]
    translation: Translation
    not_run: list[str] = field(default_factory=list)
    ran: list[str] = field(default_factory=list)
    processes: list[tuple[subprocess.Popen[bytes], Path]] = field(default_factory=list)
    session: subprocess.Popen[str] | None = None

    # ------------------------------------------------------------------ the page

    def run(self) -> None:
        for block in blocks(self.page):
            where = block.where(self.page)
            if block.not_run is not None:
                self.not_run.append(f"{where}: {block.not_run}")
                continue
            if block.language == "console":
                self.console(block)
            elif block.language == "pycon":
                self.pycon(block)
            elif block.language == "python":
                self.python(block)
            else:
                raise DocsFailure(f"{where}: no way to run a {block.language} block")
            self.ran.append(where)

    def python(self, block: Block) -> None:
        title = re.search(r'title="([^"]+)"', block.attributes)
        if title is not None:  # a file the page tells the reader to write, or to add to
            path = self.workdir / title.group(1)
            path.parent.mkdir(parents=True, exist_ok=True)
            (path.parent / "__init__.py").touch()
            text = self.translation.apply(block.text)
            if path.exists() and path.read_text().strip():
                text = path.read_text().rstrip("\n") + "\n\n" + text
            path.write_text(text + self.translation.appended.get(title.group(1), ""))
            return
        if self.translation.settings and "INSTALLED_APPS" in block.text:
            self.translation.settings(block.text, self.workdir)
            return
        raise DocsFailure(f"{block.where(self.page)}: a python block this test cannot run")

    # ------------------------------------------------------------------ shell

    def console(self, block: Block) -> None:
        group: list[Command] = []
        for command in commands(block):
            background = next(
                (b for b in self.translation.background if b.pattern.search(command.text)), None
            )
            if background is None:
                group.append(command)
                continue
            self._shell(group, block)
            group = []
            self._start(command, background, block)
        self._shell(group, block)

    def _env_file(self) -> Path:
        return self.workdir / ".docs-test-env"

    def _shell(self, group: list[Command], block: Block) -> None:
        if not group:
            return
        env_file = self._env_file()
        # The terminal's exported and shell variables (lower-case names: the page's own) carry
        # over to the next block.
        variables = self.workdir / ".docs-test-variables"
        script = [f"[ -f {env_file} ] && . {env_file}", f"[ -f {variables} ] && . {variables}"]
        for command in group:
            script.append(self.translation.apply(command.text))
            script.append("printf '\\n@@docs-test rc=%s@@\\n' \"$?\"")
        script.append(f"export -p > {env_file}")
        script.append(
            "for name in $(compgen -v | grep -E '^[a-z][a-z0-9_]*$'); do declare -p \"$name\"; "
            f"done > {variables}"
        )
        result = subprocess.run(
            ["bash", "-c", "\n".join(script)],
            cwd=self.workdir,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=COMMAND_TIMEOUT * len(group),
            check=False,
        )
        pieces = MARKER.split(result.stdout.decode(errors="replace"))
        for index, command in enumerate(group):
            if 2 * index + 1 >= len(pieces):
                raise DocsFailure(
                    f"{block.where(self.page)}: the shell stopped before `{command.text}`:\n"
                    f"{pieces[-1]}"
                )
            got, code = pieces[2 * index], int(pieces[2 * index + 1])
            if code != 0:
                raise DocsFailure(
                    f"{block.where(self.page)}: `{command.text}` exited {code}:\n{got}"
                )
            self._compare(block, command, got)
        self._read_env()

    def _read_env(self) -> None:
        dumped = subprocess.run(
            ["bash", "-c", f". {self._env_file()} && env -0"],
            env=self.env,
            capture_output=True,
            check=True,
        ).stdout.decode()
        self.env = dict(item.split("=", 1) for item in dumped.split("\0") if "=" in item)

    def _compare(self, block: Block, command: Command, got: str) -> None:
        if not command.output:
            return
        want = self.translation.apply(command.output)
        if not matches(want, got):
            raise DocsFailure(
                f"{block.where(self.page)}: `{command.text}` printed something else.\n"
                f"--- the page shows:\n{want}--- the command printed:\n{got}"
            )

    def _start(self, command: Command, background: Background, block: Block) -> None:
        text = background.rewrite(self.translation.apply(command.text))
        log_path = self.workdir / f"background-{len(self.processes)}.log"
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                ["bash", "-c", f"exec {text}"],
                cwd=self.workdir,
                env={**self.env, "PYTHONUNBUFFERED": "1"},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.processes.append((process, log_path))
        deadline = time.monotonic() + COMMAND_TIMEOUT
        pause = 0.05
        while background.ready not in log_path.read_text(errors="replace"):
            if process.poll() is not None or time.monotonic() > deadline:
                raise DocsFailure(
                    f"{block.where(self.page)}: `{text}` did not get ready:\n"
                    f"{log_path.read_text(errors='replace')}"
                )
            time.sleep(pause)  # polling a log file for a process's readiness
            pause = min(pause * 1.5, 0.5)
        self._compare(block, command, log_path.read_text(errors="replace"))

    # ------------------------------------------------------------------ Python

    def pycon(self, block: Block) -> None:
        answer = self.ask(
            {"source": block.text, "name": self.page.name, "lineno": block.lineno - 1}
        )
        if answer["failures"]:
            raise DocsFailure(f"{block.where(self.page)}:\n{answer['report']}")

    def ask(self, request: dict[str, Any]) -> dict[str, Any]:
        """Send a request to the tutorial's Python shell (started at its first use)."""
        if self.session is None:
            env = {**self.env, "PYTHONPATH": os.pathsep.join([str(self.workdir), str(ROOT)])}
            if self.translation.shell_settings:
                env["DJANGO_SETTINGS_MODULE"] = self.translation.shell_settings
            self.session = subprocess.Popen(
                [sys.executable, str(ROOT / "tests" / "docs" / "session.py")],
                cwd=self.workdir,
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
        assert self.session.stdin is not None
        assert self.session.stdout is not None
        self.session.stdin.write(json.dumps(request) + "\n")
        self.session.stdin.flush()
        line = self.session.stdout.readline()
        if not line:
            raise DocsFailure("the Python shell exited (its error is above)")
        answer: dict[str, Any] = json.loads(line)
        return answer

    # ------------------------------------------------------------------ the end

    def stop(self) -> None:
        if self.session is not None:
            stream: IO[str] | None = self.session.stdin
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
            try:
                self.session.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.session.kill()
                self.session.wait(timeout=10)
            if self.session.stdout is not None:
                self.session.stdout.close()
        for process, _ in reversed(self.processes):
            if process.poll() is not None:
                continue
            group = os.getpgid(process.pid)
            os.killpg(group, signal.SIGTERM)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(group, signal.SIGKILL)
                process.wait(timeout=10)
            with contextlib.suppress(ProcessLookupError):  # children left behind
                os.killpg(group, signal.SIGKILL)


def matches(want: str, got: str) -> bool:
    """``got`` is what ``want`` shows: ``...`` matches anything; ids, times and durations are
    placeholders on both sides; trailing spaces and carriage returns do not count."""

    def tidy(text: str) -> str:
        lines = normalise(text).splitlines()
        return "".join(line.rstrip() + "\n" for line in lines)

    return doctest.OutputChecker().check_output(tidy(want), tidy(got), doctest.ELLIPSIS)
