"""Sending a message to a run: kept in its mailbox until a ``receive`` of its topic takes it."""

from __future__ import annotations

import json
from typing import Any

from .. import registry, store
from ..conf import reactor_settings
from ..engine.constructs.receive import check_topic, receive_paths
from ..engine.outcomes import InProgress, Outcome
from ..engine.serialization import encode
from ..exceptions import InvalidMessage, InvalidTransition, ResultNotSerializable, UnknownTopic
from .databases import across_databases
from .guards import check_key
from .interrupts import deliver_kept, spec_at


@across_databases
def send(
    execution: Any,
    topic: str,
    payload: Any,
    *,
    idempotency_key: str | None = None,
    background: bool | None = None,
) -> Outcome:
    """Send ``payload`` to the run ``execution`` (its id, a handle or its row) on ``topic``.

    The message is kept in the run's mailbox until a ``receive(topic)`` step of the run takes
    it: messages of a topic are taken in the order they were sent, each exactly once. A run
    paused at such a step goes on now, as a delivery to an interrupt does: in this process
    (returning how it ended) or on a worker (``Dispatched``), as the step's ``resume=`` says or
    ``background`` overrides. Otherwise ``InProgress`` is returned: the message waits.

    With ``idempotency_key``, a repeat (same key, topic and payload) keeps nothing new and
    returns the run's outcome with ``idempotent_replay=True``; the same key for another
    message raises IdempotencyKeyReused.

    Raises ExecutionNotFound (no such run), UnknownTopic (the run's reactor receives nothing
    on this topic), InvalidMessage (no topic name; a payload that is not JSON or is larger
    than ``REACTOR["API_MAX_BODY_BYTES"]``), InvalidTransition (the run ended, or it is a
    composed child: send to the run at the top). Nothing is written when it raises.
    """
    execution_id = store.parse_id(getattr(execution, "id", execution))
    check_topic(topic)
    if idempotency_key is not None:
        check_key(idempotency_key)
    try:
        stored = encode(payload)
    except ResultNotSerializable as exc:
        raise InvalidMessage(
            f"the payload of a message to {topic!r} cannot be stored: {exc}"
        ) from None
    limit = reactor_settings.API_MAX_BODY_BYTES
    if len(json.dumps(stored, separators=(",", ":")).encode()) > limit:
        raise InvalidMessage(
            f"the payload of a message to {topic!r} is larger than {limit} bytes "
            '(REACTOR["API_MAX_BODY_BYTES"]); send a reference to the data instead'
        )
    row = store.get_row(execution_id)
    if row.parent_id is not None and not row.detached:
        raise InvalidTransition(
            f"execution {row.id} is a composed child of execution {row.parent_id}: send its "
            "messages to the run at the top of the composition, which its receive steps read",
            status=row.status,
        )
    definition = registry.of_run(row.reactor, row.version).definition
    receives = list(receive_paths(definition))
    paths = [path for path, declared in receives if declared == topic]
    if not paths:
        topics = tuple(sorted({declared for _path, declared in receives}))
        raise UnknownTopic(
            f"{definition.name} receives no messages on {topic!r} (its topics: "
            f"{', '.join(topics) or 'none'}); declare receive({topic!r}) in the reactor",
            topics=topics,
        )
    secret_paths = sorted(
        {
            tuple(secret)
            for path in paths
            if (spec := spec_at(definition, path)) is not None
            for secret in spec.secret_result_paths
        }
    )
    sent = store.messages.send(
        row.id, topic, stored, idempotency_key=idempotency_key, secret_paths=secret_paths
    )
    if sent.replay:
        return store.outcome_of(store.get_row(row.id), replay=True)
    moved = deliver_kept(row.id, background=background)
    return moved if moved is not None else InProgress(execution_id=row.id, status=sent.status)
