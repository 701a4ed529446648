"""Reactors of the worker tests of messages: a receive resumed in the background."""

from __future__ import annotations

from django_reactor import Reactor, arg, interrupt, receive, step
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
