"""Reactors whose step bodies lose their database connection mid-way (the connection-loss
matrix of ``test_reconnection.py``, inline and on workers).

A body notes that it started in a file (outside the database: an atomic body's rows roll
back), writes its effect, then reaches a fault point (``mid_body``, ``mid_undo``,
``mid_compensate``) that ``REACTOR_FAULTS`` arms with ``db_kill``: the body's own backend is
terminated, as a failover, a pooler restart or an idle-session timeout would. Then it writes
again, on whatever connection it has: a body run again on a new connection gets there.
"""

from __future__ import annotations

import os
from decimal import Decimal
from typing import Any

from rest_framework import serializers

from django_reactor import Reactor, Step, Success, arg, faults, map_over, step, step_context
from testproject.example.models import BodyRun, Effect
from testproject.example.reactors import move


def note_body(label: str) -> None:
    """One line per body started: ``<execution id> <label>`` (read by :func:`bodies`)."""
    context = step_context()
    folder = os.environ.get("REACTOR_FAULTS_STATE") or "/tmp"
    with open(os.path.join(folder, "bodies"), "a") as lines:
        lines.write(f"{context.execution_id} {label}\n")


def effect(label: str) -> None:
    """The body's external effect, once per idempotency key (a payment provider would)."""
    context = step_context()
    Effect.objects.get_or_create(
        key=context.idempotency_key, defaults={"execution_id": context.execution_id, "step": label}
    )


class Cuts(Step):
    """A plain step: notes its start, writes its effect, may lose its connection, writes a
    ``BodyRun`` after that; fails when its name is ``fails``. Its undo and compensate do the
    same around ``mid_undo`` and ``mid_compensate``."""

    def run(self, **arguments: Any) -> Any:
        name = self.context.step
        note_body(name)
        effect(name)
        faults.point("mid_body", step=name)
        BodyRun.objects.create(execution_id=self.context.execution_id, step=name, pid=os.getpid())
        if name == "fails":
            raise RuntimeError("the step failed, as it should")
        return Success({"step": name})

    def undo(self, result: Any, **arguments: Any) -> None:
        label = f"undo:{self.context.step}"
        note_body(label)
        effect(label)
        faults.point("mid_undo", step=self.context.step)
        BodyRun.objects.create(execution_id=self.context.execution_id, step=label, pid=os.getpid())

    def compensate(self, error: Any, **arguments: Any) -> None:
        label = f"compensate:{self.context.step}"
        note_body(label)
        effect(label)
        faults.point("mid_compensate", step=self.context.step)
        BodyRun.objects.create(execution_id=self.context.execution_id, step=label, pid=os.getpid())


class CutsAtomically(Step):
    """An atomic step: moves money (a balance and a ledger entry) in its transaction, then may
    lose its connection inside it; its undo moves the money back the same way."""

    atomic = True

    def run(self, account: str, amount: str) -> Any:
        note_body(self.context.step)
        moved = move(account, Decimal(amount), step=self.context.step)
        faults.point("mid_body", step=self.context.step)
        return moved

    def undo(self, result: Any, account: str, amount: str) -> None:
        label = f"undo:{self.context.step}"
        note_body(label)
        move(account, -Decimal(amount), step=label)
        faults.point("mid_undo", step=self.context.step)


class Accounts(serializers.Serializer):
    source = serializers.CharField()
    target = serializers.CharField()


class CutPlain(Reactor):
    """Three plain steps in a row."""

    first = step(Cuts)
    second = step(Cuts, wait_for=["first"])
    third = step(Cuts, wait_for=["second"])


class CutAtomic(Reactor):
    """A plain step, then two atomic steps: debit, credit."""

    Inputs = Accounts

    first = step(Cuts)
    debit = step(CutsAtomically, account=arg.input("source"), amount=arg.value("-30"))
    credit = step(
        CutsAtomically, account=arg.input("target"), amount=arg.value("30"), wait_for=["debit"]
    )


class CutSideBySide(Reactor):
    """Two plain steps and an atomic one side by side, then a step after them."""

    Inputs = Accounts

    left = step(Cuts)
    right = step(Cuts)
    debit = step(CutsAtomically, account=arg.input("source"), amount=arg.value("-30"))
    after = step(Cuts, wait_for=["left", "right", "debit"])

    class Meta:
        max_concurrency = 3


class CutUnderTimeout(Reactor):
    """A plain step whose body runs under a timeout (in a thread of its own), then another."""

    timed = step(Cuts, timeout=60)
    after = step(Cuts, wait_for=["timed"])


class CutElement(Reactor):
    """The element of :class:`CutMap`: one plain step."""

    class Inputs(serializers.Serializer):
        item = serializers.IntegerField()

    tick = step(Cuts)


class CutMap(Reactor):
    """A map of six elements, then a plain step."""

    ticks = map_over(arg.value([1, 2, 3, 4, 5, 6]), CutElement, item=arg.element(), batch_size=2)
    after = step(Cuts, wait_for=["ticks"])


class CutRollback(Reactor):
    """A plain step and an atomic one, then a step that fails: both are undone, the failed
    one compensated."""

    Inputs = Accounts

    first = step(Cuts)
    debit = step(
        CutsAtomically, account=arg.input("source"), amount=arg.value("-30"), wait_for=["first"]
    )
    fails = step(Cuts, wait_for=["debit"])


def on_workers(reactor: type[Reactor]) -> type[Reactor]:
    """The same reactor, run on workers from its first step (``Meta.background = "all"``)."""
    meta = type("Meta", (), {**_meta_of(reactor), "background": "all"})
    return type(f"{reactor.__name__}OnWorker", (reactor,), {"Meta": meta, "__module__": __name__})


def _meta_of(reactor: type[Reactor]) -> dict[str, Any]:
    meta = reactor.__dict__.get("Meta")
    return {k: v for k, v in vars(meta).items() if not k.startswith("__")} if meta else {}


CutPlainOnWorker = on_workers(CutPlain)
CutAtomicOnWorker = on_workers(CutAtomic)
CutSideBySideOnWorker = on_workers(CutSideBySide)
CutUnderTimeoutOnWorker = on_workers(CutUnderTimeout)
CutMapOnWorker = on_workers(CutMap)
CutRollbackOnWorker = on_workers(CutRollback)
