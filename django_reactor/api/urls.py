"""URLs of the API, and the Prometheus metrics (``metrics/``, closed until
``REACTOR["METRICS_AUTH"]`` opens them). Include them with a prefix of your choice::

path("reactor/", include("django_reactor.api.urls")),
"""

from __future__ import annotations

from django.urls import path, re_path
from rest_framework.routers import SimpleRouter

from .bulk import BulkDetailView, BulkStopView, BulkView
from .errors import endpoint_not_found
from .events import EventView
from .messages import MessageView
from .metrics import MetricsView
from .starts import StartView
from .stream import ExecutionStreamView
from .views import CorrelationResumeView, ExecutionResumeView, ExecutionViewSet, TokenResumeView

app_name = "django_reactor"

router = SimpleRouter()
router.register("executions", ExecutionViewSet, basename="execution")

urlpatterns = [
    path(
        "executions/<str:execution_id>/resume/",
        ExecutionResumeView.as_view(),
        name="execution-resume",
    ),
    path(
        "executions/<str:execution_id>/messages/<str:topic>/",
        MessageView.as_view(),
        name="execution-message",
    ),
    path(
        "executions/<str:execution_id>/stream/",
        ExecutionStreamView.as_view(),
        name="execution-stream",
    ),
    path(
        "correlations/<str:correlation_id>/resume/",
        CorrelationResumeView.as_view(),
        name="correlation-resume",
    ),
    path("resume/", TokenResumeView.as_view(), name="token-resume"),
    path("reactors/<str:name>/runs/", StartView.as_view(), name="reactor-runs"),
    path("events/<str:name>/", EventView.as_view(), name="event-emit"),
    path("bulk/", BulkView.as_view(), name="bulk"),
    path("bulk/<str:operation_id>/", BulkDetailView.as_view(), name="bulk-detail"),
    path("bulk/<str:operation_id>/stop/", BulkStopView.as_view(), name="bulk-stop"),
    path("metrics/", MetricsView.as_view(), name="metrics"),
    *router.urls,
    # Last: any other path under the API's prefix is a JSON 404.
    re_path(r"^(?P<path>.*)$", endpoint_not_found, name="not-found"),
]
