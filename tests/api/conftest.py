"""Fixtures of the API tests: clients with and without permissions, webhook secrets."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.core.cache import cache
from rest_framework.test import APIClient

from tests.integration.reactors import FAIL_AT, ledger

SECRET = "whsec_" + "c2VjcmV0LWtleS1mb3ItdGVzdHMtMDEyMzQ1Njc4OQ=="
OLD_SECRET = "old-plain-secret"


@pytest.fixture(autouse=True)
def _api_settings(settings: Any) -> Iterator[None]:
    settings.REACTOR = {"WEBHOOK_SECRETS": [SECRET, OLD_SECRET], "API_RESUME_RATE": None}
    cache.clear()
    ledger.clear()
    FAIL_AT.clear()
    yield
    FAIL_AT.clear()


def user_with(*codenames: str) -> User:
    user = User.objects.create_user(f"user-{'-'.join(codenames) or 'none'}", password="pw")
    for codename in codenames:
        user.user_permissions.add(
            Permission.objects.get(content_type__app_label="django_reactor", codename=codename)
        )
    return User.objects.get(pk=user.pk)  # a fresh object: permissions are cached per instance


@pytest.fixture
def operator() -> APIClient:
    """A client whose user may read, resume, cancel, undo and retry."""
    client = APIClient()
    client.force_authenticate(
        user_with(
            "view_execution",
            "resume_interrupt",
            "cancel_execution",
            "undo_execution",
            "retry_execution",
        )
    )
    return client


@pytest.fixture
def anonymous() -> APIClient:
    return APIClient()
