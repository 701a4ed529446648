"""Suite-wide fixtures and the one-line report of which real services the run used."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings

from tests.helpers import FAIL_AT, ledger


def _problems() -> dict[str, str]:
    return getattr(settings, "SERVICE_PROBLEMS", {})


def pytest_configure(config: pytest.Config) -> None:
    if getattr(settings, "REQUIRE_SERVICES", False) and _problems():
        missing = "; ".join(f"{name} ({why})" for name, why in _problems().items())
        raise pytest.UsageError(
            f"REACTOR_REQUIRE_SERVICES=1 but these services are not reachable: {missing}. "
            "Start them (see the README) or unset REACTOR_REQUIRE_SERVICES."
        )


@pytest.fixture(autouse=True)
def _reset_ledger() -> Iterator[None]:
    """Every test starts with an empty ledger and no step set to fail, and leaves none set."""
    ledger.clear()
    FAIL_AT.clear()
    yield
    FAIL_AT.clear()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    problems = _problems()
    server = getattr(settings, "DATABASE_SERVER", "PostgreSQL")
    for item in items:
        if "postgres" in item.keywords and server in problems:
            item.add_marker(pytest.mark.skip(reason=f"needs {server}: {problems[server]}"))
        elif (
            server == "MariaDB"
            and item.get_closest_marker("postgres")
            # Not in ``keywords``, which hold the names of the folders above (a checkout's too).
            and not item.get_closest_marker("mariadb")
        ):
            item.add_marker(pytest.mark.skip(reason="PostgreSQL only (this is the MariaDB pass)"))
        if "redis" in item.keywords and "Redis" in problems:
            item.add_marker(pytest.mark.skip(reason=f"needs Redis: {problems['Redis']}"))


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    problems = _problems()
    skipped = len(terminalreporter.stats.get("skipped", []))
    if problems:
        line = (
            f"services: NOT using {', '.join(problems)} (unreachable); SQLite fallback, "
            f"{skipped} test(s) skipped. Set REACTOR_REQUIRE_SERVICES=1 to make this an error."
        )
    else:
        db = settings.DATABASES["default"]
        server = getattr(settings, "DATABASE_SERVER", "PostgreSQL")
        line = (
            f"services: {server} at {db.get('HOST')}:{db.get('PORT') or ''} "
            f"and Redis at {settings.REDIS_URL}; {skipped} test(s) skipped."
        )
    terminalreporter.write_sep("-", line)
