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


#: The first migration written under the rule below (the ones before it shipped without it).
ROLLING_DEPLOY_SAFE_FROM = 35


def test_a_column_added_to_a_table_has_a_database_default() -> None:
    """During a rolling deploy the migration runs while processes of the previous release still
    write rows: a NOT NULL column it adds must have a database default (``db_default``), or
    their inserts fail (Django's ``default`` is filled in by the new code only)."""
    from django.db import migrations as operations
    from django.db.migrations.loader import MigrationLoader

    loader = MigrationLoader(None, ignore_no_migrations=True)
    unsafe = []
    for (app, name), migration in loader.disk_migrations.items():
        if app != "django_reactor" or int(name[:4]) < ROLLING_DEPLOY_SAFE_FROM:
            continue
        for operation in migration.operations:
            if not isinstance(operation, operations.AddField):
                continue
            field = operation.field
            if not field.null and not field.has_db_default():
                unsafe.append(f"{name}: {operation.model_name}.{operation.name}")
    assert unsafe == []
