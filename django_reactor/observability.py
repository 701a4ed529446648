"""Structured log lines for runs, and the observers every execution is given.

:class:`LogObserver` writes one ``key=value`` line on the ``django_reactor.runs`` logger (INFO)
when a run ends, is handed off, parks, pauses or resumes. Lines carry identities, statuses,
timings and error classes; never inputs, arguments or error messages (they may hold secrets).
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Mapping

from django.utils.module_loading import import_string

from .conf import reactor_settings
from .engine.definition import ReactorDefinition
from .engine.observers import CompositeObserver, RunEvent, RunObserver
from .exceptions import ReactorImproperlyConfigured
from .signals import SignalObserver

run_logger = logging.getLogger("django_reactor.runs")


def logfmt(fields: Mapping[str, object]) -> str:
    """``key=value`` pairs; values with spaces, quotes or ``=`` are JSON-quoted; None dropped."""
    parts = []
    for key, value in fields.items():
        if value is None:
            continue
        if isinstance(value, float):
            text = f"{value:.1f}"
        elif isinstance(value, list | tuple):
            text = ",".join(str(v) for v in value)
        else:
            text = str(value)
        if text == "" or any(c in text for c in ' "=\\\t\n'):
            text = json.dumps(text, ensure_ascii=False)
        parts.append(f"{key}={text}")
    return " ".join(parts)


class LogObserver(RunObserver):
    """One structured INFO line per terminal run, hand-off, park, pause and resume."""

    def __init__(self, parent_id: uuid.UUID | str | None = None) -> None:
        self.parent_id = parent_id

    def _log(self, name: str, event: RunEvent) -> None:
        if not run_logger.isEnabledFor(logging.INFO):
            return
        fields = {
            "event": f"execution.{name}",
            "execution_id": event.execution_id,
            "reactor": event.reactor,
            "status": event.status,
            "step": event.step,
            "duration_ms": event.duration_ms,
            "error_class": event.error_class,
            "reason": event.reason,
            "delay": event.delay,
            "waiting_for": list(event.waiting_for) or None,
            "parent_id": self.parent_id,
        }
        run_logger.info(
            logfmt(fields), extra={"reactor_event": {k: v for k, v in fields.items() if v}}
        )

    def execution_resumed(self, event: RunEvent) -> None:
        self._log("resumed", event)

    def execution_completed(self, event: RunEvent) -> None:
        self._log("completed", event)

    def execution_failed(self, event: RunEvent) -> None:
        self._log("failed", event)

    def execution_halted(self, event: RunEvent) -> None:
        self._log("halted", event)

    def execution_cancelled(self, event: RunEvent) -> None:
        self._log("cancelled", event)

    def execution_paused(self, event: RunEvent) -> None:
        self._log("paused", event)

    def execution_suspended(self, event: RunEvent) -> None:
        self._log("suspended", event)

    def execution_handed_off(self, event: RunEvent) -> None:
        self._log("handed_off", event)

    def execution_parked(self, event: RunEvent) -> None:
        self._log("parked", event)


def middleware_classes() -> list[type[RunObserver]]:
    """The classes named by ``REACTOR["MIDDLEWARE"]``, imported."""
    classes = []
    for path in reactor_settings.MIDDLEWARE:
        cls = import_string(path) if isinstance(path, str) else path
        if not (isinstance(cls, type) and issubclass(cls, RunObserver)):
            raise ReactorImproperlyConfigured(
                f"REACTOR['MIDDLEWARE'] entry {path!r} is not a RunObserver subclass "
                "(django_reactor.engine.observers.RunObserver)"
            )
        classes.append(cls)
    return classes


def observer_for(
    definition: ReactorDefinition, *, parent_id: uuid.UUID | str | None = None
) -> CompositeObserver:
    """The observers of one execution: global middleware, the reactor's, signals, logs."""
    observers: list[RunObserver] = [cls() for cls in middleware_classes()]
    observers.extend(cls() for cls in definition.middleware)
    observers.append(SignalObserver(definition.reactor_class))
    observers.append(LogObserver(parent_id))
    return CompositeObserver(observers)
