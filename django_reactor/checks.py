"""System checks. Every id is documented in ``docs/reference/checks.md``."""

from __future__ import annotations

from typing import Any

from django.core.checks import CheckMessage, Error, Tags, Warning, register

from .api.metrics import INSTALL, MetricsView, auth_problems, prometheus
from .api.signatures import configured_secrets
from .conf import (
    DEFAULTS,
    ByEvent,
    ByReactor,
    Count,
    DatabaseRouting,
    FernetKeys,
    Flag,
    OptionalSeconds,
    OptionalText,
    ReactorSettings,
    Seconds,
    reactor_settings,
)
from .coordination import get_backend
from .coordination.coordinator import coordinated
from .coordination.validation import settings_problems
from .engine import timevalues
from .engine.observers import RunObserver
from .exceptions import InvalidTime, ReactorImproperlyConfigured, ReactorNotRegistered
from .registry import all_reactors, resolve, suggestions
from .services.deploys import deploy_check, parking_summary
from .services.events import event_names


@register()
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Validate the ``REACTOR`` setting."""
    from django.conf import settings

    messages: list[CheckMessage] = []
    raw = getattr(settings, "REACTOR", None)
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        return [
            Error(
                "settings.REACTOR must be a dict.",
                hint="Set REACTOR = {...} with the keys listed in the settings reference.",
                id="django_reactor.E001",
            )
        ]
    for key in reactor_settings.unknown_keys():
        messages.append(
            Warning(
                f"settings.REACTOR has an unknown key {key!r}; it is ignored.",
                hint=f"Known keys: {', '.join(sorted(DEFAULTS))}.",
                id="django_reactor.W001",
            )
        )
    # Every key declared with a type (numbers, flags, optional strings), by the same rule the
    # settings object applies when the value is read.
    for key, setting in ReactorSettings.declared().items():
        value = raw.get(key, setting.default)
        problem = setting.problem(value)
        if problem is None and isinstance(setting, Seconds | OptionalSeconds):
            problem = _duration_problem(key, setting.coerce(value))
        if problem is None:
            continue
        if isinstance(setting, Seconds | Count | OptionalSeconds):
            messages.append(Error(problem, id="django_reactor.E002"))
        elif isinstance(setting, Flag):
            messages.append(Error(problem, id="django_reactor.E004"))
        elif isinstance(setting, OptionalText):
            messages.append(Error(problem, id="django_reactor.E005"))
        elif isinstance(setting, FernetKeys):
            messages.append(Error(problem, id="django_reactor.E012"))
        elif isinstance(setting, DatabaseRouting):
            messages.append(Error(problem, id="django_reactor.E013"))
    messages += _database_messages(raw)
    messages += _api_messages(raw)
    messages += [
        Error(
            problem,
            hint='For example "METRICS_AUTH": ["token"] with "METRICS_TOKENS": '
            '[os.environ["REACTOR_METRICS_TOKEN"]] (secrets.token_urlsafe(32) makes one), '
            '["user"], or ["open"] for a scrape on a private network.',
            id="django_reactor.E016",
        )
        for problem in auth_problems(
            raw.get("METRICS_AUTH", DEFAULTS["METRICS_AUTH"]),
            raw.get("METRICS_TOKENS", DEFAULTS["METRICS_TOKENS"]),
        )
    ]
    messages += _by_reactor_messages(raw)
    modules = raw.get("AUTODISCOVER_MODULES", DEFAULTS["AUTODISCOVER_MODULES"])
    if not isinstance(modules, list | tuple) or not all(isinstance(m, str) for m in modules):
        messages.append(
            Error(
                "REACTOR['AUTODISCOVER_MODULES'] must be a list of module names.",
                hint='For example ["reactors"].',
                id="django_reactor.E003",
            )
        )
    return messages


def _database_messages(raw: dict[str, Any]) -> list[CheckMessage]:
    """``E013``: ``REACTOR["DATABASE"]`` names an alias that is not in ``DATABASES``."""
    from django.db import connections

    setting = ReactorSettings.DATABASE
    value = raw.get("DATABASE", setting.default)
    if setting.problem(value) is not None:
        return []  # its shape is reported above
    routed = {"default": value} if isinstance(value, str) else dict(value)
    known = sorted(connections.settings)
    return [
        Error(
            f"REACTOR['DATABASE'] routes {_whose(name)} to the database {alias!r}, which is "
            "not in DATABASES.",
            hint=f"Add {alias!r} to DATABASES (and run migrate --database {alias}), or route "
            f"to one of: {', '.join(known)}.",
            id="django_reactor.E013",
        )
        for name, alias in routed.items()
        if alias not in connections.settings
    ]


def _whose(name: str) -> str:
    return "the reactors it does not name" if name == "default" else f"runs of {name!r}"


def _duration_problem(key: str, seconds: float | None) -> str | None:
    """What is wrong with a duration setting a date cannot hold (infinite, too long)."""
    if seconds is None:
        return None
    try:
        timevalues.seconds(seconds, f"REACTOR[{key!r}]", zero=True)
    except InvalidTime as exc:
        return f"{exc}."
    return None


RESUME_MODES = ("user", "webhook", "token")
START_MODES = ("user", "webhook")
EVENT_MODES = ("webhook",)


def _credential_messages(
    raw: dict[str, Any], key: str, modes: tuple[str, ...], *, hint: str, id: str
) -> tuple[list[Any], list[CheckMessage]]:
    """The entries of a credentials setting (``RESUME_AUTH``, ``START_AUTH``, ``EVENT_AUTH``),
    and an error for each that is not a list of ``modes``."""
    auth = raw.get(key, DEFAULTS[key])
    choices = list(auth.values()) if isinstance(auth, dict) else [auth]
    messages: list[CheckMessage] = [
        Error(
            f"REACTOR[{key!r}] has {chosen!r}; each entry must be a list of {', '.join(modes)}.",
            hint=hint,
            id=id,
        )
        for chosen in choices
        if not isinstance(chosen, list | tuple) or not set(chosen) <= set(modes)
    ]
    return choices, messages


def _api_messages(raw: dict[str, Any]) -> list[CheckMessage]:
    """The interrupt and API settings: credentials, secrets, limits."""
    choices, messages = _credential_messages(
        raw,
        "RESUME_AUTH",
        RESUME_MODES,
        hint='For example ["webhook", "token"], or {"default": ["user"], '
        '"app.reactors.Refund": ["webhook"]}.',
        id="django_reactor.E006",
    )
    start_choices, start_messages = _credential_messages(
        raw,
        "START_AUTH",
        START_MODES,
        hint='For example {"default": [], "app.reactors.Checkout": ["user", "webhook"]}.',
        id="django_reactor.E014",
    )
    messages += start_messages
    event_choices, event_messages = _credential_messages(
        raw,
        "EVENT_AUTH",
        EVENT_MODES,
        hint='For example {"default": [], "charge.refunded": ["webhook"]}: events are emitted '
        "over HTTP by signed webhooks only.",
        id="django_reactor.E015",
    )
    messages += event_messages + _event_key_messages(raw)
    choices = [*choices, *start_choices, *event_choices]
    try:
        secrets = configured_secrets()
    except ReactorImproperlyConfigured as exc:
        messages.append(Error(str(exc), id="django_reactor.E007"))
        secrets = {}
    uses_webhooks = any(
        isinstance(chosen, list | tuple) and "webhook" in chosen for chosen in choices
    )
    if uses_webhooks and "WEBHOOK_SECRETS" in raw and not any(secrets.values()):
        messages.append(
            Warning(
                "REACTOR['WEBHOOK_SECRETS'] is set but empty: signed webhooks are refused.",
                hint="Add a secret (whsec_<base64>), or drop 'webhook' from RESUME_AUTH, "
                "START_AUTH and EVENT_AUTH.",
                id="django_reactor.W004",
            )
        )
    messages += _middleware_messages(raw)
    return messages


def _event_key_messages(raw: dict[str, Any]) -> list[CheckMessage]:
    """``E015``: a key of ``EVENT_AUTH`` that no registered reactor waits for, starts on or
    cancels on (a typo, or a reactor not loaded). Until it is fixed, the events the dict does
    not name are refused, for the entry may have been meant for any of them."""
    auth = raw.get("EVENT_AUTH", DEFAULTS["EVENT_AUTH"])
    known = sorted(event_names())
    shown = ", ".join(known[:10]) + (f" and {len(known) - 10} more" if len(known) > 10 else "")
    return [
        Error(
            f"REACTOR['EVENT_AUTH'] has an entry for {name!r}, which no registered reactor "
            "waits for, starts on or cancels on: until it is fixed, POST /events/{name}/ "
            "accepts no event the dict does not name.",
            hint="Key each entry by an event name a reactor declares (wait_for_event, "
            f'Meta.triggers, Meta.cancel_on), or "default". Known events: {shown or "none"}.',
            id="django_reactor.E015",
        )
        for name in ByEvent.event_keys(auth)
        if name not in known
    ]


def _by_reactor_messages(raw: dict[str, Any]) -> list[CheckMessage]:
    """``E011``: a key of a per-reactor setting that names no registered reactor (it applies
    to no run; the message says what the setting does meanwhile)."""
    known = sorted(all_reactors())
    shown = ", ".join(known[:10]) + (f" and {len(known) - 10} more" if len(known) > 10 else "")
    messages: list[CheckMessage] = []
    for key, setting in ReactorSettings.declared().items():
        if not isinstance(setting, ByReactor):
            continue
        for name in setting.reactor_keys(raw.get(key, setting.default)):
            if name in known:
                continue
            meant = _meant(name)
            guess = f"Did you mean {meant[0]!r}? " if len(meant) == 1 else ""
            if len(meant) > 1:
                guess = f"Did you mean {meant[0]!r} (or {', '.join(map(repr, meant[1:]))})? "
            messages.append(
                Error(
                    f"REACTOR[{key!r}] has an entry for {name!r}, which names no registered "
                    f"reactor: {setting.while_unknown}.",
                    hint=f"{guess}Key each entry by a reactor's registered name (Meta.name or "
                    f'the class\'s dotted path), or "default". Known reactors: '
                    f"{shown or 'none'}.",
                    id="django_reactor.E011",
                )
            )
    return messages


def _meant(name: str) -> tuple[str, ...]:
    """The registered names a key that names no reactor was probably meant as: the reactor it
    resolves to (a class name, the class's dotted path under another ``Meta.name``), else the
    close names."""
    try:
        return (resolve(name).definition.name,)
    except ReactorNotRegistered as exc:
        return exc.matches or suggestions(name)


def _middleware_messages(raw: dict[str, Any]) -> list[CheckMessage]:
    """Every ``REACTOR["MIDDLEWARE"]`` entry imports and is a RunObserver subclass."""
    from django.utils.module_loading import import_string

    entries = raw.get("MIDDLEWARE", DEFAULTS["MIDDLEWARE"])
    if not isinstance(entries, list | tuple):
        return [
            Error(
                f"REACTOR['MIDDLEWARE'] must be a list of dotted paths, got {entries!r}.",
                id="django_reactor.E008",
            )
        ]
    messages: list[CheckMessage] = []
    for entry in entries:
        try:
            found = import_string(entry) if isinstance(entry, str) else entry
        except ImportError as exc:
            messages.append(
                Error(
                    f"REACTOR['MIDDLEWARE'] entry {entry!r} cannot be imported: {exc}.",
                    hint="Give the dotted path of a RunObserver subclass.",
                    id="django_reactor.E008",
                )
            )
            continue
        if not (isinstance(found, type) and issubclass(found, RunObserver)):
            messages.append(
                Error(
                    f"REACTOR['MIDDLEWARE'] entry {entry!r} is not a RunObserver subclass.",
                    hint="Subclass django_reactor.engine.observers.RunObserver.",
                    id="django_reactor.E008",
                )
            )
    return messages


@register(Tags.urls)
def check_metrics(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """``W006``: the metrics are routed and opened (``METRICS_AUTH``), but ``prometheus_client``
    is not installed, so every scrape answers 501. Metrics nobody may read (the default) need
    nothing: the API's URLs route them for every project that includes the API."""
    from django.conf import settings

    raw = getattr(settings, "REACTOR", None)
    auth = raw.get("METRICS_AUTH", DEFAULTS["METRICS_AUTH"]) if isinstance(raw, dict) else None
    if not auth or not isinstance(auth, list | tuple) or prometheus() is not None:
        return []
    if not getattr(settings, "ROOT_URLCONF", None) or not _routes(MetricsView):
        return []
    return [
        Warning(
            f"The metrics are routed and REACTOR['METRICS_AUTH'] opens them, but {INSTALL}; "
            "until then every scrape answers 501.",
            hint="Install the metrics extra where the web processes run, or set "
            "REACTOR['METRICS_AUTH'] = [] to close the metrics.",
            id="django_reactor.W006",
        )
    ]


def _routes(view_class: type) -> bool:
    """Whether the project's URLs route a view of ``view_class``."""
    from django.urls import URLResolver, get_resolver

    def routed(patterns: Any) -> bool:
        for pattern in patterns:
            if isinstance(pattern, URLResolver):
                if routed(pattern.url_patterns):
                    return True
                continue
            found = getattr(pattern.callback, "view_class", None)
            if isinstance(found, type) and issubclass(found, view_class):
                return True
        return False

    return routed(get_resolver().url_patterns)


@register()
def check_coordination(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Report coordination settings the backend would refuse when a run first needs it."""
    messages: list[CheckMessage] = [
        Error(
            problem,
            hint="See the Coordination section of the settings reference.",
            id="django_reactor.E009",
        )
        for problem in settings_problems()
    ]
    users = sorted(name for name, r in all_reactors().items() if coordinated(r.definition))
    if users and not messages:
        try:
            get_backend()  # builds the client only: no server is contacted
        except ReactorImproperlyConfigured as exc:
            shown = ", ".join(users[:3]) + (f" and {len(users) - 3} more" if len(users) > 3 else "")
            messages.append(
                Error(
                    f"{shown} declare locks, semaphores, rate limits, periods or ordered locks, "
                    f"but the coordination backend cannot be set up: {exc}",
                    hint='Set REACTOR["COORDINATION_REDIS"] to a redis:// URL (or the alias of '
                    'a django-redis cache), or REACTOR["COORDINATION_BACKEND"] = '
                    '"django_reactor.coordination.backends.database.DatabaseBackend" to '
                    "coordinate through the database.",
                    id="django_reactor.E010",
                )
            )
    return messages


@register(deploy=True)
def check_database(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[CheckMessage]:
    """Warn when the database cannot give the guarantees the engine relies on.

    ``W003`` (prepared checkpoints behind a transaction pooler) is raised from the settings when
    ``DISABLE_SERVER_SIDE_CURSORS`` is set, and, when the check may use the database
    (``check --deploy --database default``), from the connection itself: a pooler such as
    PgBouncer answers the client's startup with a backend process id of its own, which is not
    the ``pg_backend_pid()`` of the server process behind it.
    """
    from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections

    if DEFAULT_DB_ALIAS not in connections.settings:
        return []
    from .store import dialect_for

    database = connections[DEFAULT_DB_ALIAS]
    dialect = dialect_for(DEFAULT_DB_ALIAS)
    messages: list[CheckMessage] = []
    try:
        prepared = reactor_settings.CHECKPOINT_PREPARED_STATEMENTS
    except ReactorImproperlyConfigured:  # reported by check_settings (E001, E004)
        prepared = False
    # Only PostgreSQL's dialect with psycopg 3 prepares the checkpoint; elsewhere the setting
    # does nothing.
    prepared = prepared and dialect.prepares_statements
    pooled_because = ""
    if prepared:
        if database.settings_dict.get("DISABLE_SERVER_SIDE_CURSORS"):
            pooled_because = "DISABLE_SERVER_SIDE_CURSORS suggests a transaction-pooling PgBouncer"
        elif databases and DEFAULT_DB_ALIAS in databases:
            try:
                with database.cursor() as cursor:
                    cursor.execute("SELECT pg_backend_pid()")
                    server_pid = cursor.fetchone()[0]
                announced = database.connection.info.backend_pid
            except (DatabaseError, AttributeError):  # unreachable: other checks report it
                announced = server_pid = None
            if announced != server_pid:
                pooled_because = (
                    f"The default database is reached through a connection pooler (the "
                    f"connection announced backend process {announced}, the server runs it as "
                    f"{server_pid})"
                )
    if pooled_because:
        messages.append(
            Warning(
                f"{pooled_because}, but REACTOR['CHECKPOINT_PREPARED_STATEMENTS'] is on.",
                hint="Keep it on with PgBouncer 1.21+ and max_prepared_statements > 0 (or in "
                "session pooling mode); otherwise set "
                "REACTOR['CHECKPOINT_PREPARED_STATEMENTS'] = False.",
                id="django_reactor.W003",
            )
        )
    messages += _connection_reuse_messages()
    if dialect.name == "sqlite":
        messages.append(
            Warning(
                "django_reactor is running on SQLite: fine for development and the demo, but "
                "SQLite serialises writers and cannot run Celery workers safely side by side.",
                hint="Use PostgreSQL (or MariaDB/MySQL) in production.",
                id="django_reactor.W002",
            )
        )
    elif dialect.name == "mysql":
        messages += _mysql_messages(
            database, checked=bool(databases) and DEFAULT_DB_ALIAS in databases
        )
    elif dialect.name not in TESTED_DATABASES:
        messages.append(
            Warning(
                f"django_reactor is not tested on the default database's vendor "
                f"({dialect.name!r}); it may work through its generic ORM store, untested.",
                hint="Supported and tested: PostgreSQL and MariaDB/MySQL in production, SQLite "
                "for development and the demo.",
                id="django_reactor.W007",
            )
        )
    return messages


@register(deploy=True)
def check_runs_in_flight(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[CheckMessage]:
    """``W009``: runs in flight that this code would park (``definition_changed``,
    ``reactor_missing``), when the check may use the database (``check --deploy --database
    default``): the summary of ``reactor_deploy_check``."""
    from django.db import DEFAULT_DB_ALIAS, DatabaseError  # as the other checks import it

    if not databases or DEFAULT_DB_ALIAS not in databases:
        return []
    try:
        parking = parking_summary(deploy_check(sample=0))
    except DatabaseError:  # not migrated yet, or unreachable: other checks report it
        return []
    if not parking:
        return []
    shown = ", ".join(f"{reactor}: {runs}" for reactor, runs in parking.most_common(5))
    more = len(parking) - 5
    return [
        Warning(
            f"{sum(parking.values())} run(s) in flight would park when a worker on this code "
            f"takes them ({shown}{f', and {more} more reactor(s)' if more > 0 else ''}): a "
            "step they recorded is gone or changed, or their reactor is (or they would wait "
            "for a version of it this code lacks).",
            hint="Run `manage.py reactor_deploy_check` for what changed and which runs; keep "
            "the steps runs recorded, or finish, cancel or migrate those runs before deploying.",
            id="django_reactor.W009",
        )
    ]


#: The databases django_reactor is tested on, by Django's vendor name: PostgreSQL (its own
#: SQL), MariaDB and MySQL ("mysql", the generic ORM store), SQLite (development, the demo).
TESTED_DATABASES = ("postgresql", "mysql", "sqlite")

#: The oldest servers with ``SELECT ... FOR UPDATE SKIP LOCKED``, which claims and sweeps use.
_SKIP_LOCKED_SINCE = "MariaDB 10.6 or MySQL 8.0.1"


def _mysql_messages(database: Any, *, checked: bool) -> list[CheckMessage]:
    """``W008``: MariaDB or MySQL at another isolation level than READ COMMITTED (Django's
    default there), or, when the check may use the database, a server without SKIP LOCKED."""
    messages: list[CheckMessage] = []
    level = (database.settings_dict.get("OPTIONS") or {}).get("isolation_level")
    if level is not None and str(level).lower() != "read committed":
        messages.append(
            Warning(
                f"The default database (MariaDB/MySQL) runs transactions at {level!r}; "
                "django_reactor's store is written and tested for READ COMMITTED.",
                hint="Remove 'isolation_level' from DATABASES['default']['OPTIONS'] (Django's "
                "default on MySQL is 'read committed') or set it to 'read committed'.",
                id="django_reactor.W008",
            )
        )
    if checked:
        from django.db import DatabaseError  # imported when called, as the other checks'

        try:
            skip_locked = database.features.has_select_for_update_skip_locked
        except DatabaseError:  # unreachable: other checks report it
            skip_locked = True
        if not skip_locked:
            messages.append(
                Warning(
                    "The default database server has no SELECT ... FOR UPDATE SKIP LOCKED: "
                    "workers claiming runs and map elements wait for each other instead of "
                    "skipping what another holds.",
                    hint=f"Upgrade to {_SKIP_LOCKED_SINCE} or newer.",
                    id="django_reactor.W008",
                )
            )
    return messages


def _connection_reuse_messages() -> list[CheckMessage]:
    """``W005``: with Celery installed and ``CELERY_DB_REUSE_MAX`` unset, Celery's Django
    integration closes the database connection around every task, whatever ``CONN_MAX_AGE``
    says, so every background run pays a new connection (12.7 ms a run against 7.0 measured
    on a 2-core machine, ``benchmarks/background_throughput.py``)."""
    from django.conf import settings

    try:
        import celery  # noqa: F401
    except ImportError:
        return []
    if getattr(settings, "CELERY_DB_REUSE_MAX", None):
        return []
    return [
        Warning(
            "CELERY_DB_REUSE_MAX is not set: Celery workers close the database connection "
            "after every task, so each background run opens a new one.",
            hint="Set CELERY_DB_REUSE_MAX = 1000 in your settings (with "
            '"CONN_HEALTH_CHECKS": True in DATABASES), or import it from '
            "django_reactor.celery.RECOMMENDED_DJANGO_SETTINGS.",
            id="django_reactor.W005",
        )
    ]
