"""Admin pages for operators: read-only runs, their DAG and trace, and the operations on them.

Nothing here changes a row directly: cancel, undo, retry and resume go through
``django_reactor.services`` (which enforce the state machine and the lease), each behind its
custom permission, and each change is recorded as an admin ``LogEntry``.

- ``executions``: the runs' list, page, actions, resume form and parked view;
- ``console``: the overview (``overview``, drawn by ``charts``) and the coordination panel
  (``coordination``);
- ``timeline``: a run's trace as a Gantt chart, on its page;
- ``records``: read-only lists of interrupts, dispatches, maps and map elements;
- ``events``: the read-only list of events emitted;
- ``bulk``: bulk operations: acting on every run of a filtered list, and their progress;
- ``pauses``, ``forks``: pausing reactors (and the banner), forking a run from a step;
- ``audit``: the steering history (who cancelled, undid, retried, resumed, ... and why), and
  ``acting``: the signed-in user those actions are recorded as;
- ``schedules``: schedules (through ``services.schedules``) and their fires;
- ``display`` and ``forms``: what those pages share.
"""

from __future__ import annotations

from .audit import AuditEntryAdmin
from .bulk import BulkOperationAdmin
from .events import EventAdmin
from .executions import ExecutionAdmin
from .records import DispatchAdmin, InterruptAdmin, MapResultAdmin, MapRunAdmin
from .schedules import ScheduleAdmin, ScheduleFireAdmin

__all__ = [
    "AuditEntryAdmin",
    "BulkOperationAdmin",
    "DispatchAdmin",
    "EventAdmin",
    "ExecutionAdmin",
    "InterruptAdmin",
    "MapResultAdmin",
    "MapRunAdmin",
    "ScheduleAdmin",
    "ScheduleFireAdmin",
]
