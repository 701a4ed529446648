"""Data migrations carry existing rows forward (and back)."""

from __future__ import annotations

import uuid

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

APP = "django_reactor"
BEFORE_DEFINITIONS = [(APP, "0010_event_kind_hand_back")]


def migrate(targets: list[tuple[str, str]]) -> MigrationExecutor:
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)
    return MigrationExecutor(connection)


def leaf() -> list[tuple[str, str]]:
    executor = MigrationExecutor(connection)
    return [key for key in executor.loader.graph.leaf_nodes() if key[0] == APP]


@pytest.mark.django_db(transaction=True)
def test_stored_definition_shapes_are_kept_once_per_hash() -> None:
    latest = leaf()
    old = migrate(BEFORE_DEFINITIONS).loader.project_state(BEFORE_DEFINITIONS).apps
    Execution = old.get_model(APP, "Execution")
    shape = {"reserve": {"impl": "shop.Reserve", "depends_on": []}}
    for _ in range(3):
        Execution.objects.create(
            id=uuid.uuid4(),
            reactor="shop.Order",
            definition_hash="abc",
            definition_shape=shape,
            status="completed",
            inputs={},
        )
    Execution.objects.create(
        id=uuid.uuid4(),
        reactor="shop.Order",
        definition_hash="bad",
        definition_shape={},
        status="failed",
        inputs={},
    )
    try:
        new = migrate(latest).loader.project_state(latest).apps
        Definition = new.get_model(APP, "Definition")
        assert list(Definition.objects.values_list("hash", "shape")) == [("abc", shape)]
        assert new.get_model(APP, "Execution").objects.count() == 4
    finally:
        migrate(latest)
