"""Reactors of the worker tests of messages and events: waits resumed in the background."""

from __future__ import annotations

import datetime as dt

from django_reactor import Reactor, arg, interrupt, receive, step, wait_for_event
from tests.workers.reactors import Effectful


class Mailboxed(Reactor):
    """Waits for an operator's go, then for a payment message; workers run the rest."""

    first = step(Effectful)
    go = interrupt(after="first", resume="background")
    paid = receive("payment", after="go", resume="background")
    ship = step(Effectful, paid=arg.result("paid"))


class RacingOnWorkers(Reactor):
    """Workers carry it from ``go`` to its interrupt and its receive while deliveries race."""

    first = step(Effectful)
    go = interrupt(after="first", resume="background")
    legal = interrupt(after="go", resume="background")
    paid = receive("payment", after="go", resume="background")
    ship = step(Effectful, legal=arg.result("legal", "n"), paid=arg.result("paid", "n"))


class WaitsOnWorkers(Reactor):
    """Workers carry it from ``go`` to a wait for an event while the event is emitted."""

    first = step(Effectful)
    go = interrupt(after="first", resume="background")
    shipped = wait_for_event(
        "worker.shipped",
        match=arg.input("order"),
        after="go",
        lookback=dt.timedelta(minutes=5),
    )
    ship = step(Effectful, n=arg.result("shipped", "n"))
