"""What the tables' columns share."""

from __future__ import annotations

from django.db import models


def max_length_of(choices: type[models.TextChoices]) -> int:
    """The length of a column that holds one of ``choices``: its longest value."""
    return max(len(value) for value in choices.values)
