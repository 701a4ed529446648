"""A project's URLs that route the admin and not the metrics (check W006 stays quiet)."""

from __future__ import annotations

from django.contrib import admin
from django.urls import path

urlpatterns = [path("admin/", admin.site.urls)]
