"""A PgBouncer of the tests' own, in transaction-pooling mode, in front of the test database.

The worker tests marked ``behind_pgbouncer`` run a second time with their worker (and "web")
processes connected through it (``conftest.worker_database``), with the settings a production
deployment uses behind such a pooler: ``DISABLE_SERVER_SIDE_CURSORS`` and
``REACTOR["CHECKPOINT_PREPARED_STATEMENTS"] = False``. ``test_pgbouncer.py`` drops its server
connections under running workers and shows what prepared checkpoints do behind it.

PgBouncer runs as a child process of the test session (never daemonized) on a free loopback
port, with a generated configuration in a directory of its own, and is stopped by its PID. The
binary is ``$PGBOUNCER``, else ``pgbouncer`` on the ``PATH``, else Debian's ``/usr/sbin/pgbouncer``.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from tests.workers.harness import stop_process, wait_until

#: The settings a Django project uses behind a transaction-pooling PgBouncer older than 1.21:
#: no server-side cursors (Django's advice for any transaction pooler) and no prepared
#: checkpoint statement (django_reactor's, checked by ``django_reactor.W003``).
POOLED_DATABASE_OPTIONS: dict[str, Any] = {"DISABLE_SERVER_SIDE_CURSORS": True}
POOLED_REACTOR_SETTINGS: dict[str, Any] = {"CHECKPOINT_PREPARED_STATEMENTS": False}


def pgbouncer_binary() -> str | None:
    """The PgBouncer executable to run, or None when none is installed."""
    configured = os.environ.get("PGBOUNCER")
    if configured:
        return configured if os.access(configured, os.X_OK) else None
    found = shutil.which("pgbouncer")
    if found:
        return found
    debian = "/usr/sbin/pgbouncer"
    return debian if os.access(debian, os.X_OK) else None


def free_port() -> int:
    """A TCP port on the loopback interface nobody listens on (at the time of asking)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class ServerConnection:
    """One row of the admin console's ``SHOW SERVERS``."""

    database: str
    state: str
    remote_pid: int


class PgBouncer:
    """``pgbouncer`` in transaction-pooling mode in front of one PostgreSQL database.

    ``database`` is both the name clients connect to and the server database it maps to.
    Clients authenticate as ``user`` (trust; listed in the generated ``auth_file``), who is also
    an admin of the console (``SHOW POOLS``, ``RECONNECT``, ``KILL``, ``RESUME``).
    """

    def __init__(
        self, *, binary: str, database: str, server_host: str, server_port: int, user: str
    ) -> None:
        self.binary = binary
        self.database = database
        self.server_host = server_host
        self.server_port = server_port
        self.user = user
        self.directory = Path(tempfile.mkdtemp(prefix="reactor-pgbouncer-"))
        self.ini_path = self.directory / "pgbouncer.ini"
        self.log_path = self.directory / "pgbouncer.log"
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None
        # PgBouncer refuses to run as root: drop to the server's user then (``-u``).
        self.run_as = _unprivileged_user() if os.geteuid() == 0 else None

    # ------------------------------------------------------------------ addresses

    def url(self, database: str | None = None) -> str:
        """A ``postgres://`` URL of ``database`` (the pooled one by default) through PgBouncer."""
        return f"postgres://{self.user}@127.0.0.1:{self.port}/{database or self.database}"

    def _conninfo(self, database: str) -> str:
        return f"host=127.0.0.1 port={self.port} dbname={database} user={self.user}"

    # ------------------------------------------------------------------ life cycle

    def start(self) -> PgBouncer:
        """Start PgBouncer on a free port (a few tries, should another process take the port)
        and wait until its admin console answers."""
        last = ""
        for _ in range(3):
            self.port = free_port()
            self._write_config()
            self._spawn()
            if self._wait_ready():
                return self
            last = self.log()
            self.stop()
        raise RuntimeError(f"pgbouncer did not start; its log:\n{last}")

    def _write_config(self) -> None:
        (self.directory / "userlist.txt").write_text(f'"{self.user}" ""\n')
        self.ini_path.write_text(
            "[databases]\n"
            f"{self.database} = host={self.server_host} port={self.server_port} "
            f"dbname={self.database}\n"
            "\n[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {self.port}\n"
            "unix_socket_dir =\n"
            "pidfile =\n"
            f"logfile = {self.log_path}\n"
            "auth_type = trust\n"
            f"auth_file = {self.directory / 'userlist.txt'}\n"
            f"admin_users = {self.user}\n"
            "pool_mode = transaction\n"
            "default_pool_size = 20\n"
            "max_client_conn = 200\n"
            "log_connections = 0\n"
            "log_disconnections = 0\n"
        )
        if self.run_as is not None:
            uid, gid = self.run_as
            for path in (self.directory, *self.directory.iterdir()):
                os.chown(path, uid, gid)

    def _spawn(self) -> None:
        command = [self.binary, str(self.ini_path)]
        if self.run_as is not None:
            command[1:1] = ["-u", pwd.getpwuid(self.run_as[0]).pw_name]
        with (self.directory / "stdout.log").open("ab") as out:
            self.process = subprocess.Popen(
                command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )

    def _wait_ready(self) -> bool:
        assert self.process is not None

        def ready() -> bool:
            if self.process is None or self.process.poll() is not None:
                return True  # exited: stop waiting, the caller reads the log
            with contextlib.suppress(psycopg.Error):
                self.admin("SHOW VERSION")
                return True
            return False

        wait_until(ready, timeout=20, what=f"pgbouncer on port {self.port}")
        return self.process.poll() is None

    def stop(self) -> None:
        """Stop PgBouncer (SIGTERM, then SIGKILL) by its PID; its server connections close."""
        process, self.process = self.process, None
        if process is not None:
            stop_process(process)

    def remove(self) -> None:
        """Delete the configuration and log directory."""
        shutil.rmtree(self.directory, ignore_errors=True)

    def log(self) -> str:
        """PgBouncer's log (and anything it wrote to stdout/stderr before opening it)."""
        parts = []
        for name in ("stdout.log", "pgbouncer.log"):
            with contextlib.suppress(OSError):
                parts.append((self.directory / name).read_text(errors="replace"))
        return "".join(parts)

    # ------------------------------------------------------------------ admin console

    def admin(self, command: str) -> list[dict[str, Any]]:
        """Run one admin-console command; its rows as dicts (none for RECONNECT, KILL...)."""
        with psycopg.connect(
            self._conninfo("pgbouncer"), autocommit=True, connect_timeout=3, prepare_threshold=None
        ) as conn:
            cursor = conn.execute(command.encode())
            if cursor.description is None:
                return []
            names = [column.name for column in cursor.description]
            return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]

    def servers(self) -> list[ServerConnection]:
        """PgBouncer's server connections to the pooled database (``SHOW SERVERS``)."""
        return [
            ServerConnection(row["database"], row["state"], int(row["remote_pid"]))
            for row in self.admin("SHOW SERVERS")
            if row["database"] == self.database
        ]

    def pools(self) -> list[dict[str, Any]]:
        """The pooled database's rows of ``SHOW POOLS`` (one per user, once a client came)."""
        return [row for row in self.admin("SHOW POOLS") if row["database"] == self.database]

    def transactions(self) -> int:
        """How many transactions PgBouncer has carried to the pooled database (``SHOW STATS``)."""
        rows = [row for row in self.admin("SHOW STATS") if row["database"] == self.database]
        return int(rows[0]["total_xact_count"]) if rows else 0

    def config(self, key: str) -> str:
        """A setting's value as the running PgBouncer has it (``SHOW CONFIG``)."""
        values = [row["value"] for row in self.admin("SHOW CONFIG") if row["key"] == key]
        assert len(values) == 1, key
        return str(values[0])


def _unprivileged_user() -> tuple[int, int]:
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            entry = pwd.getpwnam(name)
            return entry.pw_uid, entry.pw_gid
    raise RuntimeError("running as root and no 'postgres' or 'nobody' user to run pgbouncer as")
