"""What the database cannot store is refused when encoded, and stored rows this code cannot
read are reported as such (not as a crash somewhere later)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from django_reactor.engine.outcomes import ErrorInfo, RollbackFailure, exception_message
from django_reactor.engine.serialization import (
    MAX_DEPTH,
    TAG,
    decode,
    encode,
    printable,
    safe_repr,
    shown,
    unstorable,
)
from django_reactor.exceptions import ResultNotSerializable, StoredValueUnreadable
from tests.helpers import nested


def cyclic() -> dict[str, Any]:
    value: dict[str, Any] = {"a": []}
    value["a"].append(value)
    return value


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"v": "a\x00b"}, "NUL character"),
        ({"a\x00": 1}, "NUL character"),
        (["\udc00"], "lone surrogate"),
        ({"\ud800": 1}, "lone surrogate"),
        (("ok", {"deep": "x\udfff"}), "lone surrogate"),
        ({"n": 10**5000}, "more than 4300 digits"),
        (nested(MAX_DEPTH + 1), f"more than {MAX_DEPTH} levels deep"),
        (cyclic(), "contains itself"),
    ],
)
def test_values_the_database_refuses_are_refused_when_encoded(value: Any, message: str) -> None:
    with pytest.raises(ResultNotSerializable, match=message):
        encode(value)
    assert message in (unstorable(value) or "")


def test_what_the_database_accepts_round_trips() -> None:
    value = {"text": "ü €  𝄞", "big": 10**4000, "deep": nested(MAX_DEPTH - 1), "empty": ""}
    stored = encode(value)
    assert json.loads(json.dumps(stored)) == stored  # what the checkpoint writes
    assert decode(stored) == value
    assert unstorable(value) is None


def test_a_shared_member_is_not_a_cycle() -> None:
    shared = {"x": 1}
    assert decode(encode({"a": shared, "b": [shared, shared]})) == {
        "a": {"x": 1},
        "b": [{"x": 1}, {"x": 1}],
    }


@pytest.mark.parametrize(
    ("stored", "message"),
    [
        ({TAG: "frobnicated", "v": 1}, "type tag 'frobnicated'"),
        ({TAG: "datetime", "v": "yesterday"}, "stored datetime value cannot be read"),
        ({TAG: "decimal", "v": "lots"}, "stored decimal value cannot be read"),
        ({TAG: "uuid", "v": 7}, "stored uuid value cannot be read"),
        ([{"ok": {TAG: "date", "v": "2026-13-40"}}], "stored date value cannot be read"),
        ({TAG: ["not", "a", "tag"], "v": 1}, "type tag"),
    ],
)
def test_stored_values_this_code_cannot_read(stored: Any, message: str) -> None:
    with pytest.raises(StoredValueUnreadable, match=message):
        decode(stored)


def test_text_that_is_only_shown_is_escaped_never_refused() -> None:
    assert printable("a\x00b\udc00c") == "a\\x00b\\udc00c"
    assert printable("plain ü") == "plain ü"
    error = ErrorInfo(kind="step", message="bad\x00", traceback="line \udc00\n")
    assert unstorable(error.to_dict()) is None
    assert error.message == "bad\\x00"
    assert RollbackFailure(
        step="s", action="undo", exception_class=None, message="\udc00"
    ).message == ("\\udc00")


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no")


def test_reports_of_values_that_cannot_be_stored_or_even_printed() -> None:
    assert exception_message(Unprintable()) == "Unprintable"
    assert exception_message(ValueError("x\x00")) == "x\\x00"
    for value in (nested(5000), cyclic(), 10**5000, "\udc00", object()):
        text = safe_repr(value)
        assert unstorable(text) is None
        assert len(text) < 1000
        assert unstorable(shown(value)) is None
    assert shown({"fine": [1, 2]}) == {"fine": [1, 2]}
