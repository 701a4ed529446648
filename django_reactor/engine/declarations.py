"""``step(...)``: how a reactor class body declares its steps."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar, overload

from ..exceptions import DefinitionError
from .retry import Retry
from .step import FunctionStep, Step
from .templates import Template

F = TypeVar("F", bound=Callable[..., object])

OPTION_NAMES = frozenset(
    {
        "retry",
        "wait_for",
        "coordination",
        "atomic",
        "timeout",
        "heartbeat_timeout",
        "secret_result",
    }
)


class StepDeclaration:
    """One ``step(...)`` in a reactor's class body; the reactor turns it into a ``StepSpec``.

    A function step can also declare its rollback with decorators::

        @step(order=arg.result("create"))
        def reserve(order): ...

        @reserve.undo
        def release(result, order): ...
    """

    def __init__(
        self,
        impl: type[Step],
        wiring: dict[str, Template],
        *,
        retry: Retry | None = None,
        wait_for: Iterable[str] = (),
        unit: str | None = None,
        coordination: object = None,
        atomic: bool | None = None,
        timeout: object = None,
        heartbeat_timeout: object = None,
        secret_result: object = None,
    ) -> None:
        self.impl = impl
        # As given (checked when the reactor is defined); None: the step class's own.
        self.secret_result = secret_result
        # ``coordination``, ``timeout``, ``heartbeat_timeout`` as given: the reactor checks
        # them when it is defined.
        # None: the step class's own ``atomic``, ``timeout``, ``heartbeat_timeout``.
        self.atomic = atomic
        self.timeout = timeout
        self.heartbeat_timeout = heartbeat_timeout
        # None: the step class's own ``coordination``.
        self.coordination = coordination
        # "step" for async_step, "reactor" for async_reactor: the body runs in its own execution.
        self.unit = unit
        self.wiring = wiring
        self.retry = retry
        if isinstance(wait_for, str):
            wait_for = (wait_for,)
        self.wait_for = tuple(wait_for)
        self.name: str | None = None

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"<step {self.name or '?'}: {self.impl.__qualname__}>"

    def undo(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """Decorate the function that undoes this function step: ``fn(result, **arguments)``."""
        return self._attach("undo", fn)

    def compensate(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """Decorate the function that compensates this step: ``fn(error, **arguments)``."""
        return self._attach("compensate", fn)

    def _attach(self, action: str, fn: F) -> F:
        label = self.name or self.impl.__qualname__
        if not issubclass(self.impl, FunctionStep):
            raise DefinitionError(
                f"@{label}.{action} only works on function steps; define "
                f"{action}() on {self.impl.__qualname__} instead"
            )
        if not callable(fn):
            raise DefinitionError(f"@{label}.{action} must decorate a function, got {fn!r}")
        setattr(self.impl, f"{action}_function", staticmethod(fn))
        # If the function takes the step's own name in the class body, the reactor still finds
        # the step through this mark (see definition._collect_declarations).
        fn._reactor_rollback_of = self  # type: ignore[attr-defined]
        return fn


def _function_step(fn: Callable[..., object]) -> type[Step]:
    return type(
        f"{fn.__name__}_step",
        (FunctionStep,),
        {"function": staticmethod(fn), "__module__": fn.__module__, "__doc__": fn.__doc__},
    )


def _declare(target: object, options: dict[str, Any], unit: str | None = None) -> StepDeclaration:
    if isinstance(target, type) and issubclass(target, Step):
        impl = target
    elif isinstance(target, type):
        raise DefinitionError(
            f"step() takes a Step subclass or a function, got class {target.__qualname__}; "
            "make it subclass django_reactor.Step"
        )
    elif callable(target):
        impl = _function_step(target)
    else:
        raise DefinitionError(f"step() takes a Step subclass or a function, got {target!r}")
    wiring = {k: v for k, v in options.items() if k not in OPTION_NAMES}
    for name, value in wiring.items():
        if not isinstance(value, Template):
            raise DefinitionError(
                f"step argument {name}={value!r} must be arg.input(...), arg.result(...) or "
                f"arg.value(...); wrap literals as arg.value({value!r})"
            )
    retry = options.get("retry")
    if retry is not None and not isinstance(retry, Retry):
        raise DefinitionError(f"retry= must be a Retry(...), got {retry!r}")
    wait_for = options.get("wait_for", ())
    if isinstance(wait_for, str):
        wait_for = (wait_for,)
    if not all(isinstance(w, str) for w in wait_for):
        raise DefinitionError(f"wait_for= must name steps as strings, got {wait_for!r}")
    atomic = options.get("atomic")
    if atomic is not None and not isinstance(atomic, bool):
        raise DefinitionError(f"atomic= must be True or False, got {atomic!r}")
    return StepDeclaration(
        impl,
        wiring,
        retry=retry,
        wait_for=wait_for,
        unit=unit,
        coordination=options.get("coordination"),
        atomic=atomic,
        timeout=options.get("timeout"),
        heartbeat_timeout=options.get("heartbeat_timeout"),
        secret_result=options.get("secret_result"),
    )


@overload
def step(target: type[Step] | Callable[..., object], /, **options: Any) -> StepDeclaration: ...
@overload
def step(**options: Any) -> Callable[[Callable[..., object]], StepDeclaration]: ...


def step(
    target: type[Step] | Callable[..., object] | None = None, /, **options: Any
) -> StepDeclaration | Callable[[Callable[..., object]], StepDeclaration]:
    """Declare a step in a reactor's class body.

    ``name = step(StepClass, arg_name=arg.input(...), retry=Retry(...), wait_for=["other"])``
    or, for a function step, ``@step(arg_name=arg.result("other"))`` above a function (the step
    is named after the function). Options: ``retry``, ``wait_for``, ``coordination``,
    ``atomic`` (run the body inside the transaction of its checkpoint: its database writes
    happen exactly once), ``timeout`` and ``heartbeat_timeout`` (a ``timedelta`` or seconds:
    an attempt that runs longer, or goes that long without ``context.heartbeat()``, fails),
    ``secret_result`` (``True``: the step's result is a secret; a dotted path or a list of
    them: those parts of it are; sealed in the database, redacted wherever shown); every other
    keyword wires an argument of the step's ``run`` from a template.
    """
    if target is None:
        return lambda fn: _declare(fn, options)
    return _declare(target, options)


@overload
def async_step(
    target: type[Step] | Callable[..., object], /, **options: Any
) -> StepDeclaration: ...
@overload
def async_step(**options: Any) -> Callable[[Callable[..., object]], StepDeclaration]: ...


def async_step(
    target: type[Step] | Callable[..., object] | None = None, /, **options: Any
) -> StepDeclaration | Callable[[Callable[..., object]], StepDeclaration]:
    """Declare a step whose body runs in its own Celery task (an async unit).

    Same forms as :func:`step`. The reactor goes on with other ready steps meanwhile; a step
    that reads ``arg.result("<name>")`` (or waits for it) waits for the unit: its value when it
    succeeded, or the unit's ``Failed``/``Halted`` outcome, for the reader to decide. A unit
    retries and compensates itself; its parent never undoes it.
    """
    if target is None:
        return lambda fn: _declare(fn, options, unit="step")
    return _declare(target, options, unit="step")
