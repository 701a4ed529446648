"""The store picks its dialect once per database alias, from the alias's vendor."""

from __future__ import annotations

import uuid

import pytest
from django.db import connection, connections

from django_reactor import store
from django_reactor.engine.journal import JournalBatch
from django_reactor.store.dialects import Dialect, PostgreSQL


def test_the_store_picks_its_dialect_once_from_the_vendor() -> None:
    chosen = store.dialect()
    assert chosen is store.dialect() is store.dialect_for(store.using())
    assert type(chosen) is (PostgreSQL if connection.vendor == "postgresql" else Dialect)
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
