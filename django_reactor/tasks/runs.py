"""The internal reactors a task runs as: one step, ``call``, that imports the task by its dotted
path and calls it with the stored arguments.

A reactor's retry policy is part of its definition, so each policy a task asks for has a
reactor of its own, named after the policy (``TaskRun`` retries nothing,
``TaskRun_a5_exponential_d1000_m300000_j0`` is ``Retry(attempts=5, delay=1)``). The name is the
whole policy: a worker that meets a run of a reactor it has not built yet builds it from the
name, when the registry imports it from this module (:func:`__getattr__`).
"""

from __future__ import annotations

import re
import threading
import types
from typing import TYPE_CHECKING, Any

from django.utils.module_loading import import_string

from ..engine.declarations import step
from ..engine.retry import NO_RETRY, Retry
from ..engine.step import step_context
from ..engine.templates import arg
from ..exceptions import ReactorError
from ..reactor import Reactor

if TYPE_CHECKING:
    from .compat import Task

PREFIX = "TaskRun"
_NAMED = re.compile(
    rf"^{PREFIX}_a(?P<attempts>\d+)_(?P<backoff>[a-z]+)_d(?P<delay>\d+)"
    r"_m(?P<max_delay>\d+|none)_j(?P<jitter>\d+)$"
)
_lock = threading.Lock()
_built: dict[str, type[Reactor]] = {}


def policy_name(retry: Retry) -> str:
    """The attribute (and last part of the registered name) of ``retry``'s reactor; delays in
    milliseconds, jitter in thousandths. Refuses what a name cannot carry (``on=``)."""
    if retry.on != (Exception,):
        raise ReactorError(
            f"a task's {retry!r} cannot narrow which exceptions it retries (on=...): a task "
            "retries every exception; raise one with `retryable = False` to stop its retries"
        )
    if retry.attempts == 1:
        return PREFIX
    max_delay = "none" if retry.max_delay is None else str(round(retry.max_delay * 1000))
    return (
        f"{PREFIX}_a{retry.attempts}_{retry.backoff}_d{round(retry.delay * 1000)}"
        f"_m{max_delay}_j{round(retry.jitter * 1000)}"
    )


def policy_of(name: str) -> Retry | None:
    """The retry policy a reactor's attribute name says, or None for no such name."""
    if name == PREFIX:
        return NO_RETRY
    found = _NAMED.match(name)
    if found is None:
        return None
    max_delay = found["max_delay"]
    return Retry(
        attempts=int(found["attempts"]),
        backoff=found["backoff"],
        delay=int(found["delay"]) / 1000,
        max_delay=None if max_delay == "none" else int(max_delay) / 1000,
        jitter=int(found["jitter"]) / 1000,
    )


def reactor_for(retry: Retry) -> type[Reactor]:
    """The internal reactor that runs a task under ``retry`` (built once per process)."""
    name = policy_name(retry)
    built = _reactor_named(name)
    assert built is not None
    return built


def is_task_reactor(reactor: str) -> bool:
    """Whether a run's reactor name is one of this module's reactors."""
    module, _, name = reactor.rpartition(".")
    return module == __name__ and policy_of(name) is not None


def _reactor_named(name: str) -> type[Reactor] | None:
    with _lock:
        if name in _built:
            return _built[name]
        retry = policy_of(name)
        if retry is None:
            return None

        def body(namespace: dict[str, Any]) -> None:
            namespace["__module__"] = __name__
            namespace["__qualname__"] = name
            namespace["call"] = step(
                call,
                retry=retry,
                task=arg.input("task"),
                args=arg.input("args"),
                kwargs=arg.input("kwargs"),
            )
            namespace["Meta"] = type(
                "Meta", (), {"name": f"{__name__}.{name}", "background": "all", "returns": "call"}
            )

        reactor = types.new_class(name, (Reactor,), exec_body=body)
        _built[name] = reactor
        return reactor


def __getattr__(name: str) -> type[Reactor]:
    """Build the reactor ``name`` says (the registry imports a run's reactor by its name)."""
    built = _reactor_named(name)
    if built is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return built


def call(task: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
    """Run the task at dotted path ``task`` with ``args`` and ``kwargs``; its return value is
    the run's result. Sends the framework's ``task_started`` before each attempt and
    ``task_finished`` after the last one (a success, or a failure that is not retried)."""
    # Imported when a task runs: a worker imports this module by a run's reactor name, and
    # compat imports the optional framework.
    from . import results
    from .compat import task_finished, task_started

    found: Task[Any, Any] = import_string(task)
    context = step_context()
    sender = type(found.get_backend())
    running = results.running(found, context, args, kwargs)
    task_started.send(sender, task_result=running)
    try:
        if found.takes_context:
            value = found.call(results.task_context(running), *args, **kwargs)
        else:
            value = found.call(*args, **kwargs)
    except Exception as exc:
        policy = policy_of(context.reactor.rpartition(".")[2]) or NO_RETRY
        if context.attempt >= policy.attempts or getattr(exc, "retryable", True) is False:
            task_finished.send(sender, task_result=results.failed(running, exc))
        raise
    task_finished.send(sender, task_result=results.succeeded(running, value))
    return value
