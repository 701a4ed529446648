"""Django signals for a run's lifecycle, sent by :class:`SignalObserver`.

Every signal is sent with ``sender=<the reactor class>`` and ``event=<RunEvent or
StepEvent>`` (see :mod:`django_reactor.engine.observers`), after the state change it reports is
committed. Receivers run in the process running the step (the caller or a Celery worker); one
that raises is logged (``django.dispatch``) and neither the run nor the other receivers notice::

    from django.dispatch import receiver
    from django_reactor import signals

    @receiver(signals.execution_failed)
    def page_someone(sender, event, **kwargs):
        ...
"""

from __future__ import annotations

from django.dispatch import Signal

from .engine.observers import NOTIFICATIONS, CoordinationEvent, RunEvent, RunObserver, StepEvent

execution_started = Signal()
execution_resumed = Signal()
execution_completed = Signal()
execution_failed = Signal()
execution_halted = Signal()
execution_cancelled = Signal()
execution_paused = Signal()
execution_suspended = Signal()
execution_handed_off = Signal()
execution_parked = Signal()
step_started = Signal()
step_completed = Signal()
step_failed = Signal()
step_retried = Signal()
step_undone = Signal()
step_compensated = Signal()
coordination_acquired = Signal()


class SignalObserver(RunObserver):
    """Sends each notification as the Django signal of the same name."""

    def __init__(self, sender: type) -> None:
        self.sender = sender

    def listens(self, notification: str) -> bool:
        """While the notification's signal has receivers."""
        return bool(_SIGNALS[notification].receivers)

    def _send(self, signal: Signal, event: object) -> None:
        if signal.receivers:
            signal.send_robust(sender=self.sender, event=event)

    def execution_started(self, event: RunEvent) -> None:
        self._send(execution_started, event)

    def execution_resumed(self, event: RunEvent) -> None:
        self._send(execution_resumed, event)

    def execution_completed(self, event: RunEvent) -> None:
        self._send(execution_completed, event)

    def execution_failed(self, event: RunEvent) -> None:
        self._send(execution_failed, event)

    def execution_halted(self, event: RunEvent) -> None:
        self._send(execution_halted, event)

    def execution_cancelled(self, event: RunEvent) -> None:
        self._send(execution_cancelled, event)

    def execution_paused(self, event: RunEvent) -> None:
        self._send(execution_paused, event)

    def execution_suspended(self, event: RunEvent) -> None:
        self._send(execution_suspended, event)

    def execution_handed_off(self, event: RunEvent) -> None:
        self._send(execution_handed_off, event)

    def execution_parked(self, event: RunEvent) -> None:
        self._send(execution_parked, event)

    def step_started(self, event: StepEvent) -> None:
        self._send(step_started, event)

    def step_completed(self, event: StepEvent) -> None:
        self._send(step_completed, event)

    def step_failed(self, event: StepEvent) -> None:
        self._send(step_failed, event)

    def step_retried(self, event: StepEvent) -> None:
        self._send(step_retried, event)

    def step_undone(self, event: StepEvent) -> None:
        self._send(step_undone, event)

    def step_compensated(self, event: StepEvent) -> None:
        self._send(step_compensated, event)

    def coordination_acquired(self, event: CoordinationEvent) -> None:
        self._send(coordination_acquired, event)


#: Each notification's signal (of the same name), by the notification's name.
_SIGNALS: dict[str, Signal] = {name: globals()[name] for name in NOTIFICATIONS}
