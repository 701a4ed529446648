"""Named fault points for crash tests: inert unless ``REACTOR_FAULTS`` arms them.

``REACTOR_FAULTS`` holds rules separated by ``;``, each ``point[@step]=action[:once]``::
    REACTOR_FAULTS="after_step_commit@s3=kill:once;before_undo@s2=kill"

Actions: ``kill`` (SIGKILL this process), ``stop`` (SIGSTOP it; the test sends SIGCONT),
``term`` (SIGTERM), ``exit`` (``os._exit(137)``), ``raise`` (RuntimeError), ``sysexit``
(``SystemExit``), ``keyboard`` (``KeyboardInterrupt``), ``db_kill`` (terminate this process's own
PostgreSQL connection). ``:once`` fires the rule only the first time across
all processes, using a marker file in ``REACTOR_FAULTS_STATE`` (a directory). The engine and
the store call the hook in ``engine.probes`` at the places a crash is interesting;
:func:`install` (run as Django starts) attaches :func:`point` to it only when the variable is
set, so production code pays nothing for it.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from .engine import probes

ENV = "REACTOR_FAULTS"
STATE_ENV = "REACTOR_FAULTS_STATE"
ACTIONS = ("kill", "stop", "term", "exit", "raise", "sysexit", "keyboard", "db_kill")


class InjectedFault(RuntimeError):
    """Raised by the ``raise`` action."""


@dataclass(frozen=True, slots=True)
class Rule:
    point: str
    step: str
    action: str
    once: bool

    def matches(self, point: str, step: str) -> bool:
        return self.point == point and (not self.step or self.step == step)


@lru_cache(maxsize=8)
def parse(spec: str) -> tuple[Rule, ...]:
    """Parse ``REACTOR_FAULTS``; raise ValueError naming a malformed rule."""
    rules = []
    for raw in filter(None, (part.strip() for part in spec.split(";"))):
        where, _, what = raw.partition("=")
        point, _, step = where.partition("@")
        action, _, flag = what.partition(":")
        if not point or action not in ACTIONS or flag not in ("", "once"):
            raise ValueError(
                f"bad {ENV} rule {raw!r}: expected point[@step]=action[:once] with an action "
                f"among {', '.join(ACTIONS)}"
            )
        rules.append(Rule(point, step, action, flag == "once"))
    return tuple(rules)


def install() -> None:
    """Attach :func:`point` to the engine's probe when ``REACTOR_FAULTS`` arms rules (a bad
    rule raises ValueError now, not at the first point it would match)."""
    spec = os.environ.get(ENV)
    if spec:
        parse(spec)
        probes.active = _probe
    else:
        probes.active = None


def _probe(name: str, step: str) -> None:
    point(name, step=step)


def point(name: str, *, step: str = "") -> None:
    """A place where tests may crash the process. Does nothing unless armed."""
    spec = os.environ.get(ENV)
    if not spec:
        return
    for rule in parse(spec):
        if rule.matches(name, step) and _first_time(rule, step):
            _fire(rule.action, f"{name}@{step}" if step else name)


def _first_time(rule: Rule, step: str) -> bool:
    if not rule.once:
        return True
    directory = Path(os.environ.get(STATE_ENV) or "/tmp")
    marker = directory / f"fault-{rule.point}-{step or 'any'}-{rule.action}"
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    os.close(fd)
    return True


def _fire(action: str, where: str) -> None:
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif action == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
    elif action == "term":
        os.kill(os.getpid(), signal.SIGTERM)
    elif action == "exit":
        os._exit(137)
    elif action == "raise":
        raise InjectedFault(f"fault injected at {where}")
    elif action == "sysexit":
        raise SystemExit(f"fault injected at {where}")
    elif action == "keyboard":
        raise KeyboardInterrupt(f"fault injected at {where}")
    elif action == "db_kill":
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(pg_backend_pid())")
