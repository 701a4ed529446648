"""The public :class:`Reactor` base class: declare steps, then run and steer executions."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from uuid import UUID

from .engine.definition import ReactorBase

if TYPE_CHECKING:
    from .engine.outcomes import Outcome
    from .handle import ExecutionHandle


# The methods import ``registry``, ``services`` and ``runtime.aio`` when called: this module
# is part of the import-safe public API (``django_reactor/__init__``), loaded before Django's
# apps are ready, and those modules reach the models.


class Reactor(ReactorBase):
    """Base class of sagas.

    Declare inputs as a DRF serializer named ``Inputs`` and steps with :func:`step`; run with
    :meth:`run`. ``write_only`` input fields are secrets: they are redacted wherever a run is
    displayed or logged.

    >>> class Hello(Reactor):
    ...     class Inputs(serializers.Serializer):
    ...         name = serializers.CharField()
    ...
    ...     @step(name=arg.input("name"))
    ...     def greet(name):
    ...         return f"Hello, {name}"
    ...
    ...     class Meta:
    ...         returns = "greet"
    >>> Hello.run({"name": "Ada"}).value  # doctest: +SKIP
    'Hello, Ada'
    """

    @classmethod
    def _on_defined(cls, *, abstract: bool) -> None:
        # Reactor itself is the base class users subclass, not a reactor to register.
        if not abstract and not (cls.__module__ == __name__ and cls.__qualname__ == "Reactor"):
            from . import registry

            registry.register(cls)

    @classmethod
    def run(
        cls,
        inputs: Mapping[str, Any] | None = None,
        *,
        idempotency_key: str | None = None,
        at: dt.datetime | None = None,
        delay: dt.timedelta | float | None = None,
        deadline: dt.timedelta | dt.datetime | None = None,
        queue: str | None = None,
        priority: int | None = None,
    ) -> Outcome:
        """Run the reactor in this process and return its :class:`Outcome`.

        With ``idempotency_key``, at most one execution exists per key and reactor: a repeat
        (even a concurrent one) runs nothing and returns the first execution's outcome with
        ``idempotent_replay=True``. With ``at`` (an aware datetime) or ``delay`` (a
        ``timedelta`` or seconds) the run is stored ``scheduled`` and a worker starts it then
        (``Scheduled`` outcome). ``deadline`` (a ``timedelta`` from the start, or an aware
        datetime) overrides ``Meta.deadline``: past it the run starts no more steps and rolls
        back (or halts, ``Meta.on_deadline``). ``queue`` and ``priority`` (0 lowest to 9
        highest) override ``Meta.queue`` and ``Meta.priority``: where the run's tasks go and
        which waiting runs go first (InvalidRoute, nothing written, for bad ones).
        """
        from . import services

        return services.run(
            cls,
            inputs or {},
            idempotency_key=idempotency_key,
            at=at,
            delay=delay,
            deadline=deadline,
            queue=queue,
            priority=priority,
        )

    @classmethod
    async def arun(
        cls,
        inputs: Mapping[str, Any] | None = None,
        *,
        idempotency_key: str | None = None,
        at: dt.datetime | None = None,
        delay: dt.timedelta | float | None = None,
        deadline: dt.timedelta | dt.datetime | None = None,
        queue: str | None = None,
        priority: int | None = None,
    ) -> Outcome:
        """The async :meth:`run`, for ASGI views and other coroutines: the same arguments and
        outcome. It runs :meth:`run` through ``sync_to_async(thread_sensitive=True)`` (steps
        that run inline run there, on that thread), then closes the database connections the
        call opened there; see the async how-to. Await the outcome of a background run with
        ``await (await MyReactor.afind(outcome.execution_id)).await_outcome(timeout=...)``.
        """
        from .runtime import aio

        return await aio.call(
            cls.run,
            inputs,
            idempotency_key=idempotency_key,
            at=at,
            delay=delay,
            deadline=deadline,
            queue=queue,
            priority=priority,
        )

    @classmethod
    async def afind(cls, execution_id: UUID | str) -> ExecutionHandle:
        """The async :meth:`find`."""
        from .runtime import aio

        return await aio.call(cls.find, execution_id)

    @classmethod
    def find(cls, execution_id: UUID | str) -> ExecutionHandle:
        """The execution ``execution_id`` of this reactor; raises ExecutionNotFound."""
        from . import services

        return services.find(execution_id, reactor=cls)

    @classmethod
    def find_by_correlation_id(cls, correlation_id: str) -> ExecutionHandle:
        """The run of this reactor waiting (or last waiting) under ``correlation_id``."""
        from . import services

        return services.find_by_correlation_id(correlation_id, reactor=cls)
