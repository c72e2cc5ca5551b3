"""Does ``mpgpu-edu calibrate`` predict our own ring? Several calibrations in a row.

    python benchmarks/calibrate_vs_measured.py --quick        # runs end to end? (seconds)
    python benchmarks/calibrate_vs_measured.py --runs 3 --results benchmarks/RESULTS.md

Each run is one whole ``calibrate`` (``mpgpu_edu.measure.calibrate``): ping-pong, exchanges and
adds fit a CPU profile, and in the same job our rings and torch.distributed's all-reduce are
timed; the profile is then loaded as a simulated cluster and both rings are simulated on it.
Per size, the error (simulated - measured) / measured of each run, and over runs the median of
the runs' errors (min-max). ``ring`` is the readable ``all_reduce_ring``; ``fast`` is
``RingAllReduce``, the one DDP uses.

The 1-minute load average is printed before and after; ``--results`` writes the summary into
that Markdown file (its own section) and refuses to when the load before is above
``MAX_LOAD_PER_CORE`` per core, unless ``--force``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from mpgpu_edu.measure.bench import size_label  # noqa: E402
from mpgpu_edu.measure.recording import MAX_LOAD_PER_CORE, load_before, record  # noqa: E402

MARKER = "<!-- calibrate_vs_measured -->"
QUICK_SIZES = [2**12, 2**22]


def run_quick(world_size: int, repeats: int, sizes: list[int] | None,
              attempts: int = 3) -> dict:
    """``run_once`` for ``--quick``, which checks that the bench runs end to end, not its
    numbers: with two tiny repeats a busy machine's hiccup can make a small message slower
    than a large one, and the fit then has no bandwidth to find; try again (and say so)."""
    for attempt in range(1, attempts + 1):
        try:
            return run_once(world_size, repeats, sizes)
        except ValueError as exc:
            if "do not grow" not in str(exc) or attempt == attempts:
                raise
            print(f"attempt {attempt}: {exc}; measuring again")
    raise AssertionError("unreachable")


def run_once(world_size: int, repeats: int, sizes: list[int] | None) -> dict:
    """One calibration and its comparison (``compare``'s dict, with the profile's load)."""
    from mpgpu_edu.measure.calibrate import ALLREDUCE_SIZES, DEFAULT_SIZES, calibrate, compare
    from mpgpu_edu.measure.calibrated import load_calibrated, save_profile

    ping = DEFAULT_SIZES if sizes is None else [0, *sizes]
    profile = calibrate(world_size, ping, repeats, "gloo", sizes or ALLREDUCE_SIZES)
    with tempfile.TemporaryDirectory() as tmp:
        path = save_profile(profile, Path(tmp) / "profile.json")
        comparison = compare(profile, load_calibrated(path, gpu="CPU-16GB"))
    comparison["alpha_s"], comparison["beta_Bps"] = profile["alpha_s"], profile["beta_Bps"]
    return comparison


def summary(runs: list[dict], load_before: float, load_after: float) -> str:
    """One Markdown table: per size, the median error over runs (min-max) of both rings."""
    lines = ["| size | ring: simulated vs measured | fast: simulated vs measured |",
             "|---:|---:|---:|"]
    for i, nbytes in enumerate(runs[0]["sizes"]):
        cells = [size_label(nbytes)]
        for key in ("error", "fast_error"):
            values = [r[key][i] for r in runs]
            cells.append(f"**{statistics.median(values):+.1%}** "
                         f"({min(values):+.1%} to {max(values):+.1%})")
        lines.append("| " + " | ".join(cells) + " |")
    fits = "; ".join(f"alpha {r['alpha_s'] * 1e6:.0f} us, beta {r['beta_Bps'] / 1e9:.2f} GB/s"
                     for r in runs)
    return "\n".join([
        f"**{runs[0]['world_size']} ranks**, gloo, {len(runs)} calibration(s) of "
        f"{runs[0]['repeats']} repeats; error = (simulated - measured) / measured, the "
        f"median over runs (min to max). Fits: {fits}. 1-minute load average {load_before:.2f}"
        f" before, {load_after:.2f} after, on {os.cpu_count()} cores.", "", *lines])


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--runs", type=int, default=3, help="whole calibrations")
    parser.add_argument("--results", help="write the summary into this Markdown file")
    parser.add_argument("--force", action="store_true", help="write even on a busy machine")
    parser.add_argument("--quick", action="store_true",
                        help="two small sizes, 2 repeats, 1 run: does it run end to end?")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    options = parse(argv)
    sizes = QUICK_SIZES if options.quick else None
    runs_wanted, repeats = (1, 2) if options.quick else (options.runs, options.repeats)
    if runs_wanted < 1 or repeats < 1:
        print("error: --runs and --repeats must be at least 1", file=sys.stderr)
        return 2
    load = load_before(options.results, options.force)
    if load is None:
        return 2
    runs = []
    for k in range(runs_wanted):
        runs.append(run_quick(options.world_size, repeats, sizes) if options.quick
                    else run_once(options.world_size, repeats, sizes))
        print(f"run {k + 1} of {runs_wanted}: fast ring error per size "
              + ", ".join(f"{size_label(n)} {e:+.1%}"
                          for n, e in zip(runs[-1]["sizes"], runs[-1]["fast_error"])))
    after = os.getloadavg()[0]
    text = summary(runs, load, after)
    print(text)
    print(f"1-minute load average after: {after:.2f} (recorded only below "
          f"{MAX_LOAD_PER_CORE} per core before)")
    if options.results:
        record(options.results, MARKER, "Calibrate: the simulator against our own ring (gloo)",
               "calibrate_vs_measured.py", argv, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
