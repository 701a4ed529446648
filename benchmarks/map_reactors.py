"""The reactors ``map_fanout.py`` runs: one ``map_over`` step of no-op elements, fanned out.

``Map_b100_c50`` maps ``noop_element`` (a function step returning its item) over
``range(count)`` with ``fan_out=True, batch_size=100, chunk_size=50`` (the library's default:
``chunk_size = max(1, min(50, batch_size // 2))``); the other classes try other
``batch_size`` / ``chunk_size`` pairs. ``MapFailing`` is the same map with ``atomic=False``
and elements that fail when ``item % fail_every == 0`` (its failure sample is not empty).

The source is a callable over the map's arguments, so that neither the run's inputs nor the
process that starts the run ever hold the whole collection. Workers find the reactors by their
dotted names (``benchmarks.map_reactors.Map_b100_c50``), so run them with the repository root on
``PYTHONPATH``.
"""

from __future__ import annotations

from typing import Any, cast

from django_reactor import Reactor, arg, map_over

#: (batch_size, chunk_size) pairs with a reactor each; the first is the library's default.
CONFIGS: list[tuple[int, int]] = [(100, 50), (100, 25), (200, 50), (500, 100), (1000, 250)]
DEFAULT = CONFIGS[0]


def numbers(count: int) -> range:
    """The map's source: ``0 .. count - 1``, produced lazily."""
    return range(count)


def noop_element(item: int, count: int) -> int:
    """An element that does nothing: returns its item."""
    return item


def failing_element(item: int, count: int, fail_every: int) -> int:
    """An element that fails for every ``fail_every``-th item."""
    if item % fail_every == 0:
        raise ValueError(f"element {item} fails on purpose")
    return item


def name_of(batch_size: int, chunk_size: int) -> str:
    return f"Map_b{batch_size}_c{chunk_size}"


def _map_reactor(batch_size: int, chunk_size: int) -> type[Reactor]:
    attrs: dict[str, Any] = {
        "__module__": __name__,
        "elements": map_over(
            numbers,
            noop_element,
            item=arg.element(),
            count=arg.input("count"),
            fan_out=True,
            batch_size=batch_size,
            chunk_size=chunk_size,
        ),
    }
    name = name_of(batch_size, chunk_size)
    return cast("type[Reactor]", type(name, (Reactor,), attrs))


REACTORS: dict[tuple[int, int], type[Reactor]] = {}
for _batch, _chunk in CONFIGS:
    REACTORS[_batch, _chunk] = globals()[name_of(_batch, _chunk)] = _map_reactor(_batch, _chunk)


class MapFailing(Reactor):
    """The default map, tolerant (``atomic=False``); every ``fail_every``-th element fails."""

    elements = map_over(
        numbers,
        failing_element,
        item=arg.element(),
        count=arg.input("count"),
        fail_every=arg.input("fail_every"),
        fan_out=True,
        atomic=False,
    )
