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
