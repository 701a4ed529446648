"""Workers the benchmarks start and stop (Celery's, DBOS's): one subprocess in its own session."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


class BenchmarkError(RuntimeError):
    """A phase could not be measured (a worker did not start, a run did not complete...)."""


class Service:
    """One subprocess in its own session that logs ``ready.`` once it serves, stopped with all
    its children."""

    def __init__(self, name: str, command: list[str], env: dict[str, str], logs: Path):
        self.name = name
        self.log_path = logs / f"{name}.log"
        self.command = command
        self.env = env
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60.0) -> Worker:
        with self.log_path.open("wb") as log:  # the child keeps its own handle
            self.process = subprocess.Popen(
                self.command,
                env=self.env,
                cwd=REPO_ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while "ready." not in self.log():
            if self.process.poll() is not None:
                raise BenchmarkError(f"worker {self.name} exited at start:\n{self.log()[-3000:]}")
            if time.monotonic() > deadline:
                raise BenchmarkError(f"worker {self.name} not ready after {timeout:.0f} s")
            time.sleep(0.05)
        return self

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self) -> None:
        """Warm shutdown of the whole process group; SIGKILL what is left after 15 s."""
        process = self.process
        if process is None:
            return
        group = process.pid  # start_new_session: the worker leads its own process group
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGTERM)
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(group, signal.SIGKILL)
                process.wait(timeout=10)
        with contextlib.suppress(ProcessLookupError):  # children a killed parent left behind
            os.killpg(group, signal.SIGKILL)
        self.process = None


class Worker(Service):
    """One ``celery worker`` subprocess."""

    def __init__(
        self,
        name: str,
        app: str,
        queue: str | None,
        env: dict[str, str],
        logs: Path,
        *,
        processes: int = 2,
    ):
        command = [
            sys.executable, "-m", "celery", "-A", app, "worker",
            "-P", "prefork", "-c", str(processes),
            "-n", f"{name}-{os.getpid()}@%h",
            "--without-mingle", "--without-gossip", "--without-heartbeat", "-l", "INFO",
        ]  # fmt: skip
        if queue is not None:
            command += ["-Q", queue]
        super().__init__(name, command, env, logs)
