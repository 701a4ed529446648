"""A reactor as two deploys wrote it, for the rolling-deploy test: ``REACTOR_TEST_CODE=old``
is the code before the deploy (version 1 only), anything else the code after it (version 2,
which adds a step, and version 1 kept in code to finish its runs).

Each step returns ``"<version>@<code>"``: the version of the class that ran it and the deploy
of the process that did, so the test can tell which code ran every step of every run.
"""

from __future__ import annotations

import os
import time

from django_reactor import Reactor, step

CODE = "old" if os.environ.get("REACTOR_TEST_CODE") == "old" else "new"
#: How long each step takes: long enough that killed workers leave runs in flight.
STEP_SECONDS = 0.25


def ran(version: str) -> str:
    time.sleep(STEP_SECONDS)
    return f"{version}@{CODE}"


def reserve_v1() -> str:
    return ran("1")


def charge_v1() -> str:
    return ran("1")


def ship_v1() -> str:
    return ran("1")


def reserve_v2() -> str:
    return ran("2")


def charge_v2() -> str:
    return ran("2")


def tax_v2() -> str:
    return ran("2")


def ship_v2() -> str:
    return ran("2")


if CODE == "old":

    class Checkout(Reactor):
        """Version 1: reserve, charge, ship."""

        reserve = step()(reserve_v1)
        charge = step(wait_for=["reserve"])(charge_v1)
        ship = step(wait_for=["charge"])(ship_v1)

        class Meta:
            version = "1"
            background = "all"

else:

    class Checkout(Reactor):  # type: ignore[no-redef]
        """Version 2: a tax step between charge and ship."""

        reserve = step()(reserve_v2)
        charge = step(wait_for=["reserve"])(charge_v2)
        tax = step(wait_for=["charge"])(tax_v2)
        ship = step(wait_for=["tax"])(ship_v2)

        class Meta:
            version = "2"
            background = "all"

    class CheckoutV1(Reactor):
        """Version 1, kept until the runs that started on it finish."""

        reserve = step()(reserve_v1)
        charge = step(wait_for=["reserve"])(charge_v1)
        ship = step(wait_for=["charge"])(ship_v1)

        class Meta:
            version_of = Checkout
            version = "1"
            background = "all"
