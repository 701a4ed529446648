"""Reactors shared by the database tests. Steps write to ``ledger`` so tests see what ran."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from django_reactor import Failure, Reactor, Step, Success, arg, step
from tests.helpers import FAIL_AT, ledger


class Tracked(Step):
    """Writes run/undo/compensate to the ledger; raises when its name is in FAIL_AT."""

    def run(self, **arguments: Any) -> Any:
        ledger("run", self.context.step)
        if self.context.step in FAIL_AT:
            raise RuntimeError(f"{self.context.step} exploded")
        return Success({"step": self.context.step, **arguments})

    def undo(self, result: Any, **arguments: Any) -> None:
        ledger("undo", self.context.step)

    def compensate(self, error: Any, **arguments: Any) -> None:
        ledger("compensate", self.context.step)


class Transfer(Reactor):
    """Debit, credit, notify: the shape of most money-moving sagas."""

    class Inputs(serializers.Serializer):
        account = serializers.CharField()
        amount = serializers.IntegerField(min_value=1)
        pin = serializers.CharField(write_only=True)

    debit = step(
        Tracked, account=arg.input("account"), amount=arg.input("amount"), pin=arg.input("pin")
    )
    credit = step(Tracked, amount=arg.result("debit", "amount"))
    notify = step(Tracked, wait_for=["credit"])

    class Meta:
        returns = "credit"


class UndoFails(Step):
    def run(self) -> Any:
        ledger("run", self.context.step)
        return "done"

    def undo(self, result: Any) -> Any:
        ledger("undo", self.context.step)
        if "undo" in FAIL_AT:
            return Failure("the refund service is down")
        return None


class Fragile(Reactor):
    """First step's undo can be made to fail; second step can be made to fail."""

    first = step(UndoFails)
    second = step(Tracked, wait_for=["first"])
