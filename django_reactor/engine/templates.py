"""Argument templates: where a step's arguments come from.

``arg.input(name, path)``, ``arg.result(step, path)`` and ``arg.value(literal)`` describe a value
to be resolved when the step runs. ``arg.result`` makes the step depend on the named step.
Paths are dotted strings (``"items.0.sku"``) or sequences of keys; an optional ``transform``
is applied to the resolved value.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from ..exceptions import ArgumentResolutionError, DefinitionError
from .redaction import SecretPath, relative_secret_paths

Path = tuple[str, ...]


def parse_path(path: str | Sequence[str | int] | None) -> Path:
    """Normalise a path given as ``"a.b.0"``, ``["a", "b", 0]`` or ``None``."""
    if path is None or path == "":
        return ()
    if isinstance(path, str):
        parts = path.split(".")
    elif isinstance(path, Sequence):
        parts = [str(p) for p in path]
    else:
        raise DefinitionError(f"a path must be a dotted string or a list of keys, got {path!r}")
    if any(p == "" for p in parts):
        raise DefinitionError(f"path {path!r} has an empty part")
    return tuple(parts)


def dig(value: object, path: Path, *, what: Callable[[], str]) -> object:
    """Follow ``path`` into ``value``; raise ArgumentResolutionError naming the failing key
    (and the value, as ``what()`` describes it: asked only then).

    Mappings are read by key, sequences by index, other objects by public attribute.
    """
    current = value
    for depth, key in enumerate(path):
        if isinstance(current, Mapping):
            if key not in current:
                available = ", ".join(sorted(map(str, current))) or "nothing"
                raise ArgumentResolutionError(
                    f"{what()} has no key {_prefix(path, depth)!r} (it has: {available})"
                )
            current = current[key]
        elif isinstance(current, Sequence) and not isinstance(current, str | bytes):
            try:
                current = current[int(key)]
            except (ValueError, IndexError):
                raise ArgumentResolutionError(
                    f"{what()}: {_prefix(path, depth)!r} is not a valid index into a list of "
                    f"{len(current)}"
                ) from None
        elif not key.startswith("_") and hasattr(current, key):
            # An object (a model instance a map element runs for): its public attribute.
            current = getattr(current, key)
        else:
            raise ArgumentResolutionError(
                f"{what()}: cannot look up {_prefix(path, depth)!r} in a {type(current).__name__}"
            )
    return current


def _prefix(path: Path, depth: int) -> str:
    """The dotted path down to the key at ``depth``, for an error."""
    return ".".join(path[: depth + 1])


@dataclass(frozen=True, slots=True)
class Template:
    """Base class of argument templates."""

    path: Path = ()
    transform: Callable[[Any], object] | None = None

    @property
    def depends_on(self) -> str | None:
        """The step this template reads the result of, if any."""
        return None

    def describe(self) -> str:
        raise NotImplementedError

    def lookup(self, scope: ResolutionScope) -> object:
        raise NotImplementedError

    def resolve(self, scope: ResolutionScope) -> object:
        value = self.lookup(scope)
        if self.path:
            value = dig(value, self.path, what=self.describe)
        if self.transform is not None:
            try:
                value = self.transform(value)
            except Exception as exc:
                raise ArgumentResolutionError(
                    f"the transform of {self.describe()} raised {type(exc).__name__}: {exc}"
                ) from exc
        return value

    def secret_paths(
        self,
        input_secrets: Sequence[SecretPath],
        result_secrets: Mapping[str, Sequence[SecretPath]] | None = None,
    ) -> list[SecretPath]:
        """Secret paths inside the value this template gives (``[()]``: all of it), from the
        reactor's secret inputs and the steps' secret results."""
        return []


@dataclass(frozen=True, slots=True)
class InputRef(Template):
    """A reactor input (``arg.input``)."""

    name: str = ""

    def describe(self) -> str:
        suffix = f" at {'.'.join(self.path)!r}" if self.path else ""
        return f"input {self.name!r}{suffix}"

    def lookup(self, scope: ResolutionScope) -> object:
        if self.name not in scope.inputs:
            raise ArgumentResolutionError(f"the run has no input {self.name!r}")
        return scope.inputs[self.name]

    def secret_paths(
        self,
        input_secrets: Sequence[SecretPath],
        result_secrets: Mapping[str, Sequence[SecretPath]] | None = None,
    ) -> list[SecretPath]:
        found = relative_secret_paths((self.name, *self.path), input_secrets)
        if found and self.transform is not None:
            return [()]  # a transformed secret is still a secret, whole
        return found


@dataclass(frozen=True, slots=True)
class ResultRef(Template):
    """Another step's result (``arg.result``); creates a dependency edge."""

    step: str = ""

    @property
    def depends_on(self) -> str | None:
        return self.step

    def describe(self) -> str:
        suffix = f" at {'.'.join(self.path)!r}" if self.path else ""
        return f"the result of step {self.step!r}{suffix}"

    def secret_paths(
        self,
        input_secrets: Sequence[SecretPath],
        result_secrets: Mapping[str, Sequence[SecretPath]] | None = None,
    ) -> list[SecretPath]:
        secrets = (result_secrets or {}).get(self.step, ())
        found = relative_secret_paths(self.path, [tuple(p) for p in secrets])
        if found and self.transform is not None:
            return [()]  # a transformed secret is still a secret, whole
        return found

    def lookup(self, scope: ResolutionScope) -> object:
        if self.step not in scope.results:
            raise ArgumentResolutionError(f"step {self.step!r} has no result yet")
        return scope.results[self.step]


@dataclass(frozen=True, slots=True)
class ValueRef(Template):
    """A literal value (``arg.value``)."""

    value: object = None

    def describe(self) -> str:
        return f"value {self.value!r}"

    def lookup(self, scope: ResolutionScope) -> object:
        return self.value


@dataclass(frozen=True, slots=True)
class ElementRef(Template):
    """The current element of a ``map_over`` (``arg.element``)."""

    def describe(self) -> str:
        suffix = f" at {'.'.join(self.path)!r}" if self.path else ""
        return f"the map element{suffix}"

    def lookup(self, scope: ResolutionScope) -> object:
        if scope.element is NO_ELEMENT:
            raise ArgumentResolutionError(
                "arg.element() only has a value inside map_over(): use it in a map's arguments"
            )
        return scope.element


NO_ELEMENT: Final = object()


@dataclass(frozen=True, slots=True)
class ResolutionScope:
    """What templates resolve against: the run's inputs, the results so far, a map element."""

    # Untyped values: user code reads them too (an interrupt's ``correlation_id(run)``).
    inputs: Mapping[str, Any]
    results: Mapping[str, Any]
    element: object = NO_ELEMENT


class _Arg:
    """Template constructors: ``arg.input``, ``arg.result``, ``arg.value``, ``arg.element``."""

    @staticmethod
    def input(
        name: str,
        path: str | Sequence[str | int] | None = None,
        *,
        transform: Callable[[Any], object] | None = None,
    ) -> InputRef:
        """The reactor input ``name`` (optionally a path inside it)."""
        _check_name(name, "arg.input")
        _check_transform(transform)
        return InputRef(name=name, path=parse_path(path), transform=transform)

    @staticmethod
    def result(
        step: str,
        path: str | Sequence[str | int] | None = None,
        *,
        transform: Callable[[Any], object] | None = None,
    ) -> ResultRef:
        """The result of ``step`` (optionally a path inside it); runs after that step."""
        _check_name(step, "arg.result")
        _check_transform(transform)
        return ResultRef(step=step, path=parse_path(path), transform=transform)

    @staticmethod
    def element(
        path: str | Sequence[str | int] | None = None,
        *,
        transform: Callable[[Any], object] | None = None,
    ) -> ElementRef:
        """The element a ``map_over`` runs for (optionally a path inside it)."""
        _check_transform(transform)
        return ElementRef(path=parse_path(path), transform=transform)

    @staticmethod
    def value(value: object, *, transform: Callable[[Any], object] | None = None) -> ValueRef:
        """A literal value."""
        _check_transform(transform)
        return ValueRef(value=value, transform=transform)


def _check_name(name: object, where: str) -> None:
    if not isinstance(name, str) or not name:
        raise DefinitionError(f"{where}() needs a name string, got {name!r}")


def _check_transform(transform: object) -> None:
    if transform is not None and not callable(transform):
        raise DefinitionError(f"transform must be callable, got {transform!r}")


arg = _Arg()
