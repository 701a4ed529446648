"""Owning a run and keeping it: lease owner names, and the process's heartbeat thread that
keeps leases alive while work runs (a run's lease, the map slots an element task holds, a
reserved ``Idempotency-Key``, a run's locks and semaphore slots)."""

from __future__ import annotations

import datetime as dt
import math
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Self

from django.db import connections
from django.db.models import Q
from django.utils import timezone

from ..conf import reactor_settings
from ..models import Execution
from .db import bound, logger, using
from .rows import Owned

if TYPE_CHECKING:
    from ..engine.serialization import JSONObject, JSONValue


def lease_owner_token() -> str:
    """A name for this process and call, stored as the lease owner."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class Kept:
    """Something the heartbeat extends while a ``with`` block runs: subclasses say what
    (``extend()``, which returns False once it is no longer theirs) and name it (``label``)."""

    def __init__(self, interval: float | None = None) -> None:
        lease = reactor_settings.LEASE_SECONDS
        self.interval = interval if interval is not None else max(lease / 3, 0.05)
        self.lost = False  # set when an extension found it taken: the holder must stop
        self.due = 0.0  # monotonic time of the next extension, set by the heartbeat
        self.alias = using()  # the database it is kept in: the heartbeat extends it there

    @property
    def label(self) -> str:
        """What is kept, for the log."""
        raise NotImplementedError

    def extend(self) -> bool:
        """Extend it once; False when it is no longer this holder's."""
        raise NotImplementedError

    def __enter__(self) -> Self:
        Heartbeat.current().add(self)
        return self

    def __exit__(self, *exc_info: object) -> None:
        Heartbeat.current().discard(self)


class Heartbeat:
    """The process's one thread that extends the leases of the keepers it holds when due."""

    _instance: Heartbeat | None = None
    _instance_lock = threading.Lock()

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.keepers: set[Kept] = set()
        self.changed = threading.Condition()
        # When the thread, waiting, will look at its keepers again (monotonic; inf: when told;
        # -inf: it is not waiting, and looks before it waits).
        self.wakes_at = -math.inf
        self.thread = threading.Thread(
            target=self._loop, name="reactor-lease-heartbeat", daemon=True
        )
        self.thread.start()

    @classmethod
    def current(cls) -> Heartbeat:
        """This process's heartbeat (a new one in a forked child: threads do not survive)."""
        instance = cls._instance
        if instance is None or instance.pid != os.getpid():  # threads do not survive a fork
            with cls._instance_lock:
                instance = cls._instance
                if instance is None or instance.pid != os.getpid():
                    instance = cls._instance = cls()
        return instance

    def add(self, keeper: Kept) -> None:
        with self.changed:
            keeper.due = time.monotonic() + keeper.interval
            self.keepers.add(keeper)
            # Waking the thread costs the adding run a context switch: only when it would
            # otherwise sleep past this keeper's first extension.
            if keeper.due < self.wakes_at:
                self.changed.notify()

    def discard(self, keeper: Kept) -> None:
        # No wake-up: the thread finds the set changed at its next planned look (and, the last
        # keeper gone, lets its connection go then).
        with self.changed:
            self.keepers.discard(keeper)

    def _loop(self) -> None:
        connected = False
        while True:
            with self.changed:
                while True:
                    now = time.monotonic()
                    due = [k for k in self.keepers if k.due <= now]
                    if due or (connected and not self.keepers):
                        break
                    wait = min((k.due for k in self.keepers), default=None)
                    self.wakes_at = math.inf if wait is None else wait
                    self.changed.wait(None if wait is None else wait - now)
                    self.wakes_at = -math.inf
            for keeper in due:
                self._beat(keeper)
                connected = True
            with self.changed:
                idle = not self.keepers
            if idle and connected:
                connections.close_all()  # this thread's connections only: none held while idle
                connected = False

    def _beat(self, keeper: Kept) -> None:
        with bound(keeper.alias):
            self._extend(keeper)

    def _extend(self, keeper: Kept) -> None:
        try:
            extended = keeper.extend()
        except Exception:
            # A dropped connection must not end the heartbeat: reconnect next time.
            logger.warning(
                "could not extend the lease of %s; trying again in %.1f s",
                keeper.label,
                keeper.interval,
                exc_info=True,
            )
            connections[using()].close()
            extended = True
        with self.changed:
            if not extended:
                keeper.lost = True
                self.keepers.discard(keeper)
            else:
                keeper.due = time.monotonic() + keeper.interval


# The last heartbeat of each run's step in flight in this process, written (and dropped) with
# the run's next lease extension: a step may beat often without a write each time.
_beats: dict[uuid.UUID, JSONObject] = {}
_beats_lock = threading.Lock()


def note_heartbeat(execution_id: uuid.UUID | None, step: str, details: JSONValue) -> None:
    """Keep a step's heartbeat for the run's next lease extension (``Execution.heartbeat``)."""
    if execution_id is None:
        return
    beat = {"step": step, "at": timezone.now().isoformat(), "details": details}
    with _beats_lock:
        _beats[execution_id] = beat


class LeaseKeeper(Kept):
    """Keeps extending an owned run's lease from the heartbeat thread while the run executes.

    Checkpoints extend the lease too; the keeper covers steps that run longer than the lease,
    so nobody takes over a run whose process is alive. It stops when the fence has moved on
    (the run was taken over): the next checkpoint then raises LeaseLost.
    """

    def __init__(self, owned: Owned, *, interval: float | None = None) -> None:
        self.owned = owned
        self.lease_seconds = reactor_settings.LEASE_SECONDS
        super().__init__(interval)

    @property
    def label(self) -> str:
        return f"execution {self.owned.execution_id}"

    def extend(self) -> bool:
        """Push the lease out once (with the last heartbeat of the step in flight, if one
        came since); False when the fence moved on (another owner)."""
        fields: dict[str, Any] = {
            "lease_expires_at": timezone.now() + dt.timedelta(seconds=self.lease_seconds)
        }
        with _beats_lock:
            beat = _beats.pop(self.owned.execution_id, None)
        if beat is not None:
            fields["heartbeat"] = beat
        return bool(
            Execution.objects.using(using())
            .filter(pk=self.owned.execution_id, fence=self.owned.fence)
            .update(**fields)
        )

    def __exit__(self, *exc_info: object) -> None:
        super().__exit__(*exc_info)
        with _beats_lock:
            _beats.pop(self.owned.execution_id, None)


class HeldLeases(Kept):
    """Keeps extending the leases of runs a worker claimed ahead of their turn (a batch of
    wake-ups run one after the other, ``claims.claim_ahead``), in one statement a beat, until
    each run's turn takes it (``take``) or the ``with`` block ends.

    Without it a run waiting its turn behind slow runs would outlive its lease: the sweeper
    would hand it to another worker while this one still meant to run it.
    """

    def __init__(self, held: Iterable[Owned], *, interval: float | None = None) -> None:
        self.held = {owned.execution_id: owned for owned in held}
        self.lease_seconds = reactor_settings.LEASE_SECONDS
        self._lock = threading.Lock()
        super().__init__(interval)

    @property
    def label(self) -> str:
        return f"{len(self.held)} runs claimed ahead"

    def take(self, execution_id: uuid.UUID) -> Owned | None:
        """The run's claim, now its turn has come (its own ``LeaseKeeper`` keeps it from
        here); None when it was not held, or another process took it over meanwhile."""
        with self._lock:
            return self.held.pop(execution_id, None)

    def extend(self) -> bool:
        """Push out the lease of every run still waiting its turn; those another process took
        over meanwhile are let go. Always True: each run's loss is its own."""
        with self._lock:
            waiting = list(self.held.values())
        if not waiting:
            return True
        mine = Q()
        for owned in waiting:
            mine |= Q(pk=owned.execution_id, fence=owned.fence)
        # A run whose turn came and ended between the read above and this update has
        # released its lease (no owner): it is left as it is.
        runs = Execution.objects.using(using()).filter(mine, lease_owner__isnull=False)
        until = timezone.now() + dt.timedelta(seconds=self.lease_seconds)
        if runs.update(lease_expires_at=until) < len(waiting):
            kept = set(runs.values_list("pk", flat=True))
            with self._lock:
                for owned in waiting:
                    if owned.execution_id not in kept:
                        self.held.pop(owned.execution_id, None)
        return True
