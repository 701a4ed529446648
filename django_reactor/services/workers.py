"""What a worker's tasks do: resume a run from its last checkpoint, and sweep."""

from __future__ import annotations

import contextlib
import functools
import logging
import time
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from django.db import connections
from django.utils import timezone

from .. import registry, store
from ..conf import reactor_settings
from ..engine.actors import Actor, acting_as
from ..engine.constructs.map import MapRollbackPending
from ..engine.outcomes import (
    ErrorKind,
    Outcome,
    Rescheduled,
    qualified_class_name,
)
from ..engine.serialization import decode, printable
from ..engine.state import RunState
from ..exceptions import (
    LeaseLost,
    PatchRemoved,
    ReactorNotRegistered,
    StoredValueUnreadable,
    SubjectErased,
    VersionMissing,
    WrongDatabase,
)
from ..runtime import executors
from ..states import EventKind

if TYPE_CHECKING:
    from ..engine.definition import ReactorDefinition
    from ..models import Execution
    from ..reactor import Reactor


from . import flow
from .attention import park
from .bulk import republish_stalled
from .databases import in_each_database
from .deadlines import expire_deadlines
from .events import finish_events
from .forks import release_waiting_forks
from .health import ProcessSeen, record_sweep, worker_with_code
from .interrupts import after_pause, deliver_kept_messages, expire_interrupts
from .patches import park_removed
from .schedules import fire_due
from .secrets import fail_erased

DATABASE_ERROR_RETRIES = 3

#: Who the sweeper's steering actions are recorded as.
SWEEPER = Actor("sweeper", "system")

logger = logging.getLogger("django_reactor.services")


#: How many runs of a batch (``resume_many``) a worker claims in one round trip. The runs
#: claimed wait their turn with their leases kept; a worker that dies leaves at most this many
#: to wait out their leases (``LEASE_SECONDS``) before the sweeper hands them on.
CLAIM_AHEAD = 10


def resume(
    execution_id: uuid.UUID | str, *, published_for: store.DatabaseMark | None = None
) -> Outcome | None:
    """Run an execution from its last checkpoint in this process (the worker's task), in the
    database that holds it: the one the message names when several are configured
    (``REACTOR["DATABASE"]``), else the one it is found in."""
    with store.bound(
        store.database_of_message(published_for, lambda: store.holds_run(execution_id))
    ):
        return _resume_here(execution_id, published_for=published_for)


def resume_many(
    execution_ids: Sequence[uuid.UUID | str], *, published_for: store.DatabaseMark | None = None
) -> None:
    """Run each execution of a batch (the sweeper's wake-ups, due together) from its last
    checkpoint, one after the other, as ``resume`` runs one: ``CLAIM_AHEAD`` claimed at a time
    in one round trip, where the database allows, their leases kept while they wait their turn.

    A run that raises is logged and the others go on; WrongDatabase (the message is for
    another database) stops the batch. An id that is not an execution id is logged and
    skipped.
    """
    keys = [key for key in map(_execution_key, execution_ids) if key is not None]
    if not keys:
        return
    with store.bound(store.database_of_message(published_for, lambda: store.holds_run(keys[0]))):
        owner = store.lease_owner_token()
        for start in range(0, len(keys), CLAIM_AHEAD):
            _resume_together(keys[start : start + CLAIM_AHEAD], owner, published_for)


def _resume_together(
    keys: list[uuid.UUID], owner: str, published_for: store.DatabaseMark | None
) -> None:
    """Claim the runs ``keys`` ahead, then run each in turn (one not claimed ahead is claimed
    on its turn, waiting for a lock another transaction holds)."""
    try:
        claims = store.reconnecting(
            lambda: store.claim_ahead(keys, owner), what=f"claiming {len(keys)} executions"
        )
    except Exception:
        logger.exception("claiming %d executions together failed; each is claimed alone", len(keys))
        claims = {}
    with store.HeldLeases(claim.owned for claim in claims.values()) as held:
        for key in keys:
            ahead = claims.get(key)
            if ahead is not None and held.take(key) is None:
                logger.info("execution %s was taken over while it waited its turn; skipped", key)
                continue
            try:
                _resume_here(key, published_for=published_for, claimed=ahead, owner=owner)
            except WrongDatabase:
                raise  # the message's runs are all in another database
            except Exception:
                logger.exception("resuming execution %s failed", key)
            store.refresh_connections()


def _execution_key(execution_id: uuid.UUID | str) -> uuid.UUID | None:
    """The execution id a task was given, or None (logged) when it is not one."""
    if isinstance(execution_id, uuid.UUID):
        return execution_id
    try:
        return uuid.UUID(str(execution_id))
    except ValueError:
        logger.warning("resume task for %r, which is not an execution id; ignored", execution_id)
        return None


def _resume_here(
    execution_id: uuid.UUID | str,
    *,
    published_for: store.DatabaseMark | None = None,
    claimed: store.WorkerClaim | None = None,
    owner: str | None = None,
) -> Outcome | None:
    """Run an execution from its last checkpoint in this process (the worker's task).

    Takes the run only if nobody owns it: a duplicate delivery, a finished run or a retry that
    is not due yet does nothing. Completed steps are not run again; a step that was in flight
    when the previous owner died runs again (use its idempotency key for external calls).

    ``published_for``: the database the task's message was published for. An execution this
    database does not have raises WrongDatabase when that is another database (the worker is
    configured with other ``DATABASES`` than the web processes), instead of being ignored.

    A broken database connection, or one whose server no longer takes writes, is reconnected
    (the claim and the run carry on from what the database holds); a stored run this code
    cannot read, and an error of the engine itself, park the run as ``needs_attention`` at
    once instead of failing every delivery.

    ``claimed``: the run's claim, made ahead by ``owner`` (``resume_many``); else it is
    claimed here.
    """
    key = _execution_key(execution_id)
    if key is None:
        return None
    me = owner if owner is not None else store.lease_owner_token()
    claim = claimed or store.reconnecting(
        lambda: store.claim_for_worker(key, me), what=f"claiming execution {key}"
    )
    if claim is None:
        if store.reconnecting(lambda: store.execution_exists(key), what="reading a run"):
            logger.info(
                "execution %s is running elsewhere, finished or not due; delivery ignored", key
            )
        else:
            store.refuse_foreign(published_for, f"the task resuming execution {key}")
            logger.warning("resume task for unknown execution %s; ignored", key)
        return None
    row = claim.row
    owned = claim.owned
    if claim.recovery_attempts:
        # This run lost an owner before (perhaps just now): one stalled inside an atomic step's
        # transaction would hold row locks the steps run here wait on.
        store.reconnecting(
            lambda: store.end_stalled_owners(owned), what=f"ending {key}'s stalled owners"
        )
    code = _code_of(owned, row)
    if code is None or isinstance(code, Outcome):
        return code
    definition = code.definition
    limit = reactor_settings.MAX_RECOVERY_ATTEMPTS
    if claim.recovery_attempts > limit:
        return _park(
            owned,
            row,
            ErrorKind.RECOVERY_LIMIT,
            f"the run lost its worker {claim.recovery_attempts} times (limit {limit}, "
            f"REACTOR['MAX_RECOVERY_ATTEMPTS']) while at step {row.current_step!r}; it is parked "
            "instead of being resumed again. Fix what kills the process, then undo() or "
            "cancel() the run",
            step=row.current_step or None,
        )
    try:
        state = RunState.restore(definition, claim.records)
        problems = definition.incompatibilities(
            store.stored_shape(row, kept=claim.shape), state.recorded
        )
        _readable_inputs(row)
    except SubjectErased as exc:
        return fail_erased(owned, row, exc)
    except StoredValueUnreadable as exc:
        return _park(owned, row, ErrorKind.UNREADABLE, _unreadable_message(row, exc))
    if problems:
        return _park(
            owned,
            row,
            ErrorKind.DEFINITION_CHANGED,
            f"{definition.reactor_class.__qualname__} changed under this run: "
            f"{'; '.join(problems)}. Deploy the previous definition to finish it or to undo() "
            "it, or cancel() it",
        )
    if row.definition_hash != definition.definition_hash:
        # Deployed code that keeps every step the run recorded: the run goes on under it.
        try:
            store.reconnecting(
                lambda: store.adopt_definition(owned, definition.definition_hash, definition.shape),
                what=f"moving {key} to the deployed definition",
            )
        except LeaseLost:
            logger.info("execution %s was taken over by another process", key)
            return None
        logger.info(
            "execution %s goes on under %s's deployed definition %s (it started under %s)",
            key,
            row.reactor,
            definition.definition_hash[:12],
            row.definition_hash[:12],
        )
    for attempt in range(1, DATABASE_ERROR_RETRIES + 1):
        try:
            if attempt > 1:
                # After a lost connection, fence out the old connection's statement first: its
                # server backend may still commit a checkpoint (a backend waiting for a lock
                # does not notice that its client went away). Taking the run again under a new
                # fence waits for that commit or makes it write nothing; only then does the
                # database say where the run stands.
                taken = store.reconnecting(
                    functools.partial(store.refence, owned, me), what=f"taking {key} back"
                )
                if taken is None:
                    logger.warning(
                        "execution %s moved on while this process's connection was lost; "
                        "this process stopped",
                        key,
                    )
                    return None
                owned = taken
                # The old connection's backend may still be inside an atomic step's
                # transaction, waiting for a lock: it can never commit now; end it.
                store.reconnecting(
                    functools.partial(store.end_stalled_owners, owned),
                    what=f"ending {key}'s stalled owners",
                )
                row = store.get_row(key)
                state = RunState.restore(definition, store.run_records(row))
            with store.LeaseKeeper(owned):
                outcome = _run_claimed(definition, owned, row, state, claim, first=attempt == 1)
            flow.ended(definition, row.concurrency_key, outcome)
            return outcome
        except LeaseLost:
            logger.warning("execution %s was taken over by another process; stopped", key)
            return None
        except SubjectErased as exc:
            return fail_erased(owned, row, exc)
        except StoredValueUnreadable as exc:
            return _park(owned, row, ErrorKind.UNREADABLE, _unreadable_message(row, exc))
        except MemoryError:
            raise  # handed back by the executor: another worker resumes the run
        except PatchRemoved as removed:
            return park_removed(owned, row.reactor, removed)
        except Exception as exc:
            if store.reconnectable(exc):
                # The connection died, perhaps while committing, or its server stopped taking
                # writes (a primary fenced read-only for a switchover). Reconnect and carry on
                # from what the database holds: a step whose checkpoint did commit is not run
                # again.
                if attempt == DATABASE_ERROR_RETRIES:
                    raise
                # Expected in production (a failover, a pooler restart, a stalled process whose
                # session was ended) and handled: one line, the traceback only at DEBUG.
                logger.warning(
                    "database connection lost while running execution %s; reconnecting "
                    "(attempt %d of %d)",
                    key,
                    attempt + 1,
                    DATABASE_ERROR_RETRIES,
                )
                logger.debug("the lost connection's error", exc_info=True)
                connections[store.using()].close()
                continue
            # Not the step's code (its exceptions are failures the executor records): the
            # engine or the database refused something. It would fail the same way on every
            # delivery, so the run is parked for a person instead of recovered in a loop.
            logger.exception("execution %s: the engine failed while running it", key)
            return _park(
                owned,
                row,
                ErrorKind.ENGINE,
                f"the engine failed while running this run ({qualified_class_name(exc)}: "
                f"{printable(str(exc))[:500]}); its checkpoints are intact, but the step in "
                f"flight ({row.current_step!r}) may have run. Fix the cause, then undo() or "
                "cancel() the run",
                step=row.current_step or None,
            )
    return None  # pragma: no cover - the loop returns or raises


def _code_of(owned: store.Owned, row: Execution) -> type[Reactor] | Outcome | None:
    """The code that runs the claimed run ``row``: the class of the version it started on.

    A run of code this process lacks (another version, another fingerprint, a reactor it does
    not know) goes back, nothing run, for a live worker that has it: a worker still on the
    old code during a rolling deploy never runs a run the new code started, nor the other way
    round. A run of a version this process lacks always waits for one that has it. When no live
    worker has its code, a run of an older fingerprint goes on under this code if its recorded
    steps allow (the caller checks), and one of an unknown reactor is parked for a person.
    None when the run moved on under another owner meanwhile.
    """
    try:
        reactor = registry.of_run(row.reactor, row.version)
    except VersionMissing:
        # Another version's run: a worker with it takes it, perhaps one not started yet (a
        # deploy whose web processes went first). It waits, never run by other code.
        return _hand_back(owned, row, worker_with_code(row.reactor, version=row.version))
    except ReactorNotRegistered as exc:
        holder = worker_with_code(row.reactor, definition_hash=row.definition_hash)
        if holder is not None:
            return _hand_back(owned, row, holder)
        return _park(owned, row, ErrorKind.REACTOR_MISSING, str(exc))
    own = reactor.definition.definition_hash
    if own != row.definition_hash:
        holder = worker_with_code(row.reactor, definition_hash=row.definition_hash)
        if holder is not None or store.deploys.recorded_after(row.definition_hash, own):
            # Its own code runs elsewhere, or is newer than this worker's (a worker still
            # on the old code during a rolling deploy): it waits for that code.
            return _hand_back(owned, row, holder)
    return reactor


def _hand_back(owned: store.Owned, row: Execution, holder: ProcessSeen | None) -> Outcome | None:
    """Hand the claimed run back for a worker with its code: ``holder``, a live one, or one
    to come (None when the run moved on under another owner meanwhile)."""
    started_on = f"version {row.version!r}" if row.version else f"definition {row.definition_hash}"
    if holder is not None:
        who = f"worker {holder.name or f'{holder.host}:{holder.pid}'} has it and takes the run"
    else:
        who = (
            "no live worker has it yet: the run waits for one (deploy that code, or keep the "
            "version in code with Meta.version_of)"
        )
    message = f"this worker lacks {started_on} of {row.reactor}; {who}"
    logger.info("execution %s handed back: %s", row.id, message)
    try:
        delay = store.reconnecting(
            lambda: store.hand_back(
                owned,
                after=reactor_settings.HAND_BACK_AFTER,
                data={
                    "reason": "code",
                    "version": row.version,
                    "definition": row.definition_hash,
                    "error": message,
                },
            ),
            what=f"handing {row.id} back",
        )
    except LeaseLost:
        return None
    return Rescheduled(execution_id=row.id, step=row.current_step, delay=delay, reason="hand_back")


def _run_claimed(
    definition: ReactorDefinition,
    owned: store.Owned,
    row: Execution,
    state: RunState,
    claim: store.WorkerClaim,
    *,
    first: bool,
) -> Outcome:
    executor = executors.for_worker(definition, owned, row, state)
    if first:
        executor.note(
            EventKind.RESUME,
            {"recovery_attempts": claim.recovery_attempts} if claim.recovery_attempts else {},
        )
    if state.rolling_back:
        with contextlib.suppress(MapRollbackPending):  # parked again: still undoing
            executor.finish_rollback("rollback resumed")
        return store.outcome_of(store.get_row(row.id))
    if claim.pause is not None and first:
        # Paused (the run, or its reactor) while it waited: it stops before its next step.
        return executor.suspend(claim.pause)
    return after_pause(executor.run())


def _readable_inputs(row: Execution) -> Any:
    """The run's stored inputs, decoded; StoredValueUnreadable when they are not an object."""
    inputs = decode(row.inputs)
    if not isinstance(inputs, dict):
        raise StoredValueUnreadable(
            f"the stored inputs are a {type(inputs).__name__}, not a JSON object"
        )
    return inputs


def _unreadable_message(row: Execution, exc: StoredValueUnreadable) -> str:
    return (
        f"the stored run cannot be read by this code: {exc}. Nothing ran. Repair the row or "
        "deploy the code that wrote it, then undo() or cancel() the run"
    )


def _park(
    owned: store.Owned, row: Execution, kind: str, message: str, *, step: str | None = None
) -> Outcome:
    return park(owned, row.reactor, kind, message, step=step)


def sweep() -> store.SweepReport:
    """Queue again the work that crashes and lost messages left behind (see ``reactor_sweep``),
    in every database runs are written to (``REACTOR["DATABASE"]``), one after the other; the
    report adds them up. Then it records this process's sweeper heartbeat
    (``services.health.record_sweep``).

    A phase whose batch (``SWEEP_BATCH`` rows, each batch committed and published on its own)
    comes back full goes again at once, for up to ``SWEEP_BUDGET`` seconds; the report says
    when the time ran out first (``cut_short``: sweep again at once) and when the next wake-up
    or schedule tick comes (``next_due_at``).

    A sweep is safe to repeat: when the database connection broke (a restart, a failover, a
    pooler or an operator dropped it), it reconnects and sweeps again. What it steers is
    recorded as the system's (``SWEEPER``), whoever started it.
    """
    store.refresh_connections()
    began = time.monotonic()
    report = store.SweepReport()
    with acting_as(SWEEPER):
        for swept in in_each_database(
            lambda: store.reconnecting(_sweep_once, what=f"sweeping the database {store.using()!r}")
        ):
            report.add(swept)
    record_sweep(report.as_dict(), time.monotonic() - began)
    return report


def next_sweep_in(report: store.SweepReport, interval: float) -> float:
    """Seconds to wait after the sweep of ``report`` before the next: none when its time ran
    out on a full batch, until the next wake-up or schedule tick when that comes before
    ``interval`` is over, else ``interval``."""
    if report.cut_short:
        return 0.0
    if report.next_due_at is None:
        return interval
    return max(0.0, min(interval, (report.next_due_at - timezone.now()).total_seconds()))


def _sweep_once() -> store.SweepReport:
    batch = reactor_settings.SWEEP_BATCH
    rounds = store.Rounds(reactor_settings.SWEEP_BUDGET)
    report = store.sweep(
        limit=batch,
        grace=reactor_settings.SWEEP_INTERVAL,
        redispatch_after=reactor_settings.REDISPATCH_AFTER,
        retention=reactor_settings.DISPATCH_RETENTION,
        rounds=rounds,
    )
    report.expired = rounds.run(batch, functools.partial(expire_interrupts, batch))
    report.recovered += rounds.run(batch, functools.partial(deliver_kept_messages, batch))
    # Forks whose original ended its undo after the process that forked them stopped.
    report.recovered += rounds.run(batch, functools.partial(release_waiting_forks, batch))
    # Bulk operations nobody holds (their task lost, their worker gone): to a worker again.
    report.recovered += republish_stalled(batch, reactor_settings.REDISPATCH_AFTER)
    # Queued runs whose key has room (the run that ended did not admit them: its process died).
    report.recovered += flow.admit_waiting()
    report.deadlines += rounds.run(batch, functools.partial(expire_deadlines, batch))
    report.events = rounds.run(batch, functools.partial(finish_events, batch))
    report.maps = rounds.run(
        batch,
        functools.partial(
            store.maps.redispatch_stalled, after=reactor_settings.REDISPATCH_AFTER, limit=batch
        ),
    )
    report.deleted += rounds.run(batch, functools.partial(store.request_keys.forget_expired, batch))
    fired = fire_due(rounds=rounds)
    report.fired = fired.started
    report.cut_short = rounds.cut_short
    report.next_due_at = min(
        (at for at in (report.next_due_at, fired.next_due_at) if at is not None), default=None
    )
    if any(report.as_dict().values()):
        logger.info("sweep: %s", report.as_dict())
    return report
