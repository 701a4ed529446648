"""Completion signals: Redis pub/sub wakes whoever waits for an async unit, the database decides.

A finished async unit publishes on ``django_reactor:done:<execution id>`` after its final commit.
A waiter subscribes, then re-checks the row, then waits for a message at most one poll interval
before checking the row again: a lost message (pub/sub is fire-and-forget) costs at most one
interval, and no message is ever trusted without the database agreeing.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

from django.conf import settings

from ..conf import reactor_settings
from ..coordination.backends.redis import redis_client as shared_client

logger = logging.getLogger("django_reactor.completion")


def channel(execution_id: uuid.UUID) -> str:
    return f"django_reactor:done:{execution_id}"


def progress_channel(execution_id: uuid.UUID) -> str:
    """Where a run's progress is announced (values published, a pause): its stream listens."""
    return f"django_reactor:progress:{execution_id}"


def redis_client() -> Any | None:
    """``REACTOR["REDIS_URL"]``, else django-redis' default cache, else None (poll only).

    The client comes from the one place that makes Redis clients (the coordination backend's
    ``redis_client``), cached per URL or cache alias.
    """
    url = reactor_settings.REDIS_URL
    if url:
        return shared_client(url)
    backend = settings.CACHES.get("default", {}).get("BACKEND", "")
    if backend.startswith("django_redis."):
        return shared_client("default")
    return None


def announce(execution_id: uuid.UUID, status: str) -> None:
    """Tell whoever waits for ``execution_id`` that it finished (an outbox listener: called
    after the commit that recorded it). Only a hint: waiters poll the database anyway."""
    client = redis_client()
    if client is None:
        return
    try:
        client.publish(channel(execution_id), status)
    except Exception:
        logger.warning("could not publish the completion of %s", execution_id, exc_info=True)


def announce_progress(execution_id: uuid.UUID) -> None:
    """Tell whoever follows ``execution_id``'s stream that it moved (an outbox listener).
    Only a hint: the stream reads the database anyway."""
    client = redis_client()
    if client is None:
        return
    try:
        client.publish(progress_channel(execution_id), "progress")
    except Exception:
        logger.debug("could not announce the progress of %s", execution_id, exc_info=True)


class Follower:
    """Waits for news of a run: a progress or completion announcement over Redis pub/sub, or
    the end of a poll interval when none comes (or Redis is unavailable)."""

    def __init__(self, execution_id: uuid.UUID) -> None:
        self.pubsub: Any = None
        client = redis_client()
        if client is None:
            return
        try:
            self.pubsub = client.pubsub(ignore_subscribe_messages=True)
            self.pubsub.subscribe(progress_channel(execution_id), channel(execution_id))
        except Exception:
            logger.warning("progress signals unavailable; polling the database", exc_info=True)
            self.pubsub = None

    def wait(self, seconds: float) -> None:
        """Return when news comes or ``seconds`` have passed."""
        if self.pubsub is not None:
            try:
                self.pubsub.get_message(timeout=seconds)
                return
            except Exception:
                self.pubsub = None
        time.sleep(seconds)  # the bounded poll interval when no signal can come

    def close(self) -> None:
        if self.pubsub is not None:
            try:
                self.pubsub.close()
            except Exception:
                logger.debug("closing the progress subscription failed", exc_info=True)
            self.pubsub = None


def wait(
    execution_id: uuid.UUID, finished: Callable[[], bool], *, timeout: float, poll: float
) -> bool:
    """Wait until ``finished()`` is true or ``timeout`` seconds pass; return the last answer."""
    deadline = time.monotonic() + timeout
    pubsub = None
    client = redis_client()
    if client is not None:
        try:
            pubsub = client.pubsub(ignore_subscribe_messages=True)
            pubsub.subscribe(channel(execution_id))
        except Exception:
            logger.warning("completion signals unavailable; polling the database", exc_info=True)
            pubsub = None
    try:
        while True:
            if finished():
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            pause = min(poll, remaining)
            if pubsub is not None:
                try:
                    pubsub.get_message(timeout=pause)
                except Exception:
                    pubsub = None
                    time.sleep(pause)
            else:
                time.sleep(pause)  # the bounded poll interval when no signal can come
    finally:
        if pubsub is not None:
            try:
                pubsub.close()
            except Exception:
                logger.debug("closing the completion subscription failed", exc_info=True)
