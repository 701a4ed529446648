"""Show one stored run: its steps, trace, failure and what it waits for."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

from django.core.management.base import CommandError, CommandParser

from django_reactor import services, store
from django_reactor.display import duration_seconds, format_duration, short_json, trace_lines
from django_reactor.engine.routing import DEFAULT_PRIORITY
from django_reactor.exceptions import ExecutionNotFound
from django_reactor.handle import ExecutionHandle
from django_reactor.management.commandtools import (
    ReactorCommand,
    dumps,
    expand_execution_id,
    iso,
    sentence,
    status_cell,
    styled,
    write_table,
)
from django_reactor.models import Execution
from django_reactor.runtime.maps import displayable
from django_reactor.services.health import waiting_warnings
from django_reactor.states import ExecutionStatus


class Command(ReactorCommand):
    help = (
        "Show one stored run: status, business attributes, inputs (secrets redacted), each "
        "step's status, attempts, rollback and result, what it published, the trace, the "
        "failure with its traceback, rollback failures, who steered it (the steering history), "
        "the interrupts it waits at, the messages sent to it (unread ones too), and its parent "
        "and child runs. Reads only."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "execution_id",
            help="The id of the run (the execution_id of its outcome, or its first 8 or more "
            "characters).",
        )
        parser.add_argument(
            "--no-trace",
            action="store_true",
            help="Leave out the trace (one line per event), for runs with long histories.",
        )
        parser.add_argument(
            "--json",
            action="store_true",
            help="Print the run as one JSON object (id, reactor, status, attributes, inputs, "
            "steps, trace, failure, interrupts, messages, parent_id, children...).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            handle = services.find(expand_execution_id(options["execution_id"]))
        except ExecutionNotFound as exc:
            raise CommandError(
                f"cannot show the run: {sentence(exc)} Give the execution_id of a run's "
                "outcome; reactor_list lists the stored runs."
            ) from exc
        interrupts = [
            {
                "step": store.interrupts.path_of(row),
                "correlation_id": row.correlation_id,
                "expires_at": row.expires_at,
                "invalid_attempts": row.invalid_attempts,
                "max_attempts": row.max_attempts,
            }
            for row in store.interrupts.waiting(handle.id)
        ]
        # The handle does not carry started_at (the run's duration is measured from it), nor
        # the times the run waits for.
        found = (
            Execution.objects.filter(pk=handle.id)
            .values("started_at", "wake_at", "deadline_at", "lease_owner")
            .first()
        )
        times: dict[str, Any] = dict(found) if found else {}
        self._messages: list[dict[str, Any]] = [
            {
                "id": message.pk,
                "topic": message.topic,
                "kind": message.kind,
                "status": message.status,
                "consumed_by_step": message.consumed_by_step,
                "errors": message.errors,
                "sent_at": iso(message.created_at),
                "consumed_at": iso(message.consumed_at),
            }
            for message in store.messages.of_run(handle.id)
        ]
        self._steering: list[dict[str, Any]] = [
            {
                "action": entry.action,
                "who": entry.who,
                "via": entry.via,
                "reason": entry.reason,
                "at": iso(entry.at),
                "detail": entry.detail,
            }
            for entry in services.audit.of_run(handle.id)
        ]
        started_at = times.get("started_at")
        self._times = times
        children = list(
            Execution.objects.filter(parent_id=handle.id)
            .order_by("created_at", "id")
            .values("id", "parent_step", "reactor", "status", "detached")
        )
        if options["json"]:
            self.stdout.write(dumps(self._data(handle, started_at, interrupts, children, options)))
        else:
            self._text(handle, started_at, interrupts, children, options)

    # ------------------------------------------------------------------ output

    def _waits(self, handle: ExecutionHandle) -> None:
        """What the run waits for in time (a sleep, its start, a wake-up) and its deadline."""
        times = self._times
        wake_at = times.get("wake_at")
        if wake_at is not None and handle.status in ("pending", "scheduled"):
            sleeping = [v.name for v in handle.steps if v.status == "sleeping"]
            why = (
                f"sleeping at step {sleeping[0]}"
                if sleeping
                else "its scheduled start"
                if handle.status == "scheduled"
                else "its wake-up"
            )
            self.stdout.write(f"waits until: {iso(wake_at)} ({why}; reactor_wake ID wakes it now)")
        if times.get("deadline_at") is not None:
            self.stdout.write(f"deadline: {iso(times['deadline_at'])}")

    def _data(
        self,
        handle: ExecutionHandle,
        started_at: dt.datetime | None,
        interrupts: list[dict[str, Any]],
        children: Sequence[Mapping[str, Any]],
        options: dict[str, Any],
    ) -> dict[str, Any]:
        error = handle.error
        continued_as = handle.continued_as
        data: dict[str, Any] = {
            "id": str(handle.id),
            "reactor": handle.reactor,
            "status": handle.status,
            "wake_at": iso(self._times.get("wake_at")),
            "deadline_at": iso(self._times.get("deadline_at")),
            "current_step": handle.current_step,
            "created_at": iso(handle.created_at),
            "started_at": iso(started_at),
            "finished_at": iso(handle.finished_at),
            "duration_seconds": duration_seconds(started_at, handle.finished_at),
            "idempotency_key": handle.idempotency_key,
            "retry_of": str(handle.retry_of) if handle.retry_of else None,
            "fork_step": handle.fork_step or None,
            "continued_from": str(handle.continued_from) if handle.continued_from else None,
            "continued_as": str(continued_as) if continued_as else None,
            "generation": handle.generation,
            "concurrency_key": handle.concurrency_key or None,
            "throttle_key": handle.throttle_key or None,
            "debounce_key": handle.debounce_key or None,
            "batch_key": handle.batch_key or None,
            "batch_size": handle.batch_size if handle.batch_key else None,
            "queue": handle.queue,
            "priority": handle.priority,
            "pause": handle.pause_info,
            "parent_id": str(handle.parent_id) if handle.parent_id else None,
            "attributes": handle.attributes,
            "inputs": handle.inputs,
            "steps": [
                {
                    "name": view.name,
                    "status": view.status,
                    "attempts": view.attempts,
                    "arguments": view.arguments,
                    "result": displayable(view.result),
                    "error": view.error.to_dict() if view.error else None,
                    "rollback": view.rollback,
                    "rollback_error": view.rollback_error,
                    "started_at": iso(view.started_at),
                    "finished_at": iso(view.finished_at),
                    "duration_seconds": duration_seconds(view.started_at, view.finished_at),
                }
                for view in handle.steps
            ],
            "failure": error.to_dict() if error is not None else None,
            "published": {key: displayable(value) for key, value in handle.published.items()},
            "maps": handle.maps,
            "interrupts": [{**item, "expires_at": iso(item["expires_at"])} for item in interrupts],
            "messages": self._messages,
            "steering": self._steering,
            "children": [
                {
                    "id": str(child["id"]),
                    "step": child["parent_step"],
                    "reactor": child["reactor"],
                    "status": child["status"],
                    "detached": child["detached"],
                }
                for child in children
            ],
        }
        if handle.status == "completed":
            data["value"] = displayable(getattr(handle.outcome, "value", None))
        if not options["no_trace"]:
            data["trace"] = [
                {
                    "seq": event.seq,
                    "kind": event.kind,
                    "step": event.step,
                    "attempt": event.attempt,
                    "at": iso(event.at),
                    "duration_ms": event.duration_ms,
                    "data": event.data,
                }
                for event in handle.trace
            ]
        return data

    def _map(self, summary: dict[str, Any]) -> None:
        write = self.stdout.write
        counts = ", ".join(
            f"{summary[key]} {key.replace('_', ' ')}"
            for key in ("succeeded", "failed", "halted", "pending", "not_started", "undone")
            if summary.get(key)
        )
        write(f"map {summary['step']} ({summary['status']}): {summary['total']} elements: {counts}")
        for failure in summary["failures"]:
            write(f"  element {failure['index']} failed: {failure['message']}")
        if summary["failures_truncated"]:
            write(f"  ... {summary['failed'] - len(summary['failures'])} more failures not shown")

    def _text(
        self,
        handle: ExecutionHandle,
        started_at: dt.datetime | None,
        interrupts: list[dict[str, Any]],
        children: Sequence[Mapping[str, Any]],
        options: dict[str, Any],
    ) -> None:
        write = self.stdout.write
        write(f"{handle.reactor}  execution {handle.id}")
        write("status: " + styled(self, handle.status))
        for warning in waiting_warnings(
            handle.status, wakes=self._times.get("wake_at") is not None
        ):
            write("warning: " + warning)
        pause = handle.pause_info
        if pause is not None:
            by = f" by {pause['by']}" if pause["by"] else ""
            if pause["reactor_paused"]:
                write(f"paused: every run of {handle.reactor} is paused{by}: {pause['reason']}")
                how = f"reactor_unpause --reactor {handle.reactor}"
            else:
                write(f"paused: this run is paused{by}: {pause['reason']}")
                how = f"reactor_unpause {handle.id}"
            stops = (
                "it waits, holding no worker"
                if handle.status == "suspended"
                else "it stops at its next step boundary"
            )
            write(f"  {stops}; {how} lets it go on")
        if handle.current_step:
            write(f"current step: {handle.current_step}")
        times = f"created {iso(handle.created_at)}"
        if started_at is not None:
            times += f", started {iso(started_at)}"
        if handle.finished_at is not None:
            took = format_duration(duration_seconds(started_at, handle.finished_at))
            times += f", finished {iso(handle.finished_at)} (took {took})"
        write(times)
        self._waits(handle)
        if handle.idempotency_key:
            write(f"idempotency key: {handle.idempotency_key}")
        if handle.retry_of:
            if handle.fork_step:
                write(f"fork of: {handle.retry_of}, from step {handle.fork_step}")
            else:
                write(f"retry of: {handle.retry_of}")
        if handle.continued_from:
            write(f"continued from: {handle.continued_from} (generation {handle.generation})")
        if (continued_as := handle.continued_as) is not None:
            write(f"continued as: {continued_as}")
        if handle.concurrency_key:
            write(f"concurrency key: {handle.concurrency_key}")
            if handle.status == ExecutionStatus.QUEUED:
                detail = services.flow.waiting_detail(
                    handle.reactor, handle.concurrency_key, handle.created_at
                )
                write(f"  {detail}")
        if handle.throttle_key:
            write(f"throttle key: {handle.throttle_key}")
        if handle.debounce_key:
            write(f"debounce key: {handle.debounce_key}")
            if handle.status == ExecutionStatus.SCHEDULED:
                write(
                    "  starts when its key has been quiet for its period; another start of the key"
                )
                write("  collapses into it (its inputs replaced, its start moved)")
        if handle.batch_key:
            write(f"batch key: {handle.batch_key} ({handle.batch_size} items)")
            if handle.status == ExecutionStatus.SCHEDULED:
                write(
                    "  collecting: another start of the key joins it until it is full; it starts "
                    "when full or at its max_wait"
                )
        if handle.queue or handle.priority != DEFAULT_PRIORITY:
            write(f"queue: {handle.queue or 'the default queue'}, priority {handle.priority}")
        if handle.parent_id:
            write(f"parent: {handle.parent_id}")
        if handle.subject:
            write(f"subject: {handle.subject}")
        attributes = handle.attributes
        if attributes:
            pairs = ", ".join(f"{key}={value}" for key, value in attributes.items())
            write(f"attributes: {pairs}")
        write(f"inputs: {short_json(handle.inputs, 200)}")
        if handle.status == "completed":
            value = displayable(getattr(handle.outcome, "value", None))
            write(f"value: {short_json(value, 200)}")

        steps = handle.steps
        if not steps:
            write("steps: none recorded")
        else:
            write("steps:")
            write_table(
                self,
                ["STEP", "STATUS", "ATTEMPTS", "DURATION", "ROLLBACK", "RESULT"],
                (
                    [
                        view.name,
                        status_cell(self, view.status),
                        str(view.attempts),
                        format_duration(duration_seconds(view.started_at, view.finished_at)),
                        view.rollback or "-",
                        "-" if view.result is None else short_json(displayable(view.result), 60),
                    ]
                    for view in steps
                ),
                indent="  ",
            )
            errors = []
            for view in steps:
                if view.error is not None:
                    errors.append(f"  {view.name}: {view.error}")
                if view.rollback_error:
                    message = view.rollback_error.get("message", view.rollback_error)
                    errors.append(f"  {view.name} (rollback): {message}")
            if errors:
                write("step errors:")
                for line in errors:
                    write(line)

        for summary in handle.maps:
            self._map(summary)

        if not options["no_trace"]:
            # The trace stays hand-written lines, not a rich table: a table measures every row
            # before it prints the first, and a run's history can hold thousands of events;
            # the same lines (display.trace_lines) go to logs and the demo, one event a line.
            write("trace:")
            for line in trace_lines(handle):
                write(f"  {line}")

        if self._steering:
            write("steered:")
            for entry in self._steering:
                why = f": {entry['reason']}" if entry["reason"] else ""
                who = f"{entry['who']} via {entry['via']}"
                write(f"  {entry['at']} {entry['action']} by {who}{why}")

        error = handle.error
        if error is not None:
            write("failure:")
            write(f"  kind: {error.kind}")
            if error.step:
                write(f"  step: {error.step}")
            if error.exception_class:
                write(f"  exception: {error.exception_class}")
            write(f"  message: {error.message}")
            if error.attempts:
                write(f"  attempts: {error.attempts}")
            if error.traceback:
                write("  traceback:")
                for line in error.traceback.rstrip().splitlines():
                    write(f"    {line}")
            if error.rollback_failures:
                write("rollback failures (undo the run again, or fix by hand):")
                for failure in error.rollback_failures:
                    write(f"  could not {failure.action} {failure.step}: {failure.message}")

        if handle.published:
            write("published:")
            for key, value in handle.published.items():
                write(f"  {key}: {short_json(displayable(value), 200)}")
        if interrupts:
            write("waiting at:")
            for item in interrupts:
                details = [f"correlation id {item['correlation_id'] or '-'}"]
                details.append(f"expires {iso(item['expires_at']) or 'never'}")
                limit = item["max_attempts"]
                attempts = f"{item['invalid_attempts']}" + (f" of {limit}" if limit else "")
                details.append(f"invalid payloads {attempts}")
                write(f"  {item['step']} ({', '.join(details)})")
            write(
                f"  resume it with: python manage.py reactor_resume {handle.id} "
                "[--step STEP] key=value ..."
            )
        if self._messages:
            write("messages:")
            write_table(
                self,
                ["ID", "TOPIC", "KIND", "STATUS", "TAKEN BY", "SENT"],
                (
                    [
                        str(item["id"]),
                        item["topic"],
                        item["kind"],
                        item["status"],
                        item["consumed_by_step"] or "-",
                        item["sent_at"],
                    ]
                    for item in self._messages
                ),
                indent="  ",
            )
            for item in self._messages:
                if item["errors"]:
                    write(f"  message {item['id']} refused: {short_json(item['errors'], 200)}")
        if children:
            write("children:")
            write_table(
                self,
                ["STEP", "ID", "STATUS", "KIND"],
                (
                    [
                        child["parent_step"],
                        str(child["id"]),
                        status_cell(self, child["status"]),
                        "async unit" if child["detached"] else "composed",
                    ]
                    for child in children
                ),
                indent="  ",
            )
