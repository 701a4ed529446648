"""Reactors the API tests pause and resume."""

from __future__ import annotations

import threading
from typing import Any

from rest_framework import serializers

from django_reactor import Reactor, Step, Success, arg, interrupt, step
from tests.integration.reactors import Tracked


class Approval(serializers.Serializer):
    approved = serializers.BooleanField()
    note = serializers.CharField(max_length=20, required=False, default="")


class Request(Tracked):
    """Tracked, but the card stays out of its result: a step never returns a secret.

    (Step results are not redacted, see docs/how-to/secrets.md; the API tests check that the
    secret input appears nowhere in what the API shows.)
    """

    def run(self, *, card: str, **arguments: Any) -> Any:
        return super().run(**arguments)


class ApiRefund(Reactor):
    class Inputs(serializers.Serializer):
        order = serializers.CharField()
        card = serializers.CharField(write_only=True)

    request = step(Request, order=arg.input("order"), card=arg.input("card"))
    approval = interrupt(
        after=["request"],
        payload=Approval,
        correlation_id=lambda run: f"api-refund-{run.inputs['order']}",
        max_attempts=3,
    )
    refund = step(Tracked, approved=arg.result("approval", "approved"))

    class Meta:
        name = "tests.ApiRefund"


class ApiRefundInBackground(Reactor):
    request = step(Tracked)
    approval = interrupt(after=["request"], payload=Approval, resume="background")
    refund = step(Tracked, wait_for=["approval"])

    class Meta:
        name = "tests.ApiRefundInBackground"


class Gate:
    """Holds a step open: the step sets ``entered`` and waits until a test sets ``release``."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    def reset(self) -> None:
        self.entered.clear()
        self.release.clear()


GATE = Gate()


class Held(Step):
    """Runs until the test opens ``GATE`` (a resume that runs longer than the lease)."""

    def run(self, **arguments: Any) -> Any:
        GATE.entered.set()
        if not GATE.release.wait(timeout=30):
            raise RuntimeError("the test never opened the gate")
        return Success({"held": True})


class ApiHeldRefund(Reactor):
    """Resumed inline, its step after the interrupt runs until the test releases it."""

    request = step(Tracked)
    approval = interrupt(after=["request"], payload=Approval)
    hold = step(Held, wait_for=["approval"])

    class Meta:
        name = "tests.ApiHeldRefund"
