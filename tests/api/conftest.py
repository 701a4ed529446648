"""Fixtures of the API tests: clients with and without permissions, webhook secrets."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.core.cache import cache
from django.db.models import QuerySet
from rest_framework.request import Request
from rest_framework.test import APIClient

from django_reactor.api.signatures import sign

SECRET = "whsec_" + "c2VjcmV0LWtleS1mb3ItdGVzdHMtMDEyMzQ1Njc4OQ=="
OLD_SECRET = "old-plain-secret"

# Every permission of the API (read, resume, cancel, undo, retry, pause).
ALL_PERMISSIONS = (
    "view_execution",
    "resume_interrupt",
    "cancel_execution",
    "undo_execution",
    "retry_execution",
    "pause_execution",
)
# REACTOR["API_SCOPE"] of the scoping tests (see tenant_scope).
TENANT_SCOPE = "tests.api.conftest.tenant_scope"


@pytest.fixture(autouse=True)
def _api_settings(settings: Any) -> None:
    # The suite's settings (its own Celery queue...) with webhook secrets and no rate limit.
    settings.REACTOR = {
        **settings.REACTOR,
        "WEBHOOK_SECRETS": [SECRET, OLD_SECRET],
        "API_RESUME_RATE": None,
        # A paused run's stream ends (timeout) within a second: the schema's fuzzer reads
        # whole answers.
        "STREAM_MAX_SECONDS": 1.0,
        "STREAM_POLL_SECONDS": 0.1,
    }
    # Only this run's keys: a FLUSHDB would wipe what parallel test runs keep in the same
    # Redis database (their keys carry other prefixes).
    delete_pattern = getattr(cache, "delete_pattern", None)
    if delete_pattern is not None:
        delete_pattern("*")
    else:
        cache.clear()


def make_user(username: str, *codenames: str, tenant: str = "") -> User:
    """A user holding ``codenames`` (django_reactor permissions); ``tenant`` is its first_name."""
    user = User.objects.create_user(username, password="pw", first_name=tenant)
    for codename in codenames:
        user.user_permissions.add(
            Permission.objects.get(content_type__app_label="django_reactor", codename=codename)
        )
    return User.objects.get(pk=user.pk)  # a fresh object: permissions are cached per instance


def user_with(*codenames: str) -> User:
    return make_user(f"user-{'-'.join(codenames) or 'none'}", *codenames)


def client_for(user: User, **kwargs: Any) -> APIClient:
    client = APIClient(**kwargs)
    client.force_authenticate(user)
    return client


def tenant_scope(request: Request, queryset: QuerySet[Any]) -> QuerySet[Any]:
    """A tenant sees the runs whose ``order`` input starts with its name and a dash.

    The tenant is the user's ``first_name``; a user without one (or no user) sees nothing.
    """
    tenant = getattr(request.user, "first_name", "")
    if not tenant:
        return queryset.none()
    return queryset.filter(inputs__order__startswith=f"{tenant}-")


def resume_body(payload: Any, **extra: Any) -> bytes:
    return json.dumps({"payload": payload, **extra}).encode()


def signed_headers(raw: bytes, *, secret: str = SECRET, webhook_id: str | None = None) -> dict:
    """The Standard Webhooks headers of a delivery of ``raw`` signed now with ``secret``."""
    return sign(secret, webhook_id or f"msg_{time.monotonic_ns()}", raw)


@pytest.fixture
def operator() -> APIClient:
    """A client whose user may read, resume, cancel, undo and retry."""
    return client_for(user_with(*ALL_PERMISSIONS))


@pytest.fixture
def anonymous() -> APIClient:
    return APIClient()
