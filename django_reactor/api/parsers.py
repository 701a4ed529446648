"""The API's request parser: JSON bodies the database can store, and a clear 400 for the rest.

Python's ``json`` reads text PostgreSQL refuses (a NUL, a lone surrogate such as ``\\udc00``),
NaN and infinities, and integers too long to write back out; it gives up with a
``RecursionError`` on deep nesting. Stored, such a value is a server error, so the parser
refuses it before any view sees it, with the API's error shape:
``{"detail": "...", "code": "parse_error"}``.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Mapping
from typing import IO, TYPE_CHECKING, NoReturn

from django.conf import settings
from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

from ..engine.serialization import MAX_DEPTH, unstorable

if TYPE_CHECKING:
    from ..engine.serialization import JSONValue


class BodyRefused(ParseError):
    """A 400 with ``code`` ``parse_error``: the body is not JSON, or cannot be stored.

    ``errors``: for a JSON object with members that cannot be stored, the messages of each
    such member (``{"reason": ["..."]}``), as field errors are given.
    """

    def __init__(self, message: str, errors: dict[str, list[str]] | None = None) -> None:
        # A dict detail is answered as it is, so the body has the API's usual shape.
        detail: dict[str, object] = {"detail": message, "code": "parse_error"}
        if errors:
            detail["errors"] = errors
        super().__init__(detail)
        self.message = message
        self.errors = errors or {}


class _Refused(Exception):
    """Raised from json's hooks; not a ValueError, so json lets it through unchanged."""


def _integer(text: str) -> int:
    limit = sys.get_int_max_str_digits()
    digits = len(text) - text.startswith("-")
    if limit and digits > limit:
        raise _Refused(
            f"the body has an integer of {digits} digits, more than the {limit} this server "
            "reads; send such a number as a string"
        )
    return int(text)


def _float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise _Refused(
            f"the body has the number {text[:40]}, too large for a float; send it as a string"
        )
    return value


def _constant(name: str) -> NoReturn:
    raise _Refused(
        f"the body has {name}, which is not JSON and cannot be stored; send null or a number"
    )


def too_deep(value: object, limit: int) -> bool:
    """Whether JSON ``value`` nests more than ``limit`` levels (checked without recursion)."""
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth > limit:
                return True
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
    return False


def load(raw: bytes, *, encoding: str | None = None, max_depth: int = MAX_DEPTH) -> JSONValue:
    """Parse the body ``raw`` as JSON the database can store; raise BodyRefused otherwise.

    ``encoding``: the request's charset; None detects UTF-8, UTF-16 or UTF-32 as ``json``
    does. ``max_depth``: the deepest nesting accepted (at most what a stored value may have).
    """
    if encoding is None:
        encoding = json.detect_encoding(raw)
    try:
        text = raw.decode(encoding)
    except UnicodeDecodeError as exc:
        raise BodyRefused(
            f"the body is not valid {encoding.upper()} text ({exc.reason} at byte {exc.start}); "
            f"send JSON encoded as {encoding.upper()}"
        ) from None
    try:
        data = json.loads(text, parse_int=_integer, parse_float=_float, parse_constant=_constant)
    except _Refused as exc:
        raise BodyRefused(str(exc)) from None
    except RecursionError:
        raise BodyRefused(
            f"the body is nested too deeply to be read; send at most {max_depth} levels"
        ) from None
    except ValueError as exc:
        raise BodyRefused(f"the body is not valid JSON: {exc}") from None
    if too_deep(data, max_depth):
        raise BodyRefused(
            f"the body is nested more than {max_depth} levels deep; send flatter data"
        )
    reason = unstorable(data)
    if reason is not None:
        raise BodyRefused(
            f"the body cannot be stored: {reason}; remove it and send again", _members(data)
        )
    return data


def _members(data: JSONValue) -> dict[str, list[str]]:
    """Why each member of an object body cannot be stored, by its name; a name that cannot
    be stored itself is reported under ``non_field_errors`` (it is no field's name)."""
    if not isinstance(data, dict):
        return {}
    errors: dict[str, list[str]] = {}
    for name, value in data.items():
        if unstorable(name) is not None:
            errors.setdefault("non_field_errors", []).append(f"a member's name: {unstorable(name)}")
        elif (why := unstorable(value)) is not None:
            errors[name] = [why]
    return errors


class StorableJSONParser(JSONParser):
    """DRF's JSON parser, refusing (400 ``parse_error``) what :func:`load` refuses.

    The API's views take JSON only, through this parser: other media types get 415.
    """

    max_depth = MAX_DEPTH

    def parse(
        self,
        stream: IO[bytes],
        media_type: str | None = None,
        parser_context: Mapping[str, object] | None = None,
    ) -> JSONValue:
        encoding = str((parser_context or {}).get("encoding") or settings.DEFAULT_CHARSET)
        try:
            "".encode(encoding)  # unlike codecs.lookup(), refuses bytes codecs such as bz2_codec
        except (LookupError, UnicodeError):
            raise BodyRefused(
                f"the Content-Type charset {encoding[:40]!a} is not a text encoding; send UTF-8"
            ) from None
        return load(stream.read(), encoding=encoding, max_depth=self.max_depth)
