"""What differs from one run of a tutorial to the next, replaced by a placeholder on both sides
of a comparison: ids, times, durations, made-up payment references. Everything else must match
the page exactly."""

from __future__ import annotations

import re

PLACEHOLDERS = [
    # A payment reference of the first tutorial's stand-in provider (random).
    (re.compile(r"\bpay_[0-9a-f]{8}\b"), "pay_<reference>"),
    (re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"), "<id>"),
    (re.compile(r"datetime\.datetime\([^)]*\)"), "<datetime>"),
    (
        re.compile(r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:\.\d+)?(?:[+-]\d\d:\d\d|Z)?"),
        "<time>",
    ),
    # A duration as display.format_duration writes it, with the padding of its column.
    (
        re.compile(r"\b\d+(?:\.\d)? (?:ms|s|min \d\d s|h \d\d min|d \d\d h)\b( {2,})?"),
        "<duration> ",
    ),
]


def normalise(text: str) -> str:
    text = text.replace("\r\n", "\n")
    for pattern, placeholder in PLACEHOLDERS:
        text = pattern.sub(placeholder, text)
    return text
