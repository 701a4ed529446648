"""The demo command a new user runs first."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command


@pytest.mark.django_db
def test_demo_runs_every_scenario_and_prints_a_readable_summary() -> None:
    out = StringIO()
    call_command("reactor_demo", "--no-migrate", stdout=out, no_color=True)
    text = out.getvalue()
    assert "1. An order that completes" in text
    assert "completed; value:" in text
    assert "2. An order the carrier refuses: it fails and rolls back" in text
    assert "charge         undone" in text
    assert "(every completed step was undone)" in text
    assert "attempt failed (attempt 1): gateway timed out" in text
    assert "halted at load" in text
    assert "Traceback" not in text
    assert "tok_visa_4242" not in text
    assert "[REDACTED]" in text
