"""Benchmarks of django_reactor (not part of the test run; see ``benchmarks/README.md``)."""

from __future__ import annotations
