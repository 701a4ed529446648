"""URLs of the API. Include them with a prefix of your choice::

path("reactor/", include("django_reactor.api.urls")),
"""

from __future__ import annotations

from django.urls import path
from rest_framework.routers import SimpleRouter

from .views import CorrelationResumeView, ExecutionResumeView, ExecutionViewSet, TokenResumeView

app_name = "django_reactor"

router = SimpleRouter()
router.register("executions", ExecutionViewSet, basename="execution")

urlpatterns = [
    path(
        "executions/<uuid:execution_id>/resume/",
        ExecutionResumeView.as_view(),
        name="execution-resume",
    ),
    path(
        "correlations/<str:correlation_id>/resume/",
        CorrelationResumeView.as_view(),
        name="correlation-resume",
    ),
    path("resume/", TokenResumeView.as_view(), name="token-resume"),
    *router.urls,
]
