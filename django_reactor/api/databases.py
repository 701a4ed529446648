"""Which database an API request works in, when reactors are routed to several
(``REACTOR["DATABASE"]``).

A request that names a run (``executions/{id}/...``) works in the database that holds it; a
list works in the one ``?database=`` names, else the one of the reactor ``?reactor=`` names,
else the default. Deliveries by correlation id or token find their run themselves
(``services.resume_interrupt`` looks in each database). With one database nothing changes.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest

from .. import store
from .errors import ApiError

#: The query parameter that chooses the database of a list.
DATABASE_PARAMETER = "database"


class ApiDatabaseMixin:
    """Runs each request's handler with the database it works in bound (see the module)."""

    #: The URL keyword that names a run, when the view's URLs have one.
    run_keyword: str | None = None
    _unknown_database: str | None = None

    def dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        aliases = store.aliases()
        if len(aliases) == 1 or store.bound_alias() is not None:
            return super().dispatch(request, *args, **kwargs)  # type: ignore[misc]
        alias = self._database_of(request, kwargs, aliases)
        if alias is None:  # the handler never runs: ``initial`` answers 400
            return super().dispatch(request, *args, **kwargs)  # type: ignore[misc]
        with store.bound(alias):
            return super().dispatch(request, *args, **kwargs)  # type: ignore[misc]

    def initial(self, request: Any, *args: Any, **kwargs: Any) -> None:
        super().initial(request, *args, **kwargs)  # type: ignore[misc]
        if self._unknown_database is not None:
            raise ApiError(
                400,
                f"?{DATABASE_PARAMETER}={self._unknown_database!r} is not a database runs are "
                f"written to; choose one of: {', '.join(store.aliases())}",
                code="invalid",
            )

    def _database_of(
        self, request: HttpRequest, kwargs: dict[str, Any], aliases: tuple[str, ...]
    ) -> str | None:
        chosen = request.GET.get(DATABASE_PARAMETER)
        if chosen is not None:
            if chosen not in aliases:
                self._unknown_database = chosen
                return None
            return chosen
        named = kwargs.get(self.run_keyword) if self.run_keyword else None
        if named is not None:
            return store.locate(str(named)) or store.default_alias()
        reactor = request.GET.get("reactor")
        if reactor:
            return store.alias_for(reactor)
        return store.default_alias()
