"""Running ``map_over`` steps durably: reading the source, running and undoing elements.

A map's source is read once into one slot per element (``MapResult``), in batches, so memory
stays flat however large it is. Elements then run a chunk at a time: in the run's own process
(inline), or in ``django_reactor.map_elements`` tasks that each claim the next pending chunk
until none is left (``fan_out=True``; at most ``batch_size`` elements in flight). Undoing
works the same way, highest index first. See :mod:`django_reactor.store.maps` for the fan-in.
"""

from __future__ import annotations

import functools
import logging
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.apps import apps
from django.db.models import Model, QuerySet
from django.db.models.query import ModelIterable

from .. import registry, store
from ..conf import reactor_settings
from ..engine.constructs.map import (
    MapDone,
    MapPending,
    MapRollbackPending,
    MapSourceError,
    MapSpec,
    MapStopped,
)
from ..engine.elements import (
    ElementOutcome,
    ElementRunner,
    element_id,
    rollback_element,
    running_element,
)
from ..engine.outcomes import ErrorInfo, ErrorKind, RollbackFailure, qualified_class_name
from ..engine.serialization import JSONValue, decode, encode, register_decoder
from ..exceptions import ArgumentResolutionError, ResultNotSerializable
from ..states import ElementStatus, MapStatus
from .connections import reconnect

if TYPE_CHECKING:
    from ..models import MapRun

logger = logging.getLogger("django_reactor.maps")

#: Seconds between checks, inside a chunk, that another element has not stopped the map.
STOP_CHECK_INTERVAL = 0.05
#: Seconds an element task works before it hands the rest to a fresh task (fairness).
TASK_BUDGET = 10.0
#: Seconds between two folds of a task's tally into its map's counters.
FOLD_INTERVAL = 1.0
#: Rows read from a QuerySet source per query.
QUERYSET_CHUNK = 1000


# ---------------------------------------------------------------------------- results


@dataclass(frozen=True, slots=True)
class ElementResult:
    """One element's outcome, as :meth:`MapResults.outcomes` gives it."""

    index: int
    status: str
    value: Any = None
    error: dict[str, Any] | None = None

    @property
    def succeeded(self) -> bool:
        return self.status == ElementStatus.SUCCEEDED


class MapResults:
    """A map's results, read lazily from the database in index order.

    ``for value in results`` gives the value of every element that succeeded;
    :meth:`outcomes` every element with its status; :meth:`failures` the failed ones;
    :meth:`summary` the totals. Stored in a step's result as a reference, never a copy.
    """

    page_size = 500

    def __init__(self, map_id: uuid.UUID | str) -> None:
        self.map_id = uuid.UUID(str(map_id))
        #: The database of the map's run (made while it is bound): read there wherever read.
        self.alias = store.using()

    def __reactor_encode__(self) -> tuple[str, str]:
        return "map_results", str(self.map_id)

    def __repr__(self) -> str:
        return f"<MapResults {self.map_id}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MapResults) and other.map_id == self.map_id

    def __hash__(self) -> int:
        return hash(self.map_id)

    def __len__(self) -> int:
        with store.bound(self.alias):
            return store.maps.count(self.map_id, [ElementStatus.SUCCEEDED, ElementStatus.UNDONE])

    def __iter__(self) -> Iterator[Any]:
        for result in self._read([ElementStatus.SUCCEEDED, ElementStatus.UNDONE]):
            yield result.value

    def values(self) -> list[Any]:
        """Every succeeded element's value, in index order (reads them all)."""
        return list(self)

    def outcomes(self) -> Iterator[ElementResult]:
        """Every element, in index order."""
        return self._read(None)

    def failures(self) -> Iterator[ElementResult]:
        """The elements that failed, in index order."""
        return self._read([ElementStatus.FAILED])

    def summary(self) -> dict[str, Any]:
        """Totals by outcome and up to 25 sampled failures (see ``store.maps.summary``)."""
        with store.bound(self.alias):
            return store.maps.summary(self.map_id)

    def _read(self, statuses: list[str] | None) -> Iterator[ElementResult]:
        after = -1
        while True:
            with store.bound(self.alias):
                rows = store.maps.page(
                    self.map_id, after=after, limit=self.page_size, statuses=statuses
                )
            for index, status, value, error in rows:
                yield ElementResult(index, status, decode(value), error)
            if len(rows) < self.page_size:
                return
            after = rows[-1][0]


register_decoder("map_results", MapResults)


def displayable(value: Any) -> Any:
    """``value`` with every map result reader replaced by a short reference (for JSON output:
    the API, ``reactor_show``); a map's elements are never inlined."""
    if isinstance(value, MapResults):
        return {"map_results": str(value.map_id)}
    if isinstance(value, dict):
        return {key: displayable(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [displayable(item) for item in value]
    return value


# ---------------------------------------------------------------------------- the runner


class MapRunnerMixin:
    """The map half of the child runner the executor is given (see ``composition``)."""

    parent_id: uuid.UUID
    in_worker: bool

    def run_map(
        self, step: str, spec: MapSpec, source: object, shared: Mapping[str, object]
    ) -> MapDone | MapStopped | MapPending:
        run = store.maps.find(self.parent_id, step)
        if run is None or run.status == MapStatus.MATERIALISING:
            run = _materialise(self.parent_id, step, spec, source, shared)
        if run.status == MapStatus.RUNNING and not run.fan_out:
            if self._resumed_inline(run):
                store.maps.abandon_running(
                    run.pk, "the process running this element stopped before it settled"
                )
            _work(run.pk, spec, forward=True, budget=None)
            run = store.maps.get(run.pk)
            assert run is not None
        if run.status == MapStatus.RUNNING:
            return MapPending()
        return _outcome(run, spec)

    def _resumed_inline(self, run: MapRun) -> bool:
        # An inline map found running with claimed chunks: the process that claimed them died
        # (the run's own lease guarantees no other process is working on it).
        return store.maps.running_chunks(run.pk)

    def map_parked(self, step: str) -> None:
        run = store.maps.find(self.parent_id, step)
        if run is not None and run.status in (MapStatus.SETTLED, MapStatus.ROLLED_BACK):
            store.maps.wake_run(self.parent_id)

    def rollback_map(self, step: str, spec: MapSpec) -> list[RollbackFailure]:
        run = store.maps.find(self.parent_id, step)
        if run is None or run.status == MapStatus.MATERIALISING:
            return []  # no element ran
        if run.status == MapStatus.RUNNING:
            if not run.fan_out and self._resumed_inline(run):
                store.maps.abandon_running(run.pk, "the run was rolled back while it ran")
            run = store.maps.stop(run.pk, "cancelled")
            if run.status == MapStatus.RUNNING:
                raise MapRollbackPending(step)  # elements in flight settle first
        if run.status == MapStatus.SETTLED and spec.config.undo_all is not None:
            return _undo_all(run, spec, step)
        run = store.maps.start_rollback(run.pk, store.maps.tasks_for(run))
        if run.status == MapStatus.ROLLING_BACK:
            if run.fan_out:
                raise MapRollbackPending(step)
            _work(run.pk, spec, forward=False, budget=None)
        return _rollback_failures(run.pk, step) + _missing_elements(run, step)


def _undo_all(run: MapRun, spec: MapSpec, step: str) -> list[RollbackFailure]:
    undo_all = spec.config.undo_all
    assert undo_all is not None
    failure: RollbackFailure | None = None
    try:
        undo_all(MapResults(run.pk))
    except Exception as exc:
        failure = RollbackFailure(
            step=step,
            action="undo_all",
            exception_class=qualified_class_name(exc),
            message=str(exc) or type(exc).__name__,
        )
    store.maps.mark_all_undone(run.pk, [failure.to_dict()] if failure else None)
    return [failure] if failure else []


def _rollback_failures(map_id: uuid.UUID, step: str) -> list[RollbackFailure]:
    failures = []
    for index, errors in store.maps.rollback_errors(map_id):
        for error in errors or []:
            if error.get("action") == "undo_all":
                return [RollbackFailure.from_dict(error)]  # one action, reported once
            failures.append(
                RollbackFailure(
                    step=f"{step}[{index}].{error.get('step', '')}",
                    action=error.get("action", "undo"),
                    exception_class=error.get("exception_class"),
                    message=error.get("message", ""),
                    index=index,
                )
            )
    return failures


MISSING_REPORTED = 25


def _missing_elements(run: MapRun, step: str) -> list[RollbackFailure]:
    """Elements whose slot row is gone: their undo could not run, and the rollback says so
    (it cannot tell whether they had succeeded)."""
    assert run.size is not None  # known once the map's source was read
    missing = store.maps.missing_indices(run.pk, run.size)
    failures = [
        RollbackFailure(
            step=f"{step}[{index}]",
            action="undo",
            exception_class=None,
            message=f"element {index} of the map has no stored row (it was deleted), so it "
            "could not be undone; undo its work by hand if it had succeeded",
            index=index,
            kind="missing",
        )
        for index in missing[:MISSING_REPORTED]
    ]
    if len(missing) > MISSING_REPORTED:
        failures.append(
            RollbackFailure(
                step=f"{step}[*]",
                action="undo",
                exception_class=None,
                message=f"{len(missing) - MISSING_REPORTED} more elements have no stored row "
                f"(indices up to {missing[-1]})",
                kind="missing",
            )
        )
    return failures


def _outcome(run: MapRun, spec: MapSpec) -> MapDone | MapStopped:
    """The settled map as the step's outcome: its value, or why it failed or halted."""
    if run.status in (MapStatus.ROLLING_BACK, MapStatus.ROLLED_BACK):
        return MapStopped(
            error=ErrorInfo(kind=ErrorKind.STEP, message="the map's elements were rolled back")
        )
    if run.stop_reason == "halted":
        halted = store.maps.page(run.pk, after=-1, limit=1, statuses=[ElementStatus.HALTED])
        index = halted[0][0] if halted else "?"
        reason = (halted[0][3] or {}).get("reason", "") if halted else ""
        return MapStopped(halt_reason=f"map element {index} halted: {reason}".rstrip(": "))
    if run.stop_reason in ("failed", "cancelled") and run.failed:
        return MapStopped(error=_failure(run, spec))
    if run.stop_reason == "cancelled":
        return MapStopped(error=ErrorInfo(kind=ErrorKind.STEP, message="the map was cancelled"))
    results = MapResults(run.pk)
    collect = spec.config.collect
    if collect is None:
        return MapDone(results)
    try:
        return MapDone(collect(results))
    except Exception as exc:
        import traceback

        return MapStopped(
            error=ErrorInfo(
                kind=ErrorKind.STEP,
                message=f"the map's collect {getattr(collect, '__qualname__', collect)!r} "
                f"raised {type(exc).__name__}: {exc}",
                exception_class=qualified_class_name(exc),
                traceback="".join(traceback.format_exception(exc)),
            )
        )


def _failure(run: MapRun, spec: MapSpec) -> ErrorInfo:
    index = run.first_failure
    slot = store.maps.slot(run.pk, index) if index is not None else None
    inner = ErrorInfo.from_dict(slot.error) if slot is not None and slot.error else None
    where = f" at step {inner.step!r}" if inner is not None and inner.step else ""
    detail = inner.message if inner is not None else "unknown error"
    if run.atomic:
        message = f"map element {index} (of {run.size}) failed{where}: {detail}"
    else:
        message = (
            f"{run.failed} of {run.size} map elements failed, more than max_failures="
            f"{spec.config.max_failures!r} allows; the first, element {index}, failed{where}: "
            f"{detail}"
        )
    return ErrorInfo(
        kind=inner.kind if inner is not None else ErrorKind.STEP,
        message=message,
        exception_class=inner.exception_class if inner is not None else None,
        traceback=inner.traceback if inner is not None else "",
        field_errors=inner.field_errors if inner is not None else {},
        retryable=False,
    )


# ---------------------------------------------------------------------------- the source


def _materialise(
    parent_id: uuid.UUID, step: str, spec: MapSpec, source: object, shared: Mapping[str, object]
) -> MapRun:
    """Read the source into pending slots, in batches; the map is then running."""
    try:
        stored_shared = encode(dict(shared))
    except ResultNotSerializable as exc:
        raise MapSourceError(f"the map's arguments cannot be stored: {exc}") from exc
    model = _model_source(source)
    config = spec.config
    run = store.maps.start(
        parent_id,
        step,
        fan_out=config.fan_out,
        batch_size=config.batch_size,
        chunk_size=config.chunk_size,
        atomic=config.atomic,
        shared=stored_shared,
        source_model=model._meta.label if model is not None else "",
    )
    size = 0
    try:
        for batch in _batches(source, model is not None):
            store.maps.write_items(run.pk, size, batch, chunk_size=run.chunk_size)
            size += len(batch)
    except MapSourceError:
        store.maps.discard(run.pk)  # nothing ran: the map step fails as if never reached
        raise
    return store.maps.ready(run.pk, size, spec.tolerated(size))


def _model_source(source: object) -> type[Model] | None:
    if isinstance(source, QuerySet) and source._iterable_class is ModelIterable:
        return source.model
    return None


def _batches(source: Any, model_rows: bool) -> Iterator[list[JSONValue]]:
    # ``source``: whatever the map's source gave, iterated if it can be (TypeError if not).
    if isinstance(source, QuerySet):
        yield from _queryset_batches(source, model_rows)
        return
    if isinstance(source, str | bytes | Mapping) or source is None:
        raise MapSourceError(
            f"the map's source must be a list, an iterable or a QuerySet, got "
            f"{type(source).__name__}"
        )
    try:
        iterator = iter(source)
    except TypeError:
        raise MapSourceError(
            f"the map's source is not iterable: got {type(source).__name__}"
        ) from None
    batch: list[JSONValue] = []
    index = 0
    while True:
        try:
            item = next(iterator)
        except StopIteration:
            break
        except Exception as exc:
            raise MapSourceError(
                f"the map's source raised {type(exc).__name__} while reading element {index}: {exc}"
            ) from exc
        try:
            batch.append(encode(item))
        except ResultNotSerializable as exc:
            raise MapSourceError(f"map element {index} cannot be stored: {exc}") from exc
        index += 1
        if len(batch) >= store.maps.MATERIALISE_BATCH:
            yield batch
            batch = []
    if batch:
        yield batch


def _queryset_batches(queryset: QuerySet[Any], model_rows: bool) -> Iterator[list[JSONValue]]:
    """Keyset pages in primary-key order: never the whole table in memory, never OFFSET."""
    ordered = queryset.order_by("pk")
    last: object = None
    while True:
        page = ordered if last is None else ordered.filter(pk__gt=last)
        try:
            keys = list(page.values_list("pk", flat=True)[:QUERYSET_CHUNK])
        except Exception as exc:
            raise MapSourceError(
                f"the map's QuerySet source failed: {type(exc).__name__}: {exc}"
            ) from exc
        if not keys:
            return
        last = keys[-1]
        if model_rows:
            yield [encode(key) for key in keys]
        else:
            rows = list(queryset.filter(pk__in=keys).order_by("pk"))
            try:
                yield [encode(row) for row in rows]
            except ResultNotSerializable as exc:
                raise MapSourceError(
                    f"a row of the map's QuerySet cannot be stored: {exc}"
                ) from exc
        if len(keys) < QUERYSET_CHUNK:
            return


# ---------------------------------------------------------------------------- the work


def work(
    map_id: uuid.UUID | str, *, forward: bool, published_for: store.DatabaseMark | None = None
) -> None:
    """Entry point of the element tasks: run (or undo) elements of the map until none is left,
    in the database of the map's run (the one the message names when several are configured,
    ``REACTOR["DATABASE"]``, else the one that has the map)."""
    alias = store.database_of_message(published_for, lambda: store.maps.get(map_id) is not None)
    with store.bound(alias):
        _work_here(map_id, forward=forward, published_for=published_for)


def _work_here(
    map_id: uuid.UUID | str, *, forward: bool, published_for: store.DatabaseMark | None = None
) -> None:
    """Run (or undo) elements of the map until none is left, in the bound database.

    ``published_for``: the database the task's message was published for; a map this database
    does not have raises WrongDatabase when that is another database (see ``store.identity``).
    """
    run = store.reconnecting(lambda: store.maps.get(map_id), what=f"reading map {map_id}")
    if run is None:
        store.refuse_foreign(published_for, f"the task for the elements of map {map_id}")
        logger.warning("map %s no longer exists; nothing to do", map_id)
        return
    spec = _spec_of(run)
    if spec is None:
        return
    if run.status != (MapStatus.RUNNING if forward else MapStatus.ROLLING_BACK):
        # Nothing left for this task: its dispatch is taken all the same (the sweeper would
        # publish it again otherwise).
        store.outbox.mark_taken(map_id=run.pk)
        return
    _work(run.pk, spec, forward=forward, budget=TASK_BUDGET)


def _spec_of(run: MapRun) -> MapSpec | None:
    try:
        definition = registry.of_run(run.execution.reactor, run.execution.version).definition
        spec = definition.step(run.step).map
    except Exception:
        logger.error(
            "map %s: step %r of reactor %r is not a map in this code version; its elements "
            "cannot run",
            run.pk,
            run.step,
            run.execution.reactor,
            exc_info=True,
        )
        return None
    return spec


def _work(map_id: uuid.UUID, spec: MapSpec, *, forward: bool, budget: float | None) -> None:
    run = store.maps.get(map_id)
    assert run is not None
    if forward:
        store.maps.add_tallies(run)  # the map's failures so far, folded or not
    shared = decode(run.shared)
    model = apps.get_model(run.source_model) if run.source_model else None
    # Atomic maps tolerate no failure; None below means "no limit" only for non-atomic ones.
    tolerated = None if run.atomic else run.max_failures
    deadline = time.monotonic() + budget if budget is not None else None
    token = uuid.uuid4().hex
    # The process's heartbeat thread keeps the chunk this task holds leased meanwhile.
    with store.maps.SlotKeeper(map_id, token):
        claim, stopped = store.reconnecting(
            lambda: store.maps.claim(map_id, forward=forward, token=token),
            what=f"claiming elements of map {map_id}",
        )
        if claim is None:
            # Nothing left to claim: the settle of the last chunk may have died between its
            # commit and the fan-in (or the rollback's end) that follows it.
            finish = store.maps.finish_if_settled if forward else store.maps.finish_if_undone
            store.reconnecting(lambda: finish(map_id), what=f"finishing map {map_id}")
            return
        # A map past its failure line that was not stopped (the settle that crossed it died
        # before it stopped the map) starts nothing more; this task's first settle stops it.
        stopped = stopped or store.maps.past_failure_line(run.failed, run.halted, tolerated)
        failed = run.failed  # the map's failures so far, as each settle leaves them
        folded = time.monotonic()
        while claim is not None:
            claimed = claim.slots
            items = _items(claimed, model)
            # Out of time: settle without claiming more, and hand the rest to a fresh task.
            out_of_time = deadline is not None and time.monotonic() > deadline
            if forward:
                allowed = None if tolerated is None else tolerated - failed
                writes = _run_chunk(map_id, spec, shared, claimed, items, allowed, stopped)
            else:
                writes = _undo_chunk(map_id, spec, shared, claimed, items)
            settle = functools.partial(
                _settle,
                map_id,
                claim.chunk,
                writes,
                forward,
                tolerated,
                token,
                retaken=claim.retaken,
            )
            try:
                failed, (claim, stopped) = settle(not out_of_time, failed)
            except store.CONNECTION_ERRORS:
                # The elements ran: store their outcomes on a new connection (a settle that did
                # commit writes nothing the second time, since it only writes a chunk this
                # task still holds), then let a fresh task claim what is left.
                store.refresh_connections()
                store.reconnecting(
                    functools.partial(settle, False, failed),
                    what=f"settling elements of map {map_id}",
                )
                store.maps.give_back(map_id, token, forward=forward)  # a next chunk it claimed
                out_of_time = True
            if out_of_time:
                store.maps.hand_over(map_id, forward=forward)
                return
            if forward and time.monotonic() - folded > FOLD_INTERVAL:
                # The map's counters (what the admin shows) catch up with this task's tally.
                store.reconnecting(
                    functools.partial(store.maps.fold, map_id, token),
                    what=f"counting map {map_id}",
                )
                folded = time.monotonic()
        if forward:
            # This task's last settle, and another task's at the same moment, may each have
            # counted without the other: whichever comes here last sees both and fans in.
            store.reconnecting(
                functools.partial(store.maps.finish_if_settled, map_id),
                what=f"finishing map {map_id}",
            )


def _settle(
    map_id: uuid.UUID,
    chunk: int,
    writes: list[store.maps.SlotWrite],
    forward: bool,
    tolerated: int | None,
    token: str,
    claim_next: bool,
    failed: int,
    *,
    retaken: bool,
) -> tuple[int, tuple[store.maps.ChunkClaim | None, bool]]:
    """Store a chunk's outcomes (and claim the next chunk in the same transaction): the
    map's failures so far, and the next chunk (``retaken``: the chunk was claimed before)."""
    if forward:
        settled, following = store.maps.settle(
            map_id,
            chunk,
            writes,
            tolerated=tolerated,
            token=token,
            claim_next=claim_next,
            retaken=retaken,
        )
        return settled.failed, following
    _, following = store.maps.settle_rollback(
        map_id, chunk, writes, token=token, claim_next=claim_next
    )
    return failed, following


def _items(claimed: list[store.maps.Claimed], model: type[Model] | None) -> dict[int, object]:
    if model is None:
        return {slot.index: decode(slot.item) for slot in claimed}
    keys = {slot.index: decode(slot.item) for slot in claimed}
    rows = model._base_manager.in_bulk(list(keys.values()))
    return {index: rows.get(key, _Missing(model, key)) for index, key in keys.items()}


@dataclass(frozen=True, slots=True)
class _Missing:
    model: type[Model]
    key: object


def _run_chunk(
    map_id: uuid.UUID,
    spec: MapSpec,
    shared: Mapping[str, object],
    claimed: list[store.maps.Claimed],
    items: dict[int, object],
    allowed_failures: int | None,
    stop: bool,
) -> list[store.maps.SlotWrite]:
    """Run claimed elements in order; stop starting new ones once the map must fail.

    Once stopped, a slot nobody ran is settled ``not_started``; a slot a dead process was
    running is settled failed: part of its work may be done, and nothing records how to undo it.
    """
    writes: list[store.maps.SlotWrite] = []
    failures = 0
    checked = time.monotonic()
    # Built once per chunk (the retry cap and reconnect read once): elements are many.
    runner = ElementRunner(
        spec.element_definition,
        map_id,
        max_retry_delay=reactor_settings.MAX_INLINE_RETRY_DELAY,
        reconnect=reconnect(),
    )
    for slot in claimed:
        now = time.monotonic()
        if not stop and now - checked > STOP_CHECK_INTERVAL:
            stop = store.reconnecting(
                functools.partial(store.maps.stopped_map, map_id), what=f"reading map {map_id}"
            )
            checked = now
        if stop and slot.attempts:
            error = ErrorInfo(
                kind=ErrorKind.INTERRUPTED,
                message="the process running this element stopped before it settled, and the "
                "map had stopped meanwhile",
            )
            writes.append(
                store.maps.SlotWrite(slot.index, ElementStatus.FAILED, error=error.to_dict())
            )
            continue
        if stop:
            writes.append(store.maps.SlotWrite(slot.index, ElementStatus.NOT_STARTED))
            continue
        outcome = _run_one(spec, shared, items[slot.index], runner, slot.index)
        writes.append(
            store.maps.SlotWrite(
                slot.index,
                outcome.status,
                value=outcome.value if outcome.status == ElementStatus.SUCCEEDED else None,
                error=outcome.error
                if outcome.status != ElementStatus.HALTED
                else {"reason": outcome.halt_reason},
                undo=outcome.undo,
            )
        )
        failures += outcome.status == ElementStatus.FAILED
        if outcome.status == ElementStatus.HALTED or (
            outcome.status == ElementStatus.FAILED
            and (allowed_failures is None or failures > allowed_failures)
        ):
            stop = True
    return writes


def _run_one(
    spec: MapSpec, shared: Mapping[str, object], item: object, runner: ElementRunner, index: int
) -> ElementOutcome:
    if isinstance(item, _Missing):
        return _failed(
            f"row {item.key!r} of {item.model._meta.label} no longer exists", ErrorKind.ARGUMENT
        )
    try:
        inputs = spec.element_inputs(shared, item)
    except ArgumentResolutionError as exc:
        return _failed(f"the element's arguments could not be resolved: {exc}", ErrorKind.ARGUMENT)
    return runner.run_at(index, inputs)


def _failed(message: str, kind: str) -> ElementOutcome:
    return ElementOutcome(
        ElementStatus.FAILED, error=ErrorInfo(kind=kind, message=message).to_dict()
    )


def _undo_chunk(
    map_id: uuid.UUID,
    spec: MapSpec,
    shared: Mapping[str, object],
    claimed: list[store.maps.Claimed],
    items: dict[int, object],
) -> list[store.maps.SlotWrite]:
    writes = []
    recovers = reconnect()  # read once per chunk: elements are many
    for slot in claimed:  # claimed highest index first
        item = items[slot.index]
        failures: list[RollbackFailure]
        if isinstance(item, _Missing):
            failures = [
                RollbackFailure(
                    step="",
                    action="undo",
                    exception_class=None,
                    message=f"row {item.key!r} of {item.model._meta.label} no longer exists",
                )
            ]
        else:
            try:
                inputs = spec.element_inputs(shared, item)
                with running_element(map_id, slot.index):
                    failures = rollback_element(
                        spec.element_definition,
                        inputs,
                        slot.undo,
                        identity=element_id(map_id, slot.index),
                        reconnect=recovers,
                    )
            except Exception as exc:
                failures = [
                    RollbackFailure(
                        step="",
                        action="undo",
                        exception_class=qualified_class_name(exc),
                        message=str(exc) or type(exc).__name__,
                    )
                ]
        writes.append(
            store.maps.SlotWrite(
                slot.index,
                ElementStatus.UNDO_FAILED if failures else ElementStatus.UNDONE,
                error=[f.to_dict() for f in failures] if failures else None,
            )
        )
    return writes
