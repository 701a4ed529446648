"""Chaos soak: mixed reactors on real workers while processes, connections and Redis fail.

Run from the repository root (PostgreSQL on 127.0.0.1:5432, user ``postgres``, trust auth;
``redis-server`` on the PATH)::

    .venv/bin/python benchmarks/chaos_soak.py --runs 200 --faults 60 --seconds 600
    .venv/bin/python benchmarks/chaos_soak.py --runs 40 --faults 0        # the control run

What it starts, all of its own and all stopped (by PID) at the end: a database ``chaos_<pid>``
on the local PostgreSQL (migrated, dropped at the end), a ``redis-server`` on a free loopback
port (the Celery broker and django_reactor's coordination backend, no persistence),
``--workers`` Celery prefork workers (``-c 2``) on a queue of its own, the sweeper loop
(``manage.py reactor_sweep --loop --interval 1``), a web process (``manage.py runserver``) for
the HTTP resumes, a *submitter* process that starts the background runs and an inline *caller*
process that runs the inline and hand-off runs. Every Django process uses
``tests.chaos.settings`` and names its role in PostgreSQL's ``application_name``.

The runs (``tests/chaos/reactors.py``) mix fully background chains, hand-offs after and before
a step, inline chains, a step holding a ``Lock`` (inline and on workers, on shared keys), a
fanned-out map, interrupts resumed over HTTP once paused (a signed webhook with an
``Idempotency-Key``, sent twice, then once more with another key and payload, which must be
refused), deliveries racing the run to its wait (below) and atomic steps that move money
(on workers, inline, and handed off between them: ``debit`` moves an amount from the run's
source account to its escrow, ``credit`` from escrow to target, each balance change and its
``chaos_transfer`` row written through Django's connection inside the step's transaction; the
undo moves it back the same way), and runs of a reactor with a concurrency key
(``KeyedBackground``: ``Meta.concurrency = Concurrency(key="{tenant}", limit=2,
on_limit="queue")``, on workers, with longer bodies), submitted in bursts of a few runs of one
tenant, so that runs over the limit are stored ``queued`` and wait for a run of their tenant to
end (a worker or the sweeper admits them) while workers die. Their inputs decide how each ends:
completed, failed (a planned failure, rolled back), needs_attention (some undos fail) or halted
(a declined payload). Every body also runs a short query marked ``/* chaos body */`` on the
engine's own connection, so that connection faults land inside bodies.

Three kinds race their deliveries against the run (``a`` on a worker, then the wait, then
``apply`` on a worker; always approved): the *resumer* thread delivers at a random moment up to
3 s after it saw the run's row (a third at once, a third within 0.8 s, a third later), so
before the run parks, while it parks or after, each run's three deliveries in a thread of their
own:

- ``early_interrupt`` (``EarlyApproval``): ``POST .../resume/`` naming ``approval``, which the
  product keeps until the run gets there; the same again (a replay); another payload with
  another key, which must be refused;
- ``message_background`` (``MessageBackground``, a ``receive("chaos.decision")``):
  ``POST .../messages/chaos.decision/`` with key A, the same again (a replay), then another
  message with key B, which is kept (202) and must never be applied: the receive takes one;
- ``event_background`` (``EventBackground``, a ``wait_for_event("chaos.decision",
  match=arg.input("order"), lookback=10 minutes)``): ``POST /events/chaos.decision/`` with the
  run's key and event id ``<key>-A`` (for some runs at the run's planned start, whether its row
  exists yet or not: the wait looks back), the same again (a replay), then event ``<key>-B``
  with the same key, emitted (202) and never applied: the wait takes the earliest one.

While runs are in flight it injects, at random moments, at least ``--faults`` faults: SIGKILL of
a worker's main process (a replacement is started at once; the orphans are killed 3 s later),
SIGKILL of a pool child, ``pg_terminate_backend`` of backends of its own database chosen by role
(worker, sweeper, web, caller, submitter), a kill of its Redis restarted 1-6 s later, SIGKILL of
the inline caller and of the sweeper loop (most often while its connection is at work; each
restarted at once), and two faults inside step bodies:

- ``body_cut``: ``pg_terminate_backend`` of backends inside a body right now (an atomic step's
  transaction, named ``reactor-atomic <execution id> <fence>``, or a plain body's marked query):
  the body must run again on a new connection;
- ``atomic_stall``: the next atomic body to take the driver's request (a file it unlinks, so
  exactly one does; the first request is for any atomic body, later ones also for a credit or
  an undo) stops its own process (``SIGSTOP``) inside its transaction, after its writes,
  holding its row locks; the driver wakes it (``SIGCONT``) once the worker that took the run
  over has ended that session (bounded: ``LEASE_SECONDS`` + 14 s; before the settle
  phase at the latest; the soak's ``ATOMIC_STEP_TIMEOUT`` is 30 s, longer than a stall, so
  that the takeover, not the server's idle timeout, ends the session). The money must move
  once, the run end as planned, and the woken process must not run the step again.

The first faults are one of each kind, in random order (a kind that cannot be injected then is
replaced by another; ``body_cut`` and ``atomic_stall`` are sought until one lands instead, so
every soak of at least seven faults has both). It restarts a sweeper, web process or worker
that exits by itself (as a supervisor would) and reports it. Then faults stop, every process is
brought back, and it waits (polling the database, bounded) until every run has ended.

The report: runs submitted and how they ended, faults by kind, and the invariants, each with
the execution ids, steps, ledger rows and log lines to investigate it:

- runs lost: not ended (or never created) after the settle period;
- checkpointed actions run again: a step body, undo, compensate, map element or element undo
  that started while its checkpoint existed (the ledger row says so), or a step checkpointed
  twice;
- effects doubled: two attempts of one action given different idempotency keys (a provider
  would apply them twice), or one key given to two actions;
- fan-ins done twice: the map's ``collect`` run after the map step was checkpointed, the map step
  checkpointed twice, or more elements settled than the map has;
- payloads applied twice: more than one accepted payload, the apply step run after its
  checkpoint or with two payloads, a second delivery (another key) to an interrupt accepted, or
  a mailbox that gave its run two messages; and Idempotency-Key replays that did not replay
  (the repeat of each first delivery must get its answer again, ``Idempotent-Replayed``);
- deliveries lost or mishandled: for every run delivered to, a delivery left without a final
  answer (a 5xx or no answer after 90 s of retries), a first delivery refused (or an event's
  first emit answered as a replay; a retry after a try whose answer was lost, a 5xx, is
  answered afresh, as documented: an interrupt's ``already_resumed``, an event's replay, a
  message's 409 once its run has ended), a second one answered otherwise than documented (an
  interrupt's refused with a 4xx; a message kept, 202, or 409 once the run ended; an event
  emitted, 202 with replay false), not exactly one ``payload`` trace entry, the apply step run
  with any payload but the first (nonce ``<key>-A``: 0 lost, 0 doubled), or a mailbox whose
  consumed messages are not just the first;
- lock overlaps: two runs inside the same lock at once (an overlap that a Redis restart
  explains, which the docs allow, is shown apart);
- stuck locks: lock keys held in Redis by a run that had ended 5 s before, at the end or in a
  sample taken every 2 s while the soak ran (a forgotten lock lapses with its ttl);
- wrong outcomes: a run that ended otherwise than its inputs decide;
- atomic writes doubled: an atomic step's run or undo whose transfer committed more than once,
  committed transfers other than the run's end says (once per atomic step of a completed run;
  in a failed run, the steps before the planned failure moved and moved back, unless their
  undo was planned to fail; none by the failing step), or a balance the committed transfers
  do not add up to;
- failed by connection loss: a run that ended failed or needs_attention of a lost database
  connection (its failure or a rollback failure), instead of running the body again;
- task failures: Celery's ``raised unexpected`` lines, against the connection faults injected
  (``pg_terminate_backend`` calls that hit a backend, ``body_cut``, ``atomic_stall`` and Redis
  restarts): more than one per connection fault is a violation. They are grouped by the
  django_reactor frames of their tracebacks, so the code path at fault is named;
- sweeper exits: the sweeper loop died by itself;
- concurrency overruns: more than the limit of a tenant's runs in flight (holding a slot:
  pending, scheduled, running, paused, rolling back or suspended), counted in the database
  four ways: (1) exactly, after the soak, from each run's own record: it holds its slot from
  its creation (or, if it was queued, its ``admit`` trace entry) until its ``finished_at``; (2)
  by every keyed step body as it starts, in the same statement as its ``chaos_keyed`` row: the
  runs of its key holding a slot then, and its own run's status (``queued``: it ran without a
  slot); (3) from the bodies' entry and exit times: more than the limit of a key's runs inside
  a body at once (a body cut off by a kill has no exit and is left out: the run it belonged to
  stays in flight, and is counted once, by (1), until it is taken over and ends); (4) by a
  monitor thread counting each key's runs in flight every 50 ms while the soak runs. Runs are
  counted, not processes: a run whose worker died is one run, however many processes ran its
  bodies.

The report also lists each ``atomic_stall`` (the process, its run, when its session was ended
and whether by the takeover, when it was woken) and counts the trace's ``reconnect`` entries.

Exit status: 0 when no invariant is violated, 1 when one is, 2 when the soak could not run.
Logs are kept (and their directory printed) when an invariant is violated or a task failed, or
with ``--keep``.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks.common import PG_SERVER

SETTINGS_MODULE = "tests.chaos.settings"
REACTORS = "tests.chaos.reactors"
PLANNED = "chaos: planned failure"  # the same as tests.chaos.reactors.PLANNED
PLANNED_UNDO = "chaos: planned undo failure"
KEY_PREFIX = "chaos"  # REACTOR["COORDINATION_KEY_PREFIX"] of the soak's processes
FINAL = {"completed", "failed", "halted", "cancelled", "needs_attention"}
# Not ended: a queued run (over its concurrency limit) waits to become pending.
ACTIVE = {"pending", "running", "rolling_back", "paused", "queued"}
ROLES = ("worker", "sweeper", "web", "caller", "submitter")
FAULT_KINDS = {  # kind: weight
    "worker_kill": 12,
    "child_kill": 17,
    "pg_terminate": 30,
    "redis_restart": 12,
    "caller_kill": 13,
    "sweeper_kill": 8,
    "body_cut": 12,
    "atomic_stall": 4,
}
#: Fault kinds that cut database connections (against which task failures are counted).
CONNECTION_FAULTS = ("pg_terminate", "redis_restart", "body_cut", "atomic_stall")
#: Fault kinds that find their target at work and retry when there is none (not substituted
#: until one of the kind is in: every soak gets at least one of each).
SOUGHT_KINDS = ("body_cut", "atomic_stall")
TERMINATE_ROLES = {"worker": 45, "sweeper": 20, "caller": 13, "submitter": 12, "web": 10}
RESERVE = 25.0  # seconds kept for the checks and the clean-up at the end of --seconds
SPACING = 0.9  # seconds between two submissions, on average, when the time bound allows it
REAP_AFTER = 3.0  # seconds the orphans of a killed worker main process live on
STUCK_AFTER = 5.0  # seconds a lock may outlive its run's end (the release follows the end)
BUSY_AIM = 0.75  # the share of kills and terminations aimed at a process that is at work
BODY_MARKER = "/* chaos body */"  # the same as tests.chaos.reactors.BODY_MARKER
ATOMIC_PREFIX = "reactor-atomic "  # an atomic step's session (store.dialects.postgresql)
LEASE_SECONDS = 4  # REACTOR["LEASE_SECONDS"] of the soak's processes
# Longer than a stall lasts (its lease, the takeover, the wake): the takeover, not the server's
# idle_in_transaction_session_timeout, ends the stalled session.
ATOMIC_STEP_TIMEOUT = 30.0
STALL_FIND = 8.0  # seconds an atomic_stall request waits for an atomic body to take it
STALL_MAX = LEASE_SECONDS + 14.0  # seconds a process stays stopped at most
STALL_GRACE = 1.0  # seconds a stopped process stays stopped after its session was ended
INITIAL_BALANCE = 1000  # of each chaos_account row
KEYED_LIMIT = 2  # the same as tests.chaos.reactors.KEYED_LIMIT
#: Statuses of a run holding its concurrency key's slot (tests.chaos.reactors.HOLDING).
HOLDING = ("pending", "scheduled", "running", "paused", "rolling_back", "suspended")
KEYED_SHARE = 0.2  # of the runs: KeyedBackground's
KEYED_TENANTS = ("acme", "zeta", "umbra")  # as many as get 3 x the limit of runs each, 1 to 3
KEYED_BURST = 0.5  # seconds within which a burst of one tenant's runs is submitted
KEYED_PAUSE = (0.4, 0.9)  # seconds of each keyed step body: runs hold their slots a while
MONITOR_PERIOD = 0.05  # seconds between two counts of the keys' runs in flight


class SoakError(RuntimeError):
    """The soak could not run (a process did not start, the database is unreachable...)."""


def log(message: str) -> None:
    """Progress on stderr (the report goes to stdout)."""
    print(f"[chaos {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------- processes


def _stat(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


@dataclass(frozen=True)
class Proc:
    """A process this soak started (or a descendant of one), pinned by its start time so that a
    reused PID is never signalled."""

    pid: int
    start: str

    @classmethod
    def of(cls, pid: int) -> Proc | None:
        """The process ``pid`` as it is now, or None when it is gone."""
        fields = _stat(pid)
        return None if fields is None else cls(pid, fields[19])

    def alive(self) -> bool:
        """Whether this very process (same PID and start time) still runs."""
        fields = _stat(self.pid)
        return fields is not None and fields[19] == self.start and fields[0] != "Z"

    def kill(self, sig: int = signal.SIGKILL) -> bool:
        """Send ``sig`` if this very process still runs; whether it was sent."""
        if not self.alive():
            return False
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, sig)
            return True
        return False


def children_pids(pid: int) -> list[int]:
    """The direct children of ``pid`` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _stat(int(entry.name))
            if fields is not None and int(fields[1]) == pid:
                found.append(int(entry.name))
    return found


def descendants(pid: int) -> list[Proc]:
    """Every live descendant of ``pid``."""
    found: list[Proc] = []
    todo = [pid]
    while todo:
        for child in children_pids(todo.pop()):
            proc = Proc.of(child)
            if proc is not None:
                found.append(proc)
                todo.append(child)
    return found


def session_members(sid: int) -> list[Proc]:
    """Every live process of session ``sid``. Each child is started in a session of its own,
    and Linux never gives a session's id to a new process while the session has members, so
    these are the child and what it started, orphans included."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _stat(int(entry.name))
            if fields is not None and int(fields[3]) == sid and fields[0] != "Z":
                proc = Proc.of(int(entry.name))
                if proc is not None:
                    found.append(proc)
    return found


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class Child:
    """One process the soak started, in a session of its own, logging to a file."""

    def __init__(
        self, name: str, role: str, command: list[str], env: dict[str, str], logs: Path
    ) -> None:
        self.name = name
        self.role = role
        self.command = command
        self.env = env
        self.log_path = logs / f"{name}.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.proc: Proc | None = None
        self.killed = False  # by the soak, on purpose
        self.is_ready = False  # a worker that said "ready."
        self.started_at = 0.0

    def start(self) -> Child:
        """Start the process in a session of its own, its output appended to its log."""
        with self.log_path.open("ab") as handle:  # the child keeps its own copy of the handle
            self.process = subprocess.Popen(
                self.command,
                env=self.env,
                cwd=REPO_ROOT,
                stdout=handle,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        self.proc = Proc.of(self.process.pid)
        self.started_at = time.monotonic()
        return self

    @property
    def pid(self) -> int:
        """The main process's PID."""
        assert self.process is not None
        return self.process.pid

    def alive(self) -> bool:
        """Whether this very process (same PID and start time) still runs."""
        return self.process is not None and self.process.poll() is None

    def returncode(self) -> int | None:
        """The exit status, or None while it runs."""
        return None if self.process is None else self.process.poll()

    def log(self) -> str:
        """The process's log so far."""
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def tail(self, lines: int = 15) -> list[str]:
        """The last ``lines`` lines of the log."""
        return self.log().splitlines()[-lines:]

    def kill(self) -> None:
        """SIGKILL the main process only (its children live on as orphans until reaped)."""
        self.killed = True
        if self.proc is not None:
            self.proc.kill()
        if self.process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=5)

    def reap(self) -> None:
        """SIGKILL whatever is left of this process's session."""
        if self.process is not None:
            for proc in session_members(self.pid):
                proc.kill()

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM the process, wait (bounded), then SIGKILL what is left of its session."""
        if self.process is None:
            return
        if self.alive() and self.proc is not None:
            self.proc.kill(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=timeout)
        self.reap()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=5)


def free_port() -> int:
    """A TCP port free on the loopback interface now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for(condition: Callable[[], Any], timeout: float, what: str) -> Any:
    """Poll ``condition`` (bounded) until it returns something truthy; SoakError after."""
    deadline = time.monotonic() + timeout
    pause = 0.05
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise SoakError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(pause)
        pause = min(pause * 1.5, 0.5)


# ---------------------------------------------------------------------------- the plan

STEPS = {
    "Background": ["a", "b", "c", "d"],
    "BackgroundLocked": ["a", "locked", "c"],
    "HandOffAfter": ["a", "b", "c"],
    "HandOffBefore": ["a", "b", "c"],
    "Inline": ["a", "b", "c"],
    "InlineLocked": ["a", "locked", "c"],
    "AtomicBackground": ["a", "debit", "credit", "d"],
    "AtomicInline": ["a", "debit", "credit", "d"],
    "AtomicHandOff": ["a", "debit", "credit", "d"],
    "KeyedBackground": ["a", "b", "c"],
}
#: The atomic steps of each reactor and the accounts they move money between (run: from the
#: first to the second; undo: back).
ATOMIC_STEPS = {
    reactor: {"debit": ("source", "escrow"), "credit": ("escrow", "target")}
    for reactor in ("AtomicBackground", "AtomicInline", "AtomicHandOff")
}
ACCOUNTS = ("source", "escrow", "target")
KINDS = [  # kind, reactor class, client process, weight
    ("background", "Background", "submitter", 22),
    ("background_locked", "BackgroundLocked", "submitter", 10),
    ("handoff_after", "HandOffAfter", "caller", 8),
    ("handoff_before", "HandOffBefore", "caller", 8),
    ("inline", "Inline", "caller", 7),
    ("inline_locked", "InlineLocked", "caller", 13),
    ("map", "FanOut", "submitter", 12),
    ("interrupt_background", "ApprovalBackground", "submitter", 12),
    ("interrupt_inline", "ApprovalInline", "submitter", 8),
    ("early_interrupt", "EarlyApproval", "submitter", 6),
    ("message_background", "MessageBackground", "submitter", 6),
    ("event_background", "EventBackground", "submitter", 6),
    ("atomic_background", "AtomicBackground", "submitter", 12),
    ("atomic_inline", "AtomicInline", "caller", 7),
    ("atomic_handoff", "AtomicHandOff", "caller", 5),
]
#: Runs of a concurrency key: not drawn with the others, but a share of every plan, in bursts.
KEYED_KIND = ("keyed_background", "KeyedBackground", "submitter", 0)

#: Job kinds whose run waits for an interrupt the Resumer delivers to once it is paused.
PAUSED_KINDS = ("interrupt_background", "interrupt_inline")
#: Interrupt kinds: a second delivery with another key must be refused.
INTERRUPT_KINDS = (*PAUSED_KINDS, "early_interrupt")
#: Kinds whose run takes a message (``receive``) or an event (``wait_for_event``): a second one
#: with another key is accepted and must never be applied.
MAILBOX_KINDS = ("message_background", "event_background")
#: Kinds delivered to at a random moment, not once paused (the run may not have parked yet).
RACING_KINDS = ("early_interrupt", *MAILBOX_KINDS)
#: Every kind the Resumer delivers to.
DELIVERED_KINDS = (*PAUSED_KINDS, *RACING_KINDS)
DECISION = "chaos.decision"  # the same as tests.chaos.reactors.DECISION
#: When a racing delivery goes out after the run's row was seen (seconds, drawn from one of
#: these spans, each as likely): at once (the run has not parked yet), while ``a`` runs and the
#: run parks, after it parked.
RACE_DELAYS = ((0.0, 0.15), (0.15, 0.8), (0.8, 3.0))
EARLY_EVENTS = 0.3  # the share of events emitted at the run's planned start, row or not


@dataclass
class Job:
    """One run the soak submits, and what its inputs decide."""

    number: int
    kind: str
    reactor: str
    client: str
    key: str
    inputs: dict[str, Any]
    at: float  # seconds after the start of submissions
    expected: str  # completed, failed, needs_attention or halted
    expected_step: str | None = None  # the step whose planned failure fails the run
    expected_rollback_failures: int = 0
    approve: bool | None = None  # interrupts: the payload's decision


def keyed_bursts(rng: random.Random, runs: int, spread: float) -> list[tuple[str, float]]:
    """The tenants and submission times of ``runs`` runs of ``KeyedBackground``: each tenant's
    runs in bursts of twice the limit, each burst within ``KEYED_BURST`` seconds at a random
    moment, so that runs of a tenant queue."""
    if not runs:
        return []
    tenants = KEYED_TENANTS[: min(max(runs // (3 * KEYED_LIMIT), 1), len(KEYED_TENANTS))]
    found = []
    for number, tenant in enumerate(tenants):
        mine = runs // len(tenants) + (number < runs % len(tenants))
        for first in range(0, mine, 2 * KEYED_LIMIT):
            burst = rng.uniform(0, max(spread - KEYED_BURST, 0.0))
            size = min(2 * KEYED_LIMIT, mine - first)
            found += [(tenant, burst + rng.uniform(0, KEYED_BURST)) for _ in range(size)]
    return found


def make_plan(rng: random.Random, runs: int, spread: float, seed: int) -> list[Job]:
    """``runs`` jobs of every kind, with outcomes and submission times drawn from ``rng``; a
    share of them (``KEYED_SHARE``) runs of ``KeyedBackground`` in bursts per tenant."""
    keyed = round(runs * KEYED_SHARE) if runs >= len(KINDS) + 2 * KEYED_LIMIT else 0
    others = runs - keyed
    kinds = list(KINDS) if others >= len(KINDS) else []
    weights = [k[3] for k in KINDS]
    kinds += rng.choices(KINDS, weights=weights, k=others - len(kinds))
    rng.shuffle(kinds)
    # The clients start their jobs in order: the plan is sorted by submission time.
    slots: list[tuple[tuple[str, str, str, int], float, str]] = sorted(
        [(kind, rng.uniform(0, spread), "") for kind in kinds]
        + [(KEYED_KIND, at, tenant) for tenant, at in keyed_bursts(rng, keyed, spread)],
        key=lambda slot: slot[1],
    )
    jobs = []
    for number, ((kind, reactor, client, _), at, tenant) in enumerate(slots):
        spec: dict[str, Any] = {"pause": round(rng.uniform(0.05, 0.4), 3)}
        inputs: dict[str, Any] = {"spec": spec}
        if tenant:
            inputs["tenant"] = tenant
            spec["pause"] = round(rng.uniform(*KEYED_PAUSE), 3)
        job = Job(
            number=number,
            kind=kind,
            reactor=f"{REACTORS}.{reactor}",
            client=client,
            key=f"chaos-{seed}-{number}",
            inputs=inputs,
            at=round(at, 3),
            expected="completed",
        )
        if reactor in STEPS:
            steps = STEPS[reactor]
            if "locked" in steps:
                inputs["slot"] = rng.randrange(3)
            if reactor in ATOMIC_STEPS:
                # Accounts of this run only: no row lock is shared with another run.
                inputs["accounts"] = {name: f"{seed}-{number}-{name}" for name in ACCOUNTS}
                spec["amount"] = rng.randint(1, 100)
                spec["atomic_pause"] = round(rng.uniform(0.02, 0.08), 3)
            draw = rng.random()
            if draw >= 0.6:
                at_index = (
                    rng.randrange(len(steps)) if draw < 0.85 else rng.randrange(1, len(steps))
                )
                spec["fail_at"] = steps[at_index]
                job.expected, job.expected_step = "failed", steps[at_index]
                if draw >= 0.85:
                    before = steps[:at_index]
                    spec["undo_fail"] = rng.sample(before, rng.randint(1, len(before)))
                    job.expected = "needs_attention"
                    job.expected_rollback_failures = len(spec["undo_fail"])
        elif reactor == "FanOut":
            size = rng.randint(6, 10)
            inputs["items"] = list(range(size))
            spec["element_pause"] = round(rng.uniform(0.04, 0.15), 3)
            draw = rng.random()
            if 0.55 <= draw < 0.75:
                spec["fail_element"] = rng.randrange(size)
                job.expected, job.expected_step = "failed", "ticks"
            elif draw >= 0.75:
                spec["fail_at"] = "after"
                job.expected, job.expected_step = "failed", "after"
                if draw >= 0.88:
                    spec["element_undo_fail"] = rng.randrange(size)
                    job.expected_rollback_failures = 1
                    if rng.random() < 0.5:
                        spec["undo_fail"] = ["a"]
                        job.expected_rollback_failures = 2
                    job.expected = "needs_attention"
        elif kind in RACING_KINDS:  # delivered to at a random moment: always approved
            job.approve = True
            if kind == "event_background":
                inputs["order"] = job.key  # what the event's key must equal
        else:  # an interrupt resumed once paused
            job.approve = rng.random() < 0.75
            job.expected = "completed" if job.approve else "halted"
        jobs.append(job)
    return jobs


# ---------------------------------------------------------------------------- client processes


def client_main(role: str, plan_path: Path) -> int:
    """The submitter or the inline caller: start this role's runs at their planned times.

    A job whose run exists already (a previous incarnation started it before it was killed) is
    skipped: the engine must finish that run. A start that raises is tried again (the same
    idempotency key) until the run exists, as a client would.
    """
    import django

    django.setup()
    from django.db import connections
    from django.utils.module_loading import import_string

    from django_reactor.models import Execution

    def say(message: str) -> None:
        """One line of the client's log."""
        print(f"[{time.strftime('%H:%M:%S')} {role} {os.getpid()}] {message}", flush=True)

    plan = json.loads(plan_path.read_text())
    jobs = [job for job in plan["jobs"] if job["client"] == role]
    say(f"started: {len(jobs)} jobs")
    for job in jobs:
        delay = plan["t0"] + job["at"] - time.time()
        if delay > 0:
            time.sleep(delay)  # the schedule, not synchronisation
        reactor = import_string(job["reactor"])
        for attempt in range(1, 21):
            try:
                existing = (
                    Execution.objects.filter(reactor=job["reactor"], idempotency_key=job["key"])
                    .values_list("id", flat=True)
                    .first()
                )
                if existing is not None:
                    say(f"job {job['key']}: its run exists already; skipped")
                    break
                say(f"job {job['key']}: starting {job['reactor']}")
                outcome = reactor.run(job["inputs"], idempotency_key=job["key"])
                say(
                    f"job {job['key']}: execution {outcome.execution_id} "
                    f"{type(outcome).__name__} {getattr(outcome, 'status', '')}"
                )
                break
            except Exception as exc:
                say(
                    f"job {job['key']}: attempt {attempt} raised {type(exc).__name__}: {exc}\n"
                    + traceback.format_exc()
                )
                connections.close_all()
                time.sleep(min(0.3 * attempt, 2.0))
    say("done")
    connections.close_all()
    return 0


# ---------------------------------------------------------------------------- the database


def connect(database: str, application_name: str = "chaos_driver") -> Any:
    """An autocommit psycopg connection to ``database`` on the soak's server."""
    import psycopg

    return psycopg.connect(
        f"{PG_SERVER}/{database}",
        autocommit=True,
        application_name=application_name,
        connect_timeout=5,
    )


class Db:
    """The driver's own connection (``application_name`` chaos_driver: never terminated)."""

    def __init__(self, database: str) -> None:
        self.database = database
        self.connection: Any = None

    def rows(self, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
        """Run ``sql``; reconnect and try again (bounded) when the connection broke."""
        import psycopg

        for attempt in range(5):
            try:
                if self.connection is None or self.connection.closed:
                    self.connection = connect(self.database)
                with self.connection.cursor() as cursor:
                    cursor.execute(sql, params)
                    return list(cursor.fetchall()) if cursor.description else []
            except psycopg.OperationalError:
                self.connection = None
                if attempt == 4:
                    raise
                time.sleep(0.5)
        return []

    def close(self) -> None:
        """Close the connection."""
        if self.connection is not None:
            with contextlib.suppress(Exception):
                self.connection.close()


LEDGER_TABLES = """
CREATE TABLE IF NOT EXISTS chaos_ledger (
    id bigserial PRIMARY KEY,
    execution_id uuid NOT NULL,
    step text NOT NULL,
    action text NOT NULL,
    key text NOT NULL,
    attempt integer NOT NULL DEFAULT 0,
    map_id uuid,
    element integer,
    note text NOT NULL DEFAULT '',
    checkpointed boolean NOT NULL,
    pid integer NOT NULL,
    role text NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE IF NOT EXISTS chaos_account (
    name text PRIMARY KEY,
    execution_key text NOT NULL,
    balance bigint NOT NULL
);
CREATE TABLE IF NOT EXISTS chaos_transfer (
    id bigserial PRIMARY KEY,
    execution_id uuid NOT NULL,
    step text NOT NULL,
    action text NOT NULL,
    key text NOT NULL,
    source text NOT NULL REFERENCES chaos_account (name),
    target text NOT NULL REFERENCES chaos_account (name),
    amount bigint NOT NULL,
    pid integer NOT NULL,
    role text NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE IF NOT EXISTS chaos_lock (
    id bigserial PRIMARY KEY,
    execution_id uuid NOT NULL,
    step text NOT NULL,
    lock_key text NOT NULL,
    fence bigint,
    pid integer NOT NULL,
    role text NOT NULL,
    entered_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    exited_at timestamptz
);
CREATE TABLE IF NOT EXISTS chaos_keyed (
    id bigserial PRIMARY KEY,
    execution_id uuid NOT NULL,
    step text NOT NULL,
    tenant text NOT NULL,
    pid integer NOT NULL,
    role text NOT NULL,
    own_status text,
    holding uuid[] NOT NULL,
    entered_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    exited_at timestamptz
);
"""


# ---------------------------------------------------------------------------- runs in flight


class InFlightMonitor(threading.Thread):
    """Counts each concurrency key's runs in flight (and queued) in the database every
    ``MONITOR_PERIOD`` seconds while the soak runs; keeps the highest counts seen and each span
    of counts over the limit (one entry per key and span, with every run it counted)."""

    def __init__(self, database: str, reactor: str) -> None:
        super().__init__(name="in-flight-monitor", daemon=True)
        self.db = Db(database)
        self.reactor = reactor
        self.stop_event = threading.Event()
        self.samples = 0
        self.holding = Counter[str]()  # the most runs in flight seen, by key
        self.queued = Counter[str]()  # the most runs queued at once seen, by key
        self.over: list[dict[str, Any]] = []
        self.open: dict[str, dict[str, Any]] = {}  # the span over the limit going on, by key
        self.error = ""

    def run(self) -> None:
        """Count until stopped; a failed count is noted and the next one tried."""
        try:
            while not self.stop_event.wait(MONITOR_PERIOD):
                try:
                    self.count()
                except Exception:
                    self.error = traceback.format_exc()[-600:]
        finally:
            self.db.close()

    def count(self) -> None:
        """One count of every key's runs in flight and queued, in one statement."""
        rows = self.db.rows(
            "SELECT concurrency_key, count(*) FILTER (WHERE status = ANY(%s)), "
            "count(*) FILTER (WHERE status = 'queued'), "
            "array_agg(id::text ORDER BY created_at) FILTER (WHERE status = ANY(%s)), "
            "clock_timestamp() FROM django_reactor_execution "
            "WHERE reactor = %s AND status = ANY(%s) GROUP BY concurrency_key",
            [list(HOLDING), list(HOLDING), self.reactor, [*HOLDING, "queued"]],
        )
        self.samples += 1
        over = set()
        for key, holding, queued, runs, at in rows:
            self.holding[key] = max(self.holding[key], holding)
            self.queued[key] = max(self.queued[key], queued)
            if holding <= KEYED_LIMIT:
                continue
            over.add(key)
            span = self.open.get(key)
            if span is None:
                span = self.open[key] = {"key": key, "at": at.timestamp(), "most": 0, "runs": []}
                self.over.append(span)
            span["most"] = max(span["most"], holding)
            span["runs"] += [run for run in runs if run not in span["runs"]]
        for key in set(self.open) - over:
            del self.open[key]


# ---------------------------------------------------------------------------- HTTP resumes


@dataclass
class Exchange:
    """One resume request and its answer."""

    label: str
    key: str
    status: int  # 0: no answer (connection error)
    code: str
    replayed: bool
    at: float
    detail: str = ""
    retry_after: bool = False  # the answer said to try again (Retry-After)
    replay: bool | None = None  # events: the body's "replay"
    outcome: str = ""  # what the answer says happened: kept, dispatched, given, resumed...


@dataclass
class ResumeRecord:
    """What the resumer did for one run it delivers to."""

    key: str
    kind: str = ""
    execution_id: str = ""
    exchanges: list[Exchange] = field(default_factory=list)
    first: Exchange | None = None
    repeat: Exchange | None = None
    other: Exchange | None = None
    fire_at: float | None = None  # racing kinds: epoch seconds of the first delivery
    status_seen: str = ""  # the run's status when its first delivery went out ('' : no row)
    started: bool = False
    done: bool = False
    problem: str = ""


FINAL_ANSWERS = {200, 202, 400, 410, 413, 422}


class Resumer(threading.Thread):
    """Delivers to every interrupt, receive and event wait over HTTP, as a partner's system
    would: to an interrupt run once it is paused; to the racing kinds at a random moment once
    its row exists (an event even before, at the run's planned start), each run's deliveries
    in a thread of their own so that one run's retries do not hold up another's."""

    def __init__(self, soak: Soak, jobs: list[Job], t0: float) -> None:
        super().__init__(name="resumer", daemon=True)
        self.soak = soak
        self.jobs = {job.key: job for job in jobs}
        self.records = {job.key: ResumeRecord(job.key, job.kind) for job in jobs}
        self.rng = random.Random(soak.args.seed + 2)
        for job in jobs:
            if job.kind == "event_background" and self.rng.random() < EARLY_EVENTS:
                self.records[job.key].fire_at = t0 + job.at + self.rng.uniform(0.0, 0.3)
        self.stop_event = threading.Event()
        self.db = Db(soak.database)
        self.threads: list[threading.Thread] = []
        self.error = ""

    def pending(self) -> int:
        """How many runs still wait for their deliveries."""
        return sum(1 for record in self.records.values() if not record.done)

    def run(self) -> None:
        """Poll for the runs' rows and statuses; start each run's deliveries when due."""
        try:
            while not self.stop_event.is_set() and self.pending():
                keys = [key for key, record in self.records.items() if not record.started]
                rows = self.db.rows(
                    "SELECT idempotency_key, id, status FROM django_reactor_execution "
                    "WHERE parent_id IS NULL AND idempotency_key = ANY(%s)",
                    [keys],
                )
                found = {key: (str(execution_id), status) for key, execution_id, status in rows}
                now = time.time()
                for key in keys:
                    record, job = self.records[key], self.jobs[key]
                    execution_id, status = found.get(key, ("", ""))
                    record.execution_id = execution_id or record.execution_id
                    if job.kind in RACING_KINDS:
                        if record.fire_at is None and execution_id:
                            record.fire_at = now + self.rng.uniform(*self.rng.choice(RACE_DELAYS))
                        due = record.fire_at is not None and now >= record.fire_at
                        # A message or an interrupt delivery names the run: its row must exist.
                        if due and (execution_id or job.kind == "event_background"):
                            self.start_delivery(job, record, status)
                    elif status == "paused":
                        self.start_delivery(job, record, status)
                    elif status in FINAL:
                        record.started = record.done = True
                        record.problem = f"the run ended {status} without a delivery"
                    if self.stop_event.is_set():
                        return
                self.stop_event.wait(0.1)  # the polling period of a client, not a barrier
        except Exception:
            self.error = traceback.format_exc()
        finally:
            self.db.close()

    def join_all(self, timeout: float) -> None:
        """Wait (bounded) for the poller and every delivery thread."""
        deadline = time.monotonic() + timeout
        self.join(timeout=timeout)
        for thread in self.threads:
            thread.join(timeout=max(deadline - time.monotonic(), 0.1))

    def start_delivery(self, job: Job, record: ResumeRecord, status: str) -> None:
        """Start the run's three deliveries in a thread of their own."""
        record.started = True
        record.status_seen = status
        thread = threading.Thread(
            target=self.deliver, args=(job, record), name=f"deliver-{job.key}", daemon=True
        )
        self.threads.append(thread)
        thread.start()

    def deliver(self, job: Job, record: ResumeRecord) -> None:
        """The three deliveries: the payload, the same again (a replay), another payload."""
        try:
            self._deliver(job, record)
        except Exception:
            record.problem = "the delivery raised: " + traceback.format_exc()[-600:]
        finally:
            record.done = True

    def _deliver(self, job: Job, record: ResumeRecord) -> None:
        base = self.soak.web_url + "/reactor"
        payloads: list[dict[str, Any]] = [
            {"approved": job.approve, "nonce": f"{job.key}-{n}"} for n in "AB"
        ]
        first: dict[str, Any]
        other: dict[str, Any]
        if job.kind == "event_background":
            url = f"{base}/events/{DECISION}/"
            first, other = (
                {"payload": p, "key": job.key, "event_id": p["nonce"]} for p in payloads
            )
        elif job.kind == "message_background":
            url = f"{base}/executions/{record.execution_id}/messages/{DECISION}/"
            first, other = payloads
        else:
            url = f"{base}/executions/{record.execution_id}/resume/"
            first, other = ({"step": "approval", "payload": p} for p in payloads)
        record.first = self.until_final(record, "first", url, first, f"{job.key}-A")
        if record.first is None:
            record.problem = "no final answer to the first delivery"
            return
        record.repeat = self.until_final(record, "repeat", url, first, f"{job.key}-A")
        record.other = self.until_final(record, "other", url, other, f"{job.key}-B")

    def until_final(
        self, record: ResumeRecord, label: str, url: str, body: dict[str, Any], key: str
    ) -> Exchange | None:
        """POST one delivery until it gets a final answer (bounded, 90 s), as a client retries:
        a 409 without Retry-After is final (the product stores it for replays), one with it
        (busy, not waiting yet, in flight) is not."""
        from django_reactor.api.signatures import sign
        from tests.chaos import WEBHOOK_SECRET

        data = json.dumps(body, sort_keys=True).encode()
        deadline = time.monotonic() + 90
        while not self.stop_event.is_set() and time.monotonic() < deadline:
            headers = {
                **sign(WEBHOOK_SECRET, f"msg_{key}", data),
                "Content-Type": "application/json",
                "Idempotency-Key": key,
            }
            request = urllib.request.Request(url, data=data, headers=headers, method="POST")
            retry_after = 0.5
            try:
                with urllib.request.urlopen(request, timeout=30) as response:
                    exchange = self._exchange(label, key, response.status, response)
            except urllib.error.HTTPError as error:
                exchange = self._exchange(label, key, error.code, error)
                retry_after = min(float(error.headers.get("Retry-After") or 0.5), 2.0)
            except (OSError, urllib.error.URLError) as error:
                exchange = Exchange(label, key, 0, "", False, time.time(), repr(error)[:200])
            record.exchanges.append(exchange)
            final = exchange.status in FINAL_ANSWERS or (
                exchange.status == 409 and not exchange.retry_after
            )
            if final:
                return exchange
            self.stop_event.wait(retry_after)  # a client's backoff before it tries again
        return None

    @staticmethod
    def _exchange(label: str, key: str, status: int, response: Any) -> Exchange:
        raw = response.read()
        try:
            payload = json.loads(raw or b"{}")
        except ValueError:
            payload = {}
        if not isinstance(payload, dict):
            payload = {}
        code = payload.get("code", "")
        replayed = response.headers.get("Idempotent-Replayed") == "true"
        detail = raw[:200].decode(errors="replace") if status >= 300 else ""
        outcome = ""
        if "replay" in payload:  # an event: what it did
            parts = [name for name in ("given", "resumed") if payload.get(name)]
            outcome = "+".join(parts) or "taken by none"
        elif "kept" in str(payload.get("detail", "")) or "records this payload" in str(
            payload.get("detail", "")
        ):
            outcome = "kept"
        elif "a worker runs" in str(payload.get("detail", "")):
            outcome = "dispatched"
        return Exchange(
            label,
            key,
            status,
            str(code),
            replayed,
            time.time(),
            detail,
            retry_after=bool(response.headers.get("Retry-After")),
            replay=payload.get("replay") if isinstance(payload.get("replay"), bool) else None,
            outcome=outcome,
        )


# ---------------------------------------------------------------------------- the soak


@dataclass
class Fault:
    """One fault the soak injected."""

    kind: str
    at: float  # epoch seconds
    target: str
    detail: str = ""
    hit: int = 1  # how many processes or backends it hit
    restored_at: float | None = None


@dataclass
class Stall:
    """A process the soak stopped inside an atomic step's transaction (``atomic_stall``)."""

    proc: Proc
    role: str
    execution_id: str
    step: str
    action: str
    fence: int | None  # the run's fence when it stopped (its session's application_name)
    session: int | None  # the backend of that session
    stopped_at: float  # epoch seconds
    until: float  # monotonic: woken by then at the latest
    ended_at: float | None = None  # epoch seconds: its session was gone (ended by a takeover)
    woken_at: float | None = None
    fence_at_wake: int | None = None
    died: bool = False  # gone before it was woken

    def summary(self) -> dict[str, Any]:
        """What the report says about it."""
        ended = None if self.ended_at is None else round(self.ended_at - self.stopped_at, 1)
        woken = None if self.woken_at is None else round(self.woken_at - self.stopped_at, 1)
        return {
            "pid": self.proc.pid,
            "role": self.role,
            "execution_id": self.execution_id,
            "step": self.step,
            "action": self.action,
            "fence": self.fence,
            "fence_at_wake": self.fence_at_wake,
            "session": self.session,
            "session_ended_after_s": ended,
            "woken_after_s": woken,
            "died": self.died,
        }


class Soak:
    """Starts everything, runs the plan under faults, checks the invariants, cleans up."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rng = random.Random(args.seed)
        self.fault_rng = random.Random(args.seed + 1)
        self.database = f"chaos_{os.getpid()}"
        self.queue = f"chaos-{os.getpid()}"
        self.logs = Path(tempfile.mkdtemp(prefix="chaos-soak-"))
        self.redis_port = free_port()
        self.web_port = free_port()
        self.web_url = f"http://127.0.0.1:{self.web_port}"
        self.children: list[Child] = []  # every incarnation, for the clean-up
        self.workers: list[Child] = []
        self.redis: Child | None = None
        self.sweeper: Child | None = None
        self.web: Child | None = None
        self.clients: dict[str, Child] = {}
        self.clients_done: set[str] = set()
        self.orphans: list[tuple[float, Child]] = []  # killed workers whose orphans to reap
        self.plan_path = self.logs / "plan.json"
        self.faults: list[Fault] = []
        self.exits: list[dict[str, Any]] = []  # processes that exited by themselves
        self.redis_restart_at: float | None = None
        self.counter = Counter[str]()
        self.jobs: list[Job] = []
        self.resumer: Resumer | None = None
        self.monitor: InFlightMonitor | None = None
        self.t0 = 0.0  # epoch seconds: the plan's start of submissions
        self.db: Db | None = None
        self.database_created = False
        self.timeline: dict[str, float] = {}
        self.next_lock_sample = 0.0
        self.lock_watch: dict[tuple[str, str], dict[str, Any]] = {}  # locks of ended runs
        self.stall_dir = self.logs / "stall"  # atomic_stall's request and answers
        self.stall_dir.mkdir()
        self.stall: Stall | None = None  # the process stopped now
        self.next_stall_check = 0.0
        self.stalls: list[Stall] = []  # every one, for the report
        self.sought_misses = Counter[str]()  # tries of a kind that found no target

    # -- environment ------------------------------------------------------------------------

    def reactor_settings(self) -> dict[str, Any]:
        """django_reactor's settings of every soak process."""
        redis = f"redis://127.0.0.1:{self.redis_port}"
        return {
            "CELERY_QUEUE": self.queue,
            "COORDINATION_BACKEND": "django_reactor.coordination.backends.redis.RedisBackend",
            "COORDINATION_REDIS": f"{redis}/1",
            "COORDINATION_KEY_PREFIX": KEY_PREFIX,
            "REDIS_URL": f"{redis}/2",
            "LEASE_SECONDS": LEASE_SECONDS,
            "ATOMIC_STEP_TIMEOUT": ATOMIC_STEP_TIMEOUT,
            "MAX_RECOVERY_ATTEMPTS": 10,
            "SWEEP_INTERVAL": 1.0,
            "REDISPATCH_AFTER": 4.0,
            "IDEMPOTENCY_WAIT_SECONDS": 5.0,
            "CONTENTION_DELAY": 0.5,
            "ASYNC_POLL_INTERVAL": 1.0,
        }

    def env(self, role: str) -> dict[str, str]:
        """The environment of a soak process of ``role``."""
        env = {
            key: value
            for key, value in os.environ.items()
            if not key.startswith(("REACTOR_", "DJANGO_", "CELERY_"))
            and key not in ("DATABASE_URL", "REDIS_URL")
        }
        env.update(
            {
                "DJANGO_SETTINGS_MODULE": SETTINGS_MODULE,
                "DATABASE_URL": f"{PG_SERVER}/{self.database}",
                "CELERY_BROKER_URL": f"redis://127.0.0.1:{self.redis_port}/0",
                "REACTOR_SETTINGS_JSON": json.dumps(self.reactor_settings()),
                "CHAOS_ROLE": role,
                "CHAOS_LEDGER_URL": f"{PG_SERVER}/{self.database}",
                "CHAOS_STALL_DIR": str(self.stall_dir),
                "PYTHONPATH": str(REPO_ROOT),
                "PYTHONUNBUFFERED": "1",
            }
        )
        return env

    def spawn(self, name: str, role: str, command: list[str]) -> Child:
        """Start a soak process (a new incarnation of ``name``)."""
        self.counter[f"incarnation:{name}"] += 1
        number = self.counter[f"incarnation:{name}"]
        child = Child(f"{name}-{number}", role, command, self.env(role), self.logs)
        self.children.append(child)
        return child.start()

    def manage(self, *arguments: str) -> list[str]:
        """A ``manage.py`` command line."""
        return [sys.executable, str(REPO_ROOT / "manage.py"), *arguments]

    # -- starting -----------------------------------------------------------------------------

    def setup(self) -> None:
        """Create and migrate the database; start Redis, the workers, the sweeper, the web."""
        import psycopg
        from psycopg import sql

        if shutil.which("redis-server") is None:
            raise SoakError("redis-server is not on the PATH")
        with connect("postgres") as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(self.database)))
        self.database_created = True
        log(f"database {self.database}; logs in {self.logs}")
        migrate = subprocess.run(
            self.manage("migrate", "--noinput", "-v", "0"),
            env=self.env("setup"),
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=180,
        )
        if migrate.returncode != 0:
            raise SoakError(f"migrate failed:\n{migrate.stdout}\n{migrate.stderr}")
        with psycopg.connect(f"{PG_SERVER}/{self.database}", autocommit=True) as conn:
            conn.execute(LEDGER_TABLES)
        self.db = Db(self.database)
        self.start_redis()
        self.wait_redis(timeout=15)
        for index in range(self.args.workers):
            self.workers.append(self.start_worker(index))
        self.sweeper = self.start_sweeper()
        self.web = self.start_web()
        for worker in self.workers:
            wait_for(
                lambda w=worker: "ready." in w.log() or not w.alive(),  # type: ignore[misc]
                60,
                f"worker {worker.name} to start",
            )
            if not worker.alive():
                raise SoakError(f"worker {worker.name} exited at start:\n{worker.log()[-3000:]}")
        wait_for(self.web_answers, 60, "the web process to answer")

    def start_redis(self) -> None:
        """Start the soak's own redis-server."""
        self.redis = self.spawn(
            "redis",
            "redis",
            [
                "redis-server", "--port", str(self.redis_port), "--bind", "127.0.0.1",
                "--save", "", "--appendonly", "no", "--daemonize", "no",
                "--dir", str(self.logs), "--maxmemory-policy", "noeviction",
            ],
        )  # fmt: skip

    def redis_client(self, db: int = 0) -> Any:
        """A client of the soak's Redis that fails at once when it is down (redis-py's default
        retries would take about 4 s, and stretch the planned outages)."""
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        return redis.Redis(
            host="127.0.0.1",
            port=self.redis_port,
            db=db,
            socket_timeout=2,
            socket_connect_timeout=1,
            retry=Retry(NoBackoff(), 0),
        )

    def redis_up(self) -> bool:
        """Whether the soak's Redis answers."""
        try:
            client = self.redis_client()
            try:
                return bool(client.ping())
            finally:
                client.close()
        except Exception:
            return False

    def wait_redis(self, timeout: float) -> None:
        """Wait (bounded polling) until the soak's Redis answers."""
        wait_for(self.redis_up, timeout, "redis-server to answer")

    def start_worker(self, index: int) -> Child:
        """Start a Celery prefork worker (-c 2) on the soak's queue."""
        self.counter["worker_numbers"] += 1
        command = [
            sys.executable, "-m", "celery", "-A", "testproject", "worker",
            "-P", "prefork", "-c", "2", "-Q", self.queue,
            "-n", f"chaos{self.counter['worker_numbers']}-{os.getpid()}@%h",
            "--without-mingle", "--without-gossip", "--without-heartbeat", "-l", "INFO",
        ]  # fmt: skip
        return self.spawn(f"worker{index}", "worker", command)

    def start_sweeper(self) -> Child:
        """Start the sweeper loop."""
        return self.spawn(
            "sweeper", "sweeper", self.manage("reactor_sweep", "--loop", "--interval", "1")
        )

    def start_web(self) -> Child:
        """Start the web process (runserver, no reloader)."""
        return self.spawn(
            "web",
            "web",
            self.manage("runserver", f"127.0.0.1:{self.web_port}", "--noreload", "--skip-checks"),
        )

    def start_client(self, role: str, plan_path: Path) -> Child:
        """Start the submitter or the inline caller."""
        command = [sys.executable, str(Path(__file__).resolve()), "--client", role, str(plan_path)]
        child = self.spawn(role, role, command)
        self.clients[role] = child
        return child

    def web_answers(self) -> bool:
        """Whether the web process answers HTTP."""
        try:
            with urllib.request.urlopen(f"{self.web_url}/reactor/executions/", timeout=5):
                return True
        except urllib.error.HTTPError:
            return True  # 401/403: it answers
        except OSError:
            return False

    # -- supervision ------------------------------------------------------------------------

    def exited(self, child: Child, what: str) -> None:
        """Record a process that exited by itself, with where its last traceback points."""
        entry = {
            "process": child.name,
            "role": child.role,
            "returncode": child.returncode(),
            "at": time.time(),
            "what": what,
            "where": project_frames(child.tail(80)),
            "log_tail": child.tail(12),
        }
        self.exits.append(entry)
        log(f"{child.name} exited by itself ({child.returncode()}): {what}")

    def held_locks(self) -> dict[str, tuple[str, int]]:
        """The lock keys held in the soak's Redis now: key -> (owner, milliseconds left)."""
        client = self.redis_client(1)
        try:
            found = {}
            for raw in client.scan_iter(match=f"{KEY_PREFIX}:lock:*", count=500):
                name = raw.decode()
                if name.endswith(":fence"):
                    continue
                owner = client.hget(raw, "owner")
                found[name] = ((owner or b"").decode(), int(client.pttl(raw)))
            return found
        finally:
            client.close()

    def sample_locks(self) -> None:
        """Every 2 s, note each lock still held by a run that has ended. A lock outlives its
        ttl only while it is extended, so a lock a run forgot to release may be gone by the end:
        sampling catches it while it blocks others."""
        now = time.monotonic()
        if now < self.next_lock_sample or self.db is None or self.redis_restart_at is not None:
            return
        self.next_lock_sample = now + 2.0
        try:
            held = self.held_locks()
        except Exception:
            return  # Redis is down (a planned outage): nothing is held
        if not held:
            return
        owners = sorted({owner.removeprefix("run:") for owner, _ in held.values()})
        rows = self.db.rows(
            "SELECT id::text, status, extract(epoch FROM finished_at) "
            "FROM django_reactor_execution WHERE id::text = ANY(%s)",
            [owners],
        )
        ended = {row[0]: (row[1], float(row[2]) if row[2] is not None else None) for row in rows}
        seen_at = time.time()
        for name, (owner, ttl) in held.items():
            status, finished = ended.get(owner.removeprefix("run:"), ("unknown", None))
            if status in ACTIVE:
                continue
            entry = self.lock_watch.setdefault(
                (name, owner),
                {"lock": name, "owner": owner, "status": status, "finished_at": finished,
                 "first_seen": seen_at, "ttl_ms_first": ttl},
            )  # fmt: skip
            entry.update(last_seen=seen_at, ttl_ms_last=ttl)

    def restore_redis(self) -> None:
        """Start Redis again when its planned outage is over (or when it died by itself)."""
        if self.redis is None or self.redis.alive():
            return
        now = time.monotonic()
        if self.redis_restart_at is None:
            self.exited(self.redis, "redis-server exited")
            self.redis_restart_at = now
        if now >= self.redis_restart_at:
            self.start_redis()
            with contextlib.suppress(SoakError):
                self.wait_redis(timeout=10)
            for fault in reversed(self.faults):
                if fault.kind == "redis_restart" and fault.restored_at is None:
                    fault.restored_at = time.time()
            self.redis_restart_at = None

    def supervise(self) -> None:
        """Bring back what died by itself (and what the faults killed), as a supervisor would."""
        now = time.monotonic()
        for deadline, dead in list(self.orphans):
            if now >= deadline:
                dead.reap()
                self.orphans.remove((deadline, dead))
        self.restore_redis()
        self.tend_stall()
        self.sample_locks()
        for index, worker in enumerate(self.workers):
            if not worker.alive():
                if not worker.killed:
                    self.exited(worker, "worker exited")
                    self.orphans.append((now + REAP_AFTER, worker))
                self.workers[index] = self.start_worker(index)
        if self.sweeper is not None and not self.sweeper.alive():
            self.exited(self.sweeper, "sweeper loop exited")
            self.sweeper = self.start_sweeper()
        if self.web is not None and not self.web.alive():
            self.exited(self.web, "web process exited")
            self.web = self.start_web()
        for role, client in list(self.clients.items()):
            if role in self.clients_done or client.alive():
                continue
            if client.returncode() == 0 and not client.killed:
                self.clients_done.add(role)
                continue
            if not client.killed:
                self.exited(client, f"{role} exited")
            if self.counter[f"incarnation:{role}"] < 60:
                self.start_client(role, self.plan_path)

    # -- faults -------------------------------------------------------------------------------

    def inject(self, kind: str) -> Fault | None:
        """Inject one fault of ``kind`` (or a substitute when it cannot be injected now)."""
        if kind == "caller_kill" and (
            "caller" in self.clients_done
            or not self.caller_alive()
            or self.stalled(self.clients["caller"].pid)
        ):
            kind = "pg_terminate"
        if kind == "redis_restart" and self.redis_restart_at is not None:
            kind = "child_kill"
        if kind == "atomic_stall" and self.stall is not None:
            kind = "body_cut"  # one stopped process at a time
        # Most kills aim at a process that is inside a step body right now (a ledger row in the
        # last moment), the others at any process: idle ones are the easy case.
        aim = self.fault_rng.random() < BUSY_AIM
        if kind == "worker_kill":
            # Not the worker of a stopped process: its orphans would be reaped with it.
            indexes = [
                i
                for i, w in enumerate(self.workers)
                if self.ready(w) and not any(self.stalled(pid) for pid in children_pids(w.pid))
            ]
            if not indexes:
                return None
            hot = self.poll_busy(
                aim,
                lambda busy: [i for i in indexes if busy & set(children_pids(self.workers[i].pid))],
            )
            index = self.fault_rng.choice(hot or indexes)
            worker = self.workers[index]
            worker.kill()
            self.orphans.append((time.monotonic() + REAP_AFTER, worker))
            self.workers[index] = self.start_worker(index)
            state = "busy" if hot else "any"
            return Fault(kind, time.time(), worker.name, f"main pid {worker.pid} ({state})", 1)
        if kind == "child_kill":
            candidates = [
                (w, pid)
                for w in self.workers
                if self.ready(w)
                for pid in children_pids(w.pid)
                if not self.stalled(pid)
            ]
            if not candidates:
                return None
            hot = self.poll_busy(
                aim, lambda busy: [(w, pid) for w, pid in candidates if pid in busy]
            )
            worker, pid = self.fault_rng.choice(hot or candidates)
            proc = Proc.of(pid)
            if proc is None or not proc.kill():
                return None
            state = "busy" if hot else "any"
            return Fault(kind, time.time(), worker.name, f"pool child pid {pid} ({state})", 1)
        if kind == "pg_terminate":
            return self.terminate_backends()
        if kind == "body_cut":
            return self.cut_bodies()
        if kind == "atomic_stall":
            return self.stall_atomic()
        if kind == "redis_restart":
            assert self.redis is not None
            outage = round(self.fault_rng.uniform(1.0, 6.0), 2)
            self.redis.kill()
            self.redis_restart_at = time.monotonic() + outage
            return Fault(kind, time.time(), self.redis.name, f"outage {outage} s", 1)
        if kind == "sweeper_kill":
            return self.kill_sweeper(aim)
        if kind == "caller_kill":
            caller = self.clients["caller"]
            hot = bool(self.poll_busy(aim, lambda busy: [caller.pid] if caller.pid in busy else []))
            caller.kill()
            self.start_client("caller", self.plan_path)
            state = "busy" if hot else "any"
            return Fault(kind, time.time(), caller.name, f"pid {caller.pid} ({state})", 1)
        return None

    def kill_sweeper(self, aim: bool) -> Fault | None:
        """SIGKILL the sweeper loop (when ``aim``, once its connection is at work: inside a
        sweep, such as an admission of queued runs; polls up to 1.5 s) and start another."""
        sweeper = self.sweeper
        if sweeper is None or not sweeper.alive():
            return None
        hot = False
        deadline = time.monotonic() + 1.5
        while aim and not hot and time.monotonic() < deadline:
            hot = bool(self.backends("sweeper", active=True))
            if not hot:
                self.restore_redis()
                time.sleep(0.02)
        sweeper.kill()
        sweeper.reap()
        self.sweeper = self.start_sweeper()
        state = "busy" if hot else "any"
        return Fault("sweeper_kill", time.time(), sweeper.name, f"pid {sweeper.pid} ({state})", 1)

    def ready(self, worker: Child) -> bool:
        """Whether ``worker`` lives and has said it is ready (it consumes tasks)."""
        if not worker.alive():
            return False
        if not worker.is_ready:
            worker.is_ready = "ready." in worker.log()
        return worker.is_ready

    def poll_busy(self, aim: bool, targets: Callable[[set[int]], list[Any]]) -> list[Any]:
        """When ``aim``, poll (bounded, 3 s) until ``targets(busy pids)`` finds a target."""
        if not aim:
            return []
        deadline = time.monotonic() + 3.0
        while True:
            found = targets(self.busy_pids())
            if found or time.monotonic() > deadline:
                return found
            self.restore_redis()  # an outage must not outlast its plan while we aim
            time.sleep(0.05)

    def busy_pids(self, within: float = 0.3) -> set[int]:
        """PIDs that started a step body, element or undo in the last ``within`` seconds."""
        assert self.db is not None
        rows = self.db.rows(
            "SELECT DISTINCT pid FROM chaos_ledger WHERE at > clock_timestamp() - %s::interval",
            [f"{within} seconds"],
        )
        return {row[0] for row in rows}

    def caller_alive(self) -> bool:
        """Whether the inline caller runs now."""
        caller = self.clients.get("caller")
        return caller is not None and caller.alive()

    def backends(self, role: str, *, active: bool = False) -> list[int]:
        """Backends of our database with ``application_name`` chaos_<role> (``active``: in a
        statement or a transaction, not idle)."""
        assert self.db is not None
        rows = self.db.rows(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid() "
            "AND application_name = %s AND (NOT %s OR state <> 'idle')",
            [self.database, f"chaos_{role}", active],
        )
        return [row[0] for row in rows]

    def terminate_backends(self) -> Fault | None:
        """``pg_terminate_backend`` of one or all backends of one role, in our database only."""
        assert self.db is not None
        roles = list(TERMINATE_ROLES)
        first = self.fault_rng.choices(roles, weights=list(TERMINATE_ROLES.values()))[0]
        order = [first] + [r for r in self.fault_rng.sample(roles, len(roles)) if r != first]
        aim = self.fault_rng.random() < BUSY_AIM
        for role in order:
            found = []
            if role == first and (aim or role == "web"):  # web: a connection per request only
                deadline = time.monotonic() + 1.5
                while not found and time.monotonic() < deadline:
                    found = self.backends(role, active=True)
                    if not found:
                        self.restore_redis()
                        time.sleep(0.05)
            state = "active" if found else "any"
            found = found or self.backends(role)
            if not found:
                continue
            chosen = found if self.fault_rng.random() < 0.3 else [self.fault_rng.choice(found)]
            # The database is checked again in the statement itself: never another database.
            hit = self.db.rows(
                "SELECT pid, pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE pid = ANY(%s) AND datname = %s AND application_name = %s",
                [chosen, self.database, f"chaos_{role}"],
            )
            terminated = [pid for pid, ok in hit if ok]
            if terminated:
                detail = f"backends {terminated} ({state})"
                return Fault("pg_terminate", time.time(), role, detail, len(terminated))
        return None

    def body_sessions(self) -> list[tuple[int, str]]:
        """Backends of our database inside a step body now: in an atomic step's transaction
        (its ``application_name``), or running a plain body's marked query; never the session
        of the process stopped by ``atomic_stall``."""
        assert self.db is not None
        rows = self.db.rows(
            "SELECT pid, application_name FROM pg_stat_activity WHERE datname = %s "
            "AND pid <> pg_backend_pid() AND (starts_with(application_name, %s) "
            "OR (state = 'active' AND strpos(query, %s) > 0))",
            [self.database, ATOMIC_PREFIX, BODY_MARKER],
        )
        stall = self.stall
        if stall is None:
            return [(pid, name) for pid, name in rows]
        stopped = f"{ATOMIC_PREFIX}{stall.execution_id} "
        return [
            (pid, name)
            for pid, name in rows
            if pid != stall.session and not name.startswith(stopped)
        ]

    def cut_bodies(self) -> Fault | None:
        """``pg_terminate_backend`` of one (or every) backend inside a step body now: its body
        loses the engine's connection mid-way (polls up to 3 s for one, 7 s when it seeks an
        atomic step's first)."""
        assert self.db is not None
        # Half of the cuts seek an atomic step's transaction first (rarer than a plain body's
        # query, and shorter), for up to 4 s; then any body, for up to 3 s.
        seek_atomic = self.fault_rng.random() < 0.5
        start = time.monotonic()
        found = self.body_sessions()
        while time.monotonic() < start + (7.0 if seek_atomic else 3.0):
            atomic = [(pid, name) for pid, name in found if name.startswith(ATOMIC_PREFIX)]
            if atomic and seek_atomic:
                found = atomic
                break
            if found and not (seek_atomic and time.monotonic() < start + 4.0):
                break
            self.restore_redis()
            time.sleep(0.02)
            found = self.body_sessions()
        if not found:
            return None
        chosen = found if self.fault_rng.random() < 0.3 else [self.fault_rng.choice(found)]
        # Checked again in the statement itself: our database, still inside a body.
        hit = self.db.rows(
            "SELECT pid, application_name, pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE pid = ANY(%s) AND datname = %s AND pid <> pg_backend_pid() "
            "AND (starts_with(application_name, %s) OR (state = 'active' AND strpos(query, %s) "
            "> 0))",
            [[pid for pid, _ in chosen], self.database, ATOMIC_PREFIX, BODY_MARKER],
        )
        terminated = [(pid, name) for pid, name, ok in hit if ok]
        if not terminated:
            return None
        kinds = sorted(
            {"atomic" if name.startswith(ATOMIC_PREFIX) else "plain" for _, name in terminated}
        )
        names = [
            f"{pid} {'atomic' if name.startswith(ATOMIC_PREFIX) else name}"
            for pid, name in terminated
        ]
        return Fault("body_cut", time.time(), "+".join(kinds), f"backends {names}", len(terminated))

    # -- atomic_stall ---------------------------------------------------------------------------

    def stalled(self, pid: int) -> bool:
        """Whether ``pid`` is the process stopped by ``atomic_stall`` now."""
        return self.stall is not None and self.stall.proc.pid == pid

    def stall_answer(self) -> dict[str, Any] | None:
        """The note of the body that took the stall request (kept in the logs), if one did."""
        for path in sorted(self.stall_dir.glob("stopped-*")):
            note = json.loads(path.read_text())
            path.rename(self.logs / f"stall-{path.name}.json")
            return dict(note)
        return None

    def stall_atomic(self) -> Fault | None:
        """Ask the next atomic body to stop its process inside its transaction, after its
        writes (:func:`tests.chaos.reactors.stall_if_requested`); note the process, its run and
        its session, for :meth:`tend_stall` to wake it after the takeover."""
        assert self.db is not None
        # The first stall: any atomic body (the next one is almost always a run's debit); then
        # also aimed at a credit (after the debit, in the same process) or an undo.
        target = "any"
        if any(fault.kind == "atomic_stall" for fault in self.faults):
            target = self.fault_rng.choices(["any", "run-credit", "undo"], [4, 3, 3])[0]
        request = self.stall_dir / f"request-{target}"
        with contextlib.suppress(FileExistsError):
            os.close(os.open(request, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
        deadline = time.monotonic() + STALL_FIND
        answer = self.stall_answer()
        while answer is None and time.monotonic() < deadline:
            self.restore_redis()
            time.sleep(0.05)
            answer = self.stall_answer()
        if answer is None:
            try:
                request.unlink()
                log(f"atomic_stall: no atomic body took the request ({target}); withdrawn")
                return None
            except FileNotFoundError:  # taken just now: its answer follows at once
                deadline = time.monotonic() + 5.0
                while answer is None and time.monotonic() < deadline:
                    time.sleep(0.02)
                    answer = self.stall_answer()
            if answer is None:
                return None
        pid = int(answer["pid"])
        proc = Proc.of(pid)
        deadline = time.monotonic() + 2.0
        while proc is not None and proc.alive() and time.monotonic() < deadline:
            state = _stat(pid)
            if state is not None and state[0] == "T":
                break
            time.sleep(0.01)
        execution_id = str(answer["execution_id"])
        sessions = self.db.rows(
            "SELECT pid, application_name FROM pg_stat_activity WHERE datname = %s "
            "AND starts_with(application_name, %s)",
            [self.database, f"{ATOMIC_PREFIX}{execution_id} "],
        )
        session, fence = (None, None)
        if sessions:
            session, name = sessions[0]
            fence = int(name.rsplit(" ", 1)[1])
        stopped_at = time.time()
        if proc is not None:
            self.stall = Stall(
                proc=proc,
                role=str(answer["role"]),
                execution_id=execution_id,
                step=str(answer["step"]),
                action=str(answer["action"]),
                fence=fence,
                session=session,
                stopped_at=stopped_at,
                until=time.monotonic() + STALL_MAX,
            )
            self.stalls.append(self.stall)
        self.next_stall_check = 0.0
        where = f"{answer['step']}.{answer['action']} of execution {execution_id}"
        detail = (
            f"pid {pid} stopped in {where} (session {session}, fence {fence}; asked for {target})"
        )
        return Fault("atomic_stall", stopped_at, str(answer["role"]), detail, 1)

    def tend_stall(self, *, now: bool = False) -> None:
        """Wake the stopped process once its session was ended (by the worker that took its run
        over) and a moment more, or at its bound, or ``now``."""
        stall = self.stall
        if stall is None:
            return
        if not stall.proc.alive():
            stall.died = True
            self.stall = None
            return
        tick = time.monotonic()
        if stall.ended_at is None and tick >= self.next_stall_check:
            self.next_stall_check = tick + 0.3
            assert self.db is not None
            alive = self.db.rows(
                "SELECT 1 FROM pg_stat_activity WHERE pid = %s AND application_name = %s",
                [stall.session, f"{ATOMIC_PREFIX}{stall.execution_id} {stall.fence}"],
            )
            if stall.session is not None and not alive:
                stall.ended_at = time.time()
                stall.until = min(stall.until, tick + STALL_GRACE)
        if not now and tick < stall.until:
            return
        assert self.db is not None
        fences = self.db.rows(
            "SELECT fence FROM django_reactor_execution WHERE id = %s", [stall.execution_id]
        )
        stall.fence_at_wake = int(fences[0][0]) if fences else None
        stall.proc.kill(signal.SIGCONT)
        stall.woken_at = time.time()
        self.stall = None
        for fault in reversed(self.faults):
            if fault.kind == "atomic_stall" and fault.restored_at is None:
                fault.restored_at = stall.woken_at
        log(
            f"atomic_stall: woke pid {stall.proc.pid} after {stall.woken_at - stall.stopped_at:.1f}"
            f" s (session ended: {stall.ended_at is not None}; fence {stall.fence} -> "
            f"{stall.fence_at_wake})"
        )

    def end_stall(self) -> None:
        """Before the settle phase: wait (bounded by the stall's own bound) for the stopped
        process's wake, so that nothing stays stopped."""
        while self.stall is not None:
            self.supervise()
            time.sleep(0.1)

    # -- the run ------------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        """Set up, submit the plan under faults, settle, check: the report."""
        args = self.args
        begin = time.monotonic()
        end = begin + args.seconds
        self.setup()
        ready = time.monotonic()
        self.timeline["setup_s"] = round(ready - begin, 1)
        remaining = end - ready - RESERVE
        if remaining < 20:
            raise SoakError(
                f"--seconds {args.seconds} leaves no time after a {ready - begin:.0f} s setup"
            )
        window = min(max(args.runs * SPACING / 0.85, 15.0), remaining * 0.62)
        spread = window * 0.85
        self.jobs = make_plan(self.rng, args.runs, spread, args.seed)
        t0 = time.time() + 1.0
        self.t0 = t0
        self.plan_path.write_text(
            json.dumps({"t0": t0, "jobs": [asdict(job) for job in self.jobs]}, indent=1)
        )
        self.monitor = InFlightMonitor(self.database, f"{REACTORS}.{KEYED_KIND[1]}")
        self.monitor.start()
        for role in ("submitter", "caller"):
            self.start_client(role, self.plan_path)
        self.open_accounts()
        delivered = [job for job in self.jobs if job.kind in DELIVERED_KINDS]
        self.resumer = Resumer(self, delivered, t0)
        self.resumer.start()
        log(
            f"{args.runs} runs over {spread:.0f} s, at least {args.faults} faults over "
            f"{window:.0f} s, settle until {end - RESERVE - time.monotonic():.0f} s from now"
        )
        self.inject_phase(ready + 1.0, window, ready + remaining * 0.78)
        self.end_stall()
        faults_end = time.monotonic()
        self.timeline["faults_s"] = round(faults_end - ready, 1)
        self.settle(end - RESERVE)
        self.stop_monitor()
        self.timeline["settle_s"] = round(time.monotonic() - faults_end, 1)
        report = self.check()
        self.timeline["total_s"] = round(time.monotonic() - begin, 1)
        report["timeline"] = dict(self.timeline)
        return report

    def stop_monitor(self) -> None:
        """Stop the monitor of the keys' runs in flight (bounded wait)."""
        if self.monitor is not None:
            self.monitor.stop_event.set()
            self.monitor.join(timeout=10)

    def open_accounts(self) -> None:
        """The ``chaos_account`` rows of every atomic run (its own, each INITIAL_BALANCE)."""
        assert self.db is not None
        rows = [
            (name, job.key, INITIAL_BALANCE)
            for job in self.jobs
            for name in job.inputs.get("accounts", {}).values()
        ]
        if rows:
            self.db.rows(
                "INSERT INTO chaos_account (name, execution_key, balance) "
                "SELECT * FROM unnest(%s::text[], %s::text[], %s::bigint[])",
                [list(column) for column in zip(*rows, strict=True)],
            )

    def fault_kinds(self) -> Iterator[str]:
        """Every kind once (in random order), then kinds drawn by weight."""
        kinds = list(FAULT_KINDS)
        schedule = kinds[:] if self.args.faults >= len(kinds) else []
        self.fault_rng.shuffle(schedule)
        yield from schedule
        while True:
            yield self.fault_rng.choices(kinds, weights=list(FAULT_KINDS.values()))[0]

    def inject_phase(self, start: float, window: float, hard_stop: float) -> None:
        """Inject faults at random moments until enough are in and the runs are submitted."""
        wanted = self.args.faults
        mean = window / wanted * 0.9 if wanted else 0.0
        kinds = self.fault_kinds()
        next_at = start + 2.0 + (self.fault_rng.uniform(0.2, 1.0) * mean if wanted else 0)
        kind = next(kinds)
        while True:
            now = time.monotonic()
            submitted = {"submitter", "caller"} <= self.clients_done
            enough = len(self.faults) >= wanted
            if enough and (submitted or now >= start + window):
                break
            if now >= hard_stop:
                log(f"time bound reached with {len(self.faults)} of {wanted} faults injected")
                break
            self.supervise()
            if wanted and now >= next_at and not enough:
                fault = self.inject(kind)
                if fault is not None:
                    self.faults.append(fault)
                    log(f"fault {len(self.faults)}: {fault.kind} {fault.target} {fault.detail}")
                    self.sought_misses[kind] = 0
                    kind = next(kinds)
                    # Behind schedule (faults that could not be injected): catch up faster.
                    left = max(start + window - now, mean)
                    gap = left / max(wanted - len(self.faults), 1)
                    next_at = now + self.fault_rng.uniform(0.4, 1.6) * min(mean, gap)
                else:
                    next_at = now + 0.5
                    # A kind with no target now (workers still booting after a kill, no
                    # backend of the role) gives way to another after two misses, so that a
                    # busy machine does not spend the window retrying it. A sought kind is
                    # sought until one is in.
                    self.sought_misses[kind] += 1
                    injected = kind not in SOUGHT_KINDS or any(f.kind == kind for f in self.faults)
                    if injected and self.sought_misses[kind] >= 2:
                        self.sought_misses[kind] = 0
                        kind = next(kinds)
            time.sleep(0.1)  # the supervisor's tick

    def settle(self, deadline: float) -> None:
        """Faults stop; bring everything back; wait (bounded) until every run has ended."""
        log("faults stopped; settling")
        while time.monotonic() < deadline:
            self.supervise()
            if self.redis_restart_at is None and self.all_ended():
                break
            time.sleep(0.5)  # the polling period
        else:
            log("settle deadline reached with runs still going")
        if self.resumer is not None:
            self.resumer.stop_event.set()
            self.resumer.join_all(timeout=35)

    def all_ended(self) -> bool:
        """Whether every job's run exists and has ended, and every delivery was made."""
        assert self.db is not None
        if not {"submitter", "caller"} <= self.clients_done:
            return False
        if self.resumer is not None and self.resumer.pending():
            return False
        rows = self.db.rows(
            "SELECT count(*) FROM django_reactor_execution WHERE parent_id IS NULL "
            "AND idempotency_key = ANY(%s) AND status = ANY(%s)",
            [[job.key for job in self.jobs], list(FINAL)],
        )
        return rows[0][0] == len(self.jobs)

    # -- the checks ---------------------------------------------------------------------------

    def check(self) -> dict[str, Any]:
        """Check the invariants and build the report."""
        return Checker(self).report()

    # -- cleaning up --------------------------------------------------------------------------

    def cleanup(self, keep_logs: bool) -> None:
        """Stop every process this soak started (by PID) and drop its database."""
        if self.resumer is not None:
            self.resumer.stop_event.set()
            self.resumer.join_all(timeout=35)
        self.stop_monitor()
        for stall in self.stalls:  # nothing stays stopped (a stopped process ignores SIGTERM)
            stall.proc.kill(signal.SIGCONT)
        # SIGTERM every main process at once, wait for them (bounded), then SIGKILL what is
        # left of each child's session: orphans of killed workers included.
        for child in self.children:
            if child.alive() and child.proc is not None:
                child.proc.kill(signal.SIGTERM)
        deadline = time.monotonic() + 8
        while any(child.alive() for child in self.children) and time.monotonic() < deadline:
            time.sleep(0.1)
        for child in self.children:
            with contextlib.suppress(Exception):
                child.stop(timeout=0)
        self.orphans.clear()
        if self.db is not None:
            self.db.close()
        if self.database_created and not self.args.keep_db:
            from psycopg import sql

            try:
                with connect("postgres") as conn:
                    conn.execute(
                        sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                            sql.Identifier(self.database)
                        )
                    )
            except Exception as exc:
                log(f"could not drop database {self.database}: {exc}")
        if keep_logs:
            log(f"logs kept in {self.logs}")
        else:
            shutil.rmtree(self.logs, ignore_errors=True)


# ---------------------------------------------------------------------------- the checker


class LogIndex:
    """Every log line of the soak's processes, searchable by the ids they mention."""

    def __init__(self, logs: Path) -> None:
        self.lines: list[tuple[str, str]] = []
        for path in sorted(logs.glob("*.log")):
            for line in path.read_text(errors="replace").splitlines():
                self.lines.append((path.stem, line))

    def about(self, needles: list[str], limit: int = 10) -> list[str]:
        """The last ``limit`` lines naming any of ``needles`` (warnings and errors first)."""
        wanted = [re.compile(re.escape(n) + r"(?![0-9a-f])") for n in needles if n]
        found = [
            f"{name}: {line}"
            for name, line in self.lines
            if any(pattern.search(line) for pattern in wanted)
        ]
        serious = [line for line in found if "ERROR" in line or "WARNING" in line]
        chosen = serious[-limit:] if len(serious) >= limit else found[-limit:]
        return [line[:400] for line in chosen]


PROJECT_FRAME = re.compile(r'File "[^"]*/(django_reactor/[^"]+)", line (\d+), in (\S+)')


def project_frames(lines: list[str], *, last: bool = True) -> str:
    """The django_reactor frames of a traceback in ``lines`` (the last one, or the first),
    outermost first, with the exception it ends with:
    ``services.py:488 resume > store.py:412 claim_for_worker | OperationalError: ...``."""
    starts = [i for i, line in enumerate(lines) if line.startswith("Traceback")]
    if not starts:
        return ""
    frames, error = [], ""
    for line in lines[(starts[-1] if last else starts[0]) + 1 :]:
        if line.startswith("["):  # the next log record
            break
        if match := PROJECT_FRAME.search(line):
            path = match.group(1).removeprefix("django_reactor/")
            frames.append(f"{path}:{match.group(2)} {match.group(3)}")
        elif line and not line.startswith((" ", "\t", "Traceback", "During", "The above")):
            error = line.strip()
    return " > ".join(frames) + (f" | {error[:160]}" if error else "")


@dataclass
class Overrun:
    """A span during which more runs of one key than its limit were counted at once."""

    at: float  # epoch seconds: when the count first went over the limit
    most: int
    runs: set[str]


def most_at_once(intervals: list[tuple[str, float, float]]) -> tuple[int, list[Overrun]]:
    """The most runs counted at one moment from ``(run, start, end)`` intervals (a run with
    several intervals counts once while any of them is open; an interval that ends when
    another starts does not overlap it), and the spans with more than ``KEYED_LIMIT``."""
    points = sorted(
        [(start, 1, run) for run, start, end in intervals if end > start]
        + [(end, 0, run) for run, start, end in intervals if end > start]
    )
    open_ = Counter[str]()
    most, spans = 0, []
    current: Overrun | None = None
    for at, starting, run in points:
        open_[run] += 1 if starting else -1
        if not open_[run]:
            del open_[run]
        most = max(most, len(open_))
        if len(open_) <= KEYED_LIMIT:
            current = None
        elif current is None:
            current = Overrun(at, len(open_), set(open_))
            spans.append(current)
        else:
            current.most = max(current.most, len(open_))
            current.runs |= set(open_)
    return most, spans


def _clock(epoch: float | None) -> str:
    if epoch is None:
        return "-"
    return time.strftime("%H:%M:%S", time.localtime(epoch)) + f".{int(epoch % 1 * 1000):03d}"


def _rollback_failure(failure: dict[str, Any]) -> str:
    index = failure.get("index")
    where = failure.get("step") if index is None else f"{failure.get('step')}[{index}]"
    return f"{where}.{failure.get('action')}: {str(failure.get('message'))[:120]}"


#: What a lost database connection says (a run must never fail of one: its body runs again).
CONNECTION_LOSS = re.compile(
    r"terminating connection|server closed the connection|connection is lost|"
    r"connection (is |was )?(already )?closed|consuming input failed|connection to server|"
    r"could not receive data|SSL SYSCALL|no connection to the server|connection was lost",
    re.IGNORECASE,
)


def lost_connection(failure: dict[str, Any]) -> bool:
    """Whether a run's failure (or one of its rollback failures) is a lost connection."""
    cls = str(failure.get("exception_class") or "")
    message = str(failure.get("message") or "")
    return cls.endswith(("InterfaceError", "AdminShutdown")) or bool(
        CONNECTION_LOSS.search(message)
    )


TASK_FAILURE = re.compile(r"Task (\S+)\[([0-9a-f-]+)\] raised unexpected: (.*)")
HOOK_FAILURE = re.compile(
    r"chaos-task failure (\S+)\[([0-9a-f-]+)\] args=\[(.*?)\] pid=(\d+): (.*)"
)


class Checker:
    """Reads the database, Redis and the logs after the settle period; finds violations."""

    def __init__(self, soak: Soak) -> None:
        self.soak = soak
        assert soak.db is not None
        self.db = soak.db
        self.logs = LogIndex(soak.logs)
        self.jobs = {job.key: job for job in soak.jobs}
        rows = self.db.rows(
            "SELECT idempotency_key, id, status, failure, recovery_attempts, current_step, "
            "lease_owner, extract(epoch FROM finished_at) FROM django_reactor_execution "
            "WHERE parent_id IS NULL "
            "AND idempotency_key = ANY(%s)",
            [list(self.jobs)],
        )
        self.runs = {
            row[0]: {
                "id": str(row[1]),
                "status": row[2],
                "failure": row[3] or {},
                "recovery_attempts": row[4],
                "current_step": row[5],
                "lease_owner": row[6],
                "finished_at": float(row[7]) if row[7] is not None else None,
            }
            for row in rows
        }
        self.by_id = {run["id"]: key for key, run in self.runs.items()}
        maps = self.db.rows("SELECT id, execution_id FROM django_reactor_maprun")
        self.map_of = {str(execution): str(map_id) for map_id, execution in maps}

    def excerpt(self, execution_id: str) -> list[str]:
        """Log lines about an execution (and its map)."""
        return self.logs.about([execution_id, self.map_of.get(execution_id, "")])

    def trace_tail(self, execution_id: str, count: int = 8) -> list[str]:
        """The last ``count`` trace entries of an execution."""
        rows = self.db.rows(
            # A completed or skipped step's entry is its step record (``traced``).
            "SELECT kind, step, data FROM (SELECT seq, kind, step, data "
            "FROM django_reactor_executionevent WHERE execution_id = %s UNION ALL "
            "SELECT seq, CASE WHEN status = 'skipped' THEN 'skip' ELSE 'run' END, step, "
            "'{}'::jsonb FROM django_reactor_steprecord WHERE execution_id = %s AND traced) t "
            "ORDER BY seq DESC LIMIT %s",
            [execution_id, execution_id, count],
        )
        return [f"{kind} {step} {json.dumps(data)[:160]}".strip() for kind, step, data in rows][
            ::-1
        ]

    def describe(self, key: str) -> dict[str, Any]:
        """Everything needed to investigate one job's run."""
        job = self.jobs[key]
        run = self.runs.get(key, {})
        failure = run.get("failure") or {}
        return {
            "execution_id": run.get("id"),
            "job": key,
            "kind": job.kind,
            "reactor": job.reactor.rsplit(".", 1)[-1],
            "expected": job.expected,
            "status": run.get("status"),
            "failure": {
                "kind": failure.get("kind"),
                "step": failure.get("step"),
                "message": str(failure.get("message", ""))[:300],
                "rollback_failures": [
                    _rollback_failure(f) for f in failure.get("rollback_failures", [])
                ],
            }
            if failure
            else None,
            "recovery_attempts": run.get("recovery_attempts"),
            "current_step": run.get("current_step"),
            "trace_tail": self.trace_tail(run["id"]) if run else [],
            "exchanges": self.exchanges(key),
            "context": self.context(run),
            "log": self.excerpt(run["id"]) if run else [],
        }

    def context(self, run: dict[str, Any]) -> list[str]:
        """What the faults were doing around a run's failure: a Redis outage when it ended, the
        holder of the lock it could not take."""
        failure = run.get("failure") or {}
        notes = []
        finished = run.get("finished_at")
        if finished is not None:
            for fault in self.soak.faults:
                if fault.kind == "redis_restart" and fault.at - 2 <= finished:
                    back = fault.restored_at or fault.at + 6
                    if finished <= back + 2:
                        notes.append(
                            f"ended {finished - fault.at:+.1f} s after Redis was killed "
                            f"(outage {back - fault.at:.1f} s)"
                        )
        holder = re.search(r"held by execution ([0-9a-f-]{36})", str(failure.get("message", "")))
        if holder:
            owner = holder.group(1)
            rows = self.db.rows(
                "SELECT status, extract(epoch FROM finished_at) FROM django_reactor_execution "
                "WHERE id::text = %s",
                [owner],
            )
            if rows:
                status, ended = rows[0]
                late = (
                    f", {finished - float(ended):.1f} s before this run failed"
                    if ended is not None and finished is not None
                    else ""
                )
                notes.append(f"lock holder {owner} ({self.by_id.get(owner)}) ended {status}{late}")
                notes.extend(f"holder trace: {line}" for line in self.trace_tail(owner, 10))
        return notes

    def exchanges(self, key: str) -> list[str]:
        """The resume requests sent for job ``key`` and their answers (interrupt runs)."""
        resumer = self.soak.resumer
        record = resumer.records.get(key) if resumer is not None else None
        if record is None:
            return []
        seen = f"first delivery while {record.status_seen or 'no row yet'}"
        return (
            [
                f"{time.strftime('%H:%M:%S', time.localtime(e.at))}.{int(e.at % 1 * 1000):03d}"
                f" {e.label} key={e.key} -> {e.status} {e.code}"
                f"{' replayed' if e.replayed else ''}{' replay' if e.replay else ''}"
                f"{' ' + e.outcome if e.outcome else ''}{' ' + e.detail[:120] if e.detail else ''}"
                for e in record.exchanges
            ]
            + [seen]
            + ([f"resumer: {record.problem}"] if record.problem else [])
        )

    # -- invariants -----------------------------------------------------------------------

    def lost(self) -> list[dict[str, Any]]:
        """Runs never created, or not ended after the settle period."""
        found = []
        for key, job in self.jobs.items():
            run = self.runs.get(key)
            if run is None:
                found.append(
                    {
                        "job": key,
                        "kind": job.kind,
                        "problem": "never created",
                        "log": self.logs.about([key]),
                    }
                )
            elif run["status"] not in FINAL:
                entry = self.describe(key)
                entry["lease_owner"] = run["lease_owner"]
                entry["dispatches"] = [
                    f"{reason} sent={sent is not None} created={created:%H:%M:%S}"
                    for reason, sent, created in self.db.rows(
                        "SELECT reason, sent_at, created_at FROM django_reactor_dispatch "
                        "WHERE execution_id = %s ORDER BY id DESC LIMIT 5",
                        [run["id"]],
                    )
                ]
                found.append(entry)
        return found

    def ledger_rows(self, where: str, params: Any = None) -> list[dict[str, Any]]:
        """Ledger rows matching ``where``, with the run each belongs to (``root``)."""
        rows = self.db.rows(
            "SELECT l.id, COALESCE(m.execution_id, l.execution_id)::text, l.execution_id::text, "
            "l.step, l.action, l.key, l.map_id::text, l.element, l.note, l.checkpointed, l.pid, "
            "l.role, l.at FROM chaos_ledger l LEFT JOIN django_reactor_maprun m "
            f"ON m.id = l.map_id WHERE {where} ORDER BY l.id",
            params,
        )
        names = "id root execution step action key map element note checkpointed pid role at"
        return [dict(zip(names.split(), row, strict=True)) for row in rows]

    @staticmethod
    def show(row: dict[str, Any]) -> str:
        """One ledger row as a line."""
        where = f"{row['step']}" if row["element"] is None else f"element {row['element']}"
        return (
            f"{row['at']:%H:%M:%S.%f} {row['action']} {where} pid {row['pid']} ({row['role']})"
            f"{' CHECKPOINTED' if row['checkpointed'] else ''}"
            f"{' ' + row['note'] if row['note'] else ''}"
        )

    def history(self, row: dict[str, Any]) -> list[str]:
        """Every ledger row of the same action as ``row``."""
        if row["element"] is not None:
            rows = self.ledger_rows(
                "l.map_id = %s AND l.element = %s AND l.action = %s",
                [row["map"], row["element"], row["action"]],
            )
        else:
            rows = self.ledger_rows(
                "l.execution_id = %s AND l.step = %s AND l.action = %s",
                [row["execution"], row["step"], row["action"]],
            )
        return [self.show(r) for r in rows]

    def rerun_entry(self, row: dict[str, Any]) -> dict[str, Any]:
        """A ledger row of an action that ran again, with its history and logs."""
        key = self.by_id.get(row["root"])
        return {
            "execution_id": row["root"],
            "job": key,
            "step": row["step"] if row["element"] is None else f"ticks[{row['element']}]",
            "action": row["action"],
            "ledger": self.history(row),
            "trace_tail": self.trace_tail(row["root"]),
            "log": self.logs.about(
                [row["root"], row["map"] or "", f"pid={row['pid']}", f"/{row['pid']}"], 12
            ),
        }

    def checkpointed_reruns(self) -> list[dict[str, Any]]:
        """Actions that started while their checkpoint existed; steps checkpointed twice."""
        rows = self.ledger_rows(
            "l.checkpointed AND l.action <> 'collect' "
            "AND NOT (l.step = 'apply' AND l.action = 'run')"
        )
        found = []
        for row in rows:
            entry = self.rerun_entry(row)
            if row["action"] in ("undo", "compensate") and self.failed_rollback_resumed(row):
                entry["problem"] = (
                    f"its {row['action']} failed (recorded), and ran again when the rollback was "
                    "resumed after its process was lost: rollback handlers are not to be retried "
                    "automatically (docs/explanation/decisions.md)"
                )
            found.append(entry)
        twice = self.db.rows(
            # 'run' entries: event rows, and completed step records that stand for theirs.
            "SELECT execution_id::text, step, count(*) FROM ("
            "SELECT execution_id, step FROM django_reactor_executionevent "
            "WHERE kind = 'run' AND execution_id = ANY(%s::uuid[]) UNION ALL "
            "SELECT execution_id, step FROM django_reactor_steprecord "
            "WHERE traced AND status = 'completed' AND execution_id = ANY(%s::uuid[])) t "
            "GROUP BY execution_id, step HAVING count(*) > 1",
            [list(self.by_id), list(self.by_id)],
        )
        for execution_id, step_name, count in twice:
            found.append(
                {
                    "execution_id": execution_id,
                    "job": self.by_id.get(execution_id),
                    "step": step_name,
                    "problem": f"checkpointed {count} times ('run' trace entries)",
                    "trace_tail": self.trace_tail(execution_id, 14),
                    "log": self.excerpt(execution_id),
                }
            )
        return found

    def failed_rollback_resumed(self, row: dict[str, Any]) -> bool:
        """Whether the trace has the ledger row's undo or compensate failed, then a ``resume``
        (the run taken over), then failed or done again."""
        failed, done = (
            ("undo_failed", "undo")
            if row["action"] == "undo"
            else ("compensate_failed", "compensate")
        )
        kinds = [
            kind
            for (kind,) in self.db.rows(
                "SELECT kind FROM django_reactor_executionevent WHERE execution_id = %s "
                "AND (step = %s OR kind = 'resume') ORDER BY seq",
                [row["execution"], row["step"]],
            )
        ]
        first = kinds.index(failed) if failed in kinds else None
        if first is None or "resume" not in kinds[first:]:
            return False
        after = kinds[kinds.index("resume", first) :]
        return failed in after or done in after

    def rerun_before_checkpoint(self) -> dict[str, Any]:
        """Actions cut off before their checkpoint that ran again (allowed)."""
        rows = self.db.rows(
            "SELECT COALESCE(map_id::text, execution_id::text), step, action, element, count(*) "
            "FROM chaos_ledger WHERE NOT checkpointed GROUP BY 1, 2, 3, 4 HAVING count(*) > 1"
        )
        return {
            "count": len(rows),
            "note": "an action cut off before its checkpoint ran again (at-least-once, allowed)",
        }

    def effects_doubled(self) -> list[dict[str, Any]]:
        """Actions given several idempotency keys, and keys given to several actions."""
        found = []
        rows = self.db.rows(
            "SELECT COALESCE(map_id::text, execution_id::text), step, action, element, "
            "array_agg(DISTINCT key) FROM chaos_ledger WHERE action <> 'collect' "
            "GROUP BY 1, 2, 3, 4 HAVING count(DISTINCT key) > 1"
        )
        for owner, step_name, action, element, keys in rows:
            root = self.map_owner(owner) if element is not None else owner
            found.append(
                {
                    "execution_id": root,
                    "job": self.by_id.get(root),
                    "step": step_name if element is None else f"ticks[{element}]",
                    "action": action,
                    "problem": f"one action given {len(keys)} idempotency keys: {keys}",
                    "log": self.excerpt(root),
                }
            )
        rows = self.db.rows(
            "SELECT key, array_agg(DISTINCT COALESCE(map_id::text, execution_id::text) || ':' "
            "|| step || ':' || action || ':' || COALESCE(element::text, '')) FROM chaos_ledger "
            "WHERE action <> 'collect' GROUP BY key "
            "HAVING count(DISTINCT (COALESCE(map_id, execution_id), step, action, element)) > 1"
        )
        for key, owners in rows:
            found.append({"problem": f"idempotency key {key} given to {owners}"})
        return found

    def map_owner(self, map_id: str) -> str:
        """The execution a map belongs to."""
        rows = self.db.rows(
            "SELECT execution_id::text FROM django_reactor_maprun WHERE id = %s", [map_id]
        )
        return rows[0][0] if rows else map_id

    def fan_ins_twice(self) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """Maps collected after their checkpoint, or settled past their size."""
        found = []
        for row in self.ledger_rows("l.action = 'collect' AND l.checkpointed"):
            entry = self.rerun_entry(row)
            entry["problem"] = "collect ran after the map step was checkpointed"
            found.append(entry)
        rows = self.db.rows(
            "SELECT id::text, execution_id::text, size, settled, succeeded, failed "
            "FROM django_reactor_maprun WHERE settled > size OR succeeded + failed > size"
        )
        for map_id, execution_id, size, settled, succeeded, failed in rows:
            found.append(
                {
                    "execution_id": execution_id,
                    "job": self.by_id.get(execution_id),
                    "map": map_id,
                    "problem": (
                        f"size {size}, settled {settled}, succeeded {succeeded}, failed {failed}"
                    ),
                    "log": self.excerpt(execution_id),
                }
            )
        collects = self.db.rows(
            "SELECT map_id::text, count(*) FROM chaos_ledger WHERE action = 'collect' GROUP BY 1"
        )
        wakes = self.db.rows(
            "SELECT d.execution_id::text, count(*) FROM django_reactor_dispatch d "
            "JOIN django_reactor_maprun m ON m.execution_id = d.execution_id "
            "WHERE d.reason = 'wake' GROUP BY 1"
        )
        info = {
            "maps": len(self.map_of),
            "collect_runs": sum(count for _, count in collects),
            "maps_collected_more_than_once_before_checkpoint": sum(1 for _, c in collects if c > 1),
            "wake_dispatches": sum(count for _, count in wakes),
        }
        return found, info

    def payloads_twice(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
        """Payloads accepted or applied twice, and Idempotency-Key repeats not replayed."""
        twice: list[dict[str, Any]] = []
        dedup: list[dict[str, Any]] = []
        resumer = self.soak.resumer
        records = resumer.records if resumer is not None else {}
        statuses = Counter[str]()
        by_kind: dict[str, Counter[str]] = {}
        for key, record in records.items():
            job = self.jobs[key]
            for exchange in record.exchanges:
                code = f"/{exchange.code}" if exchange.code else ""
                statuses[f"{exchange.label}:{exchange.status}{code}"] += 1
            run = self.runs.get(key)
            if run is None:
                continue
            execution_id = run["id"]
            problems = []
            payloads = self.payload_entries(execution_id)
            if payloads > 1:
                problems.append(f"{payloads} payloads accepted ('payload' trace entries)")
            applies = self.ledger_rows("l.execution_id = %s AND l.step = 'apply'", [execution_id])
            if any(row["checkpointed"] for row in applies):
                problems.append("the apply step ran after its checkpoint")
            nonces = {row["note"] for row in applies}
            if len(nonces) > 1:
                problems.append(f"the apply step saw {len(nonces)} payloads: {sorted(nonces)}")
            if (
                job.kind in INTERRUPT_KINDS
                and record.other is not None
                and 200 <= record.other.status < 300
            ):
                problems.append(
                    f"a second delivery with another key was accepted ({record.other.status})"
                )
            mailbox = self.mailbox(execution_id) if job.kind in MAILBOX_KINDS else []
            consumed = [m for m in mailbox if m["status"] == "consumed"]
            if len(consumed) > 1:
                problems.append(f"the mailbox gave the run {len(consumed)} messages: {mailbox}")
            if job.kind in RACING_KINDS:
                tally = by_kind.setdefault(job.kind, Counter())
                tally["runs"] += 1
                tally[f"first while {record.status_seen or 'no row yet'}"] += 1
                if record.first is not None and record.first.outcome:
                    tally[f"first {record.first.outcome}"] += 1
                tally[f"applied {len(applies)}x"] += 1
                for message in mailbox:
                    tally[f"mailbox {message['nonce'][-1:]} {message['status']}"] += 1
            exchanges = self.exchanges(key)
            if problems:
                entry = self.describe(key)
                entry.update(
                    problem="; ".join(problems),
                    exchanges=exchanges,
                    ledger=[self.show(r) for r in applies],
                )
                twice.append(entry)
            if record.first is not None and record.repeat is not None:
                repeat = record.repeat
                # An event's repeat (the same Idempotency-Key) is replayed by the key; an emit
                # of the same event id says replay in its body.
                replayed = repeat.replayed or (
                    job.kind == "event_background" and repeat.status == 202 and repeat.replay
                )
                if not (repeat.status == record.first.status and replayed):
                    dedup.append(
                        {
                            "execution_id": execution_id,
                            "job": key,
                            "kind": job.kind,
                            "problem": (
                                f"the repeat of {record.first.status} {record.first.code} got "
                                f"{repeat.status} {repeat.code} "
                                f"(replayed={repeat.replayed}, replay={repeat.replay})"
                            ),
                            "exchanges": exchanges,
                            "log": self.logs.about([execution_id, f"{key}-A"]),
                        }
                    )
        info = {
            "answers": dict(sorted(statuses.items())),
            "first_retried_after_a_lost_answer": sum(
                1 for record in records.values() if self.answer_lost(record)
            ),
            "racing": {kind: dict(sorted(t.items())) for kind, t in sorted(by_kind.items())},
            "resumer_error": resumer.error if resumer else "",
        }
        return twice, dedup, info

    def payload_entries(self, execution_id: str) -> int:
        """How many ``payload`` trace entries the run has (each an accepted payload)."""
        return int(
            self.db.rows(
                "SELECT count(*) FROM django_reactor_executionevent WHERE execution_id = %s "
                "AND kind = 'payload'",
                [execution_id],
            )[0][0]
        )

    def mailbox(self, execution_id: str) -> list[dict[str, Any]]:
        """The run's mailbox: each message's kind, topic, status and nonce, in send order."""
        rows = self.db.rows(
            "SELECT kind, topic, status, COALESCE(payload->>'nonce', '') "
            "FROM django_reactor_message WHERE execution_id = %s ORDER BY id",
            [execution_id],
        )
        names = ("kind", "topic", "status", "nonce")
        return [dict(zip(names, row, strict=True)) for row in rows]

    @staticmethod
    def answer_lost(record: ResumeRecord) -> bool:
        """Whether a try of the first delivery went without an answer (no answer, a 5xx)."""
        return any(
            e.label == "first" and (e.status == 0 or e.status >= 500) for e in record.exchanges
        )

    def deliveries_mishandled(self) -> list[dict[str, Any]]:
        """Deliveries lost or answered otherwise than the product documents.

        For every run delivered to: each of the three exchanges got a final answer (no 5xx or
        lost connection left after the retries); the first was accepted (200 or 202; an
        event's 202 says ``replay`` false unless an earlier try of it went unanswered); the
        run took exactly one payload (one ``payload`` trace entry) and applied the first
        delivery (every apply ledger row has nonce ``<key>-A``). The second delivery with
        another key: an interrupt refuses it (a 4xx); a message is kept (202; 409 when the run
        had ended) and an event emitted (202, replay false), and neither is ever applied: the
        mailbox holds one consumed message, the first.
        """
        found = []
        resumer = self.soak.resumer
        records = resumer.records if resumer is not None else {}
        for key, record in records.items():
            job = self.jobs[key]
            run = self.runs.get(key)
            if run is None or run["status"] not in FINAL:
                continue  # counted as lost
            execution_id = run["id"]
            problems = []
            if record.problem:
                problems.append(record.problem)
            for label in ("first", "repeat", "other"):
                exchange = getattr(record, label)
                if exchange is None:
                    if not record.problem:
                        problems.append(f"no final answer to the {label} delivery")
                elif exchange.status >= 500 or exchange.status == 0:
                    problems.append(f"the {label} delivery was answered {exchange.status}")
            first, other = record.first, record.other
            # A try whose answer was lost (a 5xx: the payload was taken, storing the answer
            # failed) is answered afresh on its retry, as documented: an interrupt that took the
            # payload says already_resumed (the apply's nonce shows whose), an event replay, a
            # message to a run that has ended since invalid_transition (its mailbox, checked
            # below, shows which message it took).
            afresh = first is not None and self.answer_lost(record)
            taken = first is not None and (
                (
                    job.kind in INTERRUPT_KINDS
                    and (first.status, first.code) == (409, "already_resumed")
                )
                or (
                    job.kind == "message_background"
                    and (first.status, first.code) == (409, "invalid_transition")
                )
            )
            if first is not None and first.status not in (200, 202) and not (afresh and taken):
                problems.append(f"the first delivery was refused: {first.status} {first.code}")
            if job.kind == "event_background" and first is not None and first.replay and not afresh:
                problems.append("the first emit of the event was answered as a replay")
            if other is not None:
                # (accepted: counted as a payload accepted twice)
                if job.kind in INTERRUPT_KINDS and not 200 <= other.status < 500:
                    problems.append(f"the other delivery was answered {other.status}")
                if job.kind == "message_background" and not (
                    other.status == 202
                    or (other.status == 409 and other.code == "invalid_transition")
                ):
                    problems.append(f"the other message was answered {other.status} {other.code}")
                if job.kind == "event_background" and (other.status != 202 or other.replay):
                    problems.append(
                        f"the other event was answered {other.status} (replay={other.replay})"
                    )
            if run["status"] in ("completed", "halted"):
                payloads = self.payload_entries(execution_id)
                if payloads != 1:
                    problems.append(f"{payloads} 'payload' trace entries, not 1")
                applies = self.ledger_rows(
                    "l.execution_id = %s AND l.step = 'apply'", [execution_id]
                )
                nonces = sorted({row["note"] for row in applies})
                if nonces != [f"{key}-A"]:
                    problems.append(f"the apply step saw {nonces or 'nothing'}, not {key}-A")
            if job.kind in MAILBOX_KINDS and run["status"] == "completed":
                mailbox = self.mailbox(execution_id)
                consumed = [m["nonce"] for m in mailbox if m["status"] == "consumed"]
                if consumed != [f"{key}-A"]:
                    problems.append(f"the mailbox's consumed messages are {consumed}: {mailbox}")
                invalid = [m for m in mailbox if m["status"] == "invalid"]
                if invalid:
                    problems.append(f"messages refused as invalid: {invalid}")
            if problems:
                entry = self.describe(key)
                entry["problem"] = "; ".join(problems)
                if job.kind in MAILBOX_KINDS:
                    entry["mailbox"] = self.mailbox(execution_id)
                found.append(entry)
        return found

    def lock_overlaps(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
        """Two runs inside the same lock at once (apart: overlaps a Redis restart explains)."""
        rows = self.db.rows(
            "SELECT a.lock_key, a.execution_id::text, b.execution_id::text, "
            "extract(epoch FROM a.entered_at), extract(epoch FROM a.exited_at), "
            "extract(epoch FROM b.entered_at), extract(epoch FROM b.exited_at), a.fence, b.fence, "
            "a.pid, b.pid, a.role, b.role FROM chaos_lock a JOIN chaos_lock b "
            "ON a.lock_key = b.lock_key AND a.id < b.id AND a.exited_at IS NOT NULL "
            "AND b.exited_at IS NOT NULL AND a.entered_at < b.exited_at "
            "AND b.entered_at < a.exited_at"
        )
        kills = [f.at for f in self.soak.faults if f.kind == "redis_restart"]
        unexplained, explained = [], []
        for key, ea, eb, a_in, a_out, b_in, b_out, fa, fb, pa, pb, ra, rb in rows:
            first_in, second_in = sorted([float(a_in), float(b_in)])
            restart = any(first_in - 1.0 <= kill <= second_in + 0.5 for kill in kills)
            entry = {
                "lock": key,
                "executions": [ea, eb],
                "jobs": [self.by_id.get(ea), self.by_id.get(eb)],
                "holders": [
                    f"{ea} pid {pa} ({ra}) {float(a_in):.3f}-{float(a_out):.3f} fence {fa}",
                    f"{eb} pid {pb} ({rb}) {float(b_in):.3f}-{float(b_out):.3f} fence {fb}",
                ],
                "same_run": ea == eb,
            }
            if restart and ea != eb:
                entry["explained_by"] = "a Redis restart between the two entries (locks lost)"
                explained.append(entry)
            else:
                entry["log"] = self.logs.about([ea, eb], 8)
                unexplained.append(entry)
        counts = self.db.rows("SELECT count(*), count(exited_at) FROM chaos_lock")[0]
        info = {"lock_entries": counts[0], "entries_cut_off": counts[0] - counts[1]}
        return unexplained, explained, info

    def stuck_locks(self) -> list[dict[str, Any]]:
        """Locks held by a run that had ended at least STUCK_AFTER seconds before: at the end
        (after a bounded wait), or in a sample taken while the soak ran."""

        def stuck() -> dict[str, tuple[str, int]]:
            """Locks held now by runs that have ended."""
            result = {}
            for name, (owner, ttl) in self.soak.held_locks().items():
                rows = self.db.rows(
                    "SELECT status FROM django_reactor_execution WHERE id::text = %s",
                    [owner.removeprefix("run:")],
                )
                status = rows[0][0] if rows else "unknown"
                if status not in ACTIVE:
                    result[name] = (owner, ttl)
            return result

        entries = []
        try:
            # A run releases its locks just after it ends: give that a few seconds (bounded).
            deadline = time.monotonic() + 6
            found = stuck()
            while found and time.monotonic() < deadline:
                time.sleep(0.5)
                found = stuck()
        except Exception as exc:
            found = {}
            entries.append({"problem": f"could not read Redis at the end: {exc!r}"})
        for name, (owner, ttl) in found.items():
            entries.append(self.stuck_entry(name, owner, f"still held at the end ({ttl} ms left)"))
        for (name, owner), seen in sorted(self.soak.lock_watch.items()):
            if (name, owner) in {(e.get("lock"), e.get("owner")) for e in entries}:
                continue
            finished = seen["finished_at"]
            held_for = seen["last_seen"] - (
                finished if finished is not None else seen["first_seen"]
            )
            if held_for < STUCK_AFTER:
                continue
            when = time.strftime("%H:%M:%S", time.localtime(seen["last_seen"]))
            entries.append(
                self.stuck_entry(
                    name,
                    owner,
                    f"held {held_for:.1f} s after its run ended {seen['status']} "
                    f"(last seen {when}, {seen['ttl_ms_last']} ms left; gone by the end)",
                )
            )
        return entries

    def stuck_entry(self, name: str, owner: str, problem: str) -> dict[str, Any]:
        """One stuck lock, with its owner's lock bodies, trace and logs."""
        execution_id = owner.removeprefix("run:")
        key = self.by_id.get(execution_id)
        entries = self.db.rows(
            "SELECT pid, role, entered_at, exited_at FROM chaos_lock WHERE execution_id::text = %s "
            "ORDER BY id",
            [execution_id],
        )
        return {
            "lock": name,
            "owner": owner,
            "problem": problem,
            "job": key,
            "status": self.runs.get(key, {}).get("status") if key else None,
            "ledger": [
                f"lock body pid {pid} ({role}) {enter:%H:%M:%S.%f}-"
                f"{'cut off' if leave is None else format(leave, '%H:%M:%S.%f')}"
                for pid, role, enter, leave in entries
            ],
            "trace_tail": self.trace_tail(execution_id, 12),
            "log": self.excerpt(execution_id),
        }

    def wrong_outcomes(self) -> list[dict[str, Any]]:
        """Runs that ended otherwise than their inputs decide."""
        found = []
        for key, job in self.jobs.items():
            run = self.runs.get(key)
            if run is None or run["status"] not in FINAL:
                continue  # counted as lost
            problem = self.outcome_problem(job, run)
            if problem:
                entry = self.describe(key)
                entry["problem"] = problem
                found.append(entry)
        return found

    @staticmethod
    def outcome_problem(job: Job, run: dict[str, Any]) -> str:
        """How a run's end differs from what its inputs decide ('' when it does not)."""
        status = run["status"]
        if status != job.expected:
            return f"expected {job.expected}, ended {status}"
        failure = run["failure"] or {}
        if job.expected in ("failed", "needs_attention"):
            if failure.get("step") != job.expected_step:
                return f"failed at {failure.get('step')!r}, planned at {job.expected_step!r}"
            if PLANNED not in str(failure.get("message", "")):
                return f"failed for another reason: {str(failure.get('message'))[:200]}"
            rollback = failure.get("rollback_failures", [])
            planned = [f for f in rollback if PLANNED_UNDO in str(f.get("message", ""))]
            if len(planned) != len(rollback) or len(rollback) != job.expected_rollback_failures:
                return (
                    f"{len(rollback)} rollback failures ({len(planned)} planned), "
                    f"{job.expected_rollback_failures} planned"
                )
        return ""

    def atomic_writes(self) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """Atomic steps' money: each action's transfer committed at most once (exactly as the
        run's end says: once per atomic step of a completed run; a failed run's steps before
        the planned failure moved and moved back, unless their undo was planned to fail), and
        every balance what the committed transfers say."""
        committed = Counter[tuple[str, str, str]]()
        for execution_id, step_name, action, count in self.db.rows(
            "SELECT execution_id::text, step, action, count(*) FROM chaos_transfer GROUP BY 1, 2, 3"
        ):
            committed[(execution_id, step_name, action)] = count
        balances = {
            name: (key, balance, expected)
            for name, key, balance, expected in self.db.rows(
                "SELECT a.name, a.execution_key, a.balance, %s + COALESCE((SELECT sum(CASE "
                "WHEN t.target = a.name THEN t.amount ELSE -t.amount END) FROM chaos_transfer t "
                "WHERE a.name IN (t.source, t.target)), 0) FROM chaos_account a",
                [INITIAL_BALANCE],
            )
        }
        found = []
        for key, job in self.jobs.items():
            reactor = job.reactor.rsplit(".", 1)[-1]
            run = self.runs.get(key)
            if reactor not in ATOMIC_STEPS or run is None:
                continue
            problems = []
            for step_name in ATOMIC_STEPS[reactor]:
                done = committed[(run["id"], step_name, "run")]
                undone = committed[(run["id"], step_name, "undo")]
                if done > 1 or undone > 1:
                    problems.append(f"{step_name}: {done} transfers by its run, {undone} by undo")
                elif undone > done:
                    problems.append(f"{step_name}: undone ({undone}) without a transfer ({done})")
                wanted = self.transfers_wanted(job, run, step_name)
                if wanted is not None and (done, undone) != wanted:
                    problems.append(
                        f"{step_name}: {done} transfer(s) by its run and {undone} by its undo "
                        f"committed, {wanted[0]} and {wanted[1]} planned ({run['status']})"
                    )
            for name in job.inputs.get("accounts", {}).values():
                _, balance, expected = balances.get(name, (key, None, None))
                if balance is None or balance != expected:
                    problems.append(f"account {name}: balance {balance}, transfers say {expected}")
            if problems:
                entry = self.describe(key)
                entry["problem"] = "; ".join(problems)
                entry["ledger"] = [
                    self.show(row)
                    for row in self.ledger_rows(
                        "l.execution_id = %s AND l.step = ANY(%s)",
                        [run["id"], list(ATOMIC_STEPS[reactor])],
                    )
                ] + [
                    f"transfer {step_name}.{action} {source}->{target} {amount} pid {pid} "
                    f"({role}) {at:%H:%M:%S.%f}"
                    for step_name, action, source, target, amount, pid, role, at in self.db.rows(
                        "SELECT step, action, source, target, amount, pid, role, at "
                        "FROM chaos_transfer WHERE execution_id = %s ORDER BY id",
                        [run["id"]],
                    )
                ]
                found.append(entry)
        info = {
            "atomic_runs": sum(
                1 for job in self.jobs.values() if job.reactor.rsplit(".", 1)[-1] in ATOMIC_STEPS
            ),
            "transfers_committed": sum(committed.values()),
            "accounts": len(balances),
        }
        return found, info

    @staticmethod
    def transfers_wanted(job: Job, run: dict[str, Any], step_name: str) -> tuple[int, int] | None:
        """How many transfers an atomic step's run and undo should have committed, as the
        run's inputs decide (None when it did not end as they decide: a wrong outcome)."""
        if run["status"] != job.expected:
            return None
        if job.expected == "completed":
            return (1, 0)
        if job.expected not in ("failed", "needs_attention") or job.expected_step is None:
            return None
        steps = STEPS[job.reactor.rsplit(".", 1)[-1]]
        if steps.index(step_name) >= steps.index(job.expected_step):
            return (0, 0)  # the failing step rolled back; those after it never ran
        undo_fails = step_name in job.inputs["spec"].get("undo_fail", ())
        return (1, 0 if undo_fails else 1)

    def failed_by_connection_loss(self) -> list[dict[str, Any]]:
        """Runs that ended failed or needs_attention of a lost database connection (their
        failure, or one of their rollback failures): a body that loses its connection runs
        again on a new one, so no run may fail of it."""
        found = []
        for key, run in self.runs.items():
            if run["status"] not in ("failed", "needs_attention"):
                continue
            failure = run["failure"] or {}
            losses = [failure] if lost_connection(failure) else []
            losses += [f for f in failure.get("rollback_failures", []) if lost_connection(f)]
            if losses:
                entry = self.describe(key)
                entry["problem"] = "; ".join(
                    f"{f.get('step')}.{f.get('action', 'run')}: {f.get('exception_class')}: "
                    f"{str(f.get('message'))[:160]}"
                    for f in losses
                )
                found.append(entry)
        return found

    def concurrency_overruns(self) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """More than ``KEYED_LIMIT`` of a key's runs in flight at once, counted four ways (the
        module's docstring): from the runs' own records, at each keyed body's entry, from the
        bodies' entry and exit times, and by the monitor while the soak ran."""
        reactor = f"{REACTORS}.{KEYED_KIND[1]}"
        runs = {
            str(run): {
                "key": key,
                "status": status,
                "created": float(created),
                "finished": None if finished is None else float(finished),
                "queued": None if queued is None else float(queued),
                "admitted": None if admitted is None else float(admitted),
                "recovered": recovered > 0,
            }
            for run, key, status, created, finished, queued, admitted, recovered in self.db.rows(
                "SELECT e.id, e.concurrency_key, e.status, extract(epoch FROM e.created_at), "
                "extract(epoch FROM e.finished_at), (SELECT extract(epoch FROM min(v.at)) "
                "FROM django_reactor_executionevent v WHERE v.execution_id = e.id "
                "AND v.kind = 'queue'), (SELECT extract(epoch FROM min(v.at)) "
                "FROM django_reactor_executionevent v WHERE v.execution_id = e.id "
                "AND v.kind = 'admit'), e.recovery_attempts FROM django_reactor_execution e "
                "WHERE e.reactor = %s",
                [reactor],
            )
        }
        found: list[dict[str, Any]] = []

        def held(run: str) -> tuple[float, float] | None:
            """When ``run`` held its slot (None: never): from its creation or admission until
            it ended (still holding at the end: counted as holding for ever)."""
            row = runs[run]
            start = row["created"] if row["queued"] is None else row["admitted"]
            if start is None:
                return None
            return start, row["finished"] if row["finished"] is not None else float("inf")

        def entry(source: str, key: str, at: float, problem: str, ids: list[str]) -> None:
            """One violation, with each run's slot and what the logs say of them."""
            holders = []
            for run in ids:
                span = held(run) if run in runs else None
                row = runs.get(run, {})
                holders.append(
                    f"{run} ({self.by_id.get(run)}) {row.get('status')}, "
                    f"{'queued, ' if row.get('queued') else ''}held its slot "
                    + ("never" if span is None else f"{_clock(span[0])}-{_clock(span[1])}")
                )
            found.append(
                {
                    "source": source,
                    "key": key,
                    "at": _clock(at),
                    "problem": problem,
                    "executions": ids,
                    "jobs": [self.by_id.get(run) for run in ids],
                    "holders": holders,
                    "log": self.logs.about(ids, 8),
                }
            )

        # 1. From the runs' records: each run's slot, from its creation or admission to its end.
        by_key: dict[str, list[tuple[str, float, float]]] = {}
        for run, row in sorted(runs.items(), key=lambda item: item[1]["created"]):
            span = held(run)
            if span is not None:
                by_key.setdefault(row["key"], []).append((run, *span))
            elif row["status"] != "queued":
                entry(
                    "records",
                    row["key"],
                    row["queued"],
                    f"it left its queue ({row['status']}) without an 'admit' trace entry",
                    [run],
                )
        figures: dict[str, dict[str, Any]] = {}
        for key, spans in sorted(by_key.items()):
            most, overruns = most_at_once(spans)
            figures[key] = {
                "runs": sum(1 for row in runs.values() if row["key"] == key),
                "queued": sum(1 for row in runs.values() if row["key"] == key and row["queued"]),
                "admitted": sum(
                    1 for row in runs.values() if row["key"] == key and row["admitted"]
                ),
                "most_in_flight": most,
            }
            for overrun in overruns:
                entry(
                    "records",
                    key,
                    overrun.at,
                    f"{overrun.most} runs held a slot at once (limit {KEYED_LIMIT})",
                    sorted(overrun.runs, key=lambda run: runs[run]["created"]),
                )
        # 2. and 3. What each body saw as it started; bodies of more runs than the limit at once.
        bodies = self.db.rows(
            "SELECT execution_id::text, step, tenant, pid, role, own_status, holding::text[], "
            "extract(epoch FROM entered_at), extract(epoch FROM exited_at) FROM chaos_keyed "
            "ORDER BY id"
        )
        intervals: dict[str, list[tuple[str, float, float]]] = {}
        cut_off = stale = 0
        for run, step_name, key, pid, role, status, holding, entered, exited in bodies:
            entered = float(entered)
            where = f"step {step_name} of {run} in pid {pid} ({role})"
            figures.setdefault(key, {}).setdefault("most_at_body_entry", 0)
            figures[key]["most_at_body_entry"] = max(
                figures[key]["most_at_body_entry"], len(holding)
            )
            if len(holding) > KEYED_LIMIT:
                entry(
                    "body entry",
                    key,
                    entered,
                    f"{where} counted {len(holding)} runs holding a slot (limit {KEYED_LIMIT})",
                    list(holding),
                )
            if status == "queued":
                entry("body entry", key, entered, f"{where} ran while its run was queued", [run])
            elif status not in HOLDING:
                stale += 1  # its run was taken over and ended: other invariants judge that
            if exited is None:
                cut_off += 1
                continue
            finished = runs.get(run, {}).get("finished")
            end = float(exited) if finished is None else min(float(exited), finished)
            intervals.setdefault(key, []).append((run, entered, end))
        for key, spans in sorted(intervals.items()):
            most, overruns = most_at_once(spans)
            figures.setdefault(key, {})["most_in_bodies"] = most
            for overrun in overruns:
                entry(
                    "bodies",
                    key,
                    overrun.at,
                    f"bodies of {overrun.most} runs at once (limit {KEYED_LIMIT})",
                    sorted(overrun.runs),
                )
        # 4. The monitor's counts while the soak ran.
        monitor = self.soak.monitor
        if monitor is not None:
            for seen in monitor.over:
                entry(
                    "monitor",
                    seen["key"],
                    seen["at"],
                    f"{seen['most']} runs in flight counted (limit {KEYED_LIMIT})",
                    seen["runs"],
                )
            for key, most in monitor.holding.items():
                figures.setdefault(key, {})["monitor_most_in_flight"] = most
                figures[key]["monitor_most_queued"] = monitor.queued[key]
        info = {
            "limit": KEYED_LIMIT,
            "runs": len(runs),
            "queued": sum(1 for row in runs.values() if row["queued"]),
            "admitted": sum(1 for row in runs.values() if row["admitted"]),
            "admitted_by_sweeper": sum(
                int(match.group(1))
                for name, line in self.logs.lines
                if name.startswith("sweeper")
                and (match := re.search(r"the sweeper admitted (\d+) queued run", line))
            ),
            "recovered": sum(1 for row in runs.values() if row["recovered"]),
            "most_in_flight": max(
                (f.get("most_in_flight", 0) for f in figures.values()), default=0
            ),
            "by_key": figures,
            "body_entries": len(bodies),
            "bodies_cut_off": cut_off,
            "bodies_of_ended_runs": stale,
            "monitor_samples": monitor.samples if monitor is not None else 0,
            "monitor_error": monitor.error if monitor is not None else "",
        }
        return found, info

    def stalls(self) -> list[dict[str, Any]]:
        """Each ``atomic_stall``: the stopped process, whether the worker that took its run over
        ended its session (its log line), and how the run ended."""
        entries = []
        for stall in self.soak.stalls:
            entry = stall.summary()
            ended = re.compile(
                r"ended \d+ database session\(s\) of execution " + re.escape(stall.execution_id)
            )
            entry["ended_by_takeover"] = any(ended.search(line) for _, line in self.logs.lines)
            key = self.by_id.get(stall.execution_id)
            entry["job"] = key
            entry["status"] = self.runs.get(key, {}).get("status") if key else None
            entries.append(entry)
        return entries

    def task_failures(self) -> dict[str, Any]:
        """Celery task failures in the worker logs, grouped by code path."""
        failures = []
        hooks = {}
        worker_lost = 0
        other_errors = Counter[str]()
        paths = Counter[str]()
        for number, (name, line) in enumerate(self.logs.lines):
            if not name.startswith("worker"):
                continue
            if match := TASK_FAILURE.search(line):
                failures.append((name, match.group(1), match.group(2), match.group(3)))
                following = [text for _, text in self.logs.lines[number + 1 : number + 120]]
                where = project_frames(following, last=False)
                paths[f"{match.group(1)}: {where or match.group(3)[:120]}"] += 1
            elif match := HOOK_FAILURE.search(line):
                hooks[match.group(2)] = match.group(3).strip("'\"")
            elif "WorkerLostError" in line and "raised error" in line:
                worker_lost += 1
            elif "ERROR" in line and "chaos-task" not in line:
                other_errors[re.sub(r"^\[[^\]]*\]\s*", "", line)[:160]] += 1
        by_exception = Counter(exc.split("(")[0] for *_, exc in failures)
        connection_faults = sum(1 for f in self.soak.faults if f.kind in CONNECTION_FAULTS)
        samples = [
            f"{name}: {task}[{task_id}] for {hooks.get(task_id, '?')}: {exc[:200]}"
            for name, task, task_id, exc in failures[:25]
        ]
        return {
            "count": len(failures),
            "connection_faults": connection_faults,
            "pg_terminations": sum(1 for f in self.soak.faults if f.kind == "pg_terminate"),
            "pg_terminations_of_workers": sum(
                1 for f in self.soak.faults if f.kind == "pg_terminate" and f.target == "worker"
            ),
            "redis_restarts": sum(1 for f in self.soak.faults if f.kind == "redis_restart"),
            "body_cuts": sum(1 for f in self.soak.faults if f.kind == "body_cut"),
            "atomic_stalls": sum(1 for f in self.soak.faults if f.kind == "atomic_stall"),
            "by_exception": dict(by_exception.most_common()),
            "by_task": dict(Counter(task for _, task, _, _ in failures).most_common()),
            "executions": sorted({hooks[t] for _, _, t, _ in failures if t in hooks})[:50],
            "code_paths": dict(paths.most_common(10)),
            "samples": samples,
            "worker_lost_lines": worker_lost,
            "other_error_lines": dict(other_errors.most_common(15)),
        }

    # -- the report -------------------------------------------------------------------------

    def report(self) -> dict[str, Any]:
        """Every invariant, with what is needed to investigate each violation."""
        soak = self.soak
        lost = self.lost()
        reruns = self.checkpointed_reruns()
        doubled = self.effects_doubled()
        fan_ins, map_info = self.fan_ins_twice()
        payloads, dedup, resume_info = self.payloads_twice()
        mishandled = self.deliveries_mishandled()
        overlaps, explained, lock_info = self.lock_overlaps()
        stuck = self.stuck_locks()
        wrong = self.wrong_outcomes()
        money, atomic_info = self.atomic_writes()
        connection_losses = self.failed_by_connection_loss()
        tasks = self.task_failures()
        sweeper_exits = [e for e in soak.exits if e["role"] == "sweeper"]
        overruns, concurrency_info = self.concurrency_overruns()
        invariants = {
            "runs_lost": lost,
            "checkpointed_actions_run_again": reruns,
            "effects_doubled": doubled,
            "fan_ins_done_twice": fan_ins,
            "payloads_applied_twice": payloads,
            "idempotency_replays_broken": dedup,
            "deliveries_mishandled": mishandled,
            "lock_overlaps": overlaps,
            "stuck_locks": stuck,
            "wrong_outcomes": wrong,
            "atomic_writes_doubled": money,
            "failed_by_connection_loss": connection_losses,
            "sweeper_exits": sweeper_exits,
            "concurrency_overruns": overruns,
        }
        task_violation = tasks["count"] > tasks["connection_faults"]
        violated = [name for name, found in invariants.items() if found]
        if task_violation:
            violated.append("task_failures")
        fault_counts = Counter(f.kind for f in soak.faults)
        by_role = Counter(f.target for f in soak.faults if f.kind == "pg_terminate")
        outages = [
            f.restored_at - f.at for f in soak.faults if f.kind == "redis_restart" and f.restored_at
        ]
        statuses = Counter(run["status"] for run in self.runs.values())
        return {
            "config": {
                "runs": soak.args.runs,
                "faults_wanted": soak.args.faults,
                "seconds": soak.args.seconds,
                "seed": soak.args.seed,
                "workers": soak.args.workers,
                "database": soak.database,
                "redis_port": soak.redis_port,
                "logs": str(soak.logs),
            },
            "runs": {
                "submitted": len(self.runs),
                "planned": len(self.jobs),
                "by_kind": dict(Counter(job.kind for job in self.jobs.values()).most_common()),
                "expected": dict(Counter(job.expected for job in self.jobs.values()).most_common()),
                "final_statuses": dict(statuses.most_common()),
            },
            "faults": {
                "total": len(soak.faults),
                "by_kind": dict(fault_counts.most_common()),
                "pg_terminate_by_role": dict(by_role.most_common()),
                "backends_terminated": sum(f.hit for f in soak.faults if f.kind == "pg_terminate"),
                "body_cut_backends": sum(f.hit for f in soak.faults if f.kind == "body_cut"),
                "body_cut_by_target": dict(
                    Counter(f.target for f in soak.faults if f.kind == "body_cut").most_common()
                ),
                "redis_outage_s": [round(min(outages), 1), round(max(outages), 1)]
                if outages
                else [],
                "list": [
                    f"{time.strftime('%H:%M:%S', time.localtime(f.at))} "
                    f"{f.kind} {f.target} {f.detail}"
                    for f in soak.faults
                ],
            },
            "counts": {name: len(found) for name, found in invariants.items()}
            | {"task_failures": tasks["count"]},
            "invariants": invariants,
            "task_failures": tasks,
            "info": {
                "reruns_before_checkpoint": self.rerun_before_checkpoint(),
                "lock_overlaps_explained_by_redis_restart": explained,
                "locks": lock_info,
                "maps": map_info,
                "atomic": atomic_info,
                "concurrency": concurrency_info,
                "atomic_stalls": self.stalls(),
                "reconnects": self.db.rows(
                    "SELECT count(*) FROM django_reactor_executionevent WHERE kind = 'reconnect'"
                )[0][0],
                "resumes": resume_info,
                "process_exits": [
                    {k: v for k, v in e.items() if k != "log_tail"}
                    | {"log_tail": e["log_tail"][-6:]}
                    for e in soak.exits
                ],
            },
            "violated": violated,
            "ok": not violated,
        }


# ---------------------------------------------------------------------------- printing


def format_report(report: dict[str, Any], details: int = 8) -> str:
    """The report as text: the figures, then up to ``details`` entries per violation."""
    lines = []
    config, runs, faults = report["config"], report["runs"], report["faults"]
    lines.append(
        f"chaos soak: seed {config['seed']}, {config['runs']} runs, {config['workers']} workers "
        f"x 2 processes, at least {config['faults_wanted']} faults, bound {config['seconds']} s"
    )
    timeline = report.get("timeline", {})
    lines.append(
        "timeline: " + ", ".join(f"{k.removesuffix('_s')} {v} s" for k, v in timeline.items())
    )
    lines.append(f"database {config['database']}, Redis on port {config['redis_port']}")
    lines.append(
        f"runs: {runs['submitted']} submitted of {runs['planned']} planned; "
        f"by kind {runs['by_kind']}"
    )
    lines.append(f"  expected {runs['expected']}; ended {runs['final_statuses']}")
    lines.append(
        f"faults: {faults['total']} {faults['by_kind']}; pg_terminate by role "
        f"{faults['pg_terminate_by_role']} ({faults['backends_terminated']} backends); "
        f"body_cut {faults['body_cut_by_target']} ({faults['body_cut_backends']} backends); "
        f"Redis outages {faults['redis_outage_s']} s"
    )
    lines.append("invariants:")
    tasks = report["task_failures"]
    labels = {
        "runs_lost": "runs lost",
        "checkpointed_actions_run_again": "checkpointed actions run again",
        "effects_doubled": "effects doubled",
        "fan_ins_done_twice": "fan-ins done twice",
        "payloads_applied_twice": "payloads applied twice",
        "idempotency_replays_broken": "Idempotency-Key replays broken",
        "deliveries_mishandled": "deliveries lost or mishandled",
        "lock_overlaps": "lock overlaps",
        "stuck_locks": "stuck locks",
        "wrong_outcomes": "wrong outcomes",
        "atomic_writes_doubled": "atomic writes doubled",
        "failed_by_connection_loss": "failed by connection loss",
        "sweeper_exits": "sweeper exits",
        "concurrency_overruns": "concurrency overruns",
    }
    for name, label in labels.items():
        count = report["counts"][name]
        lines.append(f"  {label:.<40} {count}{'  VIOLATED' if count else ''}")
    verdict = "VIOLATED" if "task_failures" in report["violated"] else "ok"
    lines.append(
        f"  {'task failures':.<40} {tasks['count']} for {tasks['connection_faults']} connection "
        f"faults ({tasks['pg_terminations']} pg_terminate, {tasks['redis_restarts']} Redis "
        f"restarts, {tasks['body_cuts']} body_cut, {tasks['atomic_stalls']} atomic_stall)  "
        f"{verdict}"
    )
    info = report["info"]
    stalls = info["atomic_stalls"]
    lines.append(
        f"atomic: {info['atomic']['atomic_runs']} runs, {info['atomic']['transfers_committed']} "
        f"transfers committed; reconnect trace entries {info['reconnects']}; stalls "
        f"{len(stalls)} (session ended by the takeover in "
        f"{sum(1 for st in stalls if st['ended_by_takeover'])})"
    )
    for stall in stalls:
        lines.append(
            f"  stall: pid {stall['pid']} ({stall['role']}) in {stall['step']}.{stall['action']} "
            f"of {stall['execution_id']} ({stall['job']}, {stall['status']}): session ended "
            f"after {stall['session_ended_after_s']} s (by the takeover: "
            f"{stall['ended_by_takeover']}), woken after {stall['woken_after_s']} s, fence "
            f"{stall['fence']} -> {stall['fence_at_wake']}{', died' if stall['died'] else ''}"
        )
    keyed = info["concurrency"]
    lines.append(
        f"concurrency keys (limit {keyed['limit']}): {keyed['runs']} runs, {keyed['queued']} "
        f"queued, {keyed['admitted']} admitted ({keyed['admitted_by_sweeper']} by the sweeper), "
        f"{keyed['recovered']} taken over after a crash, at most {keyed['most_in_flight']} in "
        f"flight; body entries {keyed['body_entries']} ({keyed['bodies_cut_off']} cut off); "
        f"monitor samples {keyed['monitor_samples']}"
    )
    for key, figures in keyed["by_key"].items():
        lines.append(f"  {key}: {figures}")
    if keyed["monitor_error"]:
        lines.append(f"  monitor error: {keyed['monitor_error']}")
    lines.append(
        f"info: reruns before checkpoint (allowed) {info['reruns_before_checkpoint']['count']}; "
        f"lock entries {info['locks']}; lock overlaps explained by a Redis restart "
        f"{len(info['lock_overlaps_explained_by_redis_restart'])}; maps {info['maps']}"
    )
    lines.append(f"  resume answers {info['resumes']['answers']}")
    for kind, tally in info["resumes"].get("racing", {}).items():
        lines.append(f"  {kind}: {tally}")
    lost_answers = info["resumes"].get("first_retried_after_a_lost_answer", 0)
    lines.append(f"  first deliveries retried after a lost answer (5xx, none): {lost_answers}")
    if info["resumes"].get("resumer_error"):
        lines.append(f"  resumer error: {info['resumes']['resumer_error']}")
    if tasks["count"] or tasks["worker_lost_lines"]:
        lines.append(
            f"  task failures by exception {tasks['by_exception']}, by task {tasks['by_task']}; "
            f"WorkerLostError lines (from kills) {tasks['worker_lost_lines']}"
        )
    exits = Counter(e["role"] for e in info["process_exits"])
    if exits:
        lines.append(f"  processes that exited by themselves: {dict(exits)}")
    for name, label in labels.items():
        found = report["invariants"][name]
        if not found:
            continue
        lines.append("")
        lines.append(f"== {label}: {len(found)}")
        for entry in found[:details]:
            lines.append(_entry_text(entry))
        if len(found) > details:
            lines.append(f"   ... {len(found) - details} more (see --json)")
    if tasks["count"]:
        lines.append("")
        lines.append(f"== task failures: {tasks['count']}")
        lines.extend(f"   {n} x {path}" for path, n in tasks["code_paths"].items())
        lines.extend(f"   {sample}" for sample in tasks["samples"][:details])
        if tasks["executions"]:
            lines.append(f"   executions: {', '.join(tasks['executions'][:20])}")
    if tasks["other_error_lines"]:
        lines.append("")
        lines.append("== other ERROR lines in worker logs (most frequent)")
        lines.extend(f"   {n} x {line}" for line, n in tasks["other_error_lines"].items())
    lines.append("")
    lines.append(
        "RESULT: " + ("ok" if report["ok"] else "VIOLATED: " + ", ".join(report["violated"]))
    )
    return "\n".join(lines)


def _entry_text(entry: dict[str, Any]) -> str:
    details = ("log", "trace_tail", "ledger", "exchanges", "log_tail", "holders", "context")
    head = {k: v for k, v in entry.items() if k not in details}
    parts = [f" - {json.dumps(head, default=str)}"]
    for name in ("holders", "context", "ledger", "exchanges", "trace_tail", "log_tail", "log"):
        for line in entry.get(name) or []:
            parts.append(f"     {name}: {line}")
    return "\n".join(parts)


# ---------------------------------------------------------------------------- entry point


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The driver's options."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=200, help="runs to submit (200)")
    parser.add_argument("--faults", type=int, default=60, help="minimum number of faults (60)")
    parser.add_argument("--seconds", type=float, default=600, help="time bound in seconds (600)")
    parser.add_argument("--seed", type=int, default=None, help="random seed (default: random)")
    parser.add_argument("--workers", type=int, default=2, help="Celery workers, -c 2 each (2)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--report", type=Path, default=None, help="also write the JSON report here")
    parser.add_argument("--keep", action="store_true", help="keep the logs even without violations")
    parser.add_argument("--keep-db", action="store_true", help="do not drop the database")
    args = parser.parse_args(argv)
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1, 1_000_000)
    if args.runs < 1 or args.faults < 0 or args.workers < 1:
        parser.error("--runs and --workers must be at least 1, --faults at least 0")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the soak; print the report; 0 without violations, 1 with, 2 if it could not run."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--client"]:
        return client_main(argv[1], Path(argv[2]))
    args = parse_args(argv)
    soak = Soak(args)

    def stop(signum: int, frame: Any) -> None:
        """Turn SIGTERM and SIGHUP into SystemExit, so the clean-up runs."""
        raise SystemExit(128 + signum)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGHUP)}
    report: dict[str, Any] | None = None
    try:
        report = soak.run()
    except SoakError as exc:
        log(f"the soak could not run: {exc}")
        return 2
    except Exception:
        log(f"the soak failed:\n{traceback.format_exc()}")
        return 2
    finally:
        # Logs are kept when there is something to investigate.
        keep = args.keep or report is None or not report["ok"]
        keep = keep or bool(report["task_failures"]["count"])
        soak.cleanup(keep_logs=keep)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if args.report is not None:
        args.report.write_text(json.dumps(report, indent=1, default=str))
    print(json.dumps(report, indent=1, default=str) if args.json else format_report(report))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
