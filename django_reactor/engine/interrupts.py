"""Where ``interrupt()`` was declared; see :mod:`.constructs.interrupt`. Kept so that existing
imports go on working."""

from __future__ import annotations

from .constructs.interrupt import (
    RESUME_MODES,
    ContinueWith,
    InterruptSpec,
    InterruptStep,
    interrupt,
)

__all__ = ["RESUME_MODES", "ContinueWith", "InterruptSpec", "InterruptStep", "interrupt"]
