"""Map chunks written, claimed and settled in one statement each (``sql.WRITE_CHUNKS``,
``sql.CLAIM_CHUNK``, ``sql.SETTLE_FORWARD``, ...): PostgreSQL's
(``dialects.PostgreSQL``; the generic store does the same through the ORM, :mod:`.map_orm`)."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Sequence
from typing import Any

from django.db import connections, transaction

from ..conf import reactor_settings
from ..models import MapChunk
from . import sql
from .db import using
from .map_reads import ChunkClaim, Claimed, Settled, SlotWrite

Chunk = MapChunk.Status


def write_chunks(map_id: uuid.UUID, pieces: list[tuple[int, int, list[Any]]]) -> None:
    """``maps.write_items``'s pieces as pending chunks, in one statement per batch (the ORM's
    bulk_create costs ten times more here).

    Committed without waiting for the WAL to reach the disk (``synchronous_commit`` off for
    this transaction only): nothing reads the chunks of a map still being read but the next
    read, and ``maps.ready``, which makes the map runnable, commits synchronously, flushing the
    WAL of every batch before it. A server crash in between leaves the map unread, and a map
    found unread is read again from the start. Inside a caller's transaction the batch is
    written in it, as it commits."""
    connection = connections[using()]
    own = not connection.in_atomic_block
    with transaction.atomic(using=using()), connection.cursor() as cursor:
        if own:
            cursor.execute("SET LOCAL synchronous_commit TO off")
        cursor.execute(
            sql.WRITE_CHUNKS,
            [
                map_id,
                [start for start, _, _ in pieces],
                [size for _, size, _ in pieces],
                [_json(piece) for _, _, piece in pieces],
            ],
        )


def claim(map_id: uuid.UUID, *, forward: bool, token: str) -> ChunkClaim | None:
    """``maps.claim`` in one statement, in the caller's transaction."""
    params = {"map": map_id, **_claim_params(forward=forward, token=token)}
    if forward:
        row = sql.execute(sql.CLAIM_CHUNK, params)
        return None if row is None else _forward_claim(*row)
    with connections[using()].cursor() as cursor:
        cursor.execute(sql.CLAIM_UNDO_CHUNK, params)
        rows = cursor.fetchall()
    if not rows:
        return None
    return ChunkClaim(
        rows[0][0],
        [
            Claimed(index, _loads(item), _loads(undo))
            for _, index, item, undo in rows
            if index is not None
        ],
    )


def _claim_params(*, forward: bool, token: str) -> dict[str, Any]:
    return {
        "token": token,
        "lease": float(reactor_settings.LEASE_SECONDS),
        "fresh": Chunk.PENDING if forward else Chunk.SETTLED,
        "taken": Chunk.RUNNING if forward else Chunk.UNDOING,
        "plus": 1 if forward else 0,
    }


def _forward_claim(chunk: int, first: int, items: Any, attempts: int) -> ChunkClaim:
    """The chunk a forward claim took, as its elements to run (``attempts``: the chunk's
    claims, this one included)."""
    return ChunkClaim(
        chunk,
        [
            Claimed(first + offset, item, None, attempts - 1)
            for offset, item in enumerate(_loads(items))
        ],
    )


def settle_forward(
    map_id: uuid.UUID,
    chunk: int,
    writes: Sequence[SlotWrite],
    token: str,
    counters: dict[str, int],
    first_failure: int | None,
    now: dt.datetime,
    claim_next: bool,
    retaken: bool,
) -> tuple[Settled | None, ChunkClaim | None]:
    """``sql.SETTLE_FORWARD``, prepared: the map's progress (None: the chunk was taken over,
    nothing written) and the next chunk claimed (None: none, or not asked). ``counters``
    (settled, succeeded, failed, halted, not_started) go to the task's tally; ``retaken``: the
    chunk was claimed before this claim (its slots may exist)."""
    statement = sql.SETTLE_FORWARD.format(
        again=sql.SETTLE_AGAIN if retaken else "",
        claim=sql.SETTLE_FORWARD_CLAIM if claim_next else "",
        next_chunk="claimed.id, claimed.first, claimed.items::text, claimed.attempts"
        if claim_next
        else "NULL, NULL, NULL, NULL",
        join_next="LEFT JOIN claimed ON true" if claim_next else "",
    )
    params: dict[str, Any] = {
        "map": map_id,
        "chunk": chunk,
        "token": token,
        "succeeded": counters["succeeded"],
        "now": now,
        "first_failure": first_failure,
        # One JSON document for the chunk: one encode here, no per-element array quoting.
        "outcomes": _json([[w.index, w.status, w.value, w.error, w.undo] for w in writes]),
        **counters,
    }
    if claim_next:
        params.update(_claim_params(forward=True, token=token))
    row = sql.execute(statement, params)
    assert row is not None  # the statement always returns its one row
    progress = Settled(*row[:9]) if row[0] is not None else None
    following = _forward_claim(*row[9:13]) if row[9] is not None else None
    return progress, following


def settle_undo(
    map_id: uuid.UUID,
    chunk: int,
    writes: Sequence[SlotWrite],
    token: str,
    counters: dict[str, int],
    now: dt.datetime,
) -> Settled | None:
    """``sql.SETTLE_UNDO``, atomic on its own: the map's progress, or None (the chunk was
    taken over, nothing written)."""
    statement = sql.SETTLE_UNDO.format(
        counters=", ".join(f"{name} = {name} + %({name})s" for name in counters)
    )
    params: dict[str, Any] = {
        "map": map_id,
        "chunk": chunk,
        "token": token,
        "now": now,
        "outcomes": _json([[w.index, w.status, w.error] for w in writes]),
        **counters,
    }
    row = sql.execute(statement, params)
    return Settled(*row) if row is not None else None


def never_start(map_id: uuid.UUID, now: dt.datetime) -> int:
    """``sql.NEVER_START``: the chunks never claimed of a stopped map settled ``not_started``;
    how many elements."""
    with connections[using()].cursor() as cursor:
        cursor.execute(sql.NEVER_START, {"map": map_id, "now": now})
        return int(cursor.fetchone()[0])


def _json(value: Any) -> str | None:
    return None if value is None else json.dumps(value, separators=(",", ":"))


def _loads(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value
