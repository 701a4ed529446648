"""Reactors of the chaos soak (``benchmarks/chaos_soak.py``).

Every run's inputs decide how it ends: ``spec["fail_at"]`` names the step that fails (the run is
then rolled back), ``spec["undo_fail"]`` the completed steps whose undo fails (the run then ends
``needs_attention``), ``spec["fail_element"]`` the map element that fails, and an interrupt's
payload says whether the run completes (approved) or halts (declined). Nothing else may change
that: the soak's faults (killed processes, terminated database connections, a restarted Redis)
must only delay a run.

Every step body, undo, compensate, map element, element undo and map ``collect`` appends one row
to the ``chaos_ledger`` table (created by the driver) through a connection of its own (never the
engine's, and never one the driver terminates), before doing anything else. The row says whether
the action's checkpoint already existed when the body started: a checkpointed action that runs
again shows as a ledger row with ``checkpointed`` true. A step holding a ``Lock`` also writes
when it entered and left its body to ``chaos_lock`` (server clock), so the driver can find
holders of the same key that overlapped.

``KeyedBackground`` declares ``Meta.concurrency`` (at most :data:`KEYED_LIMIT` runs per tenant in
flight, the rest queued). Its step bodies write to ``chaos_keyed`` when they entered (server
clock) and, in the same statement, what the database said then: the status of their own run and
the runs of their key holding a slot (:data:`HOLDING`); and when they left. The driver checks
that no body saw more than the limit, nor ran for a run still queued, and that the bodies of more
than the limit of a key's runs never overlapped.

Every step body also works on the engine's own database connection (Django's), so that a
connection fault can land inside it: ``Work``, its undo and compensate, ``Apply`` and the map
element run a short ``pg_sleep`` marked :data:`BODY_MARKER`, which the driver's ``body_cut``
fault looks for in ``pg_stat_activity``. A body that loses that connection is run again on a
new one (a ``reconnect`` trace entry, and a second ledger row that was not checkpointed).

``Transfer`` is an atomic step: inside its transaction it moves ``spec["amount"]`` between two
of the run's ``chaos_account`` rows (created by the driver, one set per run, so that no two
runs share a row lock) and inserts a ``chaos_transfer`` row, through Django's connection; its
undo moves the money back the same way. Only committed transfers count: the driver checks that
each action's transfer committed at most once and the balances agree with the committed rows.
After its writes, a ``Transfer`` body takes the driver's stall request if there is one
(:func:`stall_if_requested`: it stops itself with ``SIGSTOP`` inside its transaction, holding
its row locks, for the driver to wake after the run was taken over).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import time
from typing import Any

from rest_framework import serializers

from django_reactor import (
    Concurrency,
    Halt,
    Lock,
    Reactor,
    Step,
    arg,
    interrupt,
    map_over,
    receive,
    step,
    wait_for_event,
)

#: The libpq URL of the soak's database, for the ledger's own connection.
LEDGER_URL_ENV = "CHAOS_LEDGER_URL"
#: The folder of the driver's stall requests (``atomic_stall``), see :func:`stall_if_requested`.
STALL_DIR_ENV = "CHAOS_STALL_DIR"
#: Marks the statements a step body sends on the engine's connection (``body_cut`` finds them).
BODY_MARKER = "/* chaos body */"
#: Seconds of a plain body's marked query (the rest of its pause is spent outside the database).
BODY_QUERY_SECONDS = 0.03
#: The topic of ``MessageBackground``'s receive and the event ``EventBackground`` waits for.
DECISION = "chaos.decision"
#: What planned failures say (the driver tells them from failures the faults caused).
PLANNED = "chaos: planned failure"
PLANNED_UNDO = "chaos: planned undo failure"
#: How many runs of one tenant ``KeyedBackground`` lets be in flight at once.
KEYED_LIMIT = 2
#: Statuses of a run that holds its concurrency key's slot, spelled out (not taken from
#: ``store.flow.HOLDING``) so that the soak does not take the product's word for what it checks.
HOLDING = ["pending", "scheduled", "running", "paused", "rolling_back", "suspended"]

# Which checkpoint of an action must exist for the action to count as "already done".
_STEP_DONE = (
    "EXISTS (SELECT 1 FROM django_reactor_steprecord WHERE execution_id = %(execution_id)s "
    "AND step = %(step)s AND status IN ('completed', 'failed', 'halted', 'skipped'))"
)
_CHECKPOINTS = {
    "run": _STEP_DONE,
    "undo": (
        "EXISTS (SELECT 1 FROM django_reactor_steprecord WHERE execution_id = %(execution_id)s "
        "AND step = %(step)s AND rollback IN ('undone', 'failed'))"
    ),
    "compensate": (
        "EXISTS (SELECT 1 FROM django_reactor_steprecord WHERE execution_id = %(execution_id)s "
        "AND step = %(step)s AND rollback IN ('compensated', 'failed'))"
    ),
    "element": (
        "EXISTS (SELECT 1 FROM django_reactor_mapresult WHERE map_run_id = %(map_id)s "
        "AND index = %(element)s AND status IN ('succeeded', 'failed', 'halted', 'undoing', "
        "'undone', 'undo_failed'))"
    ),
    "element_undo": (
        "EXISTS (SELECT 1 FROM django_reactor_mapresult WHERE map_run_id = %(map_id)s "
        "AND index = %(element)s AND status IN ('undone', 'undo_failed'))"
    ),
    "collect": (
        "EXISTS (SELECT 1 FROM django_reactor_steprecord s JOIN django_reactor_maprun m "
        "ON m.execution_id = s.execution_id AND m.step = s.step WHERE m.id = %(map_id)s "
        "AND s.status IN ('completed', 'failed', 'halted'))"
    ),
}

_ledger: dict[str, Any] = {"pid": None, "connection": None}


def _connection() -> Any:
    import psycopg

    current = _ledger["connection"]
    if _ledger["pid"] == os.getpid() and current is not None and not current.closed:
        return current
    # A pool child forked from a parent that had a connection must not share its socket.
    _ledger["connection"] = psycopg.connect(
        os.environ[LEDGER_URL_ENV],
        autocommit=True,
        application_name="chaos_ledger",
        connect_timeout=5,
    )
    _ledger["pid"] = os.getpid()
    return _ledger["connection"]


def _execute(sql: str, params: dict[str, Any]) -> Any:
    """Run one autocommit statement on the ledger connection; reconnect (bounded) if needed."""
    import psycopg

    deadline = time.monotonic() + 60
    while True:
        try:
            with _connection().cursor() as cursor:
                cursor.execute(sql, params)
                return cursor.fetchone() if cursor.description else None
        except psycopg.OperationalError:
            _ledger["connection"] = None
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def record(
    action: str,
    *,
    execution_id: Any,
    step: str,
    key: str,
    attempt: int = 0,
    map_id: Any = None,
    element: int | None = None,
    note: str = "",
) -> None:
    """Append one ledger row for an action that is starting, with whether it was checkpointed."""
    params = {
        "execution_id": str(execution_id),
        "step": step,
        "action": action,
        "key": key,
        "attempt": attempt,
        "map_id": None if map_id is None else str(map_id),
        "element": element,
        "note": note,
        "pid": os.getpid(),
        "role": os.environ.get("CHAOS_ROLE", "unknown"),
    }
    _execute(
        "INSERT INTO chaos_ledger (execution_id, step, action, key, attempt, map_id, element, "
        "note, pid, role, checkpointed) VALUES (%(execution_id)s, %(step)s, %(action)s, "
        "%(key)s, %(attempt)s, %(map_id)s, %(element)s, %(note)s, %(pid)s, %(role)s, "
        f"{_CHECKPOINTS[action]})",
        params,
    )


def _record_context(step_object: Step, action: str, note: str = "") -> None:
    context = step_object.context
    record(
        action,
        execution_id=context.execution_id,
        step=context.step,
        key=context.idempotency_key,
        attempt=context.attempt,
        note=note,
    )


def body_query(seconds: float = BODY_QUERY_SECONDS) -> None:
    """A marked ``pg_sleep`` on the engine's connection (Django's ``default``): a body at work
    in the database, where ``body_cut`` can cut it."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(f"SELECT pg_sleep(%s) {BODY_MARKER}", [seconds])


def _pause(spec: dict[str, Any]) -> None:
    """Work ``spec["pause"]`` seconds: a marked query first, the rest outside the database."""
    pause = float(spec.get("pause", 0.1))
    query = min(pause, BODY_QUERY_SECONDS)
    body_query(query)
    time.sleep(pause - query)


class Work(Step):
    """A step of the soak: records itself, works ``spec["pause"]`` seconds, fails if planned."""

    def run(self, spec: dict[str, Any]) -> Any:
        """Record, work, fail when planned."""
        _record_context(self, "run")
        _pause(spec)
        if self.context.step == spec.get("fail_at"):
            raise RuntimeError(f"{PLANNED} at {self.context.step}")
        return {"step": self.context.step}

    def undo(self, result: Any, spec: dict[str, Any]) -> None:
        """Record, query; fail when this undo is planned to fail."""
        _record_context(self, "undo")
        body_query()
        if self.context.step in spec.get("undo_fail", ()):
            raise RuntimeError(f"{PLANNED_UNDO} of {self.context.step}")

    def compensate(self, error: Any, spec: dict[str, Any]) -> None:
        """Record, query."""
        _record_context(self, "compensate")
        body_query()


class LockedWork(Work):
    """``Work`` under a lock on ``chaos-slot-{slot}``; writes when it entered and left."""

    coordination = [Lock("chaos-slot-{slot}", ttl=60, wait=10)]

    def run(self, spec: dict[str, Any], slot: int) -> Any:  # type: ignore[override]
        """Record, note the lock's entry and exit around the work, fail when planned."""
        _record_context(self, "run")
        key = f"chaos-slot-{slot}"
        context = self.context
        entered = _execute(
            "INSERT INTO chaos_lock (execution_id, step, lock_key, fence, pid, role) "
            "VALUES (%(execution_id)s, %(step)s, %(lock_key)s, %(fence)s, %(pid)s, %(role)s) "
            "RETURNING id",
            {
                "execution_id": str(context.execution_id),
                "step": context.step,
                "lock_key": key,
                "fence": context.fences.get(key),
                "pid": os.getpid(),
                "role": os.environ.get("CHAOS_ROLE", "unknown"),
            },
        )
        try:
            _pause(spec)
        finally:
            _execute(
                "UPDATE chaos_lock SET exited_at = clock_timestamp() WHERE id = %(id)s",
                {"id": entered[0]},
            )
        if context.step == spec.get("fail_at"):
            raise RuntimeError(f"{PLANNED} at {context.step}")
        return {"step": context.step, "fence": context.fences.get(key)}


# The body's own run's status, and the runs of its key holding a slot, in one statement (one
# snapshot) with the entry.
_KEYED_ENTRY = (
    "INSERT INTO chaos_keyed (execution_id, step, tenant, pid, role, own_status, holding) "
    "SELECT %(execution_id)s, %(step)s, %(tenant)s, %(pid)s, %(role)s, "
    "(SELECT status FROM django_reactor_execution WHERE id = %(execution_id)s), "
    "ARRAY(SELECT id FROM django_reactor_execution WHERE reactor = %(reactor)s "
    "AND concurrency_key = %(tenant)s AND status = ANY(%(holding)s) ORDER BY created_at) "
    "RETURNING id"
)


class KeyedWork(Work):
    """``Work`` of a run holding a slot of its tenant's key; writes when it entered (with the
    runs of its key in flight then) and left."""

    def run(self, spec: dict[str, Any], tenant: str) -> Any:  # type: ignore[override]
        """Record, note the entry and the runs in flight, work, note the exit, fail when
        planned."""
        _record_context(self, "run")
        context = self.context
        entered = _execute(
            _KEYED_ENTRY,
            {
                "execution_id": str(context.execution_id),
                "step": context.step,
                "tenant": tenant,
                "pid": os.getpid(),
                "role": os.environ.get("CHAOS_ROLE", "unknown"),
                "reactor": context.reactor,
                "holding": HOLDING,
            },
        )
        try:
            _pause(spec)
        finally:
            _execute(
                "UPDATE chaos_keyed SET exited_at = clock_timestamp() WHERE id = %(id)s",
                {"id": entered[0]},
            )
        if context.step == spec.get("fail_at"):
            raise RuntimeError(f"{PLANNED} at {context.step}")
        return {"step": context.step}


def _work(*after: str) -> Any:
    return step(Work, spec=arg.input("spec"), wait_for=list(after))


def _locked(*after: str) -> Any:
    return step(LockedWork, spec=arg.input("spec"), slot=arg.input("slot"), wait_for=list(after))


def _keyed(*after: str) -> Any:
    return step(KeyedWork, spec=arg.input("spec"), tenant=arg.input("tenant"), wait_for=list(after))


# ---------------------------------------------------------------------------- chains


class Background(Reactor):
    """Four steps, all on workers."""

    a = _work()
    b = _work("a")
    c = _work("b")
    d = _work("c")

    class Meta:
        background = "all"


class HandOffAfter(Reactor):
    """``a`` in the caller, ``b`` and ``c`` on a worker."""

    a = _work()
    b = _work("a")
    c = _work("b")

    class Meta:
        background = {"after": "a"}


class HandOffBefore(Reactor):
    """``a`` in the caller; ``b`` and what follows on a worker."""

    a = _work()
    b = _work("a")
    c = _work("b")

    class Meta:
        background = {"before": "b"}


class Inline(Reactor):
    """Three steps in the caller."""

    a = _work()
    b = _work("a")
    c = _work("b")


class InlineLocked(Reactor):
    """In the caller; the middle step holds ``chaos-slot-{slot}`` (waits up to 10 s)."""

    a = _work()
    locked = _locked("a")
    c = _work("locked")


class BackgroundLocked(Reactor):
    """On workers; the middle step holds ``chaos-slot-{slot}`` (shared with the inline runs)."""

    a = _work()
    locked = _locked("a")
    c = _work("locked")

    class Meta:
        background = "all"


class KeyedBackground(Reactor):
    """On workers; at most :data:`KEYED_LIMIT` runs per ``tenant`` in flight, the others queued
    until a run of their tenant ends."""

    a = _keyed()
    b = _keyed("a")
    c = _keyed("b")

    class Meta:
        background = "all"
        concurrency = Concurrency(key="{tenant}", limit=KEYED_LIMIT, on_limit="queue")


# ---------------------------------------------------------------------------- atomic steps


def _move(step_object: Step, action: str, source: str, target: str, amount: int) -> None:
    """Move ``amount`` from ``source`` to ``target`` and insert the transfer's row, through
    Django's connection (inside the atomic step's transaction)."""
    from django.db import connection

    context = step_object.context
    with connection.cursor() as cursor:
        for account, delta in ((source, -amount), (target, amount)):
            cursor.execute(
                f"UPDATE chaos_account SET balance = balance + %s WHERE name = %s {BODY_MARKER}",
                [delta, account],
            )
            if cursor.rowcount != 1:
                raise RuntimeError(f"chaos: no account {account!r}")
        cursor.execute(
            "INSERT INTO chaos_transfer (execution_id, step, action, key, source, target, "
            f"amount, pid, role) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s) {BODY_MARKER}",
            [
                str(context.execution_id),
                context.step,
                action,
                context.idempotency_key,
                source,
                target,
                amount,
                os.getpid(),
                os.environ.get("CHAOS_ROLE", "unknown"),
            ],
        )


def stall_if_requested(step_object: Step, action: str) -> None:
    """Take the driver's stall request, if there is one, and stop this process (``SIGSTOP``).

    The request is a file in ``$CHAOS_STALL_DIR`` naming the bodies it is for:
    ``request-any`` (any atomic body), ``request-run-<step>`` (that step's run) or
    ``request-undo`` (any atomic undo). Whoever unlinks it took it (exactly one body). The
    taker writes ``stopped-<pid>`` (JSON: pid, execution, step, action,
    role; renamed into place, so the driver never reads half of it) and stops itself, inside
    its atomic step's transaction, after its writes. The driver wakes it (``SIGCONT``) after
    the run was taken over."""
    folder = os.environ.get(STALL_DIR_ENV)
    if not folder:
        return
    context = step_object.context
    mine = "request-undo" if action == "undo" else f"request-run-{context.step}"
    for name in ("request-any", mine):
        try:
            os.unlink(os.path.join(folder, name))
        except FileNotFoundError:
            continue
        break
    else:
        return
    pid = os.getpid()
    note = {
        "pid": pid,
        "execution_id": str(context.execution_id),
        "step": context.step,
        "action": action,
        "role": os.environ.get("CHAOS_ROLE", "unknown"),
    }
    partial = os.path.join(folder, f".stopped-{pid}")
    with open(partial, "w") as handle:
        json.dump(note, handle)
    os.rename(partial, os.path.join(folder, f"stopped-{pid}"))
    os.kill(pid, signal.SIGSTOP)


class Transfer(Step):
    """An atomic step of the soak: records itself (outside the transaction), moves
    ``spec["amount"]`` from ``accounts[route[0]]`` to ``accounts[route[1]]`` (inside it), may
    stall, works a little in the database, fails if planned. Its undo moves the money back."""

    atomic = True

    def run(self, spec: dict[str, Any], accounts: dict[str, str], route: list[str]) -> Any:
        """Record, move, maybe stall, work, fail when planned."""
        _record_context(self, "run")
        source, target = accounts[route[0]], accounts[route[1]]
        _move(self, "run", source, target, int(spec["amount"]))
        stall_if_requested(self, "run")
        body_query(float(spec.get("atomic_pause", BODY_QUERY_SECONDS)))
        if self.context.step == spec.get("fail_at"):
            raise RuntimeError(f"{PLANNED} at {self.context.step}")
        return {"step": self.context.step, "moved": int(spec["amount"])}

    def undo(
        self, result: Any, spec: dict[str, Any], accounts: dict[str, str], route: list[str]
    ) -> None:
        """Record, move the money back, maybe stall, work; fail when this undo is planned to."""
        _record_context(self, "undo")
        source, target = accounts[route[0]], accounts[route[1]]
        _move(self, "undo", target, source, int(spec["amount"]))
        stall_if_requested(self, "undo")
        body_query(float(spec.get("atomic_pause", BODY_QUERY_SECONDS)))
        if self.context.step in spec.get("undo_fail", ()):
            raise RuntimeError(f"{PLANNED_UNDO} of {self.context.step}")


def _transfer(route: tuple[str, str], *after: str) -> Any:
    return step(
        Transfer,
        spec=arg.input("spec"),
        accounts=arg.input("accounts"),
        route=arg.value(list(route)),
        wait_for=list(after),
    )


class AtomicBackground(Reactor):
    """On workers: ``a``, then two atomic steps (source to escrow, escrow to target), ``d``."""

    a = _work()
    debit = _transfer(("source", "escrow"), "a")
    credit = _transfer(("escrow", "target"), "debit")
    d = _work("credit")

    class Meta:
        background = "all"


class AtomicInline(Reactor):
    """Like ``AtomicBackground``, in the caller."""

    a = _work()
    debit = _transfer(("source", "escrow"), "a")
    credit = _transfer(("escrow", "target"), "debit")
    d = _work("credit")


class AtomicHandOff(Reactor):
    """``a`` and ``debit`` in the caller, ``credit`` and ``d`` on a worker."""

    a = _work()
    debit = _transfer(("source", "escrow"), "a")
    credit = _transfer(("escrow", "target"), "debit")
    d = _work("credit")

    class Meta:
        background = {"after": "debit"}


# ---------------------------------------------------------------------------- the map


class Element(Step):
    """One map element: records itself, works, fails when it is ``spec["fail_element"]``."""

    def _record(self, action: str, item: int) -> None:
        from django_reactor.engine.elements import current_element

        running = current_element()
        context = self.context
        record(
            action,
            execution_id=context.execution_id,
            step=context.step,
            key=context.idempotency_key,
            attempt=context.attempt,
            map_id=None if running is None else running.map_id,
            element=None if running is None else running.index,
        )

    def run(self, item: int, spec: dict[str, Any]) -> int:
        """Record, work, fail when this element is planned to fail."""
        self._record("element", item)
        pause = float(spec.get("element_pause", 0.05))
        query = min(pause, BODY_QUERY_SECONDS)
        body_query(query)
        time.sleep(pause - query)
        if item == spec.get("fail_element"):
            raise RuntimeError(f"{PLANNED} at element {item}")
        return item * 2

    def undo(self, result: Any, item: int, spec: dict[str, Any]) -> None:
        """Record; fail when this element's undo is planned to fail."""
        self._record("element_undo", item)
        body_query(0.01)
        if item == spec.get("element_undo_fail"):
            raise RuntimeError(f"{PLANNED_UNDO} of element {item}")


def collect(results: Any) -> int:
    """The map's fan-in: records itself (once per map, unless checkpointed already), sums."""
    map_id = results.map_id
    record("collect", execution_id=map_id, step="collect", key=str(map_id), map_id=map_id)
    return sum(results)


class FanOut(Reactor):
    """``a``, a fanned-out map of ``Element`` over ``items`` (2 tasks of 3), then ``after``."""

    a = _work()
    ticks = map_over(
        arg.input("items"),
        Element,
        item=arg.element(),
        spec=arg.input("spec"),
        fan_out=True,
        batch_size=6,
        chunk_size=3,
        collect=collect,
        wait_for=["a"],
    )
    after = _work("ticks")

    class Meta:
        background = "all"


# ---------------------------------------------------------------------------- interrupts


class Decision(serializers.Serializer):
    """The payload of the soak's interrupts: approve or decline, and which delivery it is."""

    approved = serializers.BooleanField()
    nonce = serializers.CharField(max_length=100)


class Apply(Step):
    """Applies the delivered payload: records its nonce; a declined payload halts the run."""

    def run(self, spec: dict[str, Any], decision: dict[str, Any]) -> Any:
        """Record the payload's nonce; halt when it was declined."""
        _record_context(self, "run", note=str(decision.get("nonce", "")))
        _pause(spec)
        if not decision.get("approved"):
            return Halt("declined")
        return {"applied": decision.get("nonce")}


class ApprovalBackground(Reactor):
    """``a`` on a worker, then an interrupt resumed over HTTP; a worker applies the payload."""

    a = _work()
    approval = interrupt(after=["a"], payload=Decision, resume="background")
    apply = step(Apply, spec=arg.input("spec"), decision=arg.result("approval"))

    class Meta:
        background = "all"


class ApprovalInline(Reactor):
    """Like ``ApprovalBackground``, but the web process that takes the payload applies it."""

    a = _work()
    approval = interrupt(after=["a"], payload=Decision, resume="inline")
    apply = step(Apply, spec=arg.input("spec"), decision=arg.result("approval"))

    class Meta:
        background = "all"


class EarlyApproval(Reactor):
    """Like ``ApprovalBackground``; the driver delivers to ``approval`` as soon as the run's row
    exists (before it parks, while it parks or after): an early delivery is kept until the run
    gets there."""

    a = _work()
    approval = interrupt(after=["a"], payload=Decision, resume="background")
    apply = step(Apply, spec=arg.input("spec"), decision=arg.result("approval"))

    class Meta:
        background = "all"


class MessageBackground(Reactor):
    """``a``, then a receive of :data:`DECISION` (a message the driver sends over HTTP at any
    moment after the run's row exists); a worker applies the one message it takes."""

    a = _work()
    decision = receive(DECISION, after=["a"], serializer=Decision, resume="background")
    apply = step(Apply, spec=arg.input("spec"), decision=arg.result("decision"))

    class Meta:
        background = "all"


class EventBackground(Reactor):
    """``a``, then a wait for the event :data:`DECISION` keyed by ``inputs["order"]`` (emitted
    over HTTP at any moment, even before the run exists: the wait looks back 10 minutes); a
    worker applies the earliest matching event, the only one the wait takes."""

    a = _work()
    decision = wait_for_event(
        DECISION,
        match=arg.input("order"),
        after=["a"],
        serializer=Decision,
        lookback=dt.timedelta(minutes=10),
        resume="background",
    )
    apply = step(Apply, spec=arg.input("spec"), decision=arg.result("decision"))

    class Meta:
        background = "all"
