"""Reactors the sharding tests route to the second database (``REACTOR["DATABASE"]``)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from rest_framework import serializers

from django_reactor import Reactor, Step, arg, interrupt, map_over, receive, sleep, step


class Echo(Step):
    def run(self, value: Any = None) -> Any:
        return value


class Double(Step):
    def run(self, item: int) -> int:
        return 2 * item


class Approval(serializers.Serializer):
    approved = serializers.BooleanField()


class RoutedOrder(Reactor):
    """A step, an interrupt, a map and a step after: every kind of row a run writes."""

    class Inputs(serializers.Serializer):
        order_id = serializers.CharField()

    reserve = step(Echo, value=arg.input("order_id"))
    # Side by side, in threads of their own: they must write to the run's database too.
    audit = step(Echo, value=arg.value("audit"), wait_for=["reserve"])
    notify = step(Echo, value=arg.value("notify"), wait_for=["reserve"])
    approval = interrupt(
        after=["audit", "notify"],
        payload=Approval,
        correlation_id=lambda run: f"routed-{run.inputs['order_id']}",
    )
    lines = map_over(arg.value([1, 2, 3]), Double, item=arg.element(), wait_for=["approval"])
    ship = step(Echo, value=arg.result("lines"))

    class Meta:
        name = "tests.RoutedOrder"
        returns = "ship"
        max_concurrency = 2


class RoutedNap(Reactor):
    """Sleeps a day, then one step: woken by the sweeper of its database."""

    nap = sleep(dt.timedelta(days=1))
    after = step(Echo, value=arg.value("woke"), wait_for=["nap"])

    class Meta:
        name = "tests.RoutedNap"
        returns = "after"


class RoutedMailbox(Reactor):
    """Waits for a message on "payment", then one step."""

    open = step(Echo, value=arg.value("open"))
    payment = receive("payment", after="open")
    settle = step(Echo, value=arg.result("payment"))

    class Meta:
        name = "tests.RoutedMailbox"
        returns = "settle"


class HomeNap(Reactor):
    """Sleeps a day in the default database."""

    nap = sleep(dt.timedelta(days=1))
    after = step(Echo, value=arg.value("woke at home"), wait_for=["nap"])

    class Meta:
        name = "tests.HomeNap"
        returns = "after"


class StaysHome(Reactor):
    """Not routed: its runs go to the default database."""

    only = step(Echo, value=arg.value("home"))

    class Meta:
        name = "tests.StaysHome"
        returns = "only"


class StartHome(Step):
    def run(self) -> str:
        return str(StaysHome.run({}).execution_id)


class StartsElsewhere(Reactor):
    """Routed to the shard; its step starts a run of an unrouted reactor."""

    start = step(StartHome)

    class Meta:
        name = "tests.StartsElsewhere"
        returns = "start"


#: The routing the tests configure.
ROUTING = {
    "default": "default",
    "tests.RoutedOrder": "shard",
    "tests.RoutedNap": "shard",
    "tests.RoutedMailbox": "shard",
    "tests.StartsElsewhere": "shard",
}
