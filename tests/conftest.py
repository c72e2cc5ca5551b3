"""Shared pytest setup. Fixtures used by several test files live here."""

from __future__ import annotations

import os

# Figures render off-screen in tests, whatever the machine's default backend is.
os.environ.setdefault("MPLBACKEND", "Agg")
