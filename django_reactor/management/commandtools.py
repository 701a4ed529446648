"""Helpers the ``reactor_*`` management commands share.

Argument parsing (reactor names, JSON objects, ``key=value`` pairs, statuses, dates) and output
(outcomes as text; as JSON, ``engine.outcomes.outcome_data``). Errors are raised as
``CommandError`` with a plain message that says what to do next.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import sys
import uuid
from argparse import ArgumentTypeError
from pathlib import Path
from typing import IO, Any

from django.core.management.base import CommandError, CommandParser
from django.utils import timezone

from django_reactor import registry, store
from django_reactor.display import short_json
from django_reactor.engine import timevalues
from django_reactor.engine.outcomes import (
    Aborted,
    Cancelled,
    Completed,
    Dispatched,
    Failed,
    Halted,
    InProgress,
    Outcome,
    Paused,
    PendingInterrupt,
    Rescheduled,
)
from django_reactor.exceptions import (
    ExecutionBusy,
    ExecutionNotFound,
    InvalidTime,
    ReactorError,
    ReactorNotRegistered,
    TransactionActive,
)
from django_reactor.management.terminal import (  # noqa: F401 - the commands' one import
    ReactorCommand,
    status_cell,
    status_style,
    styled,
    table_lines,
    write_table,
)
from django_reactor.services.run_filters import moment_from_text
from django_reactor.states import ExecutionStatus

EXAMPLE = """'{"amount": 5}'"""

#: Outcomes that make ``reactor_run`` and ``reactor_retry`` exit non-zero (unless --exit-zero).
FAILED_STATUSES = frozenset(
    {ExecutionStatus.FAILED, ExecutionStatus.NEEDS_ATTENTION, ExecutionStatus.ABORTED}
)
EXIT_ZERO_HELP = (
    "Exit 0 whatever the run's outcome. Without it the command exits 1 when the run ended "
    "failed, needs_attention or aborted (the outcome is printed first)."
)


# ---------------------------------------------------------------------- arguments


def sentence(text: object) -> str:
    """``text`` ending with a full stop."""
    words = str(text).rstrip()
    return words if words.endswith(".") else words + "."


def reactor_name(name: str, option: str = "--reactor") -> str:
    """The registered name of the reactor ``name`` names (``registry.resolve``: registered
    name, dotted path or a unique class name); CommandError otherwise."""
    try:
        return registry.resolve(name).definition.name
    except ReactorNotRegistered as exc:
        if exc.matches:
            raise CommandError(
                f"{option} {name!r} matches several reactors ({', '.join(exc.matches)}); give "
                "the full name"
            ) from None
        raise CommandError(f"{option} {name!r}: {unknown_reactor(exc)}") from None


def unknown_reactor(exc: ReactorNotRegistered) -> str:
    """What a command says of a name that names no reactor: close names, else the known ones."""
    if exc.suggestions:
        hint = f"did you mean {' or '.join(exc.suggestions)}?"
    else:
        hint = f"known: {', '.join(sorted(registry.all_reactors())[:10]) or 'none'}"
    return (
        f"no reactor of that name is known to this process ({hint}). Give the registered name "
        "(Meta.name or the class's dotted path) or a unique class name."
    )


SHORT_ID_LENGTH = 8  # what the admin and reactor_list show


def expand_execution_id(text: str, option: str = "execution_id") -> str:
    """A run's id given whole or by its first hex digits (at least 8: what the admin and
    ``reactor_list`` show), as the full id. A prefix that names no run, or several, is refused
    with the runs it could mean."""
    text = text.strip()
    try:
        return str(uuid.UUID(text))
    except ValueError:
        pass
    digits = text.replace("-", "").lower()
    if len(digits) < SHORT_ID_LENGTH or len(digits) >= 32 or not _hex(digits):
        raise CommandError(
            f"{option} {text!r} is not an execution id: give the whole id (a UUID such as "
            f"{uuid.UUID(int=0)}) or its first {SHORT_ID_LENGTH} or more characters, as the "
            "admin and reactor_list show them"
        )
    found = store.ids_starting_with(digits, limit=5)
    if not found:
        raise CommandError(
            f"no execution id starts with {text!r}; reactor_list lists the stored runs"
        )
    if len(found) > 1:
        shown = ", ".join(str(i) for i in found[:4]) + (", ..." if len(found) > 4 else "")
        raise CommandError(
            f"{option} {text!r} could be any of several runs ({shown}); give more of the id"
        )
    return str(found[0])


def _hex(digits: str) -> bool:
    return all(c in "0123456789abcdef" for c in digits)


def parse_json(text: str, source: str, example: str = EXAMPLE, *, wanted: str = "JSON") -> Any:
    """``text`` as JSON (any value); CommandError naming ``source`` (and ``wanted``, what to
    pass instead) otherwise."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise CommandError(
            f"{source} is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}); "
            f"pass {wanted} such as {example}"
        ) from None


def parse_object(text: str, source: str, example: str = EXAMPLE) -> dict[str, Any]:
    """``text`` as a JSON object; CommandError naming ``source`` otherwise."""
    value = parse_json(text, source, example, wanted="a JSON object")
    if not isinstance(value, dict):
        raise CommandError(
            f"{source} must be a JSON object ({{...}}), got {json_type(value)}; pass a JSON "
            f"object such as {example}"
        )
    return value


def parse_pairs(
    fields: list[str], what: str = "the payload", example: str = "amount=5 note=hello"
) -> dict[str, Any]:
    """``key=value`` pairs as an object; each value is JSON when it parses, else a string."""
    payload: dict[str, Any] = {}
    for field in fields:
        key, sep, raw = field.partition("=")
        if not sep or not key:
            raise CommandError(
                f"{field!r} is not a key=value pair; write {what} as pairs such as {example}"
            )
        if key in payload:
            raise CommandError(f"the key {key!r} is given twice; give each key once")
        try:
            payload[key] = json.loads(raw)
        except json.JSONDecodeError:
            payload[key] = raw
    return payload


def read_input(
    path: str, stdin: IO[str] | None, *, what: str, option: str | None = None
) -> tuple[str, str]:
    """The text of the file ``path`` (``-``: standard input) and how errors name it: ``what``
    it holds (``"the payload"``) and, when an option named the file, that option."""
    if path == "-":
        return (stdin or sys.stdin).read(), f"{what} read from standard input"
    label = f"{what} file {path}" if option else f"the file {path}"
    try:
        return Path(path).read_text(encoding="utf-8-sig"), label
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        dash = f"{option} -" if option else "-"
        raise CommandError(
            f"cannot read {label}: {reason}. Check the path, or pass {dash} to read standard input."
        ) from None


def read_object_file(path: str, what: str, stdin: IO[str] | None = None) -> dict[str, Any]:
    """The JSON object in the file ``path`` (``-``: standard input)."""
    return parse_object(*read_input(path, stdin, what=what))


def json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return type(value).__name__


def parse_statuses(text: str, option: str = "--status") -> list[str]:
    """Comma-separated execution statuses (``failed,needs_attention``), each checked."""
    known = list(ExecutionStatus.values)
    statuses: list[str] = []
    for part in text.split(","):
        name = part.strip().lower().replace("-", "_")
        if not name:
            continue
        if name not in known:
            raise CommandError(
                f"{option}: {part.strip()!r} is not a status; use one or more of "
                f"{', '.join(known)}, separated by commas"
            )
        if name not in statuses:
            statuses.append(name)
    if not statuses:
        raise CommandError(f"{option} needs at least one status, such as {option} failed")
    return statuses


def non_negative_int(value: str) -> int:
    """argparse ``type=``: a whole number of 0 or more (argparse reports a bad one with the
    command's usage, as for any other option)."""
    try:
        number = int(value)
    except ValueError:
        raise ArgumentTypeError(f"{value!r} is not a whole number") from None
    if number < 0:
        raise ArgumentTypeError(f"the number must be 0 or more, got {value}")
    return number


def positive_int(value: str) -> int:
    """argparse ``type=``: a whole number of 1 or more."""
    number = non_negative_int(value)
    if number < 1:
        raise ArgumentTypeError(f"the number must be 1 or more, got {value}")
    return number


def parse_moment(text: str, option: str = "--since") -> dt.datetime:
    """An ISO 8601 date or date-time; naive values are in the current time zone."""
    try:
        return moment_from_text(text, option)
    except InvalidTime as exc:
        raise CommandError(str(exc)) from None


def days_ago(days: int, option: str = "--days") -> dt.datetime:
    """The time ``days`` days before now; CommandError when that is before any date."""
    try:
        return timevalues.ago(days * 86400, f"{option} {days}", now=timezone.now())
    except InvalidTime as exc:
        raise CommandError(str(exc)) from None


# ---------------------------------------------------------------------- output


def describe_interrupt(pending: PendingInterrupt) -> str:
    details = []
    if pending.correlation_id:
        details.append(f"correlation id {pending.correlation_id}")
    if pending.expires_at is not None:
        details.append(f"expires {pending.expires_at.isoformat()}")
    return pending.step + (f" ({', '.join(details)})" if details else "")


def outcome_lines(outcome: Outcome) -> list[str]:
    """What an outcome says, one indented line each, after its ``execution ID: status``."""
    lines: list[str] = []
    if outcome.idempotent_replay:
        lines.append(
            "  (this idempotency key was used before: nothing ran again, this is the run as "
            "it stands)"
        )
    if isinstance(outcome, Completed):
        lines.append(f"  value: {short_json(outcome.value, 200)}")
    elif isinstance(outcome, Failed):
        lines.append(f"  error: {outcome.error}")
        for failure in outcome.error.rollback_failures:
            lines.append(f"  could not {failure.action} {failure.step}: {failure.message}")
    elif isinstance(outcome, Halted):
        lines.append(f"  halted at {outcome.step}: {outcome.reason}")
    elif isinstance(outcome, Paused):
        lines.append("  the run waits at:")
        lines.extend(f"    {describe_interrupt(pending)}" for pending in outcome.interrupts)
        lines.append(
            f"  resume it with: python manage.py reactor_resume {outcome.execution_id} "
            "[--step STEP] key=value ..."
        )
    elif isinstance(outcome, Dispatched | Rescheduled):
        lines.append("  a worker runs the rest")
    elif isinstance(outcome, InProgress):
        lines.append("  the run is moving in another process")
    elif isinstance(outcome, Cancelled):
        lines.append(f"  cancelled: {outcome.reason}")
    elif isinstance(outcome, Aborted) and outcome.error is not None:
        lines.append(f"  aborted: {outcome.error}; reactor_undo rolls back what completed")
    return lines


def json_default(value: Any) -> Any:
    """What ``json.dumps`` cannot write itself: datetimes, decimals, UUIDs, sets..."""
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, decimal.Decimal | uuid.UUID):
        return str(value)
    if isinstance(value, set | frozenset):
        return sorted(value, key=repr)
    return repr(value)


def dumps(value: Any) -> str:
    return json.dumps(value, default=json_default)


def iso(moment: dt.datetime | None) -> str | None:
    return moment.isoformat() if moment is not None else None


def local_time(moment: dt.datetime | None) -> str:
    """A moment as the commands print it: local time, to the second, with its zone."""
    if moment is None:
        return "-"
    return timezone.localtime(moment).strftime("%Y-%m-%d %H:%M:%S %Z")


def short_reactor(name: str) -> str:
    return name.rsplit(".", 1)[-1]


# ---------------------------------------------------------------------- steering


def add_reason(parser: CommandParser, what: str, default: str = "") -> None:
    """The ``--reason`` option of a command that steers: why ``what``, recorded with who ran
    the command (``command_actor``) on the run's trace and in the steering history."""
    parser.add_argument(
        "--reason",
        metavar="TEXT",
        default="",
        help=f"Why {what}; kept, with the command and your OS user name, in the run's trace and "
        f"the steering history{default}.",
    )


class SteeringCommand(ReactorCommand):
    """Base of ``reactor_cancel``, ``reactor_undo``, ``reactor_retry`` and ``reactor_wake``:
    apply one operation to each execution id given, report each, and fail at the end if any
    was refused. ``--reason`` says why, for each."""

    action = ""  # the verb, as in "cannot <action> execution ..."
    done = ""  # its past participle, as in "2 of 3 execution(s) could not be <done>"
    default_reason = ""  # what --reason's help says of no reason, after a comma

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "execution_ids",
            nargs="+",
            metavar="execution_id",
            help=f"The id of each run to {self.action} (the execution_id of its outcome, or "
            "its first 8 or more characters); give several to handle each in turn.",
        )
        parser.add_argument(
            "--json",
            action="store_true",
            help="Print one JSON array with an object per id: execution_id, ok, and status "
            "(or error, when it was refused).",
        )
        add_reason(parser, f"the runs are {self.done}", self.default_reason)

    def operate(
        self, execution_id: str, options: dict[str, Any]
    ) -> tuple[dict[str, Any], list[str]]:
        """Apply the operation; return the JSON result and the text lines for one id."""
        raise NotImplementedError

    def run_failed(self, data: dict[str, Any]) -> bool:
        """Whether the operation ran a run that failed (the command then exits non-zero)."""
        return False

    def handle(self, *args: Any, **options: Any) -> None:
        ids = list(dict.fromkeys(options["execution_ids"]))
        results: list[dict[str, Any]] = []
        refused = failed = 0
        for execution_id in ids:
            try:
                data, lines = self.operate(expand_execution_id(execution_id), options)
            except CommandError as exc:  # the id itself names no run (or several)
                refused += 1
                results.append({"execution_id": execution_id, "ok": False, "error": str(exc)})
                if not options["json"]:
                    self.stderr.write(f"cannot {self.action} {execution_id}: {sentence(exc)}")
                continue
            except ReactorError as exc:
                refused += 1
                hint = ""
                if isinstance(exc, ExecutionNotFound):
                    hint = " Check the id; reactor_list lists the stored runs."
                elif isinstance(exc, ExecutionBusy):
                    hint = " Nothing changed; run the command again when it stops."
                elif isinstance(exc, ReactorNotRegistered):
                    hint = " Run the command with the settings of the project that defines it."
                elif isinstance(exc, TransactionActive):
                    hint = " Run the command outside the transaction."
                if str(exc).startswith(f"cannot {self.action} "):
                    message = sentence(exc) + hint  # it names the execution already
                else:
                    message = f"cannot {self.action} execution {execution_id}: {sentence(exc)}"
                    message += hint
                results.append({"execution_id": execution_id, "ok": False, "error": str(exc)})
                if not options["json"]:
                    self.stderr.write(message)
                continue
            results.append({"execution_id": execution_id, "ok": True, **data})
            failed += self.run_failed(data)
            if not options["json"]:
                for line in lines:
                    self.stdout.write(line)
        if options["json"]:
            self.stdout.write(dumps(results))
        if refused:
            where = "the JSON output" if options["json"] else "the messages above"
            raise CommandError(
                f"{refused} of {len(ids)} execution(s) could not be {self.done}; see {where}"
            )
        if failed and not options.get("exit_zero"):
            raise CommandError(
                f"{failed} of {len(ids)} {self.done} run(s) failed (the outcome is above); "
                "pass --exit-zero to exit 0 whatever the runs' outcomes",
                returncode=1,
            )
