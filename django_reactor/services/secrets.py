"""Secrets at rest: forgetting a subject (its secrets erased for good), re-encrypting stored
secrets with the first key, and ending a run that needs a secret of a forgotten subject."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from .. import registry, store
from ..engine.outcomes import Completed, ErrorInfo, ErrorKind, Failed, Outcome
from ..engine.redaction import redact
from ..exceptions import ReactorError, ReactorNotRegistered, SubjectErased
from ..states import EventKind, ExecutionStatus
from . import audit
from .audit import check_reason
from .databases import in_each_database

if TYPE_CHECKING:
    from ..models import Execution

logger = logging.getLogger("django_reactor.services")


def forget_subject(subject: str, *, reason: str = "") -> store.subject_keys.Forgotten:
    """Delete ``subject``'s data key (crypto-shredding): every secret sealed with it, in every
    run of the subject, can never be read again. The runs stay and still display, those
    secrets shown as ``[ERASED]``; a run that needs one of them to go on fails saying so.

    Idempotent: forgetting a forgotten subject changes nothing. A run of the subject started
    later gets a new key. Recorded in the steering history (of each database where a key was
    erased) with who asked and ``reason``.
    """
    check_reason(reason, "forget a subject")
    if not isinstance(subject, str) or not subject.strip():
        raise ReactorError("name the subject to forget: the value of its runs' Meta.subject")
    store.subject_keys.check_subject(subject, "the subject to forget")
    steering = audit.steering("forget_subject", reason=reason, target=f"subject {subject}")
    # A subject's runs may be in several databases, each with the subject's key of its own.
    each = in_each_database(lambda: store.subject_keys.forget(subject, steering=steering))
    erased_at = [f.erased_at for f in each if f.erased_at is not None]
    forgotten = store.subject_keys.Forgotten(
        subject=subject,
        erased=sum(f.erased for f in each),
        erased_at=min(erased_at) if erased_at else None,
        runs=sum(f.runs for f in each),
    )
    if forgotten.erased:
        logger.info("subject %r forgotten: its secrets are erased", subject)
    return forgotten


def rotate_keys(
    *, batch_size: int = 500, progress: Callable[[store.rotation.Progress], None] | None = None
) -> store.rotation.Progress:
    """Seal again, with the first of ``REACTOR["ENCRYPTION_KEYS"]``, every stored secret
    sealed with another key, and seal the secrets stored in clear (rows written before secrets
    were sealed); the subjects' data keys are encrypted again too, in every database runs are
    written to. See ``store.rotation``."""
    if batch_size < 1:
        raise ReactorError(f"the batch size must be at least 1, got {batch_size}")
    done = in_each_database(lambda: store.rotation.rotate(batch_size=batch_size, progress=progress))
    if len(done) == 1:
        return done[0]
    total = store.rotation.Progress(table=done[-1].table)
    for part in done:
        for field in dataclasses.fields(part):
            if field.name != "table":
                setattr(total, field.name, getattr(total, field.name) + getattr(part, field.name))
    return total


def shown_outcome(outcome: Outcome) -> Outcome:
    """``outcome`` as the faces (the API, the commands) show it: a completed run's value with
    its secret results redacted. The caller of ``run()`` gets the value itself."""
    if not isinstance(outcome, Completed) or outcome.execution_id is None:
        return outcome
    reactor = store.get_row(outcome.execution_id).reactor
    try:
        paths = registry.get(reactor).definition.value_secret_paths
    except ReactorNotRegistered:
        return outcome
    if not paths:
        return outcome
    return dataclasses.replace(outcome, value=redact(outcome.value, paths))


def fail_erased(owned: store.Owned, row: Execution, exc: SubjectErased) -> Failed:
    """End a run this process owns that needs a secret of a forgotten subject: it fails
    where it stands with a plain error, nothing rolled back (the rollback would need the erased
    secrets too)."""
    message = (
        f"{exc}. The run stopped where it stood and nothing was rolled back; its records stay "
        "for reading"
    )
    failure = ErrorInfo(kind=ErrorKind.SUBJECT_ERASED, message=message, reactor=row.reactor)
    logger.warning("execution %s cannot go on: %s", row.id, exc)
    store.end_owned(
        owned,
        status=ExecutionStatus.FAILED,
        failure=failure.to_dict(),
        event_kind=EventKind.FAIL,
        data={"kind": ErrorKind.SUBJECT_ERASED, "error": message},
    )
    return Failed(execution_id=row.id, error=failure, status=ExecutionStatus.FAILED)
