"""How runs, statuses and errors are shown on the admin pages (shared helpers)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from django.contrib import admin
from django.contrib.admin.utils import quote
from django.core.exceptions import FieldDoesNotExist
from django.db.models import DateTimeField, Model
from django.http import HttpRequest
from django.urls import get_script_prefix, get_urlconf, reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import gettext_lazy as _

from ..display import short_json
from ..models import Execution
from ..states import EventKind, RollbackStatus

if TYPE_CHECKING:
    import datetime as dt
    import uuid

    from django_stubs_ext import StrOrPromise

    from ..engine.outcomes import ErrorInfo

APP = Execution._meta.app_label

# Trace entries drawn in the error colour, and those drawn as rollback work.
FAILURE_EVENTS = frozenset(
    {
        EventKind.FAIL,
        EventKind.RETRY,
        EventKind.COMPENSATE_FAILED,
        EventKind.UNDO_FAILED,
        EventKind.ATTENTION,
        EventKind.ABORT,
        EventKind.HAND_BACK,
        EventKind.INVALID_PAYLOAD,
        EventKind.EXPIRE,
    }
)
ROLLBACK_EVENTS = frozenset(
    {
        EventKind.COMPENSATE,
        EventKind.COMPENSATE_SKIPPED,
        EventKind.UNDO,
        EventKind.UNDO_SKIPPED,
        EventKind.ROLLBACK,
        EventKind.CANCEL,
    }
)


def status_badge(status: str, label: object = None) -> SafeString:
    """A coloured badge for an execution, step or interrupt status."""
    return format_html(
        '<span class="reactor-badge reactor-badge-{}">{}</span>', status, label or status
    )


def rollback_badge(rollback: str, label: object = None) -> SafeString:
    """A step's rollback as a badge: ``undone``, ``compensated``, ``no_handler``, and a rollback
    call that failed as ``rollback_failed`` (its own colour, not a failed step's)."""
    css = "rollback_failed" if rollback == RollbackStatus.FAILED else rollback
    return status_badge(css, label or rollback)


# The status labels of each model, by its label: lazy translations, translated when rendered.
_status_labels: dict[str, dict[object, object]] = {}


def status_badge_of(row: Any) -> SafeString:
    """:func:`status_badge` of a row's ``status``, labelled from its field's choices (a row's
    ``get_status_display()`` builds the choices' dictionary on every call: 0.15 ms a row)."""
    meta = row._meta
    labels = _status_labels.get(meta.label)
    if labels is None:
        field = meta.get_field("status")
        labels = _status_labels[meta.label] = dict(field.flatchoices)
    status = row.status
    return status_badge(status, labels.get(status, status))


def short_reactor(name: str) -> SafeString:
    """The last part of a reactor's dotted name, with the full name as its title."""
    return format_html('<span title="{}">{}</span>', name, breakable(name.rsplit(".", 1)[-1]))


def execution_link(execution_id: uuid.UUID | str, label: object = None) -> SafeString:
    """A link to a run's admin page (its short id unless ``label`` is given)."""
    url = admin_url(f"admin:{APP}_execution_change", quote(str(execution_id)))
    return format_html('<a href="{}">{}</a>', url, label or str(execution_id)[:8])


# A URL pattern's reversal with a marker where the argument goes, by (name, script prefix,
# URL conf): a list page links every row, and ``reverse()`` costs about 0.1 ms a call.
_ARGUMENT = "00000000-0000-0000-0000-000000000000"
_reversed: dict[tuple[str, bool, str, str | None, str | None], str] = {}


def admin_url(name: str, argument: str | None = None, *, current_app: str | None = None) -> str:
    """``reverse(name, args=[argument], current_app=...)`` (or without an argument), the
    pattern reversed once."""
    key = (name, argument is None, get_script_prefix(), get_urlconf(), current_app)
    pattern = _reversed.get(key)
    if pattern is None:
        pattern = _reversed[key] = reverse(
            name, args=[] if argument is None else [_ARGUMENT], current_app=current_app
        )
    return pattern if argument is None else pattern.replace(_ARGUMENT, argument, 1)


MAP_WAITS = ("map", "map rollback")


def waits_for(row: Any, map_run: Mapping[str, object] | None = None) -> str:
    """What a parked run waits for, from its last trace entry (``last_kind``/``last_data``);
    ``map_run`` holds the counters of the map it waits for (``MapRun`` values)."""
    data = row.last_data or {}
    if row.last_kind == EventKind.PARK:
        if data.get("waiting_for") in MAP_WAITS:
            return map_wait(getattr(row, "last_step", "") or "", data["waiting_for"], map_run)
        if "waiting_for" in data:
            return f"async unit {data['waiting_for']}"
        if "child_step" in data:
            return f"composed child at {data['child_step']} ({data.get('reason', '')})".replace(
                " ()", ""
            )
        return "an async result"
    if row.last_kind == EventKind.RETRY:
        return "its next attempt"
    return "its wake-up time"


def map_wait(step: str, waiting_for: str, map_run: Mapping[str, object] | None) -> str:
    """``map pack: 4 of 10 elements settled``, or its rollback's ``2 of 6 elements undone``."""
    if map_run is None:
        return f"map {step}: its elements" if waiting_for == "map" else f"map {step}: its rollback"
    if waiting_for == "map rollback":
        return (
            f"map {step}: {map_run['rollback_settled']} of {map_run['rollback_total']} "
            "elements undone"
        )
    if map_run["size"] is None:
        return f"map {step}: reading its source"
    return f"map {step}: {map_run['settled']} of {map_run['size']} elements settled"


def progress(done: int, total: int | None) -> dict[str, object]:
    """A progress bar's numbers: ``done``, ``total`` and the percentage (``0`` to ``100``)."""
    total = total or 0
    done = min(done, total) if total else done
    percent = (100.0 * done / total) if total else 100.0
    return {"done": done, "total": total, "percent": percent, "label": f"{percent:.0f} %"}


def failure_fields(failure: ErrorInfo | None) -> list[tuple[StrOrPromise, object]]:
    """A run's failure as ``(label, value)`` rows for the run page."""
    if failure is None:
        return []
    rows: list[tuple[StrOrPromise, object]] = [(_("kind"), failure.kind)]
    if failure.step:
        rows.append((_("step"), failure.step))
    if failure.exception_class:
        rows.append((_("exception"), failure.exception_class))
    if failure.attempts:
        rows.append((_("attempts"), failure.attempts))
    rows.append((_("message"), failure.message))
    if failure.field_errors:
        rows.append((_("field errors"), short_json(failure.field_errors, 400)))
    if failure.arguments:
        rows.append((_("arguments"), short_json(failure.arguments, 400)))
    return rows


#: A JSON array or object printed on one line when it fits in this many characters.
INLINE_WIDTH = 88


def pretty_json(value: object, indent: int = 0, lead: int = 0) -> str:
    """Indented JSON for a ``<pre>`` block; an array or object that fits on one line (of
    ``INLINE_WIDTH`` characters, with its indentation and the ``lead`` before it on that line)
    stays on one line, and scalars share lines, so a list of numbers or of small records does
    not print one value per line."""
    flat = json.dumps(value, default=str, ensure_ascii=False)
    if not isinstance(value, (dict, list, tuple)) or not value:
        return flat
    if indent + lead + len(flat) <= INLINE_WIDTH:
        return flat
    inner = " " * (indent + 2)
    end = "\n" + " " * indent
    if isinstance(value, dict):
        rows = []
        for k, v in value.items():
            key = f"{json.dumps(str(k), ensure_ascii=False)}: "
            rows.append(f"{inner}{key}{pretty_json(v, indent + 2, len(key))}")
        return "{\n" + ",\n".join(rows) + end + "}"
    if all(not isinstance(v, (dict, list, tuple)) for v in value):
        lines, line = [], ""
        for v in value:
            item = json.dumps(v, default=str, ensure_ascii=False)
            if line and len(inner) + len(line) + len(item) + 1 > INLINE_WIDTH:
                lines.append(inner + line.rstrip())
                line = ""
            line += item + ", "
        lines.append(inner + line.rstrip(", "))
        return "[\n" + "\n".join(lines) + end + "]"
    rows = [inner + pretty_json(v, indent + 2) for v in value]
    return "[\n" + ",\n".join(rows) + end + "]"


#: A JSON value longer than this many lines (or characters) is folded behind an expander.
FOLD_LINES = 12
FOLD_CHARS = 1_500


def json_block(value: object) -> SafeString:
    """Indented JSON in a ``<pre>``; a large value folded in a ``<details>`` whose summary is
    its start and size, so that a run with a big input stays a short page."""
    text = pretty_json(value)
    lines = text.count("\n") + 1
    if lines <= FOLD_LINES and len(text) <= FOLD_CHARS:
        return format_html('<pre class="reactor-json">{}</pre>', text)
    preview = short_json(value, 100)
    size = len(text.encode())
    amount = f"{size / 1024:.1f} kB" if size >= 1024 else f"{size} bytes"
    return format_html(
        '<details class="reactor-json reactor-fold"><summary><code>{}</code> '
        '<span class="reactor-muted">{}</span></summary><pre>{}</pre></details>',
        preview,
        _("%(lines)s lines, %(size)s: show all") % {"lines": f"{lines:,}", "size": amount},
        text,
    )


def moment(value: dt.datetime | None, zone: dt.tzinfo | None = None) -> SafeString:
    """A time as the admin writes every time: ``2026-12-03 10:04:05``, in the current time zone,
    or in ``zone`` followed by its name (a schedule's times, read in its own zone). The full
    time, to the millisecond and with its zone, is its title; in a list the date stands over
    the time (a narrow column)."""
    if value is None:
        return format_html("{}", "-")
    if zone is not None:
        local = value.astimezone(zone)
    else:
        local = timezone.localtime(value) if timezone.is_aware(value) else value
    clock = local.strftime("%H:%M:%S")
    if zone is not None:
        clock += local.strftime(" %Z")
    return format_html(
        '<time class="reactor-moment" datetime="{}" title="{}"><span>{}</span> <span>{}</span>'
        "</time>",
        value.isoformat(),
        local.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + local.strftime(" %Z").rstrip(),
        local.strftime("%Y-%m-%d"),
        clock,
    )


#: The column of each model's date-time field, by (model label, field name): one object, so
#: that the admin finds it again in its lists of fields.
_moment_columns: dict[tuple[str, str], Callable[[Any], SafeString]] = {}


def moment_column(model: type[Model], name: str) -> Callable[[Any], SafeString] | None:
    """A list column or read-only field showing ``model``'s date-time field ``name`` as
    :func:`moment` (named as the field, so its cells keep the ``field-<name>`` class); None
    when ``name`` is no date-time field of ``model``."""
    key = (model._meta.label, name)
    column = _moment_columns.get(key)
    if column is not None:
        return column
    try:
        field = model._meta.get_field(name)
    except FieldDoesNotExist:
        return None
    if not isinstance(field, DateTimeField):
        return None

    def shown(obj: Any) -> SafeString:
        return moment(getattr(obj, name))

    shown.__name__ = name
    shown.short_description = field.verbose_name  # type: ignore[attr-defined]
    shown.admin_order_field = name  # type: ignore[attr-defined]
    return _moment_columns.setdefault(key, shown)


class MomentsAdmin(admin.ModelAdmin):
    """A model admin whose lists and read-only fields show date-time fields as :func:`moment`,
    as every time of django_reactor's admin is written (Django would write them in the
    locale's format, ``Dec. 3, 2026, 10:04 a.m.``). Editable date-time fields stay inputs."""

    def _moment(self, name: Any) -> Any:
        if isinstance(name, list | tuple):  # fields of a fieldset shown on one line
            return type(name)(self._moment(n) for n in name)
        return (moment_column(self.model, name) or name) if isinstance(name, str) else name

    def get_list_display(self, request: HttpRequest) -> Any:
        return [self._moment(name) for name in super().get_list_display(request)]

    def get_sortable_by(self, request: HttpRequest) -> Any:
        sortable = list(super().get_sortable_by(request))
        return [*sortable, *(self._moment(name) for name in sortable)]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return [self._moment(name) for name in super().get_readonly_fields(request, obj)]

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        # Read-only: the declared read-only fields, and every field of a page nobody may change.
        everything = obj is not None and not self.has_change_permission(request, obj)
        readonly = set(super().get_readonly_fields(request, obj))

        def shown(name: Any) -> Any:
            if isinstance(name, list | tuple):
                return type(name)(shown(n) for n in name)
            return self._moment(name) if everything or name in readonly else name

        return [
            (title, {**options, "fields": [shown(name) for name in options["fields"]]})
            for title, options in super().get_fieldsets(request, obj)
        ]


def breakable(name: str) -> SafeString:
    """A name that may wrap at its word boundaries (``RenewDue|Subscriptions``,
    ``charge_|card``), so that a long one takes two lines instead of a column's width."""
    pieces = re.split(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[_.:-])", name)
    return format_html_join(mark_safe("<wbr>"), "{}", ((piece,) for piece in pieces))
