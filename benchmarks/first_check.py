"""How long a learner waits for the first ``mp.check`` in a fresh kernel.

    python benchmarks/first_check.py --quick          # runs end to end? (seconds)
    python benchmarks/first_check.py --runs 3 --results benchmarks/RESULTS.md

Each run starts a new Python process (a fresh kernel), imports ``mpgpu_edu`` and checks
exercise 1.3 (the ring capstone, every case) with the solutions, timing the check alone, in
two ways: ``cold``, the check right after the import; ``warmed``, as a notebook does it: the
first cell's ``mp.progress()`` starts the grader's process server in the background
(``grading.runner.warm_up``), the learner reads and writes for a while (``--read-seconds``),
then checks. The 1-minute load average is printed before and after; ``--results`` writes the
medians into that Markdown file and refuses to when the machine is busy, unless ``--force``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from mpgpu_edu.measure.recording import MAX_LOAD_PER_CORE, load_before, record  # noqa: E402

MARKER = "<!-- first_check -->"
KERNEL = """
import sys, time
import mpgpu_edu as mp
if {warm}:
    from mpgpu_edu.grading import runner
    runner.warm_up()
    time.sleep({read})
start = time.perf_counter()
result = mp.check("1.3")
print(time.perf_counter() - start, result.status)
"""


def one(warm: bool, read_seconds: float) -> float:
    """Seconds of the first check in a new process (solutions, so every case runs)."""
    env = {**os.environ, "MPGPU_EDU_IMPL": "solutions"}
    done = subprocess.run([sys.executable, "-c", KERNEL.format(warm=warm, read=read_seconds)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(done.stderr.strip().splitlines()[-1])
    seconds, status = done.stdout.split()[-2:]
    if status != "passed":
        raise RuntimeError(f"the check of 1.3 with the solutions says {status!r}")
    return float(seconds)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--read-seconds", type=float, default=15.0,
                   help="time between the warm-up and the check (default 15 s)")
    p.add_argument("--results", help="write the summary into this Markdown file")
    p.add_argument("--force", action="store_true", help="write even on a busy machine")
    p.add_argument("--quick", action="store_true", help="one run, 5 s of reading")
    args = p.parse_args(argv)
    runs, read = (1, 5.0) if args.quick else (args.runs, args.read_seconds)
    if runs < 1 or read < 0:
        print("error: --runs must be at least 1 and --read-seconds at least 0", file=sys.stderr)
        return 2
    load = load_before(args.results, args.force)
    if load is None:
        return 2
    cold = [one(False, 0.0) for _ in range(runs)]
    warmed = [one(True, read) for _ in range(runs)]
    after = os.getloadavg()[0]
    text = (f"First `mp.check(\"1.3\")` in a fresh process (the solutions: every case runs), "
            f"{runs} run(s) each, median (min-max): **cold {statistics.median(cold):.2f} s** "
            f"({min(cold):.2f}-{max(cold):.2f}), right after the import; **warmed "
            f"{statistics.median(warmed):.2f} s** ({min(warmed):.2f}-{max(warmed):.2f}), "
            f"{read:g} s after `mp.progress()` started the grader as a notebook's first cell "
            f"does. 1-minute load average {load:.2f} before, {after:.2f} after, on "
            f"{os.cpu_count()} cores.")
    print(text)
    print(f"1-minute load average after: {after:.2f} (recorded only below "
          f"{MAX_LOAD_PER_CORE} per core before)")
    if args.results:
        record(args.results, MARKER, "The first check in a fresh kernel", "first_check.py",
               argv, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
