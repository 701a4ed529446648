"""A PostgreSQL primary and its streaming standby, of a test's own, for failover tests.

Both servers run from a temporary directory on free loopback ports, as child processes of the
test session (``postgres -D``, never daemonized), and are stopped by their PIDs: the suite's
shared server is never touched. PostgreSQL refuses to run as root, so when the tests run as root
the server binaries run as the ``postgres`` OS user (the directory is given to that user).

The primary has ``wal_level = replica``, trusts replication connections from the loopback
interface, and commits synchronously with ``synchronous_commit = remote_apply`` and
``synchronous_standby_names = '*'``: a commit is acknowledged only once the standby has applied
it, so nothing acknowledged is lost when the standby takes over. The standby is a
``pg_basebackup -R`` of the primary, streaming from it, with no synchronous standby of its own
(once promoted it has none). ``failover()`` promotes it and stops the primary
(``pg_ctl stop -m immediate``, as a crash would); ``primary.stop_immediately()`` and
``promote()`` do it in the other order, with a gap in between; ``fence_primary()`` makes the
primary refuse writes and leaves it up, as a switchover does.

The binaries are in ``$POSTGRES_BIN`` (a directory) when it is set, else in ``pg_config
--bindir``, else in Debian's ``/usr/lib/postgresql/<version>/bin``, newest first.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
from pathlib import Path

import psycopg

from tests.workers.harness import wait_until

#: The programs the tests need besides the server itself.
TOOLS = ("initdb", "pg_basebackup", "pg_ctl", "postgres")

#: Settings of both servers, on their command line (the data directory's files are left alone).
COMMON_SETTINGS = {
    "listen_addresses": "127.0.0.1",
    "unix_socket_directories": "",
    "max_connections": "100",
    "shared_buffers": "16MB",
    "max_wal_senders": "4",
    "wal_level": "replica",
    "hot_standby": "on",
    # A test cluster: its data outlives nothing, so it is not flushed to disk.
    "fsync": "off",
    "full_page_writes": "off",
    "log_min_messages": "warning",
}
#: A commit returns only once the standby applied it: the setting that makes a failover lose
#: nothing that was acknowledged.
SYNCHRONOUS_SETTINGS = {"synchronous_commit": "remote_apply", "synchronous_standby_names": "*"}


def postgres_bindir() -> Path | None:
    """The directory of ``initdb``, ``pg_basebackup``, ``pg_ctl`` and ``postgres``, if any:
    ``$POSTGRES_BIN`` alone when it is set."""
    candidates: list[Path] = []
    if os.environ.get("POSTGRES_BIN"):
        candidates.append(Path(os.environ["POSTGRES_BIN"]))
    else:
        pg_config = shutil.which("pg_config")
        if pg_config:
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                found = subprocess.run(
                    [pg_config, "--bindir"], capture_output=True, text=True, timeout=10, check=True
                )
                candidates.append(Path(found.stdout.strip()))
        debian = Path("/usr/lib/postgresql")
        if debian.is_dir():
            versions = [p for p in debian.iterdir() if p.name.isdigit()]
            candidates += [p / "bin" for p in sorted(versions, key=lambda p: -int(p.name))]
    for directory in candidates:
        if all(os.access(directory / tool, os.X_OK) for tool in TOOLS):
            return directory
    return None


def free_port() -> int:
    """A TCP port on the loopback interface nobody listens on (at the time of asking)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _server_user() -> str | None:
    """Who runs the server binaries: ``postgres`` when this process is root, else this user."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        raise RuntimeError(
            "running as root and there is no 'postgres' OS user to run PostgreSQL as"
        ) from None
    return "postgres"


class Server:
    """One ``postgres`` process on a data directory and a port of its own."""

    def __init__(self, bindir: Path, directory: Path, name: str, user: str | None) -> None:
        self.bindir = bindir
        self.name = name
        self.data = directory / name
        self.log_path = directory / f"{name}.log"
        self.user = user
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None

    def conninfo(self, database: str = "postgres") -> str:
        """A libpq connection string to ``database`` on this server."""
        return f"host=127.0.0.1 port={self.port} user=postgres dbname={database} connect_timeout=3"

    def run_tool(self, tool: str, *arguments: str, timeout: float = 60) -> str:
        """Run one of the server's programs as the server's user; its output. Raises with the
        output when it fails."""
        result = subprocess.run(
            [str(self.bindir / tool), *arguments],
            user=self.user,
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd="/",
        )
        if result.returncode != 0:
            raise RuntimeError(
                f"{tool} {' '.join(arguments)} failed ({result.returncode}):\n"
                f"{result.stdout}{result.stderr}"
            )
        return result.stdout

    def start(self, settings: dict[str, str]) -> Server:
        """Start ``postgres`` on a free port with ``settings``; wait until it accepts
        connections (a standby: read-only ones). A few tries, should another process take the
        port first."""
        last = ""
        for _ in range(3):
            self.port = free_port()
            options = {**COMMON_SETTINGS, **settings, "port": str(self.port)}
            command = [str(self.bindir / "postgres"), "-D", str(self.data)]
            for key, value in options.items():
                command += ["-c", f"{key}={value}"]
            with self.log_path.open("ab") as log:
                self.process = subprocess.Popen(
                    command, user=self.user, stdout=log, stderr=subprocess.STDOUT, cwd="/",
                    start_new_session=True,
                )  # fmt: skip
            if self._wait_ready():
                return self
            last = self.log()
            self.kill()
        raise RuntimeError(f"PostgreSQL ({self.name}) did not start; its log:\n{last}")

    def _wait_ready(self) -> bool:
        def ready() -> bool:
            if self.process is None or self.process.poll() is not None:
                return True  # exited: stop waiting, the caller reads the log
            with contextlib.suppress(psycopg.Error):
                psycopg.connect(self.conninfo(), connect_timeout=1).close()
                return True
            return False

        wait_until(ready, timeout=30, what=f"PostgreSQL ({self.name}) on port {self.port}")
        return self.process is not None and self.process.poll() is None

    def query(
        self, sql: str, *params: object, database: str = "postgres"
    ) -> list[tuple[object, ...]]:
        """Run one statement in autocommit; its rows."""
        with psycopg.connect(self.conninfo(database), autocommit=True) as conn:
            cursor = conn.execute(sql.encode(), params or None)
            return cursor.fetchall() if cursor.description else []

    def running(self) -> bool:
        """Whether the postmaster is alive."""
        return self.process is not None and self.process.poll() is None

    def stop_immediately(self) -> None:
        """``pg_ctl stop -m immediate``: every backend quits at once, as in a crash (what is not
        acknowledged is lost); its clients see their connections break."""
        if not self.running():
            return
        self.run_tool("pg_ctl", "stop", "-D", str(self.data), "-m", "immediate", "-w", "-t", "30")
        assert self.process is not None
        self.process.wait(timeout=30)

    def kill(self) -> None:
        """Kill the postmaster and every backend (its process group) by PID, whatever their
        state; idempotent."""
        process, self.process = self.process, None
        if process is None:
            return
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)
        with contextlib.suppress(ProcessLookupError):  # backends left by a killed postmaster
            os.killpg(process.pid, signal.SIGKILL)

    def log(self) -> str:
        """The server's log."""
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""


class ReplicatedPostgres:
    """A synchronous primary and its streaming standby; ``failover()`` makes the standby the
    primary. Call ``remove()`` when done (it stops both, by PID, and deletes their files)."""

    def __init__(self, bindir: Path) -> None:
        self.user = _server_user()
        # Under /tmp, not pytest's tmp_path: the server's user must be able to reach it.
        self.directory = Path(tempfile.mkdtemp(prefix="reactor-failover-"))
        if self.user is not None:
            entry = pwd.getpwnam(self.user)
            os.chown(self.directory, entry.pw_uid, entry.pw_gid)
        self.primary = Server(bindir, self.directory, "primary", self.user)
        self.standby = Server(bindir, self.directory, "standby", self.user)

    @property
    def ports(self) -> tuple[int, int]:
        """The ports of the first primary and of its standby, in that order."""
        return self.primary.port, self.standby.port

    def start(self) -> ReplicatedPostgres:
        """``initdb`` and start the primary, take the standby with ``pg_basebackup -R`` and
        start it; return once the standby streams synchronously."""
        self.primary.run_tool(
            "initdb", "-D", str(self.primary.data), "-U", "postgres", "--auth=trust",
            "-E", "UTF8", "--locale=C", "--no-sync",
        )  # fmt: skip
        # initdb's pg_hba.conf trusts local connections and loopback replication already; say
        # so explicitly rather than rely on its defaults.
        with (self.primary.data / "pg_hba.conf").open("a") as hba:
            hba.write("host replication all 127.0.0.1/32 trust\nhost all all 127.0.0.1/32 trust\n")
        self.primary.start(SYNCHRONOUS_SETTINGS)
        self.standby.run_tool(
            "pg_basebackup", "-h", "127.0.0.1", "-p", str(self.primary.port), "-U", "postgres",
            "-D", str(self.standby.data), "-R", "-X", "stream", "--checkpoint=fast", "--no-sync",
        )  # fmt: skip
        # Promoted, it has no standby: waiting for one would hold every commit forever.
        self.standby.start({"synchronous_standby_names": ""})
        wait_until(
            lambda: self.primary.query("SELECT sync_state FROM pg_stat_replication") == [("sync",)],
            timeout=30,
            what="the standby to stream synchronously from the primary",
        )
        return self

    def fence_primary(self, database: str) -> None:
        """What a switchover does before it promotes the standby: the primary refuses writes
        from now on (``ALTER SYSTEM SET default_transaction_read_only = on``, reloaded), and
        every transaction on ``database`` that began before ends: those idle are terminated,
        those running finish (their commits wait for the standby, which still streams). The
        primary's other connections stay open and keep answering reads.

        A transaction left open would otherwise commit after the promotion and wait for ever
        for a synchronous standby that is gone."""
        self.primary.query("ALTER SYSTEM SET default_transaction_read_only = on")
        self.primary.query("SELECT pg_reload_conf()")
        # The postmaster signals every backend before a new one starts with the new setting.
        wait_until(
            lambda: self.primary.query("SHOW default_transaction_read_only") == [("on",)],
            timeout=30,
            what="the primary to take default_transaction_read_only",
        )
        fenced_at = self.primary.query("SELECT now()")[0][0]
        begun_before = (
            "FROM pg_stat_activity WHERE datname = %s AND xact_start < %s "
            "AND pid <> pg_backend_pid()"
        )
        self.primary.query(
            f"SELECT pg_terminate_backend(pid) {begun_before} AND state LIKE 'idle in%%'",
            database,
            fenced_at,
        )
        wait_until(
            lambda: self.primary.query(f"SELECT pid {begun_before}", database, fenced_at) == [],
            timeout=30,
            what="the transactions begun before the fence to end",
        )

    def wait_until_replayed(self) -> None:
        """Wait until the standby has applied everything the primary wrote so far."""
        wait_until(
            lambda: (
                self.primary.query(
                    "SELECT replay_lsn >= pg_current_wal_lsn() FROM pg_stat_replication"
                )
                == [(True,)]
            ),
            timeout=30,
            what="the standby to apply the primary's last writes",
        )

    def promote(self) -> None:
        """Promote the standby; it accepts writes once this returns."""
        self.standby.run_tool("pg_ctl", "promote", "-D", str(self.standby.data), "-w", "-t", "30")

    def failover(self) -> None:
        """Promote the standby, then stop the primary immediately: the primary's connections
        break mid-whatever they were doing."""
        self.promote()
        self.primary.stop_immediately()

    def remove(self) -> None:
        """Stop both servers (by PID) and delete their data directories."""
        for server in (self.primary, self.standby):
            with contextlib.suppress(RuntimeError, subprocess.SubprocessError):
                server.stop_immediately()
            server.kill()
        shutil.rmtree(self.directory, ignore_errors=True)

    def logs(self) -> str:
        """Both servers' logs."""
        return "\n".join(f"--- {s.name}:\n{s.log()}" for s in (self.primary, self.standby))
