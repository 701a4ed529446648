"""Small reactors the testing helpers are tried on."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from django_reactor import Failure, Halt, Reactor, Retry, Step, arg, interrupt, step
from tests.integration.reactors import Tracked, ledger

COUNTER = {"n": 0}


class Order(Reactor):
    """reserve -> charge -> ship, each a Tracked step (undo and compensate write the ledger)."""

    class Inputs(serializers.Serializer):
        order = serializers.CharField()

    reserve = step(Tracked, order=arg.input("order"))
    charge = step(Tracked, order=arg.result("reserve", "order"))
    ship = step(Tracked, wait_for=["charge"])

    class Meta:
        returns = "charge"


class OrderLater(Reactor):
    """The same saga, run by a worker after ``reserve``."""

    reserve = step(Tracked)
    charge = step(Tracked, wait_for=["reserve"])
    ship = step(Tracked, wait_for=["charge"])

    class Meta:
        background = {"after": "reserve"}


class Approval(serializers.Serializer):
    approved = serializers.BooleanField()


class Refund(Reactor):
    """Waits for an approval; the rest runs in the background after the payload."""

    request = step(Tracked)
    approval = interrupt(after="request", payload=Approval, resume="background")
    refund = step(Tracked, approved=arg.result("approval", "approved"))


class Flaky(Step):
    """Fails its first two attempts."""

    def run(self) -> Any:
        COUNTER["n"] += 1
        ledger("run", self.context.step)
        if COUNTER["n"] < 3:
            raise ConnectionError(f"attempt {COUNTER['n']} timed out")
        return "ok"


class Retrying(Reactor):
    fetch = step(Flaky, retry=Retry(attempts=3, delay=0.01))


class RetryingLater(Reactor):
    """Retries with a long backoff; a worker would wake it up later."""

    fetch = step(Flaky, retry=Retry(attempts=3, delay=600))

    class Meta:
        background = "all"


class Counting(Step):
    """Not idempotent: returns a new number every call."""

    def run(self) -> Any:
        COUNTER["n"] += 1
        return COUNTER["n"]


class Numbering(Reactor):
    first = step(Tracked)
    number = step(Counting, wait_for=["first"])


class RefuseUndo(Step):
    def run(self) -> Any:
        return "held"

    def undo(self, result: Any) -> Any:
        return Failure("the refund service is down")


class UndoBreaks(Reactor):
    hold = step(RefuseUndo)
    charge = step(Tracked, wait_for=["hold"])


def out_of_stock() -> Halt:
    return Halt("out of stock")


class Stops(Reactor):
    check = step(Tracked)
    stop = step(out_of_stock, wait_for=["check"])
