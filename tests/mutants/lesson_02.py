"""Plausible wrong answers for lesson 02 (see tests/mutants/__init__.py)."""

from __future__ import annotations

MUTANTS: dict[str, list[str]] = {}
