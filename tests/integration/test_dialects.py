"""The store picks its dialect once per database alias, from the alias's vendor."""

from __future__ import annotations

import uuid

import pytest
from django.db import connection, connections

from django_reactor import store
from django_reactor.engine.journal import JournalBatch
from django_reactor.store.dialects import Dialect, MySQL, PostgreSQL


def test_the_store_picks_its_dialect_once_from_the_vendor() -> None:
    chosen = store.dialect()
    assert chosen is store.dialect() is store.dialect_for(store.using())
    expected = {"postgresql": PostgreSQL, "mysql": MySQL}.get(connection.vendor, Dialect)
    assert type(chosen) is expected
    assert (chosen.alias, chosen.name) == (store.using(), connection.vendor)


def test_another_alias_gets_a_dialect_of_its_own() -> None:
    # The test settings' second database is SQLite, whatever the first one is.
    elsewhere = store.dialect_for("elsewhere")
    assert type(elsewhere) is Dialect
    assert (elsewhere.alias, elsewhere.name) == ("elsewhere", connections["elsewhere"].vendor)
    assert elsewhere.clock_sql is not None  # the database coordination backend runs on it
    capabilities = (
        elsewhere.one_statement_checkpoint,
        elsewhere.one_statement_locks,
        elsewhere.bounds_statements,
        elsewhere.prepares_statements,
    )
    assert capabilities == (False, False, False, False)
    assert elsewhere.estimated_rows("django_reactor_execution") is None


def test_forced_answers_another_dialect_within_its_block_only() -> None:
    before = store.dialect()
    generic = store.dialects.generic()
    with store.dialects.forced(generic):
        assert store.dialect() is generic
        assert store.DatabaseJournal(store.Owned(uuid.uuid4(), 1)).dialect is generic
    assert store.dialect() is before


def test_the_generic_store_has_no_one_statement_checkpoint() -> None:
    generic = store.dialects.generic()
    assert not generic.one_statement_checkpoint  # the journal writes through the ORM
    with pytest.raises(NotImplementedError):
        generic.checkpoint(uuid.uuid4(), 1, JournalBatch(current_step="a"), new_step=False)


@pytest.mark.django_db
def test_every_unique_constraint_of_the_models_is_a_unique_index_in_the_database() -> None:
    """The store counts on unique keys refusing the second of two racing rows. Django skips a
    conditional one where the database has no partial index (MariaDB, MySQL): migration 0031
    makes those there; a new conditional constraint needs the same, or this fails."""
    from django.apps import apps
    from django.db.models import UniqueConstraint

    missing = []
    with connection.cursor() as cursor:
        for model in apps.get_app_config("django_reactor").get_models():
            if not model._meta.managed:
                continue
            found = connection.introspection.get_constraints(cursor, model._meta.db_table)
            for constraint in model._meta.constraints:
                if not isinstance(constraint, UniqueConstraint):
                    continue
                if not found.get(constraint.name, {}).get("unique"):
                    missing.append(f"{model._meta.db_table}.{constraint.name}")
    assert missing == []
