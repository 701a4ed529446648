"""Writing a run's stored definition shape by hand (``Definition`` rows), for tests that need
a run as an earlier deploy would have stored it."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

from django.utils import timezone

from django_reactor.engine.spec import ReactorDefinition
from django_reactor.models import Definition, Execution


def keep_shape(definition: ReactorDefinition) -> None:
    """Keep ``definition``'s shape under its hash, as a run's creation does."""
    Definition.objects.get_or_create(
        hash=definition.definition_hash, defaults={"shape": definition.shape}
    )


def give_shape(execution_id: uuid.UUID | str, shape: Any) -> None:
    """Make the run look as if it had started under ``shape`` (kept under a hash of its own),
    an earlier deploy's: first recorded a year ago (a definition recorded after the code's
    is newer code, which a worker hands the run back for)."""
    fingerprint = f"test-{uuid.uuid4().hex[:16]}"
    Definition.objects.create(hash=fingerprint, shape=shape)
    Definition.objects.filter(hash=fingerprint).update(
        created_at=timezone.now() - dt.timedelta(days=365)
    )
    Execution.objects.filter(pk=execution_id).update(definition_hash=fingerprint)
