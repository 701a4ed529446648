"""The runs list's filter by business attribute (a text box: ``customer_id=42``) and the
attributes a run's page shows, each a link to the runs with the same value."""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING
from urllib.parse import urlencode

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html_join
from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import gettext_lazy as _

from .. import store
from ..engine.attributes import parse_filter
from ..exceptions import InvalidAttribute
from ..models import Execution
from .display import APP

if TYPE_CHECKING:
    from collections.abc import Iterator

    from django.contrib.admin.filters import _ListFilterChoices
    from django.contrib.admin.views.main import ChangeList

#: The query-string parameter of the filter: ``?attr=customer_id%3D42``.
PARAMETER = "attr"


def parse(text: str) -> dict[str, str]:
    """``customer_id=42 tenant="Acme Corp"`` as the filter of ``store.with_attributes``:
    pairs separated by spaces, a value with spaces in quotes. InvalidAttribute saying what is
    wrong otherwise."""
    where = "the attribute filter"
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise InvalidAttribute(f"{where}: {exc} in {text!r}; close the quotes") from None
    found: dict[str, str] = {}
    for word in words:
        key, value = parse_filter(word, where)
        if key in found:
            raise InvalidAttribute(f"{where}: {key} is given twice; a run has one value per key")
        found[key] = value
    return found


def text_of(attributes: dict[str, str]) -> str:
    """The filter's text that finds runs with ``attributes`` (what :func:`parse` reads)."""
    return " ".join(f"{key}={shlex.quote(value)}" for key, value in attributes.items())


class AttributeListFilter(admin.SimpleListFilter):
    """By attribute: a text box, ``customer_id=42`` (several: all of them), served by the
    attribute index (``store.with_attributes``); the list is then ordered and paged by the
    attribute rows' copy of the runs' creation time. A filter that is no filter lists nothing
    and says why."""

    title = _("attribute")
    parameter_name = PARAMETER
    template = "admin/django_reactor/attribute_filter.html"

    def lookups(
        self, request: HttpRequest, model_admin: admin.ModelAdmin[Execution]
    ) -> list[tuple[str, str]]:
        # Django shows a filter that has choices; the template draws a text box for this one.
        return [("", "")]

    def choices(self, changelist: ChangeList) -> Iterator[_ListFilterChoices]:
        # The template reads the filter itself (``spec``): its text, and the list's other
        # parameters, kept by the form as hidden fields.
        self.hidden = sorted(
            (name, value)
            for name, value in changelist.params.items()
            if name not in (self.parameter_name, "p", "after", "before")
        )
        text = str(self.value() or "")
        yield {
            "selected": bool(text),
            "query_string": changelist.get_query_string(remove=[self.parameter_name]),
            "display": text,
        }

    def queryset(self, request: HttpRequest, queryset: QuerySet[Execution]) -> QuerySet[Execution]:
        text = str(self.value() or "").strip()
        if not text:
            return queryset
        try:
            return store.with_attributes(queryset, parse(text))
        except InvalidAttribute as exc:
            messages.error(request, f"{exc}. Type KEY=VALUE, such as customer_id=42.")
            return queryset.none()


def attribute_links(attributes: dict[str, str]) -> SafeString | str:
    """``key = value`` lines, each value a link to the runs whose attribute has it."""
    if not attributes:
        return "-"
    changelist = reverse(f"admin:{APP}_execution_changelist")
    return format_html_join(
        mark_safe("<br>"),
        '{} = <a href="{}?{}" title="{}">{}</a>',
        (
            (
                key,
                changelist,
                urlencode({PARAMETER: text_of({key: value})}),
                _("Runs with this attribute"),
                value,
            )
            for key, value in attributes.items()
        ),
    )
