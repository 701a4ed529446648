"""Admin change lists that never count or offset a whole table.

A list of a million runs cannot be counted (``COUNT(*)`` reads every row) nor paged by number
(``OFFSET 99,950`` reads and drops 99,950 rows). :class:`KeysetChangeList` does neither:

- **The count is capped.** It counts at most ``count_limit + 1`` rows (``COUNT(*)`` over a
  ``LIMIT`` subquery). Up to the limit the count is exact; beyond it the list says "more than
  1,000", or, for an unfiltered list on PostgreSQL, "about 1,000,000" from the planner's row
  estimate of the table (``pg_class.reltuples``, kept by ``ANALYZE`` and autovacuum).
- **The first pages are numbered**, as far as the counted rows reach (an ``OFFSET`` of at most
  ``count_limit`` rows).
- **Deeper pages are keyset pages.** "Next" carries the ordering key of the page's last row
  (``?after=``) and "previous" the first row's (``?before=``); the page is read with a row
  comparison, ``WHERE (created_at, id) < (%s, %s) ORDER BY created_at DESC, id DESC LIMIT 51``,
  which an index on the ordering key serves at any depth.
- **Only indexed sorts.** A column sorts only if it is in the admin's ``sortable_by``, checked
  against the query string too, and the primary key that breaks ties follows the direction of
  the sort, so one index serves the whole ordering.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from django.contrib.admin.options import IncorrectLookupParameters, ShowFacets
from django.contrib.admin.templatetags.admin_urls import add_preserved_filters
from django.contrib.admin.utils import quote
from django.contrib.admin.views.main import ORDER_VAR, PAGE_VAR, ChangeList
from django.core.exceptions import FieldDoesNotExist, ValidationError
from django.core.paginator import Paginator
from django.db.models import DateField, Field, Model, QuerySet
from django.db.models.fields.tuple_lookups import Tuple, TupleGreaterThan, TupleLessThan
from django.db.models.lookups import Exact
from django.http import HttpRequest
from django.utils.formats import number_format
from django.utils.functional import cached_property
from django.utils.translation import gettext_lazy as _

from ..store import dialect_for
from .databases import DatabaseAdmin
from .display import admin_url

if TYPE_CHECKING:
    from django.db.models.expressions import Combinable

M = TypeVar("M", bound=Model)

#: The query-string parameters of a keyset page: the ordering key of the row it follows or
#: precedes.
AFTER_VAR = "after"
BEFORE_VAR = "before"
KEYSET_VARS = (AFTER_VAR, BEFORE_VAR)

#: Rows counted at most, and so the depth of the numbered pages (``KeysetAdmin.count_limit``).
COUNT_LIMIT = 1000


@dataclass(frozen=True)
class RowCount:
    """How many rows a list has, as far as it was counted.

    ``value`` is exact when ``exact``; otherwise it is the limit the count stopped at, or the
    planner's estimate when ``estimated``.
    """

    value: int
    exact: bool
    estimated: bool = False

    def number(self) -> str:
        """``523``, ``more than 1,000`` or ``about 1,000,000``."""
        number = number_format(self.value, force_grouping=True)
        if self.exact:
            return number
        if self.estimated:
            return str(_("about %(number)s") % {"number": number})
        return str(_("more than %(number)s") % {"number": number})

    def text(self, singular: str, plural: str) -> str:
        """``523 executions``, ``more than 1,000 executions`` or ``about 1,000,000 executions``."""
        noun = singular if self.exact and self.value == 1 else plural
        return f"{self.number()} {noun}"


def capped_count(queryset: QuerySet[Model], limit: int) -> int:
    """The rows of ``queryset``, counted up to ``limit + 1`` (a ``LIMIT`` subquery).

    The subquery keeps the list's ordering: the planner then reads the first rows of the index
    the page reads. Without it, it may pick a sequential scan that finds rows more than one
    filter matches at its estimated rate and reads far more of the table."""
    return queryset[: limit + 1].count()


def estimated_rows(model: type[Model], using: str) -> int | None:
    """The planner's row estimate of ``model``'s table (PostgreSQL's); ``None`` elsewhere or
    when the table was never analysed."""
    return dialect_for(using).estimated_rows(model._meta.db_table)


def count_rows(queryset: QuerySet[Model], limit: int, *, filtered: bool) -> RowCount:
    """``queryset``'s count, exact up to ``limit``; beyond, estimated if not ``filtered``."""
    counted = capped_count(queryset, limit)
    if counted <= limit:
        return RowCount(counted, exact=True)
    if not filtered:
        estimate = estimated_rows(queryset.model, queryset.db)
        if estimate is not None and estimate > limit:
            return RowCount(estimate, exact=False, estimated=True)
    return RowCount(limit, exact=False)


class CappedPaginator(Paginator):
    """A paginator that counts at most ``limit + 1`` rows: its numbered pages reach that far,
    and ``counted`` says how many rows there are as far as it knows."""

    def __init__(
        self,
        object_list: QuerySet[Model],
        per_page: int,
        limit: int = COUNT_LIMIT,
        *,
        counted_by: QuerySet[Model] | None = None,
    ) -> None:
        super().__init__(object_list, per_page)
        # The same rows without what only a page needs (annotations looked up per row).
        self.queryset = object_list if counted_by is None else counted_by
        self.limit = limit

    @cached_property
    def counted(self) -> RowCount:
        return count_rows(self.queryset, self.limit, filtered=True)

    @cached_property
    def count(self) -> int:
        return self.counted.value


# ---------------------------------------------------------------------------- keyset


@dataclass(frozen=True)
class Keyset:
    """A list's ordering key: its fields, all in one direction (``descending`` or not).

    ``names`` are what the rows are read and compared by, one per field: the field's own
    column, or an annotation that stands for it (a list narrowed by a joined row, ordered by
    that row's copy of the key so that the joined table's index serves the pages).
    """

    fields: tuple[Field[Any, Any], ...]
    descending: bool
    names: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.names:
            object.__setattr__(self, "names", tuple(f.attname for f in self.fields))

    @classmethod
    def of(
        cls,
        model: type[Model],
        ordering: Sequence[str | Combinable],
        annotations: Mapping[str, Any] | None = None,
    ) -> Keyset | None:
        """The keyset of an ordering of plain, non-null fields (or ``annotations`` of one such
        field of a joined row) in one direction, else None."""
        fields: list[Field[Any, Any]] = []
        names: list[str] = []
        directions = set()
        for item in ordering:
            if not isinstance(item, str) or "__" in item:
                return None
            name = item.removeprefix("-")
            directions.add(item.startswith("-"))
            annotation = (annotations or {}).get(name)
            if annotation is not None:
                field = getattr(annotation, "target", None)
            else:
                try:
                    field = model._meta.pk if name == "pk" else model._meta.get_field(name)
                except FieldDoesNotExist:
                    return None
            if not isinstance(field, Field) or field.null or not field.concrete:
                return None
            fields.append(field)
            names.append(name if annotation is not None else field.attname)
        if not fields or len(directions) != 1:
            return None
        return cls(tuple(fields), descending=directions.pop(), names=tuple(names))

    def values(self, row: Model) -> list[object]:
        return [getattr(row, name) for name in self.names]

    def encode(self, row: Model) -> str:
        """The cursor of ``row``: its key values, as text, in URL-safe base64."""
        texts = [
            field.value_to_string(row) if name == field.attname else _text(getattr(row, name))
            for field, name in zip(self.fields, self.names, strict=True)
        ]
        return base64.urlsafe_b64encode(json.dumps(texts).encode()).decode().rstrip("=")

    def decode(self, cursor: str) -> list[object]:
        """The key values of a cursor; raises ValueError for one this list did not make."""
        try:
            padded = cursor + "=" * (-len(cursor) % 4)
            texts = json.loads(base64.urlsafe_b64decode(padded.encode()))
        except (ValueError, binascii.Error) as exc:
            raise ValueError(f"not a page cursor: {cursor!r}") from exc
        if not isinstance(texts, list) or len(texts) != len(self.fields):
            raise ValueError(f"not a page cursor of this list: {cursor!r}")
        try:
            return [field.to_python(text) for field, text in zip(self.fields, texts, strict=True)]
        except (ValidationError, TypeError) as exc:
            raise ValueError(f"not a page cursor of this list: {cursor!r}") from exc

    def beyond(self, queryset: QuerySet[M], values: list[object], *, after: bool) -> QuerySet[M]:
        """The rows after (or before) the key ``values`` in this ordering."""
        fields, names = list(self.fields), list(self.names)
        # Leading fields the list is filtered to the cursor's values (the elements of one map)
        # are left out of the comparison: with them in it, PostgreSQL positions the index scan
        # at the filter's value and reads every entry up to the cursor (33 ms at element
        # 999,850 of a map, 0.1 ms without).
        while (
            len(fields) > 1
            and names[0] == fields[0].attname
            and _pinned(queryset, fields[0]) == (values[0],)
        ):
            fields, names, values = fields[1:], names[1:], values[1:]
        forward = after != self.descending
        if len(fields) == 1:
            lookup = "gt" if forward else "lt"
            return queryset.filter(**{f"{names[0]}__{lookup}": values[0]})
        columns = Tuple(*names)
        tuple_lookup = TupleGreaterThan if forward else TupleLessThan
        return queryset.filter(tuple_lookup(columns, values))


def _text(value: object) -> str:
    """An annotation's value as its field's ``value_to_string`` writes a row's (which reads
    the row's own column): a date in ISO 8601, anything else as ``str``."""
    return value.isoformat() if isinstance(value, dt.date) else str(value)


def _pinned(queryset: QuerySet[Model], field: Field[Any, Any]) -> tuple[object] | None:
    """``(value,)`` when ``queryset`` is filtered to rows whose ``field`` equals ``value`` (an
    ``exact`` lookup at the top of its conditions), else None."""
    where = queryset.query.where
    if where.connector != "AND" or where.negated:
        return None
    for child in where.children:
        if (
            isinstance(child, Exact)
            and getattr(child.lhs, "target", None) == field
            and not hasattr(child.rhs, "resolve_expression")
        ):
            return (field.to_python(child.rhs),)
    return None


# ---------------------------------------------------------------------------- the change list


@dataclass(frozen=True)
class PageLink:
    """A link of the page navigation: its label and query string (empty: the current page)."""

    label: str
    query: str
    current: bool = False


class KeysetChangeList(ChangeList):
    """A change list with a capped count, numbered first pages and keyset pages beyond.

    ``reactor_count`` is what was counted, ``reactor_count_text`` its words,
    ``reactor_pages`` the numbered page links and ``reactor_previous`` / ``reactor_next`` the
    neighbouring pages (None at either end).
    """

    def __init__(self, request: HttpRequest, *args: Any, **kwargs: Any) -> None:
        super().__init__(request, *args, **kwargs)
        # Not carried into the filter, sort and search links: those start at the first page.
        for name in KEYSET_VARS:
            self.params.pop(name, None)
            self.filter_params.pop(name, None)
        # Every row links to its change page with the same preserved filters: merged once
        # here, where Django merges them for each row, resolving the row's URL (0.1 ms a row).
        self.row_link_query = ""
        if self.preserved_filters:
            base = self._change_url("0")
            merged = add_preserved_filters(
                {"preserved_filters": self.preserved_filters, "opts": self.opts}, base
            )
            self.row_link_query = merged[len(base) :]
            self.preserved_filters = ""

    def _change_url(self, pk: str) -> str:
        opts = self.opts
        return admin_url(
            f"admin:{opts.app_label}_{opts.model_name}_change",
            pk,
            current_app=self.model_admin.admin_site.name,
        )

    def url_for_result(self, result: Model) -> str:
        """The row's change page (its URL pattern reversed once for the page), with the list's
        filters preserved."""
        return self._change_url(quote(str(getattr(result, self.pk_attname)))) + self.row_link_query

    def get_filters_params(self, params: dict[str, object] | None = None) -> dict[str, object]:
        lookup_params = super().get_filters_params(params)
        for name in KEYSET_VARS:
            lookup_params.pop(name, None)
        return lookup_params

    def get_ordering(
        self, request: HttpRequest, queryset: QuerySet[Model]
    ) -> list[str | Combinable]:
        if self.params.get(ORDER_VAR):
            # Only the columns an index serves, whatever the query string asks.
            allowed = set(self.sortable_by or ())
            kept = []
            for part in self.params[ORDER_VAR].split("."):
                try:
                    name = self.list_display[int(part.rpartition("-")[2])]
                except (IndexError, ValueError):
                    continue
                if name in allowed:
                    kept.append(part)
            self.params[ORDER_VAR] = ".".join(kept)
        ordering: list[str | Combinable] = []
        seen: set[str] = set()
        # Django adds the queryset's own ordering after the admin's: the same fields again.
        for item in super().get_ordering(request, queryset):
            if isinstance(item, str):
                if item.removeprefix("-") in seen:
                    continue
                seen.add(item.removeprefix("-"))
            ordering.append(item)
        # The primary key that breaks ties follows the sort's direction: (created_at, id) in
        # one direction is one index scan, mixed directions are a sort.
        if len(ordering) > 1 and ordering[-1] in ("pk", "-pk") and isinstance(ordering[0], str):
            ordering[-1] = "-pk" if ordering[0].startswith("-") else "pk"
        return ordering

    def count_limit(self) -> int:
        """How many rows this list counts at most (the admin's ``count_limit``)."""
        return int(getattr(self.model_admin, "count_limit", COUNT_LIMIT))

    def get_results(self, request: HttpRequest) -> None:
        limit = self.count_limit()
        per_page = self.list_per_page
        queryset = self.queryset
        filtered = bool(queryset.query.where) or bool(self.query)
        # A list counted no further than a page sends no count: its first page's rows say how
        # many there are, and a page past it follows a full one.
        by_page = limit <= per_page
        count = (
            RowCount(limit, exact=False)
            if by_page
            else count_rows(queryset, limit, filtered=filtered)
        )
        keyset = Keyset.of(self.model, list(queryset.query.order_by), queryset.query.annotations)
        after = request.GET.get(AFTER_VAR)
        before = request.GET.get(BEFORE_VAR)

        self.reactor_keyset = keyset
        self.reactor_page: int | None = None
        has_previous = has_next = False
        if keyset is not None and (after or before):
            try:
                values = keyset.decode(after or before or "")
            except ValueError as exc:
                raise IncorrectLookupParameters(str(exc)) from exc
            if after:
                rows = list(keyset.beyond(queryset, values, after=True)[: per_page + 1])
                has_next, has_previous = len(rows) > per_page, True
                rows = rows[:per_page]
            else:
                rows = list(keyset.beyond(queryset, values, after=False).reverse()[: per_page + 1])
                has_previous, has_next = len(rows) > per_page, True
                rows = rows[:per_page][::-1]
        else:
            counted = min(count.value, limit) if not count.exact else count.value
            numbered = max(1, math.ceil(counted / per_page))
            if self.page_num < 1 or self.page_num > numbered:
                raise IncorrectLookupParameters(f"page {self.page_num} is not a numbered page")
            offset = (self.page_num - 1) * per_page
            rows = list(queryset[offset : offset + per_page + 1])
            if by_page and len(rows) <= limit:
                count = RowCount(len(rows), exact=True)
            has_next = len(rows) > per_page
            has_previous = self.page_num > 1
            rows = rows[:per_page]
            self.reactor_page = self.page_num

        self.reactor_count = count
        opts = self.opts
        self.reactor_count_text = count.text(str(opts.verbose_name), str(opts.verbose_name_plural))
        # Django's templates and actions read these: the rows counted, capped.
        self.result_count = count.value if count.exact else limit + 1
        self.full_result_count = None
        self.show_full_result_count = False
        self.show_admin_actions = True
        self.result_list = rows
        self.can_show_all = False
        self.multi_page = has_previous or has_next
        self.paginator = None
        self._links(rows, count, limit, has_previous, has_next)

    def _links(
        self, rows: list[Model], count: RowCount, limit: int, has_previous: bool, has_next: bool
    ) -> None:
        keyset, page, per_page = self.reactor_keyset, self.reactor_page, self.list_per_page
        counted = count.value if count.exact else limit
        numbered = max(1, math.ceil(counted / per_page))
        first_query = self.get_query_string(remove=[PAGE_VAR, *KEYSET_VARS])
        self.reactor_pages = []
        if numbered > 1 or page is None:
            for number in range(1, numbered + 1):
                query = (
                    first_query
                    if number == 1
                    else self.get_query_string({PAGE_VAR: number}, remove=list(KEYSET_VARS))
                )
                self.reactor_pages.append(PageLink(str(number), query, current=number == page))
        labels = _labels(keyset)
        self.reactor_previous: PageLink | None = None
        self.reactor_next: PageLink | None = None
        if has_previous:
            if page is not None:
                query = (
                    first_query
                    if page == 2
                    else self.get_query_string({PAGE_VAR: page - 1}, remove=list(KEYSET_VARS))
                )
            elif keyset is not None and rows:
                query = self.get_query_string(
                    {BEFORE_VAR: keyset.encode(rows[0])}, remove=[PAGE_VAR, AFTER_VAR]
                )
            else:
                query = first_query
            self.reactor_previous = PageLink(labels[0], query)
        if has_next and rows:
            if page is not None and page < numbered:
                query = self.get_query_string({PAGE_VAR: page + 1}, remove=list(KEYSET_VARS))
            elif keyset is not None:
                query = self.get_query_string(
                    {AFTER_VAR: keyset.encode(rows[-1])}, remove=[PAGE_VAR, BEFORE_VAR]
                )
            else:
                query = ""
            if query:
                self.reactor_next = PageLink(labels[1], query)


def _labels(keyset: Keyset | None) -> tuple[str, str]:
    """The previous and next links' words: by time for a list ordered by a date."""
    if keyset is not None and isinstance(keyset.fields[0], DateField):
        if keyset.descending:
            return str(_("newer")), str(_("older"))
        return str(_("older")), str(_("newer"))
    return str(_("previous")), str(_("next"))


class KeysetAdmin(DatabaseAdmin):
    """A model admin whose change list is a :class:`KeysetChangeList`.

    ``count_limit`` caps the count, and so the numbered pages. Facets are off: each would count
    the whole table by its filter's values.
    """

    count_limit = COUNT_LIMIT
    show_facets = ShowFacets.NEVER
    show_full_result_count = False

    def get_changelist(self, request: HttpRequest, **kwargs: object) -> type[ChangeList]:
        return KeysetChangeList
