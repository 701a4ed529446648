"""The examples of docs/how-to/testing.md run, as a user's test file would."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "how-to" / "testing.md"


def test_the_how_to_examples_pass(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocks = re.findall(r"```python\n(.*?)```", PAGE.read_text(), flags=re.DOTALL)
    pytester.makepyfile(test_howto="\n\n".join(blocks))
    pytester.makeini("[pytest]\n")
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    )
    monkeypatch.delenv("DJANGO_SETTINGS_MODULE", raising=False)

    result = pytester.runpytest_subprocess(
        "--ds=tests.settings", "-p", "no:cacheprovider", "-p", "no:schemathesis", "-q"
    )

    result.assert_outcomes(passed=15)


@pytest.mark.django_db(transaction=True)
def test_the_failure_message_shown_on_the_page() -> None:
    from django_reactor.testing import run_reactor
    from tests.testing.reactors import OrderLater

    result = run_reactor(OrderLater)
    with pytest.raises(AssertionError) as failure:
        result.assert_ran("ship", "reserve")

    shown = re.search(r"```text\n(.*?)```", PAGE.read_text(), flags=re.DOTALL)
    assert shown is not None
    page = re.sub(r"[0-9a-f]+…", "<id>", shown.group(1)).splitlines()
    actual = str(failure.value).replace(str(result.execution_id), "<id>")
    assert actual.replace("OrderLater", "Checkout").splitlines() == page
