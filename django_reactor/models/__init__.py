"""The database models of django_reactor, one module per family of tables:

- ``runs``: ``Execution``, ``Definition`` (the shapes runs started under), ``StepRecord``,
  ``ExecutionEvent`` (the trace), ``Dispatch`` (the outbox), ``Interrupt``, ``ApiRequest``;
- ``attributes``: ``ExecutionAttribute`` (the business keys runs are found by);
- ``maps``: ``MapRun``, ``MapChunk``, ``MapResult``, ``MapTally``;
- ``messages``: ``Message`` (a run's mailbox);
- ``events``: ``Event`` (emitted, matched across runs), ``CancelSubscription``;
- ``schedules``: ``Schedule``, ``ScheduleFire``;
- ``keys``: ``SubjectKey`` (each subject's data key, for erasure);
- ``database``: ``DatabaseIdentity`` (which database this is, for the task messages);
- ``bulk``: ``BulkOperation``, ``BulkItem`` (an action applied to every run a filter matched);
- ``health``: ``ProcessHeartbeat`` (workers' and sweepers' heartbeats);
- ``pauses``: ``Pause`` (operators' pauses of reactors and runs);
- ``audit``: ``AuditEntry`` (the steering history: who cancelled, undid, retried, ...);
- ``patches``: ``PatchDecision`` (which branch of a patch each run takes);
- ``flow``: ``FlowKey`` (the lock decisions on a flow-control key take), ``BatchItem`` (a
  start that joined a batch, once per idempotency key);
- and the database coordination backend's rows (``django_reactor.coordination.models``).

The database is the source of truth for every run. Rows are written by ``django_reactor.store``
on the engine's behalf; nothing else should change them. Import them from here.
"""

from __future__ import annotations

from ..coordination.models import (
    CoordinationKey,
    CoordinationLock,
    OrderedLockEntry,
    OrderedLockState,
    PeriodMarker,
    RateLimitEvent,
    SemaphoreHolder,
)
from .attributes import ATTRIBUTE_UNIQUE, ExecutionAttribute
from .audit import AuditAction, AuditEntry
from .bulk import BulkItem, BulkOperation, BulkStatus, ItemStatus
from .database import DatabaseIdentity
from .events import CancelSubscription, Event
from .flow import BatchItem, FlowKey
from .health import ProcessHeartbeat, ProcessRole
from .keys import SubjectKey
from .maps import MapChunk, MapResult, MapRun, MapTally
from .messages import Message
from .patches import PATCH_DECISION_UNIQUE, PatchDecision
from .pauses import Pause
from .runs import (
    STEP_RECORD_UNIQUE,
    ApiRequest,
    Definition,
    Dispatch,
    Execution,
    ExecutionEvent,
    Interrupt,
    StepRecord,
)
from .schedules import Schedule, ScheduleFire

__all__ = [
    "ATTRIBUTE_UNIQUE",
    "PATCH_DECISION_UNIQUE",
    "STEP_RECORD_UNIQUE",
    "ApiRequest",
    "AuditAction",
    "AuditEntry",
    "BatchItem",
    "BulkItem",
    "BulkOperation",
    "BulkStatus",
    "CancelSubscription",
    "CoordinationKey",
    "CoordinationLock",
    "DatabaseIdentity",
    "Definition",
    "Dispatch",
    "Event",
    "Execution",
    "ExecutionAttribute",
    "ExecutionEvent",
    "FlowKey",
    "Interrupt",
    "ItemStatus",
    "MapChunk",
    "MapResult",
    "MapRun",
    "MapTally",
    "Message",
    "OrderedLockEntry",
    "OrderedLockState",
    "PatchDecision",
    "Pause",
    "PeriodMarker",
    "ProcessHeartbeat",
    "ProcessRole",
    "RateLimitEvent",
    "Schedule",
    "ScheduleFire",
    "SemaphoreHolder",
    "StepRecord",
    "SubjectKey",
]
