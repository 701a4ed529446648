"""Fixtures of the admin tests: users with and without the operator permissions."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client

from tests.admin.reactors import TRIGGERS


@pytest.fixture(autouse=True)
def _reset_triggers() -> Iterator[None]:
    TRIGGERS.clear()
    yield
    TRIGGERS.clear()


@pytest.fixture
def operator(db: None) -> User:
    """A superuser: every permission."""
    return User.objects.create_superuser("operator", "operator@example.com", "pw")


@pytest.fixture
def client_operator(client: Client, operator: User) -> Client:
    client.force_login(operator)
    return client


@pytest.fixture
def viewer(db: None) -> User:
    """Staff with view_execution only."""
    user = User.objects.create_user("viewer", "viewer@example.com", "pw", is_staff=True)
    user.user_permissions.add(
        Permission.objects.get(content_type__app_label="django_reactor", codename="view_execution")
    )
    return user


@pytest.fixture
def client_viewer(client: Client, viewer: User) -> Client:
    client.force_login(viewer)
    return client
