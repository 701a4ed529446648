"""The ``REACTOR`` setting, read lazily through :data:`reactor_settings`.

Every key is declared on :class:`ReactorSettings` with its default and its type (listed in
``docs/reference/settings.md``); :data:`DEFAULTS` maps each key to its default. A value is read
when it is used, never at import time, and comes back with its declared type: a number of seconds
as a float, a count as an int, a flag as a bool. A value that does not have that type raises
:class:`~django_reactor.exceptions.ReactorImproperlyConfigured` naming the key (the system
checks report the same values at start-up). The cache is cleared on ``setting_changed`` so
``override_settings(REACTOR={...})`` works in tests.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Generic, NoReturn, Self, TypeVar, cast, overload

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver

from .exceptions import ReactorImproperlyConfigured

if TYPE_CHECKING:
    from django.db.models import QuerySet

    from .models import Execution

T = TypeVar("T")


class Setting(Generic[T]):
    """One key of ``REACTOR``: its default, and the type a configured value is given.

    The base class takes any value as it is: keys of richer shapes (lists of dotted paths,
    rate limits, secrets) are validated where they are used and by the system checks; its
    type parameter says the shape such a key is meant to have.
    """

    #: What a value of the key must be, for the error a wrong one raises.
    expected = "any value"

    def __init__(self, default: T) -> None:
        self.default = default
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, instance: None, owner: type) -> Self: ...

    @overload
    def __get__(self, instance: ReactorSettings, owner: type) -> T: ...

    def __get__(self, instance: ReactorSettings | None, owner: type) -> Self | T:
        if instance is None:
            return self
        try:
            # Each value was coerced to T when cached. (No typing.cast: a call of its own, and
            # settings are read on every statement.)
            return instance._cache[self.name]  # type: ignore[return-value]
        except KeyError:
            value = self.coerce(instance.user_settings.get(self.name, self.default))
            instance._cache[self.name] = value
            return value

    def coerce(self, value: object) -> T:
        """``value`` with this key's type; ReactorImproperlyConfigured (naming the key) if not."""
        return cast(T, value)

    def problem(self, value: object) -> str | None:
        """What the system check reports about ``value`` for this key; None when it is fine."""
        try:
            self.coerce(value)
        except ReactorImproperlyConfigured as exc:
            return str(exc)
        return None

    def refused(self, value: object) -> ReactorImproperlyConfigured:
        """The error for a configured ``value`` that does not have this key's type."""
        return ReactorImproperlyConfigured(
            f"REACTOR[{self.name!r}] must be {self.expected}, got {value!r} "
            f"({type(value).__name__})"
        )


class _Number(Setting[T]):
    """A number that the system checks want positive (or, with ``positive=False``, >= 0)."""

    #: How the system check words the requirement.
    requirement = "a positive number"

    def __init__(self, default: T, *, positive: bool = True) -> None:
        super().__init__(default)
        self.positive = positive

    def problem(self, value: object) -> str | None:
        try:
            number = cast(float, self.coerce(value))
        except ReactorImproperlyConfigured:
            number = None
        if number is not None and (number > 0 if self.positive else number >= 0):
            return None
        wanted = self.requirement if self.positive else f"{self.expected} of at least 0"
        return f"REACTOR[{self.name!r}] must be {wanted}, got {value!r}."


class Seconds(_Number[float]):
    """A duration in seconds: an int or a float, read as a float."""

    expected = "a number of seconds"

    def coerce(self, value: object) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.refused(value)
        return float(value)


class Count(_Number[int]):
    """A whole number: an int, or a float without a fraction, read as an int."""

    expected = "a whole number"
    requirement = "a positive whole number"

    def coerce(self, value: object) -> int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise self.refused(value)


class Flag(Setting[bool]):
    """``True`` or ``False`` (not 0, 1 or "no": a flag given as anything else is refused)."""

    expected = "True or False"

    def coerce(self, value: object) -> bool:
        if not isinstance(value, bool):
            raise self.refused(value)
        return value

    def problem(self, value: object) -> str | None:
        if isinstance(value, bool):
            return None
        return f"REACTOR[{self.name!r}] must be True or False, got {value!r}."


class OptionalText(Setting[str | None]):
    """A string or ``None`` (the system check also wants the string non-empty)."""

    expected = "None or a string"

    def coerce(self, value: object) -> str | None:
        if value is not None and not isinstance(value, str):
            raise self.refused(value)
        return value

    def problem(self, value: object) -> str | None:
        if value is None or (isinstance(value, str) and value):
            return None
        return f"REACTOR[{self.name!r}] must be None or a non-empty string, got {value!r}."


class OptionalSeconds(Setting[float | None]):
    """A number of seconds, or ``None`` for none (the system check wants it positive)."""

    expected = "None or a number of seconds"

    def coerce(self, value: object) -> float | None:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.refused(value)
        return float(value)

    def problem(self, value: object) -> str | None:
        try:
            number = self.coerce(value)
        except ReactorImproperlyConfigured as exc:
            return str(exc)
        if number is None or number > 0:
            return None
        return (
            f"REACTOR[{self.name!r}] must be None or a positive number of seconds, got {value!r}."
        )


class FernetKeys(Setting[tuple[str, ...]]):
    """A list of Fernet keys (url-safe base64 of 32 bytes, as ``Fernet.generate_key()``
    gives), newest first; read as a tuple. Empty: keys derived from ``SECRET_KEY``."""

    expected = (
        "a list of Fernet keys (each the url-safe base64 text of 32 bytes, as "
        "cryptography.fernet.Fernet.generate_key() makes), newest first"
    )

    def coerce(self, value: object) -> tuple[str, ...]:
        if isinstance(value, str | bytes) or not isinstance(value, Sequence):
            raise self.refused(value)
        keys = []
        for index, key in enumerate(value):
            text = key.decode() if isinstance(key, bytes) else key
            if not isinstance(text, str) or not _is_fernet_key(text):
                raise ReactorImproperlyConfigured(
                    f"REACTOR[{self.name!r}][{index}] is not a Fernet key (the url-safe base64 "
                    'text of 32 bytes); make one with python -c "from cryptography.fernet '
                    'import Fernet; print(Fernet.generate_key().decode())"'
                )
            keys.append(text)
        return tuple(keys)


def _is_fernet_key(text: str) -> bool:
    try:
        return len(base64.urlsafe_b64decode(text.encode("ascii"))) == 32
    except (binascii.Error, UnicodeEncodeError, ValueError):
        return False


class ByReactor(Setting[T]):
    """A key that may be chosen per reactor: one value for every reactor, or a dict of values
    by registered reactor name, with ``"default"`` for the others (``RESUME_AUTH``,
    ``WEBHOOK_SECRETS``). Check E011 reports a dict key that names no registered reactor."""

    #: The dict key whose value applies to the reactors the dict does not name.
    DEFAULT_KEY = "default"

    def __init__(self, default: T, *, while_unknown: str) -> None:
        super().__init__(default)
        #: What a key naming no registered reactor does until it is fixed (for check E011).
        self.while_unknown = while_unknown

    @classmethod
    def reactor_keys(cls, value: object) -> list[str]:
        """The reactor names a configured ``value`` lists (none unless it is a dict)."""
        if not isinstance(value, Mapping):
            return []
        return [str(key) for key in value if key != cls.DEFAULT_KEY]


class ByEvent(Setting[T]):
    """A key that may be chosen per event name: one value for every event, or a dict of values
    by event name, with ``"default"`` for the others (``EVENT_AUTH``). Check E015 reports a dict
    key that no registered reactor waits for, starts on or cancels on."""

    #: The dict key whose value applies to the events the dict does not name.
    DEFAULT_KEY = "default"

    @classmethod
    def event_keys(cls, value: object) -> list[str]:
        """The event names a configured ``value`` lists (none unless it is a dict)."""
        if not isinstance(value, Mapping):
            return []
        return [str(key) for key in value if key != cls.DEFAULT_KEY]


class DatabaseRouting(ByReactor[str | Mapping[str, str]]):
    """``DATABASE``: the alias (a key of ``DATABASES``) runs are written to, or a dict of
    aliases by registered reactor name with ``"default"`` for the others. Aliases that are not
    in ``DATABASES`` are reported by check E013."""

    expected = 'a database alias, or a dict {"default": alias, "<reactor name>": alias}'

    def coerce(self, value: object) -> str | Mapping[str, str]:
        if isinstance(value, str) and value:
            return value
        if isinstance(value, Mapping) and all(
            isinstance(k, str) and k and isinstance(v, str) and v for k, v in value.items()
        ):
            return dict(value)
        raise self.refused(value)


class ReactorSettings:
    """Attribute access to ``settings.REACTOR`` with defaults, cached until settings change.

    Each key is declared here with its default; ``reactor_settings.LEASE_SECONDS`` is a float.
    """

    # Seconds a process owns a run without writing a checkpoint before others may take it over.
    LEASE_SECONDS = Seconds(60)
    # How long run(..., idempotency_key=k) waits for a concurrent run with the same key to
    # finish before returning an in-progress outcome.
    IDEMPOTENCY_WAIT_SECONDS = Seconds(10.0)
    # Longest sleep between inline retry attempts; longer backoffs are capped to this.
    MAX_INLINE_RETRY_DELAY = Seconds(30.0)
    # Refuse inline runs inside an open transaction.atomic() block (step bodies must not run
    # inside a transaction they do not own). Set to False only if you know why.
    REFUSE_INLINE_IN_TRANSACTION = Flag(True)
    # Prepare the per-step checkpoint statement on PostgreSQL (halves its cost). Turn off behind
    # a transaction-pooling PgBouncer older than 1.21 (or without max_prepared_statements).
    CHECKPOINT_PREPARED_STATEMENTS = Flag(True)
    # Longest time an atomic step's body (or undo, or compensate) may hold its transaction;
    # past it the attempt fails and its writes are rolled back. On PostgreSQL it is also each
    # of the body's statements' statement_timeout.
    ATOMIC_STEP_TIMEOUT = Seconds(10.0)
    # A step body (or undo, or compensate) that loses its database connection is run again on
    # a new one, not failed, for this many seconds from the first loss (a failover's length);
    # past it the lost connection counts as the attempt's failure. 0: never run again.
    RECONNECT_WITHIN = Seconds(30.0, positive=False)
    # The timeout of a step's attempt when the step declares none (None: no timeout). Past it
    # the attempt fails with StepTimedOut and the step's retry policy decides.
    STEP_TIMEOUT = OptionalSeconds(None)
    # The database (a DATABASES alias) runs are written to: one for every reactor, or a dict
    # {"default": alias, "<reactor name>": alias} to shard reactors across databases. A run's
    # children, maps, trace, interrupts and dispatches live in its root run's database.
    DATABASE = DatabaseRouting(
        "default",
        while_unknown="runs of the reactor it meant go to the default database meanwhile",
    )
    # Celery queue for django_reactor's tasks (None: Celery's default queue).
    CELERY_QUEUE = OptionalText(None)
    # Times a run may lose its worker (crash, kill) before it is parked as needs_attention
    # instead of being resumed again.
    MAX_RECOVERY_ATTEMPTS = Count(5)
    # Retry backoffs up to this many seconds are published with a Celery countdown; longer
    # ones are stored as a wake-up time that the sweeper releases.
    RETRY_COUNTDOWN_LIMIT = Seconds(300.0)
    # Seconds between sweeper runs when scheduled with celery.beat_schedule() or --loop.
    SWEEP_INTERVAL = Seconds(15.0)
    # Seconds between a worker's heartbeats (its row in ProcessHeartbeat): a worker unseen
    # for three of them counts as gone in the admin's health strip and reactor_health.
    HEARTBEAT_INTERVAL = Seconds(10.0)
    # Runs a second an unpaused reactor releases (its suspended runs, oldest first): the first
    # second's worth at once, the rest at wake-up times the sweeper keeps.
    UNPAUSE_RATE = Count(50)
    # A run waiting for a worker is dispatched again when its last task was sent this long ago
    # and nobody took it (the message was lost).
    REDISPATCH_AFTER = Seconds(60.0)
    # A worker without the code a run started on (its Meta.version, or its fingerprint) hands
    # the run back when a live worker has that code: it waits this long to be taken again.
    HAND_BACK_AFTER = Seconds(5.0)
    # Rows per batch of a sweep, per kind of work: each batch is one transaction, published
    # once it commits; a batch that comes back full is followed at once by the next.
    SWEEP_BATCH = Count(500)
    # Seconds a sweep keeps taking full batches before it returns (cut short: the loop and the
    # beat task sweep again at once); every kind of work has its first batch within it.
    SWEEP_BUDGET = Seconds(5.0)
    # A schedule's tick not fired within this many seconds of its time counts as missed and
    # follows the schedule's catch-up policy (never less than twice SWEEP_INTERVAL).
    SCHEDULE_MISSED_AFTER = Seconds(60.0)
    # Most missed ticks a schedule with catch_up="all" runs (the latest); older ones are
    # recorded skipped.
    SCHEDULE_CATCH_UP_LIMIT = Count(100)
    # Sent dispatches (outbox rows) older than this many seconds are deleted by the sweeper.
    DISPATCH_RETENTION = Seconds(86400.0)
    # The steering history's entries older than this many seconds are deleted by reactor_prune
    # (whatever their runs became); None keeps them for ever.
    AUDIT_RETENTION = OptionalSeconds(365 * 86400.0)
    # Redis for completion signals (pub/sub). None: the django-redis "default" cache when there
    # is one, else waiters only poll the database.
    REDIS_URL = OptionalText(None)
    # How long an inline caller waits for an async unit's result before the reader fails.
    ASYNC_WAIT_TIMEOUT = Seconds(30.0)
    # How long a worker keeps a run parked on an async unit (from the unit's dispatch) before
    # the reader fails.
    ASYNC_PARK_TIMEOUT = Seconds(3600.0)
    # Waiters re-check the database at least this often; a parked run is also woken this often
    # in case its wake-up message was lost.
    ASYNC_POLL_INTERVAL = Seconds(2.0)
    # Extra app modules autodiscovered for reactors, besides each installed app's "reactors".
    AUTODISCOVER_MODULES = Setting[Sequence[str]](["reactors"])
    # Dotted paths of RunObserver subclasses instantiated for every execution (lifecycle
    # notifications), before the reactor's own Meta.middleware and the Django signals.
    MIDDLEWARE = Setting[Sequence[str | type]]([])
    # Issue a single-use resume token whenever a run reaches an interrupt (returned in the
    # Paused outcome; only its SHA-256 is stored). services.issue_resume_token() works either way.
    RESUME_TOKENS = Flag(False)
    # How the resume endpoints may be authenticated: "user" (DRF authentication plus the
    # resume_interrupt permission), "webhook" (signed webhooks) and "token" (resume tokens).
    # A dict {"default": [...], "<reactor name>": [...]} chooses per reactor (registered names;
    # while a key names no registered reactor, the reactors it does not name accept nothing).
    RESUME_AUTH = ByReactor[Sequence[str] | Mapping[str, Sequence[str]]](
        ["user", "webhook", "token"],
        while_unknown="until it is fixed, the resume endpoints accept no credential for runs "
        "of the reactors the dict does not name",
    )
    # The credentials POST /reactors/{name}/runs/ accepts to start runs: "user" (a user with
    # the start_execution permission) and "webhook" (signed with WEBHOOK_SECRETS for the reactor
    # or "default"). Empty (the default): no reactor is started over HTTP until a project says
    # which, such as {"default": [], "<reactor name>": ["user", "webhook"]}.
    START_AUTH = ByReactor[Sequence[str] | Mapping[str, Sequence[str]]](
        [],
        while_unknown="until it is fixed, POST /reactors/{name}/runs/ starts no runs of the "
        "reactors the dict does not name",
    )
    # The credentials POST /events/{name}/ accepts to emit events: "webhook" only (a request
    # signed with the WEBHOOK_SECRETS under "default"). A dict {"default": [...], "<event
    # name>": [...]} chooses per event name. Empty (the default): no event is emitted over HTTP
    # until a project says which, such as {"charge.refunded": ["webhook"]}.
    EVENT_AUTH = ByEvent[Sequence[str] | Mapping[str, Sequence[str]]]([])
    # Who may read the Prometheus metrics (GET <API prefix>/metrics/): "token" (an
    # "Authorization: Bearer <token>" header holding one of METRICS_TOKENS), "user" (a signed-in
    # user with the view_execution permission) or "open" alone (anyone: a scrape on a private
    # network). Empty (the default): the metrics answer 403 until a project says how.
    METRICS_AUTH = Setting[Sequence[str]]([])
    # The bearer tokens METRICS_AUTH's "token" accepts, each at least 16 characters (several at
    # once allow rotation). Keep them out of the source: read them from the environment.
    METRICS_TOKENS = Setting[Sequence[str]]([])
    # Webhook signing secrets (Standard Webhooks, "whsec_<base64>" or raw strings). A list is
    # accepted for every reactor; a dict {"default": [...], "<reactor name>": [...]} chooses per
    # reactor. Several secrets at once allow rotation.
    WEBHOOK_SECRETS = ByReactor[str | Sequence[str] | Mapping[str, str | Sequence[str]]](
        [], while_unknown="a request signed with its secrets resumes no run"
    )
    # The Fernet keys that seal secrets at rest (write_only inputs and the arguments made of
    # them, secret results, an interrupt payload's write_only fields, subjects' data keys),
    # newest first: new writes use the first, reads try each. Empty: keys derived (HKDF) from
    # SECRET_KEY and SECRET_KEY_FALLBACKS.
    ENCRYPTION_KEYS = FernetKeys(())
    # Seconds a signed webhook's timestamp may differ from now (replays outside are refused).
    WEBHOOK_TOLERANCE = Seconds(300)
    # Largest request body the API reads, in bytes (larger: 413 before parsing).
    API_MAX_BODY_BYTES = Count(65536)
    # The largest value a step may publish with self.context.publish(key, value), in bytes of
    # JSON: published values are read by every poll of the run, so keep them small.
    PUBLISH_MAX_BYTES = Count(16384)
    # A run's stream (GET /executions/{id}/stream/) reads the run again at least this often
    # (at once when Redis announces progress), and ends after STREAM_MAX_SECONDS with a
    # "timeout" event: the client reconnects with Last-Event-ID and goes on from there.
    STREAM_POLL_SECONDS = Seconds(0.5)
    # The most calls of the async API (Reactor.arun, handle.await_outcome's reads, asend, ...)
    # that run at once in one event loop, each on a thread with a database connection; the
    # others wait for a turn holding neither.
    ASYNC_DATABASE_CALLS = Count(10)
    STREAM_MAX_SECONDS = Seconds(300.0)
    # Resume requests allowed per client (the user, else the client's address) and period:
    # "N/s|m|h|d". None: no limit.
    API_RESUME_RATE = OptionalText("120/m")
    # Seconds an Idempotency-Key (or a webhook id) is remembered with its response.
    API_IDEMPOTENCY_TTL = Seconds(86400)
    # DRF authentication classes of the API (dotted paths). None: REST_FRAMEWORK's defaults.
    API_AUTHENTICATION_CLASSES = Setting[Sequence[str | type] | None](None)
    # DRF permission classes a user must pass for each API action (the view's ``action`` is
    # list, retrieve, cancel, undo, retry or resume). The default asks for the matching Django
    # permission (view_execution, cancel_execution, ..., resume_interrupt).
    API_PERMISSION_CLASSES = Setting[Sequence[str | type] | None](
        ["django_reactor.api.permissions.HasReactorPermission"]
    )
    # Dotted path to a function (request, queryset) -> queryset that limits which executions a
    # request may see and steer through the API (tenants, owners). None: every execution.
    API_SCOPE: Setting[str | Callable[..., QuerySet[Execution]] | None] = Setting(None)
    # Coordination (locks, semaphores, rate limits, periods, ordered locks); the three strings
    # are validated by coordination.validation (check E009).
    # Dotted path of the CoordinationBackend class: the Redis one, or
    # "django_reactor.coordination.backends.database.DatabaseBackend" without Redis.
    COORDINATION_BACKEND = Setting[str]("django_reactor.coordination.backends.redis.RedisBackend")
    # The Redis of the Redis backend: a django-redis cache alias or a redis:// URL.
    COORDINATION_REDIS = Setting[str]("default")
    # First part of every coordination key in Redis (one per app sharing a Redis).
    COORDINATION_KEY_PREFIX = Setting[str]("django_reactor")
    # Seconds a worker waits before trying again a run (or step) that could not take its lock,
    # semaphore slot or ordered-lock turn (a rate limit says itself how long to wait).
    CONTENTION_DELAY = Seconds(1.0, positive=False)
    # Times a run may be rescheduled for contention (or an unreachable coordination backend)
    # before it fails instead.
    MAX_CONTENTION_SNOOZES = Count(100, positive=False)
    # Seconds an undo or compensate waits for its step's lock or semaphore slot while another
    # run holds it (or the backend is unreachable) before it is reported as a rollback failure
    # (coordination_unavailable); it never runs unlocked.
    ROLLBACK_WAIT = Seconds(10.0)
    # Named rate limits shared by every reactor and step that uses the name:
    # {"stripe": {"second": 3, "minute": 100}} or {"stripe": [[3, 1], [100, 60]]}.
    RATE_LIMITS = Setting[object]({})

    def __init__(self) -> None:
        self._cache: dict[str, object] = {}

    @classmethod
    def declared(cls) -> dict[str, Setting[object]]:
        """Every key's declaration, by name, in the order they are declared."""
        return {name: s for name, s in vars(cls).items() if isinstance(s, Setting)}

    @property
    def user_settings(self) -> dict[str, object]:
        """``settings.REACTOR`` as given (``{}`` when unset)."""
        value = getattr(settings, "REACTOR", None)
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise ReactorImproperlyConfigured(
                f"settings.REACTOR must be a dict, got {type(value).__name__}"
            )
        return value

    if not TYPE_CHECKING:  # for mypy, an unknown name is an error, not Any

        def __getattr__(self, name: str) -> NoReturn:
            raise AttributeError(f"REACTOR has no setting {name!r}")

    def unknown_keys(self) -> list[str]:
        """The keys of ``settings.REACTOR`` that are not settings of django_reactor."""
        return sorted(set(self.user_settings) - set(self.declared()))

    def reload(self) -> None:
        """Forget the values read so far (``settings.REACTOR`` changed)."""
        self._cache.clear()


#: Every key's default, by name.
DEFAULTS: dict[str, object] = {name: s.default for name, s in ReactorSettings.declared().items()}

reactor_settings = ReactorSettings()


@receiver(setting_changed)
def _reload(*, setting: str, **kwargs: object) -> None:
    if setting == "REACTOR":
        reactor_settings.reload()
