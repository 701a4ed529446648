"""The ``REACTOR`` setting, read lazily through :data:`reactor_settings`.

Every key has a documented default in :data:`DEFAULTS` (listed in ``docs/reference/settings.md``).
Values are read when used, never at import time, and the cache is cleared on ``setting_changed``
so ``override_settings(REACTOR={...})`` works in tests.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver

from .exceptions import ReactorImproperlyConfigured

DEFAULTS: dict[str, Any] = {
    # Seconds a process owns a run without writing a checkpoint before others may take it over.
    "LEASE_SECONDS": 60,
    # How long run(..., idempotency_key=k) waits for a concurrent run with the same key to
    # finish before returning an in-progress outcome.
    "IDEMPOTENCY_WAIT_SECONDS": 10.0,
    # Longest sleep between inline retry attempts; longer backoffs are capped to this.
    "MAX_INLINE_RETRY_DELAY": 30.0,
    # Refuse inline runs inside an open transaction.atomic() block (step bodies must not run
    # inside a transaction they do not own). Set to False only if you know why.
    "REFUSE_INLINE_IN_TRANSACTION": True,
    # Prepare the per-step checkpoint statement on PostgreSQL (halves its cost). Turn off behind
    # a transaction-pooling PgBouncer older than 1.21 (or without max_prepared_statements).
    "CHECKPOINT_PREPARED_STATEMENTS": True,
    # Celery queue for django_reactor's tasks (None: Celery's default queue).
    "CELERY_QUEUE": None,
    # Times a run may lose its worker (crash, kill) before it is parked as needs_attention
    # instead of being resumed again.
    "MAX_RECOVERY_ATTEMPTS": 5,
    # Retry backoffs up to this many seconds are published with a Celery countdown; longer
    # ones are stored as a wake-up time that the sweeper releases.
    "RETRY_COUNTDOWN_LIMIT": 300.0,
    # Seconds between sweeper runs when scheduled with celery.beat_schedule() or --loop.
    "SWEEP_INTERVAL": 15.0,
    # A run waiting for a worker is dispatched again when its last task was sent this long ago
    # and nobody took it (the message was lost).
    "REDISPATCH_AFTER": 60.0,
    # Most rows one sweep handles per kind of work.
    "SWEEP_BATCH": 500,
    # Sent dispatches (outbox rows) older than this many seconds are deleted by the sweeper.
    "DISPATCH_RETENTION": 86400.0,
    # Redis for completion signals (pub/sub). None: the django-redis "default" cache when there
    # is one, else waiters only poll the database.
    "REDIS_URL": None,
    # How long an inline caller waits for an async unit's result before the reader fails.
    "ASYNC_WAIT_TIMEOUT": 30.0,
    # How long a worker keeps a run parked on an async unit (from the unit's dispatch) before
    # the reader fails.
    "ASYNC_PARK_TIMEOUT": 3600.0,
    # Waiters re-check the database at least this often; a parked run is also woken this often
    # in case its wake-up message was lost.
    "ASYNC_POLL_INTERVAL": 2.0,
    # Extra app modules autodiscovered for reactors, besides each installed app's "reactors".
    "AUTODISCOVER_MODULES": ["reactors"],
    # Dotted paths of RunObserver subclasses instantiated for every execution (lifecycle
    # notifications), before the reactor's own Meta.middleware and the Django signals.
    "MIDDLEWARE": [],
    # Issue a single-use resume token whenever a run reaches an interrupt (returned in the
    # Paused outcome; only its SHA-256 is stored). services.issue_resume_token() works either way.
    "RESUME_TOKENS": False,
    # How the resume endpoints may be authenticated: "user" (DRF authentication plus the
    # resume_interrupt permission), "webhook" (signed webhooks) and "token" (resume tokens).
    # A dict {"default": [...], "<reactor name>": [...]} chooses per reactor.
    "RESUME_AUTH": ["user", "webhook", "token"],
    # Webhook signing secrets (Standard Webhooks, "whsec_<base64>" or raw strings). A list is
    # accepted for every reactor; a dict {"default": [...], "<reactor name>": [...]} chooses per
    # reactor. Several secrets at once allow rotation.
    "WEBHOOK_SECRETS": [],
    # Seconds a signed webhook's timestamp may differ from now (replays outside are refused).
    "WEBHOOK_TOLERANCE": 300,
    # Largest request body the API reads, in bytes (larger: 413 before parsing).
    "API_MAX_BODY_BYTES": 65536,
    # Resume requests allowed per client (the user, else the client's address) and period:
    # "N/s|m|h|d".
    # None: no limit.
    "API_RESUME_RATE": "120/m",
    # Seconds an Idempotency-Key (or a webhook id) is remembered with its response.
    "API_IDEMPOTENCY_TTL": 86400,
    # DRF authentication classes of the API (dotted paths). None: REST_FRAMEWORK's defaults.
    "API_AUTHENTICATION_CLASSES": None,
    # DRF permission classes a user must pass for each API action (the view's ``action`` is
    # list, retrieve, cancel, undo, retry or resume). The default asks for the matching Django
    # permission (view_execution, cancel_execution, ..., resume_interrupt).
    "API_PERMISSION_CLASSES": ["django_reactor.api.permissions.HasReactorPermission"],
    # Dotted path to a function (request, queryset) -> queryset that limits which executions a
    # request may see and steer through the API (tenants, owners). None: every execution.
    "API_SCOPE": None,
    # Coordination (locks, semaphores, rate limits, periods, ordered locks).
    # Dotted path of the CoordinationBackend class: the Redis one, or
    # "django_reactor.coordination.backends.database.DatabaseBackend" without Redis.
    "COORDINATION_BACKEND": "django_reactor.coordination.backends.redis.RedisBackend",
    # The Redis of the Redis backend: a django-redis cache alias or a redis:// URL.
    "COORDINATION_REDIS": "default",
    # First part of every coordination key in Redis (one per app sharing a Redis).
    "COORDINATION_KEY_PREFIX": "django_reactor",
    # Seconds a worker waits before trying again a run (or step) that could not take its lock,
    # semaphore slot or ordered-lock turn (a rate limit says itself how long to wait).
    "CONTENTION_DELAY": 1.0,
    # Times a run may be rescheduled for contention (or an unreachable coordination backend)
    # before it fails instead.
    "MAX_CONTENTION_SNOOZES": 100,
    # Seconds an undo or compensate waits for its step's lock or semaphore slot while another
    # run holds it (or the backend is unreachable) before it is reported as a rollback failure
    # (coordination_unavailable); it never runs unlocked.
    "ROLLBACK_WAIT": 10.0,
    # Named rate limits shared by every reactor and step that uses the name:
    # {"stripe": {"second": 3, "minute": 100}} or {"stripe": [[3, 1], [100, 60]]}.
    "RATE_LIMITS": {},
}

REMOVED_SETTINGS: dict[str, str] = {}


class ReactorSettings:
    """Attribute access to ``settings.REACTOR`` with defaults, cached until settings change."""

    def __init__(self, defaults: dict[str, Any]) -> None:
        self.defaults = defaults
        self._cache: dict[str, Any] = {}

    @property
    def user_settings(self) -> dict[str, Any]:
        value = getattr(settings, "REACTOR", None)
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise ReactorImproperlyConfigured(
                f"settings.REACTOR must be a dict, got {type(value).__name__}"
            )
        return value

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name not in self.defaults:
            raise AttributeError(f"REACTOR has no setting {name!r}")
        if name in self._cache:
            return self._cache[name]
        value = self.user_settings.get(name, self.defaults[name])
        self._cache[name] = value
        return value

    def unknown_keys(self) -> list[str]:
        return sorted(set(self.user_settings) - set(self.defaults))

    def reload(self) -> None:
        self._cache.clear()


reactor_settings = ReactorSettings(DEFAULTS)


@receiver(setting_changed)
def _reload(*, setting: str, **kwargs: Any) -> None:
    if setting == "REACTOR":
        reactor_settings.reload()
