"""Parking a run for a person: it ends ``needs_attention`` where it stands, nothing rolled back,
with the failure that says why and what to do, and an ``attention`` trace entry."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from .. import store
from ..engine.outcomes import ErrorInfo, Failed
from ..states import EventKind, ExecutionStatus

logger = logging.getLogger("django_reactor.services")


def park(
    owned: store.Owned,
    reactor: str,
    kind: str,
    message: str,
    *,
    step: str | None = None,
    data: Mapping[str, Any] | None = None,
) -> Failed:
    """Park the owned run of ``reactor`` with an error of ``kind`` saying ``message`` (at
    ``step``); ``data``: more for the trace entry than its kind and error."""
    failure = ErrorInfo(kind=kind, message=message, step=step, reactor=reactor)
    logger.error("execution %s needs attention: %s", owned.execution_id, message)
    store.park_for_attention(
        owned,
        failure=failure.to_dict(),
        event_kind=EventKind.ATTENTION,
        data={"kind": kind, "error": message, **(data or {})},
    )
    return Failed(
        execution_id=owned.execution_id, error=failure, status=ExecutionStatus.NEEDS_ATTENTION
    )
