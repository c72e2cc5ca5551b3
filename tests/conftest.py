"""Shared pytest setup. Fixtures used by several test files live here."""

from __future__ import annotations

import os

# Figures render off-screen in tests, whatever the machine's default backend is.
os.environ.setdefault("MPLBACKEND", "Agg")


# ---- time budgets ---------------------------------------------------------------------------
# `make test` must stay under 30 minutes on a fresh 2-core machine, notebooks included (two
# nbval passes of about 2-3 minutes each, and the instrumented solutions' check), so `pytest
# tests` has about 22 minutes (two clean runs of the same tests took 20.3 and 21.3). Each heavy
# suite has its own share; the summary at the end of every run lists the heavy suites' time
# against their budgets and names any file over its share. A budget is reported, not asserted:
# a loaded machine is slower, and a unit test never fails on speed. Benchmarks measure speed.
TOTAL_BUDGET_S = 22 * 60
DEFAULT_BUDGET_S = 60
SUITE_BUDGET_S = {
    "tests/test_browser_lessons.py": 330, "tests/test_browser.py": 120,
    "tests/test_hostile.py": 180, "tests/test_mutants.py": 120, "tests/test_fidelity.py": 180,
    "tests/test_sidebyside.py": 90, "tests/test_grading_runner.py": 120,
    "tests/test_dist.py": 90, "tests/test_dist_faults.py": 90, "tests/test_dist_processes.py": 120,
    "tests/test_many_machines_torchrun.py": 90, "tests/test_calibrate.py": 90,
    "tests/test_placements_stored.py": 90, "tests/test_grading_apart.py": 150,
    "tests/test_grading_compute_reports.py": 60,
}
_spent: dict[str, float] = {}


def pytest_runtest_logreport(report):  # type: ignore[no-untyped-def]
    file = report.nodeid.split("::")[0]
    _spent[file] = _spent.get(file, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter):  # type: ignore[no-untyped-def]
    if not _spent:
        return
    write = terminalreporter.write_line
    total = sum(_spent.values())
    write(f"time budgets: all files {total:.0f} s of {TOTAL_BUDGET_S} s")
    for file in sorted(_spent, key=_spent.get, reverse=True):
        budget = SUITE_BUDGET_S.get(file, DEFAULT_BUDGET_S)
        if file in SUITE_BUDGET_S or _spent[file] > budget:
            over = "  OVER ITS BUDGET" if _spent[file] > budget else ""
            write(f"  {file}: {_spent[file]:.0f} s of {budget} s{over}")
