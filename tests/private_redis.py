"""A ``redis-server`` of a test's own, on a free loopback port: killed and restarted at will
(the suite's shared Redis is never touched)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
from pathlib import Path

import redis

from tests.workers.harness import wait_until


def free_port() -> int:
    """A TCP port nobody listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PrivateRedis:
    """A ``redis-server`` of the test's own (no persistence): killed and restarted at will."""

    def __init__(self, log_dir: Path) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.log_path = log_dir / f"redis-{self.port}.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> PrivateRedis:
        command = [
            "redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
            "--save", "", "--appendonly", "no", "--protected-mode", "no",
        ]  # fmt: skip
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        client = redis.Redis.from_url(self.url, socket_connect_timeout=0.5)

        def up() -> bool:
            with contextlib.suppress(redis.exceptions.RedisError):
                return bool(client.ping())
            return False

        try:
            wait_until(up, timeout=10, what=f"redis-server on port {self.port}")
        finally:
            client.close()
        return self

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)
        self.process = None
