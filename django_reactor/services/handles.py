"""The handles the operations give back: read views of stored runs that steer them through
the services."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

from .. import store
from ..exceptions import ExecutionNotFound
from ..handle import ExecutionHandle, Operations
from .databases import across_databases

if TYPE_CHECKING:
    from ..models import Execution
    from ..reactor import Reactor

#: The handles ``find()`` gives steer their run through these (set by the package, which sees
#: every operation; see ``services/__init__.py``).
OPERATIONS: Operations | None = None


@across_databases
def find(execution_id: uuid.UUID | str, *, reactor: type[Reactor] | None = None) -> ExecutionHandle:
    """The stored execution ``execution_id`` (of ``reactor``, when given)."""
    row = store.get_row(execution_id)
    if reactor is not None and row.reactor != reactor.definition.name:
        raise ExecutionNotFound(
            f"execution {row.id} is a run of {row.reactor}, not of {reactor.definition.name}"
        )
    return handle_of(row)


def handle_of(row: Execution) -> ExecutionHandle:
    """A handle of the stored run ``row`` that steers it through the services."""
    return ExecutionHandle(row, OPERATIONS)
