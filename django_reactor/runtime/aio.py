"""How the async API (``Reactor.arun``, ``handle.await_outcome``, ``asend``, ...) reaches the
sync core from an event loop, and waits for runs without holding a thread or a connection.

Every call goes through :func:`call`: ``sync_to_async(thread_sensitive=True)``, as Django's own
async ORM methods do, so it runs on the thread the caller's other sync code uses (one per
request under Django's ASGI handler; the caller's own thread, and its open transaction, under
``async_to_sync``). After the call that thread closes the connections the call opened (none
in a transaction), and at most ``REACTOR["ASYNC_DATABASE_CALLS"]`` calls run at once per event
loop: a burst of requests cannot open more connections than that.

:func:`settled` waits for runs to stop moving: one poller per event loop reads the status of
every awaited run in one query on a thread of its own, ``asyncio.sleep`` in between, and closes
its connection when nothing is awaited any more.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextvars import ContextVar
from typing import ParamSpec, TypeVar
from uuid import UUID

from asgiref.sync import sync_to_async

from .. import store
from ..conf import reactor_settings
from ..states import WAITED_THROUGH

P = ParamSpec("P")
T = TypeVar("T")

#: The poller's first pause between two reads, doubled up to the longest (the sync ``wait``'s).
FIRST_PAUSE = 0.005
LONGEST_PAUSE = 0.25

# True inside a call: a call made from within one (an async step body of an inline run that
# awaits arun) takes no second slot, which could wait for ever on its own caller.
_in_call: ContextVar[bool] = ContextVar("django_reactor_async_call", default=False)
_slots: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
    weakref.WeakKeyDictionary()
)


def _returning_connections(fn: Callable[P, T]) -> Callable[P, T]:
    def returning(*args: P.args, **kwargs: P.kwargs) -> T:
        # A connection open before the call is its thread's (a worker's, running an async
        # step body that awaits this call): its session may hold locks; it stays open.
        kept = store.open_connections()
        try:
            return fn(*args, **kwargs)
        finally:
            store.give_back_connections(kept)

    return returning


@contextlib.asynccontextmanager
async def _slot() -> AsyncIterator[None]:
    if _in_call.get():
        yield
        return
    loop = asyncio.get_running_loop()
    slots = _slots.get(loop)
    if slots is None:
        slots = _slots[loop] = asyncio.Semaphore(reactor_settings.ASYNC_DATABASE_CALLS)
    async with slots:
        token = _in_call.set(True)
        try:
            yield
        finally:
            _in_call.reset(token)


async def call(fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """``fn(*args, **kwargs)`` on the caller's thread-sensitive thread, its connection given
    back afterwards, once a slot of ``REACTOR["ASYNC_DATABASE_CALLS"]`` is free."""
    async with _slot():
        return await sync_to_async(_returning_connections(fn), thread_sensitive=True)(
            *args, **kwargs
        )


class _Poller:
    """Reads the status of every run awaited in one event loop, all in one query per
    database, until each stops moving."""

    # One thread for every loop's poller: its connection is the only one waiting takes.
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="django_reactor_await")

    def __init__(self) -> None:
        self.waiting: dict[tuple[str, UUID], list[asyncio.Future[str | None]]] = {}
        self.task: asyncio.Task[None] | None = None
        self.pause = FIRST_PAUSE

    def add(self, alias: str, execution_id: UUID) -> asyncio.Future[str | None]:
        future: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
        self.waiting.setdefault((alias, execution_id), []).append(future)
        self.pause = FIRST_PAUSE  # a new waiter is read soon, as the sync wait would
        if self.task is None or self.task.done():
            self.task = asyncio.get_running_loop().create_task(self.run())
        return future

    def discard(self, alias: str, execution_id: UUID, future: asyncio.Future[str | None]) -> None:
        futures = self.waiting.get((alias, execution_id), [])
        if future in futures:
            futures.remove(future)
        if not futures:
            self.waiting.pop((alias, execution_id), None)

    async def run(self) -> None:
        try:
            while True:
                await self.poll()
                await sync_to_async(
                    store.give_back_connections, thread_sensitive=False, executor=self.executor
                )()
                # Nothing awaited since the last read: done (a waiter that came during the
                # close was added to this task, still running; it is read in the next round).
                if not self.waiting:
                    return
        except asyncio.CancelledError:  # the loop is closing: close the connection anyway
            self.executor.submit(store.give_back_connections)
            raise

    async def poll(self) -> None:
        """Read every awaited run until none is awaited any more."""
        while self.waiting:
            keys = list(self.waiting)
            try:
                statuses = await sync_to_async(
                    _read, thread_sensitive=False, executor=self.executor
                )(keys)
            except Exception as exc:  # handed to every waiter, which raises it
                for key in keys:
                    for future in self.waiting.pop(key, []):
                        if not future.done():
                            future.set_exception(exc)
                continue
            for key in keys:
                status = statuses.get(key)
                if status is None or status not in WAITED_THROUGH:
                    for future in self.waiting.pop(key, []):
                        if not future.done():
                            future.set_result(status)
            if self.waiting:
                await asyncio.sleep(self.pause)
                self.pause = min(self.pause * 2, LONGEST_PAUSE)


def _read(keys: list[tuple[str, UUID]]) -> dict[tuple[str, UUID], str]:
    by_alias: dict[str, list[UUID]] = {}
    for alias, execution_id in keys:
        by_alias.setdefault(alias, []).append(execution_id)
    statuses: dict[tuple[str, UUID], str] = {}
    for alias, ids in by_alias.items():
        with store.bound(alias):
            statuses.update(((alias, i), status) for i, status in store.statuses_of(ids).items())
    return statuses


_pollers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Poller] = (
    weakref.WeakKeyDictionary()
)


async def settled(alias: str, execution_id: UUID, timeout: float | None) -> str | None:
    """Wait until the run ``execution_id`` (in the database ``alias``) stops moving; return
    its status (None when it no longer exists). Past ``timeout`` seconds (None: no limit)
    raises ``TimeoutError``. Holds no thread and no connection of the caller meanwhile."""
    loop = asyncio.get_running_loop()
    poller = _pollers.get(loop)
    if poller is None:
        poller = _pollers[loop] = _Poller()
    future = poller.add(alias, execution_id)
    try:
        async with asyncio.timeout(timeout):
            return await future
    finally:
        poller.discard(alias, execution_id, future)
