"""Business attributes: the short key-value pairs a run is found by (a customer, an order, a
tenant).

A reactor declares them in ``Meta.attributes`` (templates read from the run's inputs when it
is created) and a step sets them with ``self.context.set_attribute(key, value)`` (written
with the step's checkpoint). Values are kept as text in one canonical form, so that a filter
``customer_id=42`` finds the runs whose attribute is the integer ``42`` or the string
``"42"``: a string as it is, a whole number in decimal, a boolean as ``true`` or ``false``, a
UUID in its hyphenated lower-case form. ``None`` and ``""`` mean "no such attribute".
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from typing import Any

from ..exceptions import ArgumentResolutionError, DefinitionError, InvalidAttribute
from .redaction import SecretPath
from .serialization import safe_repr
from .templates import InputRef, ResolutionScope, Template, ValueRef

#: A key: a letter, then letters, digits and ``_.:-``.
ATTRIBUTE_KEY = re.compile(r"[A-Za-z][A-Za-z0-9_.:-]*")
#: The longest key, and the longest value (in characters).
MAX_KEY_LENGTH = 64
MAX_VALUE_LENGTH = 255
#: How many attributes a reactor declares, and one step sets, at most.
MAX_ATTRIBUTES = 32

#: What ``Meta.attributes`` holds once checked: each key and the template of its value.
Declared = tuple[tuple[str, Template], ...]


def check_key(key: object, where: str) -> str:
    """``key`` when it is a valid attribute key, else InvalidAttribute saying why."""
    if isinstance(key, str) and len(key) <= MAX_KEY_LENGTH and ATTRIBUTE_KEY.fullmatch(key):
        return key
    raise InvalidAttribute(
        f"{where}: an attribute key is a letter followed by letters, digits and '_.:-', at "
        f"most {MAX_KEY_LENGTH} characters (such as 'customer_id'), got {safe_repr(key)}"
    )


def canonical(value: object, where: str) -> str | None:
    """The text ``value`` is kept and matched as (None: no attribute), or InvalidAttribute.

    A string as it is, a whole number in decimal, a boolean as ``true``/``false``, a UUID
    hyphenated in lower case; ``None`` and ``""`` are no attribute. Anything else (a float, a
    date, a dict) is refused rather than given a text form a filter could not guess.
    """
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        text = str(int(value))  # an IntEnum's number, not its name
    elif isinstance(value, uuid.UUID):
        text = str(value)
    elif isinstance(value, str):
        text = str.__str__(value)  # a str subclass's (a TextChoices member's) own text
    else:
        raise InvalidAttribute(
            f"{where}: an attribute is a string, a whole number, a boolean or a UUID, got "
            f"{type(value).__name__} {safe_repr(value)}; give its text (str(...)) or a part "
            "of it that is one of those"
        )
    if text == "":
        return None
    if len(text) > MAX_VALUE_LENGTH:
        raise InvalidAttribute(
            f"{where}: an attribute value is at most {MAX_VALUE_LENGTH} characters, got "
            f"{len(text)} ({safe_repr(text[:40])}...); keep a short key to the thing instead "
            "(its id)"
        )
    if "\x00" in text or not _encodable(text):
        raise InvalidAttribute(
            f"{where}: an attribute value cannot hold NUL or unpaired surrogates, got "
            f"{safe_repr(text)}"
        )
    return text


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def parse_filter(text: str, where: str) -> tuple[str, str]:
    """``"key=value"`` (an attribute filter typed by a person) as ``(key, value)``; the value
    is the text after the first ``=``, kept as typed."""
    key, equals, value = text.partition("=")
    if not equals or not value:
        raise InvalidAttribute(
            f"{where}: an attribute filter is KEY=VALUE (such as customer_id=42), got "
            f"{safe_repr(text)}"
        )
    check_key(key, where)
    matched = canonical(value, where)
    assert matched is not None  # a non-empty string
    return key, matched


def wanted(attributes: Mapping[str, object], where: str) -> dict[str, str]:
    """The filter ``attributes`` (key: value, any value :func:`canonical` takes) as the texts
    stored values are compared with; InvalidAttribute for a bad key, a bad value or none."""
    found: dict[str, str] = {}
    for key, value in attributes.items():
        check_key(key, where)
        text = canonical(value, f"{where}, attribute {key!r}")
        if text is None:
            raise InvalidAttribute(
                f"{where}: attribute {key!r} has no value to look for; give one, such as {key}=42"
            )
        found[key] = text
    return found


# ---------------------------------------------------------------------------- Meta.attributes


def declared(
    option: object,
    reactor: str,
    input_fields: frozenset[str] | None,
    input_secrets: tuple[SecretPath, ...],
) -> Declared:
    """``Meta.attributes`` checked: a dict of keys to ``arg.input(...)`` (an input declared by
    ``Inputs`` and not a secret one: attributes are kept in clear and indexed) or
    ``arg.value(...)``; DefinitionError naming the reactor and the key otherwise."""
    if option is None:
        return ()
    where = f"{reactor}.Meta.attributes"
    if not isinstance(option, Mapping):
        raise DefinitionError(
            f'{where} must be a dict of keys to templates ({{"customer_id": '
            f'arg.input("customer_id")}}), got {safe_repr(option)}'
        )
    if len(option) > MAX_ATTRIBUTES:
        raise DefinitionError(
            f"{where} declares {len(option)} attributes; a reactor declares at most "
            f"{MAX_ATTRIBUTES}"
        )
    found: list[tuple[str, Template]] = []
    for key, template in option.items():
        try:
            check_key(key, where)
        except InvalidAttribute as exc:
            raise DefinitionError(str(exc)) from None
        found.append((key, _checked(f"{where}[{key!r}]", template, reactor, input_fields)))
        if isinstance(template, InputRef) and template.secret_paths(input_secrets):
            raise DefinitionError(
                f"{where}[{key!r}] reads {template.describe()}, a secret: attributes are kept "
                "in clear and indexed, so they never hold secrets. Use another input (an id), "
                "or leave it out"
            )
    return tuple(found)


def _checked(
    where: str, template: object, reactor: str, input_fields: frozenset[str] | None
) -> Template:
    if isinstance(template, InputRef):
        if input_fields is not None and template.name not in input_fields:
            raise DefinitionError(
                f"{where} reads input {template.name!r}, which {reactor}.Inputs does not "
                f"declare (inputs: {', '.join(sorted(input_fields)) or 'none'})"
            )
        return template
    if isinstance(template, ValueRef):
        if template.transform is None:
            try:
                if canonical(template.value, where) is None:
                    raise InvalidAttribute(f"{where}: arg.value(None) sets no attribute")
            except InvalidAttribute as exc:
                raise DefinitionError(str(exc)) from None
        return template
    if isinstance(template, Template):
        raise DefinitionError(
            f"{where} is {template.describe()}: attributes are set when the run is created, "
            "from its inputs, before any step ran. Use arg.input(...) or arg.value(...), and "
            "self.context.set_attribute(key, value) in a step for a value a step finds"
        )
    raise DefinitionError(
        f"{where} must be arg.input(...) or arg.value(...), got {safe_repr(template)}; wrap "
        f"a literal as arg.value({safe_repr(template)})"
    )


def resolve(
    attributes: Declared, inputs: Mapping[str, Any], *, reactor: str, strict: bool = True
) -> dict[str, str]:
    """The run's attributes from its ``inputs``, as stored text. An input (or a key in it)
    that is missing or None sets no attribute. A value that cannot be an attribute raises
    InvalidAttribute when ``strict``; otherwise (inputs that failed their validation, the run
    recorded failed) it is left out, as is a transform that raises."""
    found: dict[str, str] = {}
    scope = ResolutionScope(inputs=inputs, results={})
    for key, template in attributes:
        where = f"{reactor}.Meta.attributes[{key!r}]"
        try:
            text = canonical(template.resolve(scope), where)
        except ArgumentResolutionError as exc:
            if strict and template.transform is not None and exc.__cause__ is not None:
                raise InvalidAttribute(f"{where}: {exc}") from exc
            continue
        except InvalidAttribute:
            if strict:
                raise
            continue
        if text is not None:
            found[key] = text
    return found
