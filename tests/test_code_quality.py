"""The code base stays lint-clean and the engine stays free of the ORM, Celery and DRF."""

from __future__ import annotations

import ast
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_ruff_finds_nothing() -> None:
    ruff = shutil.which("ruff") or str(Path(sys.executable).parent / "ruff")
    if not Path(ruff).exists():
        pytest.fail("ruff is not installed: pip install -e '.[dev]'")
    result = subprocess.run([ruff, "check", "--quiet", str(ROOT)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_finds_nothing(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """``mypy django_reactor`` with the project's configuration (``[tool.mypy]``)."""
    if importlib.util.find_spec("mypy") is None:
        pytest.fail("mypy is not installed: pip install -e '.[dev]'")
    # pytest's cache outlives the run, so only the first run checks every module from scratch.
    cache = getattr(request.config, "cache", None)  # None under -p no:cacheprovider
    cache_dir = cache.mkdir("mypy") if cache is not None else tmp_path / "mypy"
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--cache-dir", str(cache_dir), "django_reactor"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    if result.returncode == 0:
        return
    errors = [line for line in result.stdout.splitlines() if ": error:" in line]
    if result.returncode == 1 and errors:
        listed = "\n".join(errors)
        pytest.fail(
            f"mypy found {len(errors)} error(s) in django_reactor (run `mypy django_reactor` "
            f"to see them with their notes):\n{listed}",
            pytrace=False,
        )
    pytest.fail(
        f"mypy did not run (exit code {result.returncode}):\n{result.stdout}{result.stderr}",
        pytrace=False,
    )


FORBIDDEN_IN_ENGINE = (
    "django.db.models.Model",
    "django.db.transaction",
    "celery",
    "rest_framework",
    "django_reactor.models",
    "django_reactor.store",
    "django_reactor.signals",
    "django.dispatch",
)


def test_engine_imports_no_orm_celery_or_drf() -> None:
    offenders = []
    for path in (ROOT / "django_reactor" / "engine").glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                module = node.module or ""
                if node.level:  # relative: resolve against django_reactor.engine
                    base = ["django_reactor", "engine"][: 3 - node.level] if node.level < 3 else []
                    module = ".".join([*base, module]) if module else ".".join(base)
                names = [module] + [f"{module}.{a.name}" for a in node.names]
            for name in names:
                if name == "django.db" or any(name.startswith(f) for f in FORBIDDEN_IN_ENGINE):
                    offenders.append(f"{path.name}: {name}")
    assert offenders == []
