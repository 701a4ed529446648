"""``receive(topic)``: a step that waits for the next message sent to its run on a topic.

A receive is an interrupt whose payloads come from the run's mailbox: the run parks there as
at an ``interrupt(...)`` (the interrupt construct runs it), and the first unread message sent
to the topic with ``django_reactor.send()``, before the run arrived or after, is its result::

    class Checkout(Reactor):
        order = step(PlaceOrder, order_id=arg.input("order_id"))
        paid = receive("payment", after="order", serializer=PaymentSerializer,
                       timeout=dt.timedelta(hours=1), default={"status": "unpaid"})
        ship = step(Ship, payment=arg.result("paid"))

Messages are taken in send order per topic, each exactly once; one the serializer refuses is
marked invalid (with its field errors) and skipped, and the step takes the next.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from ...exceptions import DefinitionError, InvalidMessage, ReactorError, ResultNotSerializable
from ..declarations import StepDeclaration
from ..serialization import encode, safe_repr
from .interrupt import SHAPE_MODULE, ContinueWith, InterruptStep, interrupt

if TYPE_CHECKING:
    from ..definition import ReactorDefinition

TOPIC_MAX_LENGTH = 255
#: A topic: letters, digits and ``._:-``, starting with a letter or a digit.
TOPIC_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]*")


class _NoDefault:
    def __repr__(self) -> str:
        return "NO_DEFAULT"


NO_DEFAULT = _NoDefault()


def check_topic(topic: object) -> str:
    """``topic`` if it is a valid topic name; InvalidMessage saying what one looks like if not."""
    if (
        isinstance(topic, str)
        and len(topic) <= TOPIC_MAX_LENGTH
        and TOPIC_PATTERN.fullmatch(topic) is not None
    ):
        return topic
    raise InvalidMessage(
        f"a topic is a name of at most {TOPIC_MAX_LENGTH} letters, digits and '._:-', starting "
        f"with a letter or a digit (such as 'payment.succeeded'), got {safe_repr(topic)}"
    )


def receive(
    topic: str,
    *,
    after: Iterable[str] | str = (),
    serializer: type | None = None,
    timeout: float | dt.timedelta | None = None,
    default: object = NO_DEFAULT,
    resume: str = "inline",
) -> StepDeclaration:
    """Declare a step that waits for the next message sent to the run on ``topic``.

    - ``after``: the steps that must be done first (the step has no arguments of its own).
    - ``serializer``: a DRF serializer class; a message is validated when the step takes it,
      its ``validated_data`` is the step's result, and a message it refuses is marked invalid
      and skipped. Without one, the message's payload is the result as sent.
    - ``timeout`` (seconds or a ``timedelta``): how long the step waits once the run reached
      it; then the run goes on with ``default``, or, without one, is undone and fails.
    - ``resume``: ``"inline"`` (the sender's process runs the rest of a run paused here) or
      ``"background"`` (a worker does).
    """
    try:
        check_topic(topic)
    except ReactorError as exc:
        raise DefinitionError(f"receive(topic=...): {exc}") from None
    if default is not NO_DEFAULT:
        if timeout is None:
            raise DefinitionError(
                "receive(default=...) is the result when the timeout passes: give a timeout too"
            )
        try:
            encode(default)
        except ResultNotSerializable as exc:
            raise DefinitionError(f"receive(default=...) cannot be stored: {exc}") from None
    declared = interrupt(
        after=after,
        payload=serializer,
        timeout=timeout,
        on_timeout="fail" if default is NO_DEFAULT else ContinueWith(default),
        resume=resume,
    )
    waits = declared.impl
    assert issubclass(waits, InterruptStep)  # interrupt() made it
    spec = dataclasses.replace(waits.interrupt, topic=topic)
    impl = type("Receive", (InterruptStep,), {"interrupt": spec, "__module__": SHAPE_MODULE})
    return StepDeclaration(impl, {}, wait_for=declared.wait_for)


def receive_paths(definition: ReactorDefinition) -> Iterator[tuple[str, str]]:
    """Every ``receive`` a run of ``definition`` can wait at: ``(path, topic)``, its own
    first, then its composed children's (``"checkout.paid"``), in declaration order."""
    for spec in definition.steps:
        if spec.interrupt is not None and spec.interrupt.topic is not None:
            yield spec.name, spec.interrupt.topic
        elif spec.child is not None:
            for path, topic in receive_paths(spec.child.definition):
                yield f"{spec.name}.{path}", topic
