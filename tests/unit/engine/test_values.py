"""Templates, retry delays, the JSON codec and redaction."""

from __future__ import annotations

import datetime as dt
import decimal
import uuid

import pytest

from django_reactor import Retry, arg
from django_reactor.engine.redaction import REDACTED, redact
from django_reactor.engine.serialization import TAG, decode, encode
from django_reactor.engine.templates import ResolutionScope
from django_reactor.exceptions import (
    ArgumentResolutionError,
    DefinitionError,
    ResultNotSerializable,
)


def scope(**results: object) -> ResolutionScope:
    return ResolutionScope(inputs={"order": {"items": [{"sku": "A"}]}}, results=results)


def test_paths_accept_dotted_strings_and_sequences() -> None:
    assert arg.input("order", "items.0.sku").resolve(scope()) == "A"
    assert arg.input("order", ["items", 0, "sku"]).resolve(scope()) == "A"
    assert arg.result("s", "x").resolve(scope(s={"x": 3})) == 3


@pytest.mark.parametrize(
    ("template", "message"),
    [
        (arg.input("order", "lines"), r"no key 'lines' \(it has: items\)"),
        (arg.input("order", "items.5"), "not a valid index into a list of 1"),
        (arg.input("order", "items.0.sku.x"), "cannot look up 'items.0.sku.x' in a str"),
        (arg.input("missing"), "the run has no input 'missing'"),
        (arg.result("nope"), "step 'nope' has no result yet"),
    ],
)
def test_resolution_errors_say_where(template: object, message: str) -> None:
    with pytest.raises(ArgumentResolutionError, match=message):
        template.resolve(scope())  # type: ignore[attr-defined]


def test_template_constructor_errors() -> None:
    with pytest.raises(DefinitionError):
        arg.input("")
    with pytest.raises(DefinitionError):
        arg.result("a", "x..y")
    with pytest.raises(DefinitionError):
        arg.value(1, transform="upper")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("backoff", "expected"),
    [("fixed", [2, 2, 2]), ("linear", [2, 4, 6]), ("exponential", [2, 4, 8])],
)
def test_backoff_formulas(backoff: str, expected: list[float]) -> None:
    policy = Retry(attempts=4, backoff=backoff, delay=2)
    assert [policy.delay_after(n) for n in (1, 2, 3)] == expected


def test_max_delay_and_jitter_bounds() -> None:
    assert Retry(delay=10, max_delay=15).delay_after(5) == 15
    policy = Retry(delay=10, backoff="fixed", jitter=0.5, max_delay=None)
    delays = [policy.delay_after(1) for _ in range(200)]
    assert all(5 <= d <= 15 for d in delays)
    assert len(set(delays)) > 1


def test_codec_round_trips_common_types() -> None:
    value = {
        "when": dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC),
        "day": dt.date(2026, 1, 2),
        "at": dt.time(3, 4),
        "wait": dt.timedelta(seconds=90),
        "amount": decimal.Decimal("10.50"),
        "id": uuid.UUID(int=5),
        "pair": (1, 2),
        "tags": {"a"},
        "nested": [{"x": None, "ok": True, "n": 1.5}],
        TAG: "not a tag",
    }
    assert decode(encode(value)) == value


@pytest.mark.parametrize("bad", [object(), {1: "int key"}, float("nan")])
def test_codec_refuses_what_json_cannot_hold(bad: object) -> None:
    with pytest.raises(ResultNotSerializable):
        encode(bad)


def test_redaction_masks_paths_and_wildcards() -> None:
    data = {"card": {"number": "4242", "holder": "Ada"}, "items": [{"pin": 1}, {"pin": 2}]}
    masked = redact(data, [("card", "number"), ("items", "*", "pin"), ("absent",)])
    assert masked == {
        "card": {"number": REDACTED, "holder": "Ada"},
        "items": [{"pin": REDACTED}, {"pin": REDACTED}],
    }
    assert data["card"]["number"] == "4242"  # the original is untouched
    assert redact("x", [()]) == REDACTED
