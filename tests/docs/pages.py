"""The fenced code blocks of a documentation page, in order, with what the page says of them."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

FENCE = re.compile(r"^```(?P<language>[\w-]*)(?P<attributes>[^\n`]*)$")
#: Put on the line before a block that the docs test does not run, with the reason.
NOT_RUN = re.compile(r"^<!-- docs-test: not run: (?P<reason>.+?) -->$")


@dataclass(frozen=True)
class Block:
    """One fenced block: its language, attributes (``title="..."``), text and first line."""

    language: str
    attributes: str
    text: str
    lineno: int
    not_run: str | None = None  # the reason, when the page marks it as not run

    def where(self, page: Path) -> str:
        return f"{page.name}:{self.lineno}"


def blocks(page: Path) -> list[Block]:
    found = []
    lines = page.read_text().splitlines()
    index = 0
    while index < len(lines):
        match = FENCE.match(lines[index])
        if match is None or not match["language"]:
            index += 1
            continue
        start = index
        end = lines.index("```", start + 1)
        before = lines[start - 1] if start else ""
        marker = NOT_RUN.match(before)
        found.append(
            Block(
                language=match["language"],
                attributes=match["attributes"].strip(),
                text="\n".join(lines[start + 1 : end]) + "\n",
                lineno=start + 2,
                not_run=marker["reason"] if marker else None,
            )
        )
        index = end + 1
    return found


@dataclass(frozen=True)
class Command:
    """A ``$ ...`` line of a console block (with its ``\\`` continuations) and the output the
    page shows under it."""

    text: str
    output: str


def commands(block: Block) -> list[Command]:
    found: list[Command] = []
    current: list[str] = []
    output: list[str] = []
    continued = False
    for line in block.text.splitlines():
        if continued:
            current.append(line)
            continued = line.endswith("\\")
        elif line.startswith("$ "):
            if current:
                found.append(Command("\n".join(current), "".join(f"{o}\n" for o in output)))
            current, output = [line[2:]], []
            continued = line.endswith("\\")
        else:
            assert current, f"output before any command in the block at line {block.lineno}"
            output.append(line)
    if current:
        found.append(Command("\n".join(current), "".join(f"{o}\n" for o in output)))
    return found
