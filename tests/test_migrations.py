"""Migrations match the models, whatever the project's DEFAULT_AUTO_FIELD."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command
from django.test import override_settings


@pytest.mark.django_db
@pytest.mark.parametrize(
    "auto_field", ["django.db.models.AutoField", "django.db.models.BigAutoField"]
)
def test_no_missing_migrations(auto_field: str) -> None:
    with override_settings(DEFAULT_AUTO_FIELD=auto_field):
        out = StringIO()
        call_command("makemigrations", "django_reactor", "--check", "--dry-run", stdout=out)
    assert "No changes detected" in out.getvalue()
