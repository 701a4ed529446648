"""URLs of the example project."""

from __future__ import annotations

from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView

urlpatterns = [
    path("admin/", admin.site.urls),
    path("reactor/", include("django_reactor.api.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
]
