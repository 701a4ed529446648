"""Reactors the schedule tests fire. Steps write to the suite's ledger."""

from __future__ import annotations

import threading
from typing import Any

from rest_framework import serializers

from django_reactor import Reactor, Step, Success, arg, step
from tests.helpers import ledger

#: Set by a test to let ``Held``'s step finish; the step waits for it (boundedly).
RELEASE = threading.Event()
#: Set by ``Held``'s step once it runs.
STARTED = threading.Event()


class Report(Step):
    def run(self, region: str, limit: int) -> Any:
        ledger("run", f"report:{region}")
        return Success({"region": region, "limit": limit})


class NightlyReport(Reactor):
    """What a schedule runs: inputs checked by a serializer, one step."""

    class Inputs(serializers.Serializer):
        region = serializers.ChoiceField(choices=["eu", "us"])
        limit = serializers.IntegerField(min_value=1, default=10)

    report = step(Report, region=arg.input("region"), limit=arg.input("limit"))


class Hold(Step):
    def run(self) -> Any:
        STARTED.set()
        if not RELEASE.wait(timeout=30):
            raise RuntimeError("the test never released the step")
        ledger("run", "held")
        return "released"


class Held(Reactor):
    """A run that stays in flight (running, in a thread) until the test releases it."""

    hold = step(Hold)
