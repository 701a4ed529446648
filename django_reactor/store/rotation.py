"""Re-encrypting stored secrets with the first configured key (``reactor_rotate_keys``).

In batches, table by table: subjects' data keys encrypted with another key are encrypted again;
envelopes sealed with another configured key are sealed again; secrets stored in clear (rows
written before secrets were sealed: inputs at their run's secret paths, step arguments at
their record's) are sealed. A subject's envelopes stay as they are: their data key is what
the configured keys encrypt.

Safe while workers run: each row is updated on condition that the column still holds what was
read (a run that wrote the row meanwhile wrote it sealed with the first key, and wins), so
nothing a run writes is lost. Idempotent: a token the first key reads is left alone, so a second
pass changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from django.db.models import Model, Q

from ..engine.sealing import envelope
from ..engine.serialization import JSONObject, JSONValue, replace_sealed
from ..exceptions import StoredValueUnreadable
from ..models import Execution, Interrupt, StepRecord, SubjectKey
from . import keyring
from .db import using
from .secrets import Sealer


@dataclass(slots=True)
class Progress:
    """How far a rotation got, over every table so far (``table``: the one it is in)."""

    table: str = ""
    scanned: int = 0
    rotated: int = 0
    sealed: int = 0
    keys: int = 0
    changed_meanwhile: int = 0
    unreadable: int = 0

    @property
    def rows_written(self) -> int:
        return self.rotated + self.sealed + self.keys


def rotate(*, batch_size: int, progress: Callable[[Progress], None] | None = None) -> Progress:
    """Rotate every stored secret to the first key; ``progress`` is told after each batch."""
    done = Progress()

    def tell() -> None:
        if progress is not None:
            progress(done)

    done.table = "subject keys"
    for rows in _batches(SubjectKey, batch_size, ["id", "key"], Q(key__isnull=False)):
        for key_id, wrapped in rows:
            done.scanned += 1
            if keyring.is_current(wrapped):
                continue
            try:
                fresh = keyring.rotate(wrapped, "a subject's data key")
            except StoredValueUnreadable:
                done.unreadable += 1
                continue
            if _write(done, SubjectKey, key_id, {"key": (wrapped, fresh)}):
                done.keys += 1
        tell()

    done.table = "executions"
    columns = ["id", "inputs", "secret_paths", "result", "subject"]
    for rows in _batches(Execution, batch_size, columns):
        for run_id, inputs, paths, result, subject in rows:
            done.scanned += 1
            changes = {
                "inputs": _reseal(done, inputs, paths, subject),
                "result": _reseal(done, result, (), subject),
            }
            _write_changes(done, Execution, run_id, {"inputs": inputs, "result": result}, changes)
        tell()

    done.table = "step records"
    columns = ["id", "arguments", "secret_arguments", "result", "execution__subject"]
    for rows in _batches(StepRecord, batch_size, columns):
        for record_id, arguments, paths, result, subject in rows:
            done.scanned += 1
            changes = {
                "arguments": _reseal(done, arguments, paths, subject),
                "result": _reseal(done, result, (), subject),
            }
            old = {"arguments": arguments, "result": result}
            _write_changes(done, StepRecord, record_id, old, changes)
        tell()

    done.table = "interrupts"
    for rows in _batches(Interrupt, batch_size, ["id", "payload"], Q(payload__isnull=False)):
        for interrupt_id, payload in rows:
            done.scanned += 1
            changes = {"payload": _reseal(done, payload, (), "")}
            _write_changes(done, Interrupt, interrupt_id, {"payload": payload}, changes)
        tell()
    return done


class _Resealed:
    """A column's new value, and how many secrets in it were rotated and sealed."""

    def __init__(self, value: JSONValue, rotated: int, sealed: int) -> None:
        self.value = value
        self.rotated = rotated
        self.sealed = sealed

    @property
    def changed(self) -> bool:
        return bool(self.rotated or self.sealed)


def _reseal(
    done: Progress, value: JSONValue, paths: Sequence[Sequence[str]] | Any, subject: str
) -> _Resealed:
    rotated = 0

    def again(payload: JSONObject) -> JSONValue | None:
        nonlocal rotated
        token = payload.get("token")
        if payload.get("key") is not None or not isinstance(token, str):
            return None  # a subject's: its data key is what rotates
        if keyring.is_current(token):
            return None
        try:
            fresh = keyring.rotate(token)
        except StoredValueUnreadable:
            done.unreadable += 1
            return None
        rotated += 1
        return envelope({"token": fresh})

    value = replace_sealed(value, again)
    sealed = 0
    if isinstance(paths, list) and paths:
        counting = _CountingSealer(subject)
        value = counting.sealed(value, [tuple(p) for p in paths if isinstance(p, list)])
        sealed = counting.count
    return _Resealed(value, rotated, sealed)


class _CountingSealer(Sealer):
    """A sealer that counts what it sealed (values in clear at a secret path)."""

    def __init__(self, subject: str) -> None:
        super().__init__(subject)
        self.count = 0

    def seal(self, value: JSONValue) -> JSONObject:
        self.count += 1
        return super().seal(value)


def _write_changes(
    done: Progress,
    model: type[Model],
    pk: Any,
    old: dict[str, JSONValue],
    changes: dict[str, _Resealed],
) -> None:
    changed = {name: (old[name], new.value) for name, new in changes.items() if new.changed}
    if changed and _write(done, model, pk, changed):
        done.rotated += sum(new.rotated for new in changes.values())
        done.sealed += sum(new.sealed for new in changes.values())


def _write(
    done: Progress, model: type[Model], pk: Any, columns: dict[str, tuple[Any, Any]]
) -> bool:
    """Update the row on condition that each column still holds what was read; whether it
    did (a row a run wrote meanwhile is counted in ``changed_meanwhile`` and left)."""
    condition = Q(pk=pk)
    for name, (old, _) in columns.items():
        condition &= Q(**{f"{name}__isnull": True}) if old is None else Q(**{name: old})
    updated = (
        model._default_manager.using(using())
        .filter(condition)
        .update(**{name: new for name, (_, new) in columns.items()})
    )
    if not updated:
        done.changed_meanwhile += 1
        return False
    return True


def _batches(
    model: type[Model], size: int, columns: list[str], where: Q | None = None
) -> Iterable[list[tuple[Any, ...]]]:
    """The rows of ``model`` in primary-key order, ``size`` at a time (keyset pages)."""
    last: Any = None
    while True:
        rows = model._default_manager.using(using()).all()
        if where is not None:
            rows = rows.filter(where)
        if last is not None:
            rows = rows.filter(pk__gt=last)
        page = list(rows.order_by("pk").values_list(*columns)[:size])
        if not page:
            return
        yield page
        last = page[-1][0]
