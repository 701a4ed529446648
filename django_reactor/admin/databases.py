"""The admin across databases, when ``REACTOR["DATABASE"]`` routes reactors to several.

Each page of django_reactor's admin works in one database, bound while its view runs (so
every list, count, form and operation of the page reads and writes there): the one the
"Database" filter chose (``?database=``, remembered in the session for the pages after), and
for a run's own pages the database that holds the run. With one database nothing changes and
the filter is not shown.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs

from django.contrib import admin
from django.contrib.admin.options import IncorrectLookupParameters
from django.db.models import Model, QuerySet
from django.http import HttpRequest, HttpResponse
from django.urls import URLPattern
from django.utils.translation import gettext_lazy as _

from .. import store
from ..models import Execution
from .acting import acting_for

#: The query parameter (and filter) that chooses the database, and its key in the session.
PARAMETER = "database"
SESSION_KEY = "django_reactor_database"


class DatabaseFilter(admin.SimpleListFilter):
    """The database a list shows (only when runs are routed to more than one)."""

    title = _("database")
    parameter_name = PARAMETER

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(alias, alias) for alias in store.aliases()]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if value is None:
            return queryset
        if value not in store.aliases():
            raise IncorrectLookupParameters(f"{value!r} is not a database runs are written to")
        return queryset.using(value)


class DatabaseAdmin(admin.ModelAdmin):
    """A model admin whose views each work in one database (see the module)."""

    def get_list_filter(self, request: HttpRequest) -> Any:
        filters = super().get_list_filter(request)
        if len(store.aliases()) == 1:
            return filters
        return (DatabaseFilter, *filters)

    @property
    def urls(self) -> list[URLPattern]:
        # Every view of the admin, its own ones and those subclasses add, in its database, and
        # acting as the signed-in user (what it steers is recorded as theirs: ``acting``).
        patterns = self.get_urls()
        for pattern in patterns:
            if isinstance(pattern, URLPattern):
                pattern.callback = self._in_its_database(pattern.callback)
        return patterns

    def _in_its_database(self, view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
        @functools.wraps(view)
        def in_its_database(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            with acting_for(request):
                if len(store.aliases()) == 1:
                    return view(request, *args, **kwargs)
                with store.bound(database_of(request, self.model, kwargs.get("object_id"))):
                    return view(request, *args, **kwargs)

        return in_its_database


def database_of(request: HttpRequest, model: type[Model], object_id: object) -> str:
    """The database an admin page works in (see the module); an unknown ``?database=`` is left
    to the filter, which answers it as Django answers a wrong filter."""
    aliases = store.aliases()
    chosen = request.GET.get(PARAMETER) or _from_changelist_filters(request)
    if chosen in aliases:
        if hasattr(request, "session"):
            request.session[SESSION_KEY] = chosen
    else:
        chosen = None
    if object_id is not None and model is Execution:
        located = store.locate(str(object_id))
        if located is not None:
            return located
    if chosen is not None:
        return chosen
    remembered = request.session.get(SESSION_KEY) if hasattr(request, "session") else None
    return remembered if remembered in aliases else store.default_alias()


def _from_changelist_filters(request: HttpRequest) -> str | None:
    """The database of the list a form was opened from (Django keeps the list's query in
    ``_changelist_filters``)."""
    kept = request.GET.get("_changelist_filters")
    if not kept:
        return None
    values = parse_qs(kept).get(PARAMETER)
    return values[0] if values else None
