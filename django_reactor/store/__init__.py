"""The store: the only code that touches the ORM on the engine's and the services' behalf.

It imports nothing above the models, the engine and the settings. Split by what it stores:

- ``db``: the database alias, connection repair and retries (``reconnecting``);
- ``identity``: which database this is, for the task messages (``this_database``,
  ``refuse_foreign``);
- ``dialects``: the database-dependent operations, chosen once per alias (``dialect()``,
  ``dialect_for(alias)``): the generic ORM store, and PostgreSQL's in hand-written SQL;
- ``sql``: every hand-written statement, named, and the one function that sends them
  (``checkpoint_sql``: the checkpoint's statement; ``map_sql``: the map chunks' statements);
- ``rows``: the typed views of rows it hands out (``Owned``, ``WorkerClaim``);
- ``executions``: creating runs; trace entries and other writes that need no owner;
- ``attributes``: runs' business attributes: written, read back, and ``with_attributes``, the
  query that narrows runs to those with given attributes (newest first, off their index);
- ``checkpoint``: the executor's journal, one transaction per state change, under the fence;
- ``reads``: runs, step records and traces read back, and what the journal holds about a run
  (``run_records``: the engine restores its state from them);
- ``claims``: taking a run (a worker's claim, an operation's, after a broken connection),
  cancel requests, parking a run for a person;
- ``lease``: lease owners and the heartbeat thread that keeps leases alive;
- ``outbox``: dispatches and the port a publisher (Celery) registers with;
- ``outcomes``: a stored run as the outcome its caller would have received;
- ``sweep``, ``prune``: the sweeper's and ``reactor_prune``'s work;
- ``maps``, ``interrupts``, ``messages``, ``request_keys``, ``schedules``: map element slots,
  interrupt rows, runs' mailboxes, remembered API requests, schedules and their fires;
- ``events``: events emitted, what they match (waits, cancel subscriptions);
- ``time_in_tests``: moving stored times forward for the ``reactor_clock`` fixture (tests only);
- ``overview``: the admin overview's capped counts and lists (runs by status, stuck runs,
  waiting interrupts, the outbox's depth);
- ``migrating``: a run parked ``definition_changed`` moved onto the code's definition;
- ``forks``: a fork's one transaction (the original's carried records marked, the fork with
  their copies, the original taken for the undo of its abandoned branch);
- ``flow``, ``batches``: flow control's key locks and counts (concurrency, throttle,
  debounce), and batches collecting their items;
- ``pauses``: operators' pauses of reactors and runs, runs suspended and released;
- ``patches``: runs' patch decisions, recorded once (``engine.patches``), copied to a fork;
- ``audit``: the steering history (``AuditEntry``), written in the transaction of the change
  it records;
- ``health``: processes' heartbeats, overdue wake-ups, dispatches not taken, per-reactor
  figures of a recent window (``services.fleet_health``);
- ``secrets``, ``keyring``, ``subject_keys``, ``rotation``: secrets sealed at rest (opened where
  a run decodes them), the configured keys, subjects' data keys (erasure), re-encryption.

The names below are the ones the rest of the package calls as ``store.<name>``.
"""

from __future__ import annotations

from . import (
    attributes,
    audit,
    batches,
    bulk,
    continuation,
    deploys,
    dialects,
    events,
    flow,
    forks,
    health,
    interrupts,
    keyring,
    maps,
    messages,
    migrating,
    outbox,
    overview,
    patches,
    pauses,
    request_keys,
    rotation,
    schedules,
    secrets,
    subject_keys,
    time_in_tests,
)
from .atomic_steps import end_stalled_owners
from .attributes import with_attributes
from .checkpoint import DatabaseJournal
from .claims import (
    RESUMABLE,
    adopt_definition,
    claim,
    claim_ahead,
    claim_for_worker,
    end_owned,
    hand_back,
    park_for_attention,
    refence,
    request_cancel,
    roll_back_on_worker,
)
from .db import (
    CONNECTION_ERRORS,
    alias_for,
    aliases,
    bound,
    bound_alias,
    bound_to,
    connection_lost,
    default_alias,
    give_back_connections,
    holds_run,
    inside_user_transaction,
    locate,
    open_connections,
    reconnect_after,
    reconnectable,
    reconnecting,
    refresh_connections,
    side_by_side_limit,
    unbound,
    using,
)
from .dialects import dialect, dialect_for
from .executions import (
    ChildExists,
    IdempotencyConflict,
    adopt_child,
    append_event,
    collapse_start,
    create_execution,
    inputs_digest,
    save_coordination_state,
    start_now,
    wake_now,
    wake_waiter,
)
from .identity import (
    DatabaseMark,
    alias_of,
    database_of_message,
    refuse_foreign,
    this_database,
)
from .lease import Heartbeat, HeldLeases, Kept, LeaseKeeper, lease_owner_token
from .outbox import QueuedDispatch, queue_dispatch
from .outcomes import outcome_of
from .prune import count_prunable, prune_finished
from .reads import (
    cancelled_while_running,
    coordination_state,
    event_rows,
    execution_exists,
    find_child,
    find_retry,
    get_row,
    ids_starting_with,
    last_seq,
    launched_steps,
    parse_id,
    route_of,
    run_records,
    status_of,
    statuses_of,
    step_rows,
    stored_shape,
    subject_of,
    unfinished_descendants,
)
from .rows import Owned, WorkerClaim, route_of_row
from .sweep import Rounds, SweepReport, due_now, paused_past_deadline, sweep

__all__ = [
    "CONNECTION_ERRORS",
    "RESUMABLE",
    "ChildExists",
    "DatabaseJournal",
    "DatabaseMark",
    "Heartbeat",
    "HeldLeases",
    "IdempotencyConflict",
    "Kept",
    "LeaseKeeper",
    "Owned",
    "QueuedDispatch",
    "Rounds",
    "SweepReport",
    "WorkerClaim",
    "adopt_child",
    "adopt_definition",
    "alias_for",
    "alias_of",
    "aliases",
    "append_event",
    "attributes",
    "audit",
    "batches",
    "bound",
    "bound_alias",
    "bound_to",
    "bulk",
    "cancelled_while_running",
    "claim",
    "claim_ahead",
    "claim_for_worker",
    "collapse_start",
    "connection_lost",
    "continuation",
    "coordination_state",
    "count_prunable",
    "create_execution",
    "database_of_message",
    "default_alias",
    "deploys",
    "dialect",
    "dialect_for",
    "dialects",
    "due_now",
    "end_owned",
    "end_stalled_owners",
    "event_rows",
    "events",
    "execution_exists",
    "find_child",
    "find_retry",
    "flow",
    "forks",
    "get_row",
    "give_back_connections",
    "hand_back",
    "health",
    "holds_run",
    "ids_starting_with",
    "inputs_digest",
    "inside_user_transaction",
    "interrupts",
    "keyring",
    "last_seq",
    "launched_steps",
    "lease_owner_token",
    "locate",
    "maps",
    "messages",
    "migrating",
    "open_connections",
    "outbox",
    "outcome_of",
    "overview",
    "park_for_attention",
    "parse_id",
    "patches",
    "paused_past_deadline",
    "pauses",
    "prune_finished",
    "queue_dispatch",
    "reconnect_after",
    "reconnectable",
    "reconnecting",
    "refence",
    "refresh_connections",
    "refuse_foreign",
    "request_cancel",
    "request_keys",
    "roll_back_on_worker",
    "rotation",
    "route_of",
    "route_of_row",
    "run_records",
    "save_coordination_state",
    "schedules",
    "secrets",
    "side_by_side_limit",
    "start_now",
    "status_of",
    "statuses_of",
    "step_rows",
    "stored_shape",
    "subject_keys",
    "subject_of",
    "sweep",
    "this_database",
    "time_in_tests",
    "unbound",
    "unfinished_descendants",
    "using",
    "wake_now",
    "wake_waiter",
    "with_attributes",
]
