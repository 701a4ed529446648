"""Runs' business attributes (``engine.attributes``): written with their run and with a step's
checkpoint, read back, and the query that narrows runs to those with given attributes.

Through the ORM here (the generic store; PostgreSQL writes them inside the run's insert and
the routine checkpoint's statement: ``sql.insert_all``, ``checkpoint_sql``). A run's rows live
in the run's database and go with it (a foreign key that cascades, and the prune's batch).
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Mapping
from typing import Any

from django.db.models import Exists, F, FilteredRelation, OuterRef, Q, QuerySet

from ..engine.attributes import wanted
from ..models import Execution, ExecutionAttribute
from .db import conflict_target, using

#: The annotations :func:`with_attributes` gives the runs: the first attribute's copy of its
#: run's ``created_at`` and id. Ordered and paged by them (:func:`newest_first`), a list is one
#: range of the attribute index, read a page at a time however many runs have the value.
CREATED_AT = "attribute_created_at"
RUN_ID = "attribute_run_id"
_JOINED = "attribute_found"


def with_attributes(
    runs: QuerySet[Execution], attributes: Mapping[str, object]
) -> QuerySet[Execution]:
    """The runs of ``runs`` that have every one of ``attributes`` (key: value; a value as
    ``context.set_attribute`` takes it, so ``42`` and ``"42"`` find the same runs), newest
    first. Raises InvalidAttribute for a key that is no attribute key or a value no attribute
    can hold. No attributes: ``runs`` as they are.

    The first attribute is joined (one row per run: a run has one value per key) and gives the
    ordering (:data:`CREATED_AT`, :data:`RUN_ID`), the others are ``EXISTS`` tests on the
    runs' rows; the database starts from whichever it finds most selective. Narrowed again, a
    queryset keeps its first join.
    """
    found = wanted(attributes, "a filter by attributes")
    if not found:
        return runs
    pairs = list(found.items())
    if CREATED_AT not in runs.query.annotations:
        key, value = pairs.pop(0)
        runs = (
            runs.alias(
                **{
                    _JOINED: FilteredRelation(
                        "attributes", condition=Q(attributes__key=key, attributes__value=value)
                    )
                }
            )
            # Said again where it makes the join an inner one (the join's own condition
            # keeps it outer), not as "id IS NOT NULL", which the index cannot answer.
            .filter(**{f"{_JOINED}__value": value})
            .annotate(
                **{
                    CREATED_AT: F(f"{_JOINED}__run_created_at"),
                    RUN_ID: F(f"{_JOINED}__execution_id"),
                }
            )
            .order_by(*newest_first())
        )
    for key, value in pairs:
        rows = ExecutionAttribute.objects.filter(execution_id=OuterRef("pk"), key=key, value=value)
        runs = runs.filter(Exists(rows))
    return runs


def newest_first(runs: QuerySet[Any] | None = None, *, reverse: bool = False) -> list[str]:
    """The ordering, newest first (oldest first when ``reverse``), that an index serves for
    ``runs``: the first attribute's copy of ``(created_at, id)`` when narrowed by
    :func:`with_attributes` (without ``runs``: that one), else the runs' own."""
    narrowed = runs is None or CREATED_AT in runs.query.annotations
    fields = [CREATED_AT, RUN_ID] if narrowed else ["created_at", "id"]
    return fields if reverse else [f"-{name}" for name in fields]


def of_run(execution_id: uuid.UUID) -> dict[str, str]:
    """The run's attributes, by key in alphabetical order."""
    rows = ExecutionAttribute.objects.using(using()).filter(execution_id=execution_id)
    return dict(rows.order_by("key").values_list("key", "value"))


def write(
    execution_id: uuid.UUID, run_created_at: dt.datetime, attributes: Mapping[str, str | None]
) -> None:
    """Set the run's ``attributes`` (stored text by key; None removes the key), in the
    caller's transaction: each key's row is inserted, or its value replaced."""
    removed = [key for key, value in attributes.items() if value is None]
    kept = [
        ExecutionAttribute(
            execution_id=execution_id, key=key, value=value, run_created_at=run_created_at
        )
        for key, value in attributes.items()
        if value is not None
    ]
    rows = ExecutionAttribute.objects.using(using())
    if removed:
        rows.filter(execution_id=execution_id, key__in=removed).delete()
    if kept:
        rows.bulk_create(
            kept,
            update_conflicts=True,
            unique_fields=conflict_target(["execution", "key"]),
            update_fields=["value"],
        )
