"""How the ``reactor_*`` commands write for people: tables and colours through rich.

Output is coloured when Django would colour it (no ``--no-color``, no ``DJANGO_COLORS=nocolor``,
a terminal on standard output) and the command writes to a terminal, or with ``--force-color``.
Otherwise it is plain text: no ANSI codes, no box drawing, columns separated by two spaces, one
row a line, so that ``grep``, ``cut`` and ``awk`` read it. On a terminal a table has the same
layout with a bold header and coloured statuses. A table is never wrapped or cut to the
terminal's width (rich would fold cells or drop whole columns): a row longer than the terminal
wraps as any long line does, and every cell stays whole.
"""

from __future__ import annotations

import getpass
import io
import os
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from rich.color import ColorSystem
from rich.console import Console
from rich.style import Style
from rich.table import Table
from rich.text import Text

from django_reactor import store
from django_reactor.engine.actors import MAX_WHO_LENGTH, Actor, acting_as
from django_reactor.states import ExecutionStatus

# Endings by how they ended: done green, failures red, deliberate stops yellow. Runs still in
# flight or waiting are cyan (bold when they wait for someone), never red.
STATUS_STYLES: dict[str, str] = {
    ExecutionStatus.COMPLETED: "bold green",
    ExecutionStatus.FAILED: "bold red",
    ExecutionStatus.NEEDS_ATTENTION: "bold red",
    ExecutionStatus.ABORTED: "bold red",
    ExecutionStatus.HALTED: "bold yellow",
    ExecutionStatus.CANCELLED: "bold yellow",
    ExecutionStatus.PAUSED: "bold cyan",
    ExecutionStatus.SUSPENDED: "bold yellow",
}
IN_FLIGHT_STYLE = "cyan"
#: Control characters in a cell (a tab, an escape) would break the columns or the terminal.
CONTROL = re.compile(r"[\x00-\x1f\x7f]")
#: A table is as wide as its widest row (the console never makes it narrower).
UNBOUNDED_WIDTH = 1_000_000


class IntermixedCommandParser(CommandParser):
    """Allows ``key=value`` pairs after options (``Refund --background order=42``)."""

    def parse_args(self, args: Any = None, namespace: Any = None) -> Any:
        return self.parse_intermixed_args(args, namespace)


class ReactorCommand(BaseCommand):
    """Base of the ``reactor_*`` commands: remembers ``--force-color`` for :func:`colours`, and
    ends quietly when the reader of its output goes away (``reactor_list | head -1``)."""

    force_color = False
    #: Whether positional ``key=value`` pairs may come after options (IntermixedCommandParser).
    intermixed_arguments = False

    def __init__(
        self,
        stdout: Any = None,
        stderr: Any = None,
        no_color: bool = False,
        force_color: bool = False,
    ) -> None:
        super().__init__(stdout, stderr, no_color, force_color)
        self.force_color = force_color

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        parser = super().create_parser(prog_name, subcommand, **kwargs)
        if self.intermixed_arguments:
            parser.__class__ = IntermixedCommandParser
        parser.add_argument(
            "--database",
            default=None,
            help="The database (a DATABASES alias) to work in when REACTOR['DATABASE'] routes "
            "reactors to several; default: each run's own when the command names runs, else "
            "the default one.",
        )
        return parser

    def execute(self, *args: Any, **options: Any) -> Any:
        self.force_color = bool(options.get("force_color"))
        alias = options.get("database")
        # What the command steers is recorded as the command's, run by this OS user.
        with acting_as(command_actor(self)):
            if alias is None:
                return super().execute(*args, **options)
            if alias not in store.aliases():
                raise CommandError(
                    f"--database {alias!r} is not a database runs are written to; "
                    f"REACTOR['DATABASE'] routes runs to: {', '.join(store.aliases())}"
                )
            with store.bound(alias):
                return super().execute(*args, **options)

    def run_from_argv(self, argv: list[str]) -> None:
        """Run from the command line. When standard output is a pipe its reader closed, exit
        1 without a word: the reader wanted no more (Python would print a traceback, and
        another when it flushed the output at exit). Whatever the command did before its
        output stopped is done; what it would have done after is not."""
        try:
            super().run_from_argv(argv)
            sys.stdout.flush()  # inside the try: buffered output meets the closed pipe here
        except BrokenPipeError:
            # Nothing more can be written; flushing at exit must not fail again.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            sys.exit(1)


def command_actor(command: BaseCommand) -> Actor:
    """Who a command's steering actions are recorded as: the command and the operating-system
    user running it (``"reactor_cancel by deploy"``, via ``"command"``)."""
    name = type(command).__module__.rsplit(".", 1)[-1]
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no user name in the environment nor the password database
        user = f"uid {os.getuid()}" if hasattr(os, "getuid") else "an unknown user"
    return Actor(f"{name} by {user}"[:MAX_WHO_LENGTH], "command")


def colours(command: BaseCommand) -> bool:
    """Whether ``command`` writes colours (see the module)."""
    if command.style.SUCCESS("x") == "x":  # Django's no_style(): no colours at all
        return False
    return bool(getattr(command, "force_color", False)) or command.stdout.isatty()


def rich_style(status: str) -> str:
    """The rich style of text about a run or step in ``status``."""
    return STATUS_STYLES.get(status, IN_FLIGHT_STYLE)


def status_style(command: BaseCommand, status: str) -> Callable[[str], str]:
    """How ``command`` colours text about a run in ``status``: ANSI text in the status's colour,
    or the text unchanged when ``command`` writes no colours."""
    if not colours(command):
        return str
    style = Style.parse(rich_style(status))
    return lambda text: style.render(text, color_system=ColorSystem.STANDARD)


def styled(command: BaseCommand, status: str) -> str:
    """``status`` in its colour (plain when ``command`` writes no colours)."""
    return status_style(command, status)(status)


def status_cell(command: BaseCommand, status: str) -> Text:
    """A table cell holding ``status``, in its colour when ``command`` writes colours."""
    return Text(status, style=rich_style(status) if colours(command) else "")


def table_lines(
    command: BaseCommand,
    headers: Sequence[str],
    rows: Iterable[Sequence[str | Text]],
) -> list[str]:
    """``rows`` under ``headers``, one string a line, as ``command`` should write them."""
    colour = colours(command)
    table = Table(
        box=None,  # the same layout with and without colours: no line drawing
        show_edge=False,
        pad_edge=False,
        padding=(0, 1),
        header_style="bold" if colour else "",
    )
    for header in headers:
        table.add_column(header, no_wrap=True)
    for row in rows:
        table.add_row(*(CONTROL.sub(" ", cell) if isinstance(cell, str) else cell for cell in row))
    buffer = io.StringIO()
    Console(
        file=buffer,
        width=UNBOUNDED_WIDTH,
        color_system="standard" if colour else None,
        force_terminal=colour,
        no_color=not colour,
        highlight=False,
        markup=False,
        emoji=False,
        legacy_windows=False,
    ).print(table)
    return [line.rstrip() for line in buffer.getvalue().splitlines()]


def write_table(
    command: BaseCommand,
    headers: Sequence[str],
    rows: Iterable[Sequence[str | Text]],
    *,
    indent: str = "",
) -> None:
    """Write :func:`table_lines` to ``command.stdout``, each line after ``indent``."""
    for line in table_lines(command, headers, rows):
        command.stdout.write(indent + line if line else line)
