"""Which runs: a filter over stored runs, as bulk operations take it from every face.

A :class:`RunFilter` is built from plain ``key=value`` pairs (the command's ``--filter``, the
API's ``filter`` object, the admin's list): ``reactor``, ``status`` (one or several, commas),
``step`` (the step a failed run failed at), ``error`` (the exception class it failed with,
dotted or short), ``created_after``, ``created_before`` (ISO 8601), ``id`` (one or several run
ids). Only top-level runs are chosen (a composed child is steered through its parent). An empty
filter is refused: a bulk operation never means every run by accident.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from django.db.models import Q, QuerySet
from django.utils import dateparse, timezone

from .. import registry, store
from ..engine import timevalues
from ..exceptions import InvalidFilter, InvalidTime, ReactorNotRegistered
from ..models import Execution
from ..states import ExecutionStatus

#: The keys a filter takes.
KEYS = ("reactor", "status", "step", "error", "created_after", "created_before", "id")


@dataclass(frozen=True, slots=True)
class RunFilter:
    """Which top-level runs a bulk operation takes (see the module)."""

    reactor: str | None = None
    statuses: tuple[str, ...] = ()
    step: str | None = None
    error: str | None = None
    created_after: dt.datetime | None = None
    created_before: dt.datetime | None = None
    ids: tuple[uuid.UUID, ...] = ()
    #: Business attributes (``attr.<key>=<value>``).
    attributes: Mapping[str, str] = field(default_factory=dict)
    #: A face's own narrowing (the API's ``API_SCOPE``), applied at choosing time; not stored.
    narrow: Callable[[QuerySet[Execution]], QuerySet[Execution]] | None = field(
        default=None, compare=False, repr=False
    )

    @classmethod
    def parse(cls, pairs: Mapping[str, Any]) -> RunFilter:
        """A filter from ``key -> value`` (text, or a list of texts for ``status`` and ``id``);
        InvalidFilter naming the key otherwise."""
        if not isinstance(pairs, Mapping):
            raise InvalidFilter("a filter is an object of key=value pairs, such as status=failed")
        values: dict[str, Any] = {}
        attributes: dict[str, str] = {}
        for key, value in pairs.items():
            if not isinstance(key, str):
                raise InvalidFilter(f"a filter's keys are text, got {key!r}")
            if key.startswith("attr."):
                attributes[key[5:]] = _text(key, value)
            elif key not in KEYS:
                raise InvalidFilter(
                    f"a filter has no key {key!r}; it takes {', '.join(KEYS)} and attr.<name>"
                )
            else:
                values[key] = value
        made = cls(
            reactor=_reactor(values["reactor"]) if "reactor" in values else None,
            statuses=_statuses(values["status"]) if "status" in values else (),
            step=_text("step", values["step"]) if "step" in values else None,
            error=_text("error", values["error"]) if "error" in values else None,
            created_after=_moment("created_after", values.get("created_after")),
            created_before=_moment("created_before", values.get("created_before")),
            ids=_ids(values["id"]) if "id" in values else (),
            attributes=attributes,
        )
        if made.is_empty:
            raise InvalidFilter(
                "give a filter (reactor, status, step, error, created_after, created_before, "
                "id or attr.<name>): a bulk operation never takes every run"
            )
        return made

    @property
    def is_empty(self) -> bool:
        return not (
            self.reactor
            or self.statuses
            or self.step
            or self.error
            or self.created_after
            or self.created_before
            or self.ids
            or self.attributes
        )

    def as_dict(self) -> dict[str, Any]:
        """The filter as JSON (stored with an operation; ``parse`` reads it back)."""
        data: dict[str, Any] = {}
        if self.reactor:
            data["reactor"] = self.reactor
        if self.statuses:
            data["status"] = list(self.statuses)
        if self.step:
            data["step"] = self.step
        if self.error:
            data["error"] = self.error
        if self.created_after:
            data["created_after"] = self.created_after.isoformat()
        if self.created_before:
            data["created_before"] = self.created_before.isoformat()
        if self.ids:
            data["id"] = [str(i) for i in self.ids]
        for key, value in self.attributes.items():
            data[f"attr.{key}"] = value
        return data

    def runs(self) -> QuerySet[Execution]:
        """The matching top-level runs in the bound database."""
        runs = Execution.objects.using(store.using()).filter(parent__isnull=True)
        if self.reactor:
            runs = runs.filter(reactor=self.reactor)
        if self.statuses:
            runs = runs.filter(status__in=self.statuses)
        if self.step:
            runs = runs.filter(failure__step=self.step)
        if self.error:
            runs = runs.filter(
                Q(failure__exception_class=self.error)
                | Q(failure__exception_class__endswith=f".{self.error}")
            )
        if self.created_after:
            runs = runs.filter(created_at__gte=self.created_after)
        if self.created_before:
            runs = runs.filter(created_at__lt=self.created_before)
        if self.ids:
            runs = runs.filter(pk__in=self.ids)
        if self.attributes:
            runs = store.with_attributes(runs, dict(self.attributes))
        if self.narrow is not None:
            runs = self.narrow(runs)
        return runs

    def databases(self) -> list[str]:
        """The databases its runs are in: the reactor's, else every one runs go to."""
        if self.reactor:
            return [store.alias_for(self.reactor)]
        return list(store.aliases())


def _text(key: str, value: Any) -> str:
    if isinstance(value, list | tuple) and len(value) == 1:
        value = value[0]
    if not isinstance(value, str | int) or isinstance(value, bool) or str(value) == "":
        raise InvalidFilter(f"the filter's {key} is a non-empty text, got {value!r}")
    return str(value)


def _reactor(value: Any) -> str:
    name = _text("reactor", value)
    try:
        return registry.resolve(name).definition.name
    except ReactorNotRegistered as exc:
        if exc.matches:
            raise InvalidFilter(
                f"the filter's reactor {name!r} matches several reactors "
                f"({', '.join(exc.matches)}); give the full name"
            ) from None
        return name  # runs of a reactor this code no longer has are found by their name


def _listed(key: str, value: Any) -> list[str]:
    items: Iterable[Any] = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list | tuple) and not isinstance(value, str):
        raise InvalidFilter(f"the filter's {key} is a text or a list of texts, got {value!r}")
    texts = [str(item).strip() for item in items if str(item).strip()]
    if not texts:
        raise InvalidFilter(f"the filter's {key} is empty")
    return texts


def _statuses(value: Any) -> tuple[str, ...]:
    statuses = _listed("status", value)
    unknown = [s for s in statuses if s not in ExecutionStatus.values]
    if unknown:
        raise InvalidFilter(
            f"the filter's status {', '.join(unknown)} is no status; statuses: "
            f"{', '.join(ExecutionStatus.values)}"
        )
    return tuple(statuses)


def _ids(value: Any) -> tuple[uuid.UUID, ...]:
    try:
        return tuple(uuid.UUID(text) for text in _listed("id", value))
    except ValueError:
        raise InvalidFilter(f"the filter's id holds what is not a run id: {value!r}") from None


def _moment(key: str, value: Any) -> dt.datetime | None:
    if value is None:
        return None
    try:
        return moment_from_text(_text(key, value), f"the filter's {key}")
    except InvalidTime as exc:
        raise InvalidFilter(str(exc)) from None


def moment_from_text(text: str, what: str) -> dt.datetime:
    """An ISO 8601 date or date-time (naive values are in the current time zone), checked
    (``timevalues.instant``); InvalidTime naming ``what`` otherwise."""
    try:
        moment = dateparse.parse_datetime(text)
        if moment is None:
            day = dateparse.parse_date(text)
            if day is not None:
                moment = dt.datetime.combine(day, dt.time.min)
    except ValueError:
        moment = None
    if moment is None:
        raise InvalidTime(
            f"{what} {text!r} is not an ISO 8601 date or date-time; write it like "
            "2024-05-01 or 2024-05-01T12:30:00+00:00"
        )
    if timezone.is_naive(moment):
        moment = timezone.make_aware(moment)
    return timevalues.instant(moment, what)
