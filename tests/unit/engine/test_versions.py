"""Meta.version and Meta.version_of: what a definition declares, and what it refuses."""

from __future__ import annotations

from typing import Any

import pytest

from django_reactor import Reactor, step
from django_reactor.exceptions import DefinitionError


def first() -> str:
    return "first"


def reactor(class_name: str, **meta: Any) -> type[Reactor]:
    return type(
        class_name,
        (Reactor,),
        {"__module__": __name__, "Meta": type("Meta", (), meta), "first": step()(first)},
    )


def test_a_reactor_without_a_version_records_none() -> None:
    plain = reactor("Plain", name="versions.Plain")
    assert plain.definition.version == ""
    assert plain.definition.kept is False


@pytest.mark.parametrize(
    ("declared", "stored"), [("2", "2"), (3, "3"), ("2026-12.a_b", "2026-12.a_b")]
)
def test_a_version_is_a_short_label(declared: object, stored: str) -> None:
    assert (
        reactor("Labelled", name="versions.Labelled", version=declared).definition.version == stored
    )


@pytest.mark.parametrize("declared", ["", " 2", "two words", "x" * 65, True, 2.5, ["2"]])
def test_a_bad_version_is_refused_naming_the_option(declared: object) -> None:
    with pytest.raises(DefinitionError, match=r"Bad\.Meta\.version must be a short label"):
        reactor("Bad", name="versions.Bad", version=declared)


def test_a_kept_version_takes_its_reactors_name() -> None:
    current = reactor("Order", name="versions.Order", version="2")
    kept = reactor("OrderV1", version_of=current, version="1")
    assert kept.definition.name == "versions.Order"
    assert (kept.definition.version, kept.definition.kept) == ("1", True)
    by_name = reactor("OrderV0", version_of="versions.Order", version="0")
    assert by_name.definition.name == "versions.Order"


def test_a_kept_version_needs_its_version() -> None:
    current = reactor("Order", name="versions.Order", version="2")
    with pytest.raises(DefinitionError, match=r"OrderV1\.Meta\.version_of needs Meta\.version"):
        reactor("OrderV1", version_of=current)


def test_a_kept_version_cannot_be_the_current_one() -> None:
    current = reactor("Order", name="versions.Order", version="2")
    with pytest.raises(DefinitionError, match=r"keeps version '2' of versions\.Order, which is"):
        reactor("OrderV2", version_of=current, version="2")


def test_a_kept_version_cannot_rename_its_reactor() -> None:
    current = reactor("Order", name="versions.Order", version="2")
    with pytest.raises(DefinitionError, match=r"remove Meta\.name"):
        reactor("OrderV1", version_of=current, version="1", name="versions.Other")


@pytest.mark.parametrize("of", [None, 3, object(), ""])
def test_version_of_must_name_a_reactor(of: object) -> None:
    if of is None:
        with pytest.raises(DefinitionError, match=r"needs Meta\.version"):
            reactor("Lost", version_of=object)
        return
    with pytest.raises(DefinitionError, match=r"Lost\.Meta\.version_of must be the reactor class"):
        reactor("Lost", version_of=of, version="1")
