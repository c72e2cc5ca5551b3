"""Benchmark results worth keeping: the idle check, and the sections of ``RESULTS.md``.

Wall-clock timings taken on a busy machine measure mostly how long each process waited for a
core, so a benchmark that writes its results first asks ``check_idle`` (through
``load_before``): above ``MAX_LOAD_PER_CORE`` of 1-minute load average per core it refuses,
unless forced. ``record`` then writes the benchmark's text into its own section of a Markdown
file, between two marker lines, with the command that made it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

MAX_LOAD_PER_CORE = 0.5  # above this 1-minute load average per core, timings are not kept


def load_per_core() -> float:
    """The machine's 1-minute load average divided by its number of cores."""
    return os.getloadavg()[0] / (os.cpu_count() or 1)


def replace_section(path: Path, marker: str, section: str) -> None:
    """Put ``section`` (which starts and ends with ``marker``) into the Markdown file ``path``
    in place of the text between the two ``marker`` lines there, or append it."""
    text = path.read_text() if path.exists() else "# Benchmark results\n"
    if text.count(marker) == 2:
        before, _, rest = text.partition(marker)
        _, _, after = rest.partition(marker)
        text = before + section + after
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    path.write_text(text)


def record(results: str, marker: str, title: str, script: str, argv: list[str] | None,
           text: str) -> None:
    """Write a benchmark's ``text`` into its section of the Markdown file ``results``, under
    ``## title`` and the command that made it (``python benchmarks/SCRIPT ARGS``)."""
    command = " ".join(["python", f"benchmarks/{script}", *(sys.argv[1:] if argv is None
                                                            else argv)])
    replace_section(Path(results), marker,
                    f"{marker}\n## {title}\n\nCommand: `{command}`\n\n{text}\n{marker}")


def load_before(results: str | None, force: bool = False) -> float | None:
    """Print the 1-minute load average before a benchmark and return it; ``None`` (with the
    reason on stderr) when its results are to be written (``results``) and the machine is
    too busy for that (``check_idle``), unless ``force``."""
    load = os.getloadavg()[0]
    print(f"1-minute load average before: {load:.2f} on {os.cpu_count()} cores")
    if results:
        try:
            check_idle(force)
        except RuntimeError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return None
    return load


def check_idle(force: bool = False) -> None:
    """Raise ``RuntimeError`` if the machine is too busy for timings worth recording
    (1-minute load average above ``MAX_LOAD_PER_CORE`` per core), unless ``force``."""
    load = load_per_core()
    if load > MAX_LOAD_PER_CORE and not force:
        raise RuntimeError(f"the machine is busy (1-minute load average {os.getloadavg()[0]:.2f}"
                           f" on {os.cpu_count()} cores, {load:.2f} per core, above "
                           f"{MAX_LOAD_PER_CORE}): not recording these timings; run on an "
                           "idle machine, or pass --force")
