"""Who steers a run, and why: the actor of a steering action and the action as recorded.

Every steering action (cancel, undo, retry, a payload delivered, wake, a schedule paused, ...)
is recorded with who asked for it: on the run's trace (``by``, ``via`` and ``reason`` in the
data of the entry the action writes) and in the steering history (``AuditEntry``). Who that is
comes from where the request entered, set as the **current actor** for the time it is handled:

- the admin: the signed-in user (``"alice (user 7)"``, via ``"admin"``);
- the HTTP API: the user, the webhook secrets that signed the request, or a resume token
  (never a secret's value), via ``"api"``;
- a ``reactor_*`` management command: the command and the operating-system user
  (``"reactor_cancel by deploy"``, via ``"command"``);
- the sweeper and event cancellations: via ``"system"``;
- anything else (a shell, your own view, a support tool) is via ``"python"``, described as the
  process (``"deploy@web-1 pid 4242"``) unless it says who it acts for with
  :func:`acting_as`.

Pure Python (no ORM): the store, the services and every face read it.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import getpass
import os
import socket
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

from ..exceptions import ReactorError
from .serialization import safe_repr, unstorable

#: Where a steering action came from.
VIA = ("admin", "api", "command", "python", "system")

#: The longest ``who`` (the column's length).
MAX_WHO_LENGTH = 255


@dataclasses.dataclass(frozen=True, slots=True)
class Actor:
    """Who steers: ``who`` in words people recognise (a user name, a credential, a command and
    the OS user; never a secret), and ``via`` which face (one of :data:`VIA`)."""

    who: str
    via: str

    def __post_init__(self) -> None:
        if self.via not in VIA:
            raise ReactorError(f"via must be one of {', '.join(VIA)}, got {safe_repr(self.via)}")
        problem = None
        if not isinstance(self.who, str) or not self.who.strip():
            problem = "a non-empty string"
        elif len(self.who) > MAX_WHO_LENGTH:
            problem = f"at most {MAX_WHO_LENGTH} characters"
        elif (why := unstorable(self.who)) is not None:
            problem = f"storable text ({why})"
        if problem is not None:
            raise ReactorError(f"who must be {problem}, got {safe_repr(self.who)}")

    def as_data(self) -> dict[str, str]:
        """``{"by": who, "via": via}``, as trace entries carry it."""
        return {"by": self.who, "via": self.via}


def process_actor() -> Actor:
    """The actor of a call nobody said who made: this process (OS user, host, pid)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no user name in the environment nor the password database
        user = f"uid {os.getuid()}" if hasattr(os, "getuid") else "unknown user"
    return Actor(f"{user}@{socket.gethostname()} pid {os.getpid()}"[:MAX_WHO_LENGTH], "python")


_current: contextvars.ContextVar[Actor | None] = contextvars.ContextVar(
    "django_reactor_actor", default=None
)


def current_actor() -> Actor:
    """Who the steering actions of this context are recorded as: the actor set by
    :func:`acting_as` (the faces set it where a request or a command enters), else this
    process (:func:`process_actor`, via ``"python"``)."""
    return _current.get() or process_actor()


@contextlib.contextmanager
def acting_as(actor: Actor | str, *, via: str = "python") -> Iterator[Actor]:
    """Record the steering actions made inside the block as ``actor``'s.

    For your own code that steers runs for someone (a support tool, a view of yours)::

        with acting_as(f"{request.user.get_username()} (support desk)"):
            services.cancel(execution_id, reason="customer asked")

    ``actor`` is an :class:`Actor`, or who it is as text with ``via`` (default ``"python"``).
    Threads started inside the block do not inherit it (a context variable): set it there too.
    """
    chosen = actor if isinstance(actor, Actor) else Actor(actor, via)
    token = _current.set(chosen)
    try:
        yield chosen
    finally:
        _current.reset(token)


@dataclasses.dataclass(frozen=True, slots=True)
class Steering:
    """One steering action as it is recorded: what (``action``), by whom (``actor``), why
    (``reason``), on what (the run ``execution_id`` of ``reactor``, or ``target`` for a
    schedule, a subject or a lock), with ``detail`` (JSON).

    Made by ``services.audit.steering``; the store writes it (``store.audit.write``) in the
    transaction of the change it records, and the trace entry that change writes carries
    :meth:`trace_data`.
    """

    action: str
    actor: Actor
    reason: str = ""
    execution_id: uuid.UUID | None = None
    reactor: str = ""
    target: str = ""
    detail: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def on(self, execution_id: uuid.UUID, reactor: str = "") -> Steering:
        """The same action, on the run ``execution_id`` (of ``reactor``)."""
        return dataclasses.replace(self, execution_id=execution_id, reactor=reactor or self.reactor)

    def noting(self, **detail: Any) -> Steering:
        """The same action with more ``detail``."""
        return dataclasses.replace(self, detail={**self.detail, **detail})

    def trace_data(self) -> dict[str, str]:
        """What the trace entry the action writes carries: ``by``, ``via`` and, when one was
        given, ``reason``."""
        data = self.actor.as_data()
        if self.reason:
            data["reason"] = self.reason
        return data
