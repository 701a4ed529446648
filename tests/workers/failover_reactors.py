"""Reactors of the failover test (``test_failover.py``), run by real Celery workers.

Every step body, undo and atomic step notes that it started in a journal file (one JSON line
per start, appended in one write, in ``$REACTOR_FAULTS_STATE/journal.jsonl``) before it does
anything else: the journal lives outside the database, so it says what ran even where the
database lost something. Apart from the atomic steps, the bodies do not touch the database.

A run's ``spec`` says which of its actions wait while the test holds them (``spec["hold"]``,
names like ``s3`` or ``undo:s3``, held while the file ``spec["gate"]``, ``hold`` by default,
exists beside the journal; 60 s at most), how long each action works (``spec["pause"]``) and
which step fails (``fail_at``).
"""

from __future__ import annotations

import json
import os
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

from rest_framework import serializers

from django_reactor import Reactor, Step, arg, interrupt, step, step_context
from testproject.example.reactors import move

JOURNAL = "journal.jsonl"
HOLD = "hold"
PLANNED = "failover test: planned failure"


def folder() -> Path:
    """Where the journal and the hold file are (the test's ``REACTOR_FAULTS_STATE``)."""
    return Path(os.environ["REACTOR_FAULTS_STATE"])


def note(action: str, **extra: Any) -> None:
    """Append ``action``'s start to the journal, for the run in progress."""
    context = step_context()
    line = json.dumps(
        {"execution": str(context.execution_id), "action": action, "pid": os.getpid(), **extra}
    )
    descriptor = os.open(folder() / JOURNAL, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(descriptor, (line + "\n").encode())
    finally:
        os.close(descriptor)


def work(action: str, spec: dict[str, Any]) -> None:
    """Wait while the test holds ``action`` (bounded), then work ``spec["pause"]`` seconds."""
    if action in spec.get("hold", ()):
        gate = folder() / spec.get("gate", HOLD)
        deadline = time.monotonic() + 60
        while gate.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
    time.sleep(float(spec.get("pause", 0)))


class Journaled(Step):
    """Notes its start, works, fails when it is ``spec["fail_at"]``; its undo likewise."""

    def run(self, spec: dict[str, Any]) -> Any:
        """Note, work, fail when planned."""
        note(self.context.step)
        work(self.context.step, spec)
        if self.context.step == spec.get("fail_at"):
            raise RuntimeError(f"{PLANNED} at {self.context.step}")
        return {"step": self.context.step}

    def undo(self, result: Any, spec: dict[str, Any]) -> None:
        """Note, work."""
        action = f"undo:{self.context.step}"
        note(action)
        work(action, spec)


def _journaled(*after: str) -> Any:
    return step(Journaled, spec=arg.input("spec"), wait_for=list(after))


class FailoverChain(Reactor):
    """Five journaled steps in a chain, on workers; rolled back when one fails."""

    s1 = _journaled()
    s2 = _journaled("s1")
    s3 = _journaled("s2")
    s4 = _journaled("s3")
    s5 = _journaled("s4")

    class Meta:
        background = "all"


class Decision(serializers.Serializer):
    """The payload of ``FailoverApproval``: which delivery it is."""

    nonce = serializers.CharField(max_length=100)


class Apply(Step):
    """Applies the delivered payload: notes its nonce, works."""

    def run(self, spec: dict[str, Any], decision: dict[str, Any]) -> Any:
        """Note the payload's nonce, work."""
        note(self.context.step, nonce=decision["nonce"])
        work(self.context.step, spec)
        return {"applied": decision["nonce"]}


class FailoverApproval(Reactor):
    """A journaled step, an interrupt resumed on a worker, then the step applying its payload."""

    first = _journaled()
    approval = interrupt(after=["first"], payload=Decision, resume="background")
    apply = step(Apply, spec=arg.input("spec"), decision=arg.result("approval"))

    class Meta:
        background = "all"


class JournaledMove(Step):
    """Moves money in the body's transaction (the checkpoint's), noting its start first."""

    atomic = True

    def run(self, account: str, amount: str, spec: dict[str, Any]) -> Any:
        """Note, move, work (inside the transaction)."""
        note(self.context.step)
        moved = move(account, Decimal(amount), step=self.context.step)
        work(self.context.step, spec)
        return moved


class FailoverTransfer(Reactor):
    """Two atomic steps on a worker: debit ``source``, then credit ``target``, 30 each."""

    debit = step(
        JournaledMove, account=arg.input("source"), amount=arg.value("-30"), spec=arg.input("spec")
    )
    credit = step(
        JournaledMove,
        account=arg.input("target"),
        amount=arg.value("30"),
        spec=arg.input("spec"),
        wait_for=["debit"],
    )

    class Meta:
        background = "all"
