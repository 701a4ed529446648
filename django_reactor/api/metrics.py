"""``GET <API prefix>/metrics/``: the fleet's health in Prometheus's text format, for a scrape.

The figures are ``services.fleet_figures()``'s, the ones ``reactor_health`` and the admin's
overview show, computed when the scrape comes by a collector of a registry made for that
scrape (never the process's global registry: nothing else it holds is exposed, nothing of
django_reactor's is left in it). Every read is capped and index-backed, so a scrape costs the
same at a thousand runs or a million. Figures of runs are per database (``database`` label):
the workers and sweepers are the fleet's.

It needs the ``prometheus_client`` package (``pip install "django-reactor[metrics]"``);
without it the URL answers 501 saying so, and check W006 warns when the metrics are opened.
Who may read them is ``REACTOR["METRICS_AUTH"]`` (no one until a project says): a bearer
token of ``REACTOR["METRICS_TOKENS"]``, compared in constant time, a signed-in user with the
``view_execution`` permission, or anyone (``"open"``: a scrape on a private network).
"""

from __future__ import annotations

import hmac
import logging
import time
from collections.abc import Iterable, Iterator, Sequence
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views import View

from .. import services, store
from ..conf import reactor_settings
from ..services.figures import DatabaseFigures
from .errors import ApiError

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

logger = logging.getLogger("django_reactor.api")

#: The credentials ``METRICS_AUTH`` may list.
MODES = ("token", "user", "open")
#: The permission a user needs under ``"user"``.
PERMISSION = "django_reactor.view_execution"
#: The shortest bearer token ``METRICS_TOKENS`` may hold (a guessable token opens nothing).
SHORTEST_TOKEN = 16
#: The challenge of a 401 when bearer tokens are accepted.
BEARER_CHALLENGE = 'Bearer realm="django_reactor metrics"'
#: The answer's header: a scrape is never served from a cache.
NO_STORE = {"Cache-Control": "no-store"}

INSTALL = (
    "the metrics need the prometheus_client package, which is not installed on this server: "
    "pip install 'django-reactor[metrics]' (or prometheus_client)"
)


def auth_problems(auth: object, tokens: object) -> list[str]:
    """What is wrong with ``REACTOR["METRICS_AUTH"]`` (``auth``) and ``METRICS_TOKENS``
    (``tokens``), in the words of check E016 (never a token); empty when both are fine. While
    any is wrong the metrics answer no one."""
    problems = []
    if not isinstance(auth, list | tuple) or not all(mode in MODES for mode in auth):
        problems.append(
            f"REACTOR['METRICS_AUTH'] must be a list of {', '.join(MODES)}, got {auth!r}."
        )
        auth = ()
    elif "open" in auth and len(auth) > 1:
        problems.append(
            "REACTOR['METRICS_AUTH'] lists 'open' with other credentials: 'open' lets anyone "
            "read the metrics, so the others would never be asked for."
        )
    if not isinstance(tokens, list | tuple):
        problems.append(
            f"REACTOR['METRICS_TOKENS'] must be a list of tokens, got a {type(tokens).__name__}."
        )
    elif any(not isinstance(t, str) or len(t) < SHORTEST_TOKEN for t in tokens):
        problems.append(
            f"REACTOR['METRICS_TOKENS'] must hold strings of at least {SHORTEST_TOKEN} "
            "characters; one is shorter, or not a string."
        )
    elif "token" in auth and not tokens:
        problems.append(
            "REACTOR['METRICS_AUTH'] accepts 'token' but REACTOR['METRICS_TOKENS'] is empty: "
            "no token opens the metrics."
        )
    return problems


def prometheus() -> SimpleNamespace | None:
    """The pieces of ``prometheus_client`` the view uses, or None when it is not installed."""
    try:
        from prometheus_client import CollectorRegistry
        from prometheus_client.core import GaugeMetricFamily
        from prometheus_client.exposition import choose_encoder
    except ImportError:
        return None
    return SimpleNamespace(
        CollectorRegistry=CollectorRegistry,
        GaugeMetricFamily=GaugeMetricFamily,
        choose_encoder=choose_encoder,
    )


def _known(given: str, tokens: Sequence[str]) -> bool:
    """Whether ``given`` is one of ``tokens``, each compared in constant time (all of them, so
    the time does not say which one matched)."""
    found = False
    for token in tokens:
        found |= hmac.compare_digest(given.encode(), token.encode())
    return found


def _answer(error: ApiError) -> JsonResponse:
    return JsonResponse(error.data, status=error.status_code, headers=error.headers)


class FleetCollector:
    """A Prometheus collector of ``services.fleet_figures()``, read at each ``collect()``
    (see ``docs/how-to/observability.md`` for each metric)."""

    def __init__(self, gauge: Any) -> None:
        #: ``prometheus_client``'s ``GaugeMetricFamily``.
        self._gauge = gauge

    def collect(self) -> Iterator[Metric]:
        """The metrics, computed now."""
        started = time.monotonic()
        figures = services.fleet_figures()
        yield from self._fleet(figures)
        yield from self._databases(figures)
        yield from self._reactors(figures)
        yield self._family(
            "scrape_duration_seconds",
            "Seconds django_reactor took to read the figures of this scrape.",
            [((), time.monotonic() - started)],
        )

    def _family(
        self,
        name: str,
        documentation: str,
        samples: Iterable[tuple[Sequence[str], float]],
        labels: Sequence[str] = (),
    ) -> Metric:
        family = self._gauge(f"django_reactor_{name}", documentation, labels=list(labels))
        for values, value in samples:
            family.add_metric(list(values), value)
        return family

    def _fleet(self, figures: list[DatabaseFigures]) -> Iterator[Metric]:
        # Heartbeats live in the default database: every report has the same processes.
        health = figures[0].health
        sweeper = health.sweeper
        yield self._family(
            "healthy",
            "1 when reactor_health finds no problem (workers and a sweeper alive, no late "
            "work in any database), else 0.",
            [((), float(all(f.health.healthy for f in figures)))],
        )
        yield self._family(
            "workers_alive",
            "Workers whose last heartbeat is within three HEARTBEAT_INTERVAL.",
            [((), health.workers_alive)],
        )
        yield self._family(
            "workers_seen",
            "Workers that sent a heartbeat in the last day, alive or not.",
            [((), len(health.workers))],
        )
        yield self._family(
            "sweeper_healthy",
            "1 when the last sweep is within three SWEEP_INTERVAL (the sweeper is alive), else 0.",
            [((), float(health.sweeper_ok))],
        )
        yield self._family(
            "sweeper_seconds_since_last_sweep",
            "Seconds since the last sweep ended (no sample when none ran in the last day).",
            [((), sweeper.age)] if sweeper else [],
        )
        yield self._family(
            "sweeper_last_sweep_duration_seconds",
            "Seconds the last sweep took (no sample when none ran in the last day).",
            [((), sweeper.last_sweep_seconds)]
            if sweeper and sweeper.last_sweep_seconds is not None
            else [],
        )

    def _databases(self, figures: list[DatabaseFigures]) -> Iterator[Metric]:
        capped = f"counted up to {store.overview.COUNT_CAP}: a value at the cap means at least that"
        yield self._family(
            "overdue_wake_ups",
            "Runs whose wake-up (a sleep's end, a retry's backoff, a scheduled start) is more "
            f"than two SWEEP_INTERVAL late: the sweeper releases them ({capped}).",
            [((f.alias,), f.health.overdue.value) for f in figures],
            ["database"],
        )
        yield self._family(
            "dispatches_not_taken",
            f"Tasks written more than two SWEEP_INTERVAL ago that no worker has taken ({capped}).",
            [((f.alias,), f.health.not_taken.value) for f in figures],
            ["database"],
        )
        yield self._family(
            "runs",
            f"Runs by status, for the statuses of runs not ended and needs_attention ({capped}).",
            [((f.alias, status), n.value) for f in figures for status, n in f.runs.items()],
            ["database", "status"],
        )
        yield self._family(
            "runs_lease_expired",
            "Running or rolling-back runs whose lease expired: their process is gone and "
            f"the sweeper hands them to a worker ({capped}).",
            [((f.alias,), f.lease_expired.value) for f in figures],
            ["database"],
        )
        yield self._family(
            "reactor_figures_complete",
            "1 when the per-reactor figures of the last hour counted every run, 0 when one "
            "stopped at its cap (it counts the newest runs only).",
            [((f.alias,), float(f.health.reactors_complete)) for f in figures],
            ["database"],
        )

    def _reactors(self, figures: list[DatabaseFigures]) -> Iterator[Metric]:
        windows = [(f.alias, w) for f in figures for w in f.health.reactors]
        labels = ["database", "reactor"]
        for name, field, documentation in (
            ("runs_started_last_hour", "started", "Runs of the reactor created in the last hour."),
            ("runs_completed_last_hour", "completed", "Runs that completed in the last hour."),
            (
                "runs_failed_last_hour",
                "failed",
                "Runs that failed (or need attention) in the last hour.",
            ),
            ("runs_in_flight", "in_flight", "Runs not ended now: pending to rolling back."),
        ):
            yield self._family(
                name,
                documentation,
                [((alias, w.reactor), getattr(w, field)) for alias, w in windows],
                labels,
            )
        yield self._family(
            "run_duration_last_hour_seconds",
            "Duration of the reactor's runs that completed in the last hour, at the quantile "
            "(0.5, 0.95; no sample without any).",
            [
                ((alias, w.reactor, quantile), value)
                for alias, w in windows
                for quantile, value in (("0.5", w.p50), ("0.95", w.p95))
                if value is not None
            ],
            [*labels, "quantile"],
        )


class MetricsView(View):
    """The Prometheus metrics (see the module). Route it on its own with
    ``path("metrics", MetricsView.as_view())`` when the scrape should not go under the API's
    prefix."""

    http_method_names = ["get", "head"]

    def get(self, request: HttpRequest) -> HttpResponse:
        refusal = self.refusal(request)
        if refusal is not None:
            return _answer(refusal)
        client = prometheus()
        if client is None:
            return _answer(ApiError(501, INSTALL, code="metrics_unavailable"))
        registry = client.CollectorRegistry(auto_describe=False)
        registry.register(FleetCollector(client.GaugeMetricFamily))
        encode, content_type = client.choose_encoder(request.headers.get("Accept", ""))
        return HttpResponse(encode(registry), content_type=content_type, headers=NO_STORE)

    def http_method_not_allowed(self, request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        return JsonResponse(
            {"detail": f"{request.method} is not allowed here: GET", "code": "method_not_allowed"},
            status=405,
            headers={"Allow": "GET, HEAD"},
        )

    @staticmethod
    def refusal(request: HttpRequest) -> ApiError | None:
        """Why ``request`` may not read the metrics (``REACTOR["METRICS_AUTH"]``), or None.

        No credential, or a wrong one, is a 401 with a challenge; a user without the
        permission, or metrics nobody may read, a 403.
        """
        auth = reactor_settings.METRICS_AUTH
        tokens = reactor_settings.METRICS_TOKENS
        if auth_problems(auth, tokens):
            logger.error(
                "refused a metrics scrape: REACTOR['METRICS_AUTH'] or METRICS_TOKENS is wrong "
                "(check django_reactor.E016)"
            )
            return ApiError(
                403,
                "the metrics are closed until the server's REACTOR['METRICS_AUTH'] and "
                "METRICS_TOKENS settings are fixed (its operators see check django_reactor.E016)",
                code="metrics_closed",
            )
        if not auth:
            return ApiError(
                403,
                "the metrics are closed: the server's REACTOR['METRICS_AUTH'] accepts no "
                'credential (set it to ["token"] with METRICS_TOKENS, ["user"], or ["open"] '
                "for a scrape on a private network)",
                code="metrics_closed",
            )
        if "open" in auth:
            return None
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        if "token" in auth and scheme.lower() == "bearer":
            if _known(given.strip(), tokens):
                return None
            error = ApiError(
                401, "the bearer token is not one the metrics accept", code="bad_token"
            )
            error.headers["WWW-Authenticate"] = BEARER_CHALLENGE
            return error
        user = getattr(request, "user", None)
        if "user" in auth and user is not None and user.is_authenticated:
            if user.has_perm(PERMISSION):
                return None
            return ApiError(403, f"you lack the {PERMISSION} permission", code="permission_denied")
        accepted = " or ".join(
            {"token": "an 'Authorization: Bearer <token>' header", "user": "a signed-in user"}[m]
            for m in auth
        )
        error = ApiError(401, f"the metrics need {accepted}", code="not_authenticated")
        if "token" in auth:
            error.headers["WWW-Authenticate"] = BEARER_CHALLENGE
        return error
