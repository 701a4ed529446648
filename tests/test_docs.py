"""The reference docs list every setting and every system check the code has."""

from __future__ import annotations

import re
from pathlib import Path

from django_reactor import checks
from django_reactor.conf import DEFAULTS

DOCS = Path(__file__).resolve().parent.parent / "docs"


def test_every_setting_is_documented() -> None:
    text = (DOCS / "reference" / "settings.md").read_text()
    missing = [key for key in DEFAULTS if f"`{key}`" not in text]
    assert missing == []


def test_every_check_id_is_documented() -> None:
    ids = set(re.findall(r'id="(django_reactor\.[EW]\d{3})"', Path(checks.__file__).read_text()))
    text = (DOCS / "reference" / "checks.md").read_text()
    assert ids
    assert sorted(i for i in ids if i not in text) == []


def test_every_page_reads_as_plain_markdown_in_a_checkout() -> None:
    """No page includes another file (mkdocs' snippets, ``--8<--``): what a page shows is on
    the page, for a reader of the checkout as for the site (the tutorials' code is run as
    written by ``tests/docs/test_tutorials.py``)."""
    include = re.compile(r"^\s*-{1,2}8\s*<\s*-{1,2}", re.M)
    pages = sorted(DOCS.rglob("*.md"))
    assert len(pages) > 20
    assert [str(p.relative_to(DOCS)) for p in pages if include.search(p.read_text())] == []
    assert "snippets" not in (DOCS.parent / "mkdocs.yml").read_text()


def test_the_changelog_links_nothing_by_a_path_of_the_checkout() -> None:
    """The changelog is a page of the site too (``docs/changelog.md`` links to it), where a
    link to ``docs/how-to/x.md`` finds nothing and fails ``mkdocs build --strict``: it names
    such pages as paths instead."""
    text = (DOCS.parent / "CHANGELOG.md").read_text()
    assert re.findall(r"\]\((?:\.\./)?docs/[^)]*\)", text) == []
