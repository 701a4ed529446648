"""The ``Step`` base class and what a step instance knows about its run."""

from __future__ import annotations

import hashlib
import inspect
import json
import re
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar
from uuid import UUID

from asgiref.sync import async_to_sync

from ..exceptions import (
    AtomicStepError,
    InvalidAttribute,
    PatchError,
    PublishError,
    ReactorError,
    ResultNotSerializable,
)
from .attributes import MAX_ATTRIBUTES, canonical, check_key
from .outcomes import Failure, Halt, Skip, Success
from .patches import Patches, check_name
from .retry import Retry
from .serialization import encode, safe_repr

if TYPE_CHECKING:
    import datetime as dt
    from collections.abc import Sequence

    from .coordination import Declaration
    from .serialization import JSONValue
    from .supervision import Watch

F = TypeVar("F", bound=Callable[..., object])

#: A key ``publish()`` takes: letters, digits and ``._:-``, starting with a letter or a digit.
PUBLISH_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]*")
#: How many keys one step may publish.
MAX_PUBLISHED_KEYS = 50


@dataclass(frozen=True, slots=True)
class StepContext:
    """Facts about the current action, available to step code as ``self.context``.

    ``idempotency_key`` is the same on every attempt of the same action of the same step of the
    same run: pass it to external services (payment providers, mailers) so a retried or
    re-delivered step does its external work once.
    """

    execution_id: UUID | None
    reactor: str
    step: str
    action: str  # "run", "undo" or "compensate"
    attempt: int
    inputs: Mapping[str, Any]
    # Fencing numbers of the locks held for this step and its run, by lock key: pass them to
    # the writes a lock protects, so a holder whose lock lapsed can be refused.
    fences: Mapping[str, int] = field(default_factory=dict)
    # The action runs inside the checkpoint's database transaction (an atomic step).
    atomic: bool = False
    # Where heartbeat() reports (the run's watch of this attempt), when anything listens.
    watch: Watch | None = field(default=None, repr=False, compare=False)
    # The largest value publish() takes, in bytes of JSON (``REACTOR["PUBLISH_MAX_BYTES"]``).
    publish_limit: int = 16384
    # What this action published, kept for its checkpoint (stored JSON, by key).
    published: dict[str, JSONValue] = field(default_factory=dict, repr=False, compare=False)
    # Whether set_attribute() has a run to set them on (a map's element has no row of its own).
    keeps_attributes: bool = True
    # What this action set with set_attribute(), kept for its checkpoint (None: removed).
    attributes_set: dict[str, str | None] = field(default_factory=dict, repr=False, compare=False)
    # The run's patch decisions (None: no run keeps them, a map's element).
    patches: Patches | None = field(default=None, repr=False, compare=False)
    # An earlier process of this run may have started this step (on code from before a patch):
    # see :mod:`.patches`.
    attempted_before: bool = False

    @property
    def idempotency_key(self) -> str:
        """The key of this action (run, undo or compensate) of this step in this run."""
        return _key(self.execution_id, self.step, self.action)

    @property
    def run_idempotency_key(self) -> str:
        """The key ``run()`` used: lets undo and compensate find or void the original call."""
        return _key(self.execution_id, self.step, "run")

    def heartbeat(self, details: object = None) -> None:
        """Say that this step is alive, and how far it got (``details``: anything JSON can
        hold, shown in the admin). A step with a ``heartbeat_timeout`` must call it at least
        that often, or its attempt counts as lost."""
        if self.watch is not None:
            self.watch.beat(details)

    def publish(self, key: str, value: object) -> None:
        """Publish ``value`` (anything JSON can hold) under ``key`` for whoever follows the run:
        ``handle.published``, the API (``GET /executions/{id}/`` and its stream) and the admin.

        It is written with this step's checkpoint (a failed attempt publishes nothing), and a
        later value of the key replaces the earlier one. Raises PublishError (the attempt fails)
        for a key that is no short name, a value JSON cannot hold or one larger than
        ``REACTOR["PUBLISH_MAX_BYTES"]``, or more than MAX_PUBLISHED_KEYS keys in one step.
        """
        if not (isinstance(key, str) and len(key) <= 255 and PUBLISH_KEY.fullmatch(key)):
            raise PublishError(
                "publish(key, ...) takes a key of at most 255 letters, digits and '._:-', "
                f"starting with a letter or a digit (such as 'progress'), got {safe_repr(key)}"
            )
        try:
            stored = encode(value)
        except ResultNotSerializable as exc:
            raise PublishError(f"publish({key!r}, ...) cannot store the value: {exc}") from None
        size = len(json.dumps(stored, separators=(",", ":")).encode())
        if size > self.publish_limit:
            raise PublishError(
                f"publish({key!r}, ...) got {size} bytes of JSON, more than "
                f'{self.publish_limit} (REACTOR["PUBLISH_MAX_BYTES"]): publish a summary, or a '
                "reference to where the data is"
            )
        if key not in self.published and len(self.published) >= MAX_PUBLISHED_KEYS:
            raise PublishError(
                f"a step publishes at most {MAX_PUBLISHED_KEYS} keys; publish fewer, larger "
                "values (a dict under one key)"
            )
        self.published[key] = stored

    def set_attribute(self, key: str, value: object) -> None:
        """Set the run's business attribute ``key`` (what the run is found by: a customer, an
        order) to ``value``: a string, a whole number, a boolean or a UUID, kept as text
        (``42`` and ``"42"`` are found alike); ``None`` or ``""`` removes it.

        It is written with this step's checkpoint (a failed attempt sets nothing) and replaces
        an earlier value of the key, ``Meta.attributes``' too. Raises InvalidAttribute (the
        attempt fails) for a key that is no short name, a value of another type or longer than
        255 characters, more than 32 keys in one step, or a call from an undo, a compensate or
        a map's element (which have no checkpoint of a run to write it with).
        """
        where = f"set_attribute({safe_repr(key)}, ...)"
        check_key(key, where)
        if self.action != "run":
            raise InvalidAttribute(
                f"{where} in the {self.action} of step {self.step!r}: attributes are written "
                "with a step's run; set it in a step's run() instead"
            )
        if not self.keeps_attributes:
            raise InvalidAttribute(
                f"{where} in step {self.step!r} of a map's element: an element is not a run "
                "of its own and keeps no attributes; set them in a step of the run that maps"
            )
        text = canonical(value, where)
        if key not in self.attributes_set and len(self.attributes_set) >= MAX_ATTRIBUTES:
            raise InvalidAttribute(
                f"a step sets at most {MAX_ATTRIBUTES} attributes; set fewer (a run is found "
                "by a few keys)"
            )
        self.attributes_set[key] = text

    def patched(self, name: str) -> bool:
        """Whether this run takes the new branch of patch ``name`` (True) or the old one.

        Decided once per run and name, and recorded before this returns; every later call for
        the run (this step again after a crash or a retry, other steps, undo and compensate)
        returns the same. The first decision is True, unless an earlier process of this run
        may have started this step, on code that did not ask: then False. From an undo or a
        compensate it returns the run's decision, False when it has none. Keep both branches
        correct while runs may be on either. Raises PatchError (the attempt fails) for a name
        that is no short name, or a call from a map's element.
        """
        patches = self._patches("patched", name)
        if self.action != "run":
            return patches.recorded(name) is True
        return patches.decide(name, self.step, attempted_before=self.attempted_before)

    def deprecated_patch(self, name: str) -> None:
        """Say that this code no longer has the old branch of patch ``name``: a run without a
        decision records the new branch (as ``patched()`` would decide it) and goes on; a run
        that took the old branch raises PatchRemoved, which is not the step's failure: the run
        is parked ``needs_attention`` and nothing is rolled back."""
        patches = self._patches("deprecated_patch", name)
        patches.deprecate(
            name,
            self.step,
            attempted_before=self.attempted_before,
            deciding=self.action == "run",
        )

    def _patches(self, where: str, name: object) -> Patches:
        check_name(name, where)
        if self.patches is None:
            raise PatchError(
                f"{where}({name!r}) in step {self.step!r} of a map's element: an element is not "
                "a run of its own and keeps no decisions; call patched() in the step that maps "
                "and pass the branch to the elements as an argument"
            )
        return self.patches

    def should_stop(self) -> bool:
        """Whether this attempt was abandoned (it ran past its timeout or its heartbeat
        timeout): a long body checks it and returns early, since its result is not used."""
        return self.watch is not None and self.watch.abandoned


def _key(execution_id: UUID | None, step: str, action: str) -> str:
    return hashlib.sha256(f"{execution_id}:{step}:{action}".encode()).hexdigest()[:40]


_current: ContextVar[StepContext | None] = ContextVar("django_reactor_step", default=None)


def step_context() -> StepContext:
    """The :class:`StepContext` of the step running now (function steps use this).

    >>> @step(order_id=arg.input("order_id"))  # doctest: +SKIP
    ... def charge(order_id):
    ...     gateway.charge(order_id, idempotency_key=step_context().idempotency_key)
    """
    context = _current.get()
    if context is None:
        raise ReactorError(
            "step_context() is only available inside a step's run, undo or compensate"
        )
    return context


def refuse_in_atomic_step(what: str, why: str) -> None:
    """Raise :class:`AtomicStepError` when called from the body (or undo, or compensate) of an
    atomic step: ``what`` it tried to do cannot be part of the step's database transaction,
    for the reason ``why``."""
    context = _current.get()
    if context is None or not context.atomic:
        return
    raise AtomicStepError(
        f"step {context.step!r} is atomic (its {context.action} runs inside the database "
        f"transaction of its checkpoint), so it cannot {what}: {why}. Its writes were rolled "
        "back. Move that work to a step that is not atomic, or to transaction.on_commit()"
    )


class acting:
    """Make ``context`` what :func:`step_context` returns while the block runs."""

    # A class rather than a generator: it is entered around every action of every step.
    __slots__ = ("context", "token")

    def __init__(self, context: StepContext) -> None:
        self.context = context

    def __enter__(self) -> None:
        self.token = _current.set(self.context)

    def __exit__(self, *exc_info: object) -> None:
        _current.reset(self.token)


#: What step bodies return most often, of types that are never awaitable: told apart without
#: ``inspect.isawaitable`` (whose ``Awaitable`` check goes through the ABC machinery).
_NEVER_AWAITABLE = frozenset(
    {type(None), bool, int, float, str, dict, list, tuple, Success, Skip, Halt, Failure}
)


def awaited(returned: object) -> object:
    """What a step body returned, awaited when it is awaitable: an ``async def`` ``run``,
    ``undo`` or ``compensate`` (or function step) runs to completion here, in an event loop
    of its own.

    asgiref's ``async_to_sync`` runs the loop: ``sync_to_async`` calls the body makes (Django's
    async ORM methods, ``aget``, ``asave``, ... are such calls) come back to this thread, so
    they use the worker's connection and, in an atomic step, its transaction. The step's
    context (``self.context``, ``step_context()``) is the body's too.
    """
    if type(returned) in _NEVER_AWAITABLE or not inspect.isawaitable(returned):
        return returned

    async def body() -> object:
        return await returned

    return async_to_sync(body)()


def _default(fn: F) -> F:
    fn._reactor_default = True  # type: ignore[attr-defined]
    return fn


class Step:
    """Base class of class-based steps.

    Subclasses implement :meth:`run` and optionally :meth:`undo` and :meth:`compensate`. A fresh
    instance is made for every action, so nothing set in ``run`` is visible in ``undo``: undo
    gets the stored result and the same arguments instead.

    Class attributes:
        Inputs: an optional DRF serializer class, the step's input contract. Arguments are
            validated by it before the first attempt; a violation fails the run without retry
            or compensation. ``run``, ``undo`` and ``compensate`` then receive the
            serializer's validated data.
        retry: the default :class:`Retry` policy of this step (a ``step(..., retry=...)``
            declaration overrides it).
        coordination: ``Lock``, ``Semaphore``, ``RateLimit`` and ``Period`` held around the
            step's body, keyed on its arguments (``step(..., coordination=[...])`` overrides).
        atomic: run the body, and the undo and compensate, inside the database transaction
            that records them, so that the step's own database writes happen exactly once
            (``step(..., atomic=True)`` overrides). See the atomic steps how-to.
        timeout: the longest one attempt of the body may run (a ``timedelta`` or seconds;
            ``REACTOR["STEP_TIMEOUT"]`` by default); past it the attempt fails with
            ``StepTimedOut`` and the retry policy decides.
        heartbeat_timeout: the longest the body may go without calling
            ``self.context.heartbeat()``; past it the attempt counts as lost (fails the same way).
        secret_result: ``True`` when the step's result is a secret, or the dotted paths of the
            secret parts of it (``("api_key", "cards.*.number")``): sealed in the database,
            redacted wherever a run is shown (``step(..., secret_result=...)`` overrides).
    """

    Inputs: ClassVar[type | None] = None
    retry: ClassVar[Retry | None] = None
    coordination: ClassVar[Sequence[Declaration]] = ()
    atomic: ClassVar[bool] = False
    timeout: ClassVar[float | dt.timedelta | None] = None
    heartbeat_timeout: ClassVar[float | dt.timedelta | None] = None
    secret_result: ClassVar[bool | str | Sequence[str]] = False

    def __init__(self, context: StepContext) -> None:
        self.context = context

    if TYPE_CHECKING:
        # Declared as plain callables so subclasses may name their own parameters.
        run: Callable[..., Any]
        undo: Callable[..., Any]
        compensate: Callable[..., Any]
    else:

        def run(self, **arguments: Any) -> Any:
            """Do the work; return Success(value), Failure, Halt, Skip or a plain value."""
            raise NotImplementedError(f"{type(self).__qualname__} must define run()")

        @_default
        def undo(self, result: Any, **arguments: Any) -> Any:
            """Roll back the completed work described by ``result`` (a later step failed)."""

        @_default
        def compensate(self, error: Any, **arguments: Any) -> Any:
            """Clean up partial work after this step failed; ``error`` is an ErrorInfo."""

    @classmethod
    def has_handler(cls, action: str) -> bool:
        """Whether the class defines its own ``undo`` or ``compensate``."""
        method = getattr(cls, action, None)
        return method is not None and not getattr(method, "_reactor_default", False)


@dataclass(frozen=True, slots=True)
class Signature:
    """What a callable accepts, for wiring checks and argument filtering."""

    required: frozenset[str]
    optional: frozenset[str]
    var_keyword: bool

    @property
    def accepted(self) -> frozenset[str]:
        return self.required | self.optional

    def accepts(self, name: str) -> bool:
        return self.var_keyword or name in self.accepted

    def filter(self, arguments: Mapping[str, object]) -> dict[str, object]:
        if self.var_keyword:
            return dict(arguments)
        return {k: v for k, v in arguments.items() if k in self.accepted}


def signature_of(fn: Callable[..., object], *, skip: int = 0) -> Signature:
    """Keyword parameters of ``fn`` after skipping ``skip`` leading positional ones."""
    params = list(inspect.signature(fn).parameters.values())[skip:]
    required: set[str] = set()
    optional: set[str] = set()
    var_kw = False
    for p in params:
        if p.kind is p.VAR_KEYWORD:
            var_kw = True
        elif p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            (optional if p.default is not p.empty else required).add(p.name)
    return Signature(frozenset(required), frozenset(optional), var_kw)


class FunctionStep(Step):
    """A step made from a plain function by the ``@step`` decorator."""

    function: ClassVar[Callable[..., object]]
    undo_function: ClassVar[Callable[..., object] | None] = None
    compensate_function: ClassVar[Callable[..., object] | None] = None

    def run(self, **arguments: object) -> object:
        return type(self).function(**arguments)

    def undo(self, result: object, **arguments: object) -> object:
        fn = type(self).undo_function
        return None if fn is None else fn(result, **arguments)

    def compensate(self, error: object, **arguments: object) -> object:
        fn = type(self).compensate_function
        return None if fn is None else fn(error, **arguments)

    @classmethod
    def has_handler(cls, action: str) -> bool:
        return getattr(cls, f"{action}_function", None) is not None


def run_signature(impl: type[Step]) -> Signature:
    """The parameters a step's body takes (for function steps, the function's)."""
    if issubclass(impl, FunctionStep):
        return signature_of(impl.function)
    return signature_of(impl.run, skip=1)


def rollback_signature(impl: type[Step], action: str) -> Signature:
    """Keyword parameters of ``undo``/``compensate`` after ``(self, result_or_error)``."""
    if issubclass(impl, FunctionStep):
        fn = getattr(impl, f"{action}_function")
        return (
            signature_of(fn, skip=1)
            if fn is not None
            else Signature(frozenset(), frozenset(), True)
        )
    return signature_of(getattr(impl, action), skip=2)
