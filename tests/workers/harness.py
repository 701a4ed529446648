"""Real Celery worker processes for the crash tests, and bounded waiting."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def wait_until(condition: Callable[[], Any], *, timeout: float = 30.0, what: str = "") -> Any:
    """Poll ``condition`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    pause = 0.02
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what or condition}")
        time.sleep(pause)
        pause = min(pause * 1.5, 0.2)


def children_of(pid: int) -> list[int]:
    """The direct children of a process (read from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid:
            found.append(int(entry.name))
    return found


def process_state(pid: int) -> str:
    """One letter: R running, S sleeping, T stopped, Z zombie; '' when gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


class Worker:
    """One ``celery worker`` (prefork) on the test database, broker and queue."""

    def __init__(
        self, *, env: dict[str, str], queue: str, log_dir: Path, concurrency: int = 2
    ) -> None:
        self.name = f"w{uuid.uuid4().hex[:6]}"
        self.log_path = log_dir / f"{self.name}.log"
        self.command = [
            sys.executable, "-m", "celery", "-A", "testproject", "worker",
            "-P", "prefork", "-c", str(concurrency), "-Q", queue, "-n", f"{self.name}@%h",
            "--without-mingle", "--without-gossip", "--without-heartbeat", "-l", "INFO",
        ]  # fmt: skip
        self.env = env
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> Worker:
        with self.log_path.open("wb") as log:  # the child keeps its own copy of the handle
            self.process = subprocess.Popen(
                self.command, env=self.env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        wait_until(
            lambda: "ready." in self.log() or self.process.poll() is not None,  # type: ignore[union-attr]
            timeout=60,
            what=f"worker {self.name} to start",
        )
        if self.process.poll() is not None:
            raise AssertionError(f"worker {self.name} exited at start:\n{self.log()}")
        return self

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def children(self) -> list[int]:
        assert self.process is not None
        return children_of(self.process.pid)

    def stop(self) -> None:
        """Stop the worker and every child, whatever state they are in."""
        if self.process is None or self.process.poll() is not None:
            return
        group = os.getpgid(self.process.pid)
        for pid in self.children():
            if process_state(pid) == "T":
                os.kill(pid, signal.SIGCONT)
        os.killpg(group, signal.SIGTERM)
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(group, signal.SIGKILL)
            self.process.wait(timeout=10)
        with contextlib.suppress(ProcessLookupError):  # orphans of a killed parent
            os.killpg(group, signal.SIGKILL)


def stop_process(process: subprocess.Popen[Any], how: int = signal.SIGTERM) -> None:
    """Stop a process this test started: ``how`` (SIGTERM, or SIGINT for a command's Ctrl-C),
    then SIGKILL when it has not exited within 15 seconds."""
    if process.poll() is not None:
        return
    process.send_signal(how)
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)


def start_sweeper(
    env: dict[str, str], log_path: Path, interval: float = 0.5
) -> subprocess.Popen[bytes]:
    """``manage.py reactor_sweep --loop`` on the test database, its output in ``log_path``.

    System checks are skipped: the workers' settings leave coordination on the default Redis
    backend, which the example project's reactors would make ``E010`` refuse.
    """
    with log_path.open("ab") as log:
        return subprocess.Popen(
            [sys.executable, "manage.py", "reactor_sweep", "--loop", "--interval", str(interval),
             "--skip-checks"],
            cwd=ROOT, env={**env, "PYTHONUNBUFFERED": "1"}, stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
