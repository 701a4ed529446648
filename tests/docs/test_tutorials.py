"""The tutorials run, block by block, as a newcomer follows them (``tests.docs.runner``).

"Your first saga" starts in an empty directory: ``django-admin startproject``, ``startapp``,
the page's ``INSTALLED_APPS``, ``migrate``, its reactor and its Python shell. "Workers, webhooks
and the admin" goes on in that same project: the page's reactor added to ``accounts``, its
Celery app and block of settings written into the project, ``createdb`` and ``migrate`` of a
database of its own, a Celery worker, ``runserver``, the Python shell, the signed webhook sent
with ``curl`` and OpenSSL; then it logs in to the admin the page sends the reader to, over
HTTP, and finds there what the page says it shows.

Set ``REACTOR_SCREENSHOTS=<dir>`` (``docs/img`` to replace it) to take the page's screenshot of
the run in the admin with Debian's Chromium.
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


#: The apps of a project made by ``startproject``, which the first page's "# ... Django's
#: apps ..." stands for.
DJANGO_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
]
FIRST_PAGE = DOCS / "tutorial" / "first-saga.md"
PROJECT = "mysite"


def installed_apps(fragment: str, workdir: Path) -> None:
    """The first page's ``INSTALLED_APPS``, as the reader edits it into the project's
    settings: Django's apps (which the page leaves out), then the page's."""
    namespace: dict[str, object] = {}
    exec(fragment, namespace)  # the page's own assignment
    apps = namespace["INSTALLED_APPS"]
    assert isinstance(apps, list)
    settings_file = workdir / PROJECT / "settings.py"
    text = settings_file.read_text()
    made = re.search(r"^INSTALLED_APPS = \[.*?^\]\n", text, re.S | re.M)
    assert made, "startproject wrote no INSTALLED_APPS"
    settings_file.write_text(
        text.replace(made.group(0), f"INSTALLED_APPS = {[*DJANGO_APPS, *apps]!r}\n")
    )


def newcomer_env() -> dict[str, str]:
    """A terminal with the virtualenv active: its python, celery and django-admin first, and
    nothing of the test's own settings (manage.py and the Celery app find the project's)."""
    env = {
        **os.environ,
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]),
    }
    for name in ("DJANGO_SETTINGS_MODULE", "PYTHONPATH", "DATABASE_URL", "CELERY_BROKER_URL"):
        env.pop(name, None)
    return env


def first_saga(workdir: Path) -> TutorialRun:
    return TutorialRun(
        page=FIRST_PAGE,
        workdir=workdir,
        env=newcomer_env(),
        translation=Translation(
            substitutions={}, settings=installed_apps, shell_settings=f"{PROJECT}.settings"
        ),
    )


def follow(run: TutorialRun) -> None:
    try:
        run.run()
    finally:
        run.stop()
    assert len(run.not_run) <= MOST_NOT_RUN, run.not_run


def test_your_first_saga(tmp_path: Path) -> None:
    run = first_saga(tmp_path)
    follow(run)
    assert (tmp_path / "accounts" / "reactors.py").exists()
    assert (tmp_path / "db.sqlite3").exists()  # the project's own database, as made


@pytest.fixture
def workers_tutorial(tmp_path: Path) -> Iterator[TutorialRun]:
    """The second page, in the project the first page made (followed first, in ``tmp_path``),
    on a database, a broker and a queue of this test's own, and a free port."""
    follow(first_saga(tmp_path))
    port = free_port()
    database = f"reactor_tutorial_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    # The worker listens on Celery's default queue, as the reader's does; here that queue is
    # this test run's, so that parallel runs never take each other's tasks.
    queue = f"reactor-docs-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    run = TutorialRun(
        page=WORKERS_PAGE,
        workdir=tmp_path,
        env=newcomer_env(),
        translation=Translation(
            substitutions={
                "127.0.0.1:8000": f"127.0.0.1:{port}",
                "reactor_tutorial": database,
                "redis://127.0.0.1:6379/0": settings.CELERY_BROKER_URL,
            },
            background=[
                Background(re.compile(rf"^celery -A {PROJECT} worker"), ready=" ready."),
                Background(
                    re.compile(r"^python manage.py runserver$"),
                    ready="Quit the server with",
                    rewrite=lambda command: f"{command} 127.0.0.1:{port} --noreload",
                ),
            ],
            appended={f"{PROJECT}/settings.py": f"\nCELERY_TASK_DEFAULT_QUEUE = {queue!r}\n"},
            shell_settings=f"{PROJECT}.settings",
        ),
    )
    try:
        yield run
    finally:
        run.stop()
        postgres("dropdb", "--if-exists", "--force", database)


def test_workers_webhooks_and_the_admin(workers_tutorial: TutorialRun) -> None:
    run = workers_tutorial
    run.run()
    assert len(run.not_run) <= MOST_NOT_RUN, run.not_run
    execution_id = run.ask({"expression": "run.id"})["value"]
    # The page's settings and reactor went into the reader's project, not the example's.
    project = run.workdir / PROJECT
    assert "CELERY_BROKER_URL" in (project / "settings.py").read_text()
    assert "celery_app" in (project / "__init__.py").read_text()
    assert "class VerifyIdentity" in (run.workdir / "accounts" / "reactors.py").read_text()
    assert "class SignUp" in (run.workdir / "accounts" / "reactors.py").read_text()

    # Section 10: log in to the admin as the page says, open the page it links, and the run's.
    port = run.translation.substitutions["127.0.0.1:8000"].rsplit(":", 1)[1]
    text = WORKERS_PAGE.read_text()
    (listing,) = re.findall(r"<http://127\.0\.0\.1:8000(/admin/[^>]*)>", text)
    user, password = re.search(r"log in as `(\w+)` with the\s+password `(\w+)`", text).groups()  # type: ignore[union-attr]
    admin = AdminBrowser(f"http://127.0.0.1:{port}")
    admin.log_in(user, password)
    page = admin.get(listing)
    assert "VerifyIdentity" in page
    assert execution_id[:8] in page
    assert "completed" in page
    change = f"/admin/django_reactor/execution/{execution_id}/change/"
    page = admin.get(change)
    for shown in ("hold_account", "report", "activate", "identity-lin", "Resumed", "P1234567"):
        assert shown in page, shown
    for section in ("reactor-graph", "reactor-steps", "reactor-trace", "reactor-interrupts"):
        assert f'id="{section}"' in page, section
    for field in ("redacted_inputs", "result_json", "created_at", "started_at", "finished_at"):
        assert f"field-{field}" in page, field
    assert 'class="reactor-action-undo"' in page
    if os.environ.get("REACTOR_SCREENSHOTS"):
        screenshot_of_the_run(
            f"http://127.0.0.1:{port}",
            change,
            user,
            password,
            Path(os.environ["REACTOR_SCREENSHOTS"]),
        )


def screenshot_of_the_run(base: str, path: str, user: str, password: str, out: Path) -> None:
    """``tutorial-identity-run.png``: the run's page down to its steps, as the page shows it."""
    from playwright.sync_api import sync_playwright

    from tests.browser.conftest import CHROMIUM, LAUNCH_ARGS, LAUNCH_TIMEOUT_MS, VIEWPORT

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=LAUNCH_ARGS,
            timeout=LAUNCH_TIMEOUT_MS,
        )  # fmt: skip
        try:
            page = browser.new_page(viewport=VIEWPORT, locale="en-US")
            page.goto(f"{base}/admin/login/?next={path}")
            page.fill("#id_username", user)
            page.fill("#id_password", password)
            page.click("input[type=submit]")
            page.wait_for_url(f"{base}{path}")
            box = page.locator("#reactor-steps").bounding_box()
            assert box is not None
            out.mkdir(parents=True, exist_ok=True)
            page.screenshot(
                path=str(out / "tutorial-identity-run.png"),
                full_page=True,
                clip={
                    "x": 0,
                    "y": 0,
                    "width": VIEWPORT["width"],
                    "height": box["y"] + box["height"] + 16,
                },
            )
        finally:
            browser.close()


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
