"""Read the commands' plain tables the way ``cut`` would: by the header's column offsets."""

from __future__ import annotations

import re


def read_table(lines: list[str]) -> list[dict[str, str]]:
    """The rows of a plain table (its header first) as dicts by header name.

    Columns start where the header's words start; a cell is the text between its column's start
    and the next one's, stripped. Fails on a line that is not aligned to the header.
    """
    header = lines[0]
    starts = [m.start() for m in re.finditer(r"\S+", header)]
    names = header.split()
    rows = []
    for line in lines[1:]:
        for start in starts[1:]:
            assert start == 0 or line[start - 1 : start] in (" ", ""), (header, line)
        cells = [line[a:b].strip() for a, b in zip(starts, [*starts[1:], None], strict=True)]
        rows.append(dict(zip(names, cells, strict=True)))
    return rows


def section(text: str, title: str) -> list[str]:
    """The indented lines under ``title`` (``steps:``), without their indent of two spaces."""
    lines = text.splitlines()
    start = lines.index(title) + 1
    found = []
    for line in lines[start:]:
        if not line.startswith("  "):
            break
        found.append(line[2:])
    return found
