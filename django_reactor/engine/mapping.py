"""Where ``map_over()`` was declared; see :mod:`.constructs.map`. Kept so that existing imports
go on working."""

from __future__ import annotations

from .constructs.map import (
    DEFAULT_BATCH_SIZE,
    MapConfig,
    MapDone,
    MapPending,
    MapRollbackPending,
    MapRunner,
    MapSourceError,
    MapSpec,
    MapStep,
    MapStopped,
    map_over,
    unsupported_in_element,
)

__all__ = [
    "DEFAULT_BATCH_SIZE",
    "MapConfig",
    "MapDone",
    "MapPending",
    "MapRollbackPending",
    "MapRunner",
    "MapSourceError",
    "MapSpec",
    "MapStep",
    "MapStopped",
    "map_over",
    "unsupported_in_element",
]
