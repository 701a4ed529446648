"""The tutorial runner fails on a page that drifted from the code, and says where."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.docs.runner import ROOT, DocsFailure, Translation, TutorialRun, matches


def run_page(tmp_path: Path, text: str) -> TutorialRun:
    tmp_path.mkdir(parents=True, exist_ok=True)
    page = tmp_path / "page.md"
    page.write_text(text)
    workdir = tmp_path / "work"
    workdir.mkdir()
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "testproject.settings", "PYTHONPATH": str(ROOT)}
    env.pop("DATABASE_URL", None)
    run = TutorialRun(page, workdir, env, Translation(substitutions={}))
    try:
        run.run()
    finally:
        run.stop()
    return run


def test_a_command_that_prints_something_else_fails_the_page(tmp_path: Path) -> None:
    run_page(tmp_path, "```console\n$ greeting=hello\n$ echo $greeting\nhello\n```\n")
    with pytest.raises(DocsFailure, match=r"page.md:2: `echo hello` printed something else"):
        run_page(tmp_path / "b", "```console\n$ echo hello\ngoodbye\n```\n")


def test_a_command_that_fails_fails_the_page(tmp_path: Path) -> None:
    with pytest.raises(DocsFailure, match="`false` exited 1"):
        run_page(tmp_path, "```console\n$ false\n```\n")


def test_a_python_result_that_changed_fails_the_page(tmp_path: Path) -> None:
    text = "```pycon\n>>> answer = 6 * 7\n```\n\n```pycon\n>>> answer\n42\n```\n"
    assert len(run_page(tmp_path, text).ran) == 2  # the namespace is kept between blocks
    with pytest.raises(DocsFailure, match="Expected:\n    43\nGot:\n    42"):
        run_page(tmp_path / "b", text.replace("42", "43"))


def test_a_block_of_another_kind_fails_the_page(tmp_path: Path) -> None:
    with pytest.raises(DocsFailure, match="no way to run a ruby block"):
        run_page(tmp_path, "```ruby\nputs 1\n```\n")
    with pytest.raises(DocsFailure, match="a python block this test cannot run"):
        run_page(tmp_path / "b", '```python\nprint("where does this go?")\n```\n')


def test_a_file_block_creates_a_file_and_adds_to_one_that_exists(tmp_path: Path) -> None:
    text = (
        '```python title="app/settings.py"\nA = 1\n```\n\n'
        '```python title="app/settings.py"\nB = 2\n```\n\n'
        "```console\n$ python -c 'import app.settings as s; print(s.A + s.B)'\n3\n```\n"
    )
    run = run_page(tmp_path, text)
    assert (run.workdir / "app" / "settings.py").read_text() == "A = 1\n\nB = 2\n"


def test_a_block_marked_not_run_is_listed_with_its_reason(tmp_path: Path) -> None:
    run = run_page(
        tmp_path, "<!-- docs-test: not run: needs a browser -->\n```console\n$ false\n```\n"
    )
    assert run.not_run == ["page.md:3: needs a browser"]


def test_what_differs_from_run_to_run_is_compared_as_a_placeholder() -> None:
    shown = "1d87741e-6b87-4300-92da-6565a08849a9  paused  2024-05-02 10:14:03  41 ms     -\n"
    printed = "495e8d73-073a-48a5-a411-73fce36b86b9  paused  2026-12-03 03:44:38  5.2 ms    -\n"
    assert matches(shown, printed)
    assert not matches(shown, printed.replace("paused", "failed"))
    assert matches("{...}\n", '{"a": 1}')
