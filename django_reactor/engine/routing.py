"""Where a run waits and in what order: its queue and its priority.

A run's route is fixed when it is created: the reactor's ``Meta.queue`` / ``Meta.priority``,
overridden by ``run(..., queue=..., priority=...)``, or, for a composed child that declares
neither, its parent's. Every publish of the run (start, resume, the sweeper's republish, map
chunks, async units) goes to the route's queue, and where runs wait in the database (the outbox,
the sweeper's wake-ups) higher priorities go first.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..exceptions import DefinitionError, InvalidRoute

__all__ = [
    "DEFAULT_PRIORITY",
    "DEFAULT_ROUTE",
    "HIGHEST_PRIORITY",
    "LOWEST_PRIORITY",
    "MAX_QUEUE_LENGTH",
    "Route",
    "declared",
    "priority_of",
    "queue_name",
    "route_for",
]

LOWEST_PRIORITY = 0
HIGHEST_PRIORITY = 9
DEFAULT_PRIORITY = 5
MAX_QUEUE_LENGTH = 255


@dataclass(frozen=True)
class Route:
    """A run's queue (``""``: the default Celery queue) and priority (0 lowest, 9 highest)."""

    queue: str = ""
    priority: int = DEFAULT_PRIORITY


DEFAULT_ROUTE = Route()


def queue_name(value: object, what: str) -> str:
    """A queue name as given (``what`` names where it came from for the error)."""
    if not isinstance(value, str) or not value.strip() or value != value.strip():
        raise InvalidRoute(
            f"{what} must be a Celery queue name (a non-empty string without surrounding "
            f'spaces, like "payments"), got {value!r}'
        )
    if len(value) > MAX_QUEUE_LENGTH:
        raise InvalidRoute(
            f"{what} is {len(value)} characters long; a queue name has at most {MAX_QUEUE_LENGTH}"
        )
    return value


def priority_of(value: object, what: str) -> int:
    """A priority as given: a whole number from 0 (lowest) to 9 (highest)."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or not LOWEST_PRIORITY <= value <= HIGHEST_PRIORITY
    ):
        raise InvalidRoute(
            f"{what} must be a whole number from {LOWEST_PRIORITY} (lowest) to "
            f"{HIGHEST_PRIORITY} (highest); the default is {DEFAULT_PRIORITY}. Got {value!r}"
        )
    return value


def declared(reactor: str, queue: object, priority: object) -> tuple[str | None, int | None]:
    """``Meta.queue`` and ``Meta.priority`` checked at class definition (None: not declared)."""
    try:
        return (
            None if queue is None else queue_name(queue, f"{reactor}.Meta.queue"),
            None if priority is None else priority_of(priority, f"{reactor}.Meta.priority"),
        )
    except InvalidRoute as error:
        raise DefinitionError(str(error)) from None


def route_for(
    declared_queue: str | None,
    declared_priority: int | None,
    *,
    queue: str | None = None,
    priority: int | None = None,
    inherited: Route | None = None,
) -> Route:
    """The route of a new run: the caller's choice, else the reactor's, else the parent's.

    Raises InvalidRoute naming the argument when ``queue`` or ``priority`` is not valid.
    """
    base = inherited or DEFAULT_ROUTE
    if queue is not None:
        chosen_queue = queue_name(queue, "queue")
    elif declared_queue is not None:
        chosen_queue = declared_queue
    else:
        chosen_queue = base.queue
    if priority is not None:
        chosen_priority = priority_of(priority, "priority")
    elif declared_priority is not None:
        chosen_priority = declared_priority
    else:
        chosen_priority = base.priority
    return Route(chosen_queue, chosen_priority)
