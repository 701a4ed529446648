"""The tutorials run, block by block, against the example project (``tests.docs.runner``).

"Workers, webhooks and the admin" runs its commands for real: ``createdb`` and ``migrate`` of a
database of its own, a Celery worker of the example project's app, ``runserver``, the Python
shell, the signed webhook sent with ``curl`` and OpenSSL; then it logs in to the admin the page
sends the reader to, over HTTP, and finds there what the page says it shows.
"""

from __future__ import annotations

import http.cookiejar
import os
import re
import socket
import subprocess
import sys
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.conf import settings

from tests.docs.pages import blocks
from tests.docs.runner import ROOT, Background, Translation, TutorialRun

pytestmark = [pytest.mark.postgres, pytest.mark.redis]

DOCS = ROOT / "docs"
WORKERS_PAGE = DOCS / "tutorial" / "workers-webhooks-admin.md"
#: At most this many blocks of a tutorial may go unrun (each says why on the page).
MOST_NOT_RUN = 1


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def postgres(*args: str) -> None:
    db = settings.DATABASES["default"]
    subprocess.run(
        [*args, "-h", str(db["HOST"] or "127.0.0.1"), "-U", str(db["USER"] or "postgres")],
        check=True,
        capture_output=True,
        timeout=60,
    )


@pytest.fixture
def workers_tutorial(tmp_path: Path) -> Iterator[TutorialRun]:
    port = free_port()
    database = f"reactor_tutorial_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    (tmp_path / "manage.py").symlink_to(ROOT / "manage.py")
    env = {
        **os.environ,
        # The virtualenv's python and celery first, as with the reader's virtualenv active.
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]),
        "PYTHONPATH": str(ROOT),
        "DJANGO_SETTINGS_MODULE": "tests.docs.settings",
        "CELERY_BROKER_URL": settings.CELERY_BROKER_URL,
        "REACTOR_DOCS_QUEUE": f"reactor-docs-{os.getpid()}",
    }
    for name in ("DATABASE_URL", "REACTOR_WEBHOOK_SECRET", "REACTOR_FAULTS", "SECRET"):
        env.pop(name, None)
    run = TutorialRun(
        page=WORKERS_PAGE,
        workdir=tmp_path,
        env=env,
        translation=Translation(
            substitutions={"127.0.0.1:8000": f"127.0.0.1:{port}", "reactor_tutorial": database},
            background=[
                Background(re.compile(r"^celery -A testproject worker"), ready=" ready."),
                Background(
                    re.compile(r"^python manage.py runserver$"),
                    ready="Quit the server with",
                    rewrite=lambda command: f"{command} 127.0.0.1:{port} --noreload",
                ),
            ],
        ),
    )
    try:
        yield run
    finally:
        run.stop()
        postgres("dropdb", "--if-exists", "--force", database)


FIRST_PAGE = DOCS / "tutorial" / "first-saga.md"
#: The apps of a project made by ``startproject``, which the page's "# ... Django's apps ..."
#: stands for.
DJANGO_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
]


def first_saga_settings(fragment: str, workdir: Path) -> None:
    """The reader's project: the example project's settings with the page's INSTALLED_APPS (and
    Django's apps, which the page leaves out), on a SQLite database of its own."""
    namespace: dict[str, object] = {}
    exec(fragment, namespace)  # the page's own assignment
    apps = namespace["INSTALLED_APPS"]
    assert isinstance(apps, list)
    (workdir / "tutorial_settings.py").write_text(
        "from testproject.settings import *  # noqa: F403\n"
        f"INSTALLED_APPS = {[*DJANGO_APPS, *apps]!r}\n"
        "DATABASES = {'default': {'ENGINE': 'django.db.backends.sqlite3', "
        f"'NAME': {str(workdir / 'db.sqlite3')!r}}}}}\n"
    )


def test_your_first_saga(tmp_path: Path) -> None:
    (tmp_path / "manage.py").symlink_to(ROOT / "manage.py")
    # The page starts from a project with an app called accounts ("use any app of yours").
    (tmp_path / "accounts").mkdir()
    (tmp_path / "accounts" / "__init__.py").touch()
    env = {
        **os.environ,
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]),
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]),
        "DJANGO_SETTINGS_MODULE": "tutorial_settings",
    }
    env.pop("DATABASE_URL", None)
    run = TutorialRun(
        page=FIRST_PAGE,
        workdir=tmp_path,
        env=env,
        translation=Translation(substitutions={}, settings=first_saga_settings),
    )
    try:
        run.run()
    finally:
        run.stop()
    assert len(run.not_run) <= MOST_NOT_RUN, run.not_run
    assert (tmp_path / "accounts" / "reactors.py").exists()


def test_workers_webhooks_and_the_admin(workers_tutorial: TutorialRun) -> None:
    run = workers_tutorial
    run.run()
    assert len(run.not_run) <= MOST_NOT_RUN, run.not_run
    execution_id = run.ask({"expression": "run.id"})["value"]

    # Section 9: log in to the admin as the page says, open the page it links, and the run's.
    port = run.translation.substitutions["127.0.0.1:8000"].rsplit(":", 1)[1]
    text = WORKERS_PAGE.read_text()
    (listing,) = re.findall(r"<http://127\.0\.0\.1:8000(/admin/[^>]*)>", text)
    user, password = re.search(r"log in as `(\w+)` with the\s+password `(\w+)`", text).groups()  # type: ignore[union-attr]
    admin = AdminBrowser(f"http://127.0.0.1:{port}")
    admin.log_in(user, password)
    page = admin.get(listing)
    assert "RestockProduct" in page
    assert execution_id[:8] in page
    assert "completed" in page
    page = admin.get(f"/admin/django_reactor/execution/{execution_id}/change/")
    for shown in ("purchase", "delivery", "receive", "restock-MUG", "Resumed", "DN-4711"):
        assert shown in page, shown
    for section in ("reactor-graph", "reactor-steps", "reactor-trace", "reactor-interrupts"):
        assert f'id="{section}"' in page, section
    for field in ("redacted_inputs", "result_json", "created_at", "started_at", "finished_at"):
        assert f"field-{field}" in page, field
    assert 'class="reactor-action-undo"' in page


class AdminBrowser:
    """Logs in through the admin's login form and keeps the session cookie, as a browser."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.cookies = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.cookies))

    def get(self, path: str) -> str:
        with self.opener.open(self.base + path, timeout=30) as response:
            assert response.status == 200, path
            body: str = response.read().decode()
            return body

    def log_in(self, user: str, password: str) -> None:
        form = self.get("/admin/login/")
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form)
        assert token is not None
        data = urllib.parse.urlencode(
            {
                "csrfmiddlewaretoken": token.group(1),
                "username": user,
                "password": password,
                "next": "/admin/",
            }
        ).encode()
        request = urllib.request.Request(
            self.base + "/admin/login/", data=data, headers={"Referer": self.base + "/admin/"}
        )
        with self.opener.open(request, timeout=30) as response:
            assert response.status == 200
            assert "/admin/login/" not in response.url, "the login was refused"


def test_every_tutorial_block_is_run_or_marked() -> None:
    """Each tutorial's blocks are of a kind the runner runs; few are marked as not run."""
    for page in sorted((DOCS / "tutorial").glob("*.md")):
        found = blocks(page)
        assert found, page
        assert {b.language for b in found} <= {"console", "pycon", "python"}, page
        assert sum(b.not_run is not None for b in found) <= MOST_NOT_RUN, page
