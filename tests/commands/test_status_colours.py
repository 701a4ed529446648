"""How the commands colour a run's status: endings by how they ended, runs in flight apart."""

from __future__ import annotations

import pytest
from django.core.management.base import BaseCommand
from django.core.management.color import no_style

from django_reactor.management.commandtools import ReactorCommand, styled
from django_reactor.states import ExecutionStatus

RED, GREEN, YELLOW, CYAN = "31", "32", "33", "36"


def colours(text: str) -> set[str]:
    """The SGR codes that open ``text`` (``\\x1b[32;1m...``: ``{"32", "1"}``)."""
    assert text.startswith("\x1b["), repr(text)
    return set(text[2 : text.index("m")].split(";"))


def coloured() -> BaseCommand:
    return ReactorCommand(force_color=True)


@pytest.mark.parametrize(
    ("status", "colour"),
    [
        (ExecutionStatus.COMPLETED, GREEN),
        (ExecutionStatus.FAILED, RED),
        (ExecutionStatus.NEEDS_ATTENTION, RED),
        (ExecutionStatus.ABORTED, RED),
        (ExecutionStatus.HALTED, YELLOW),
        (ExecutionStatus.CANCELLED, YELLOW),
        (ExecutionStatus.PAUSED, CYAN),
        (ExecutionStatus.PENDING, CYAN),
        (ExecutionStatus.RUNNING, CYAN),
        (ExecutionStatus.ROLLING_BACK, CYAN),
    ],
)
def test_each_status_has_the_colour_of_what_it_means(status: str, colour: str) -> None:
    text = styled(coloured(), status)
    assert colour in colours(text), repr(text)
    assert status in text


def test_runs_in_flight_or_waiting_are_never_red() -> None:
    for status in (ExecutionStatus.PAUSED, ExecutionStatus.PENDING, ExecutionStatus.RUNNING):
        assert RED not in colours(styled(coloured(), status))


def test_without_colours_a_status_is_plain_text() -> None:
    command = BaseCommand()
    command.style = no_style()
    for status in ExecutionStatus.values:
        assert styled(command, status) == status
