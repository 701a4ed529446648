"""Background reactors the sharding worker tests route to the second database."""

from __future__ import annotations

import datetime as dt

from django_reactor import Reactor, Step, arg, map_over, sleep, step


class Plus(Step):
    def run(self, value: int) -> int:
        return value + 1


class Triple(Step):
    def run(self, item: int) -> int:
        return 3 * item


class ShardedFanOut(Reactor):
    """Two steps and a map fanned out to element tasks, all on workers."""

    first = step(Plus, value=arg.input("start"))
    second = step(Plus, value=arg.result("first"))
    lines = map_over(
        arg.value(list(range(12))),
        Triple,
        item=arg.element(),
        fan_out=True,
        batch_size=4,
        wait_for=["second"],
    )
    total = step(Plus, value=arg.result("second"), wait_for=["lines"])

    class Meta:
        background = "all"
        returns = "total"


class ShardedSleeper(Reactor):
    """Sleeps a day on a worker; the sweeper of its database wakes it."""

    nap = sleep(dt.timedelta(days=1))
    after = step(Plus, value=arg.value(41), wait_for=["nap"])

    class Meta:
        background = "all"
        returns = "after"


ROUTING = {
    "default": "default",
    "tests.workers.routed_reactors.ShardedFanOut": "shard",
    "tests.workers.routed_reactors.ShardedSleeper": "shard",
}
