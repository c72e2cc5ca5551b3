"""Our all-reduces against ``torch.distributed.all_reduce``, in the same processes.

    python benchmarks/allreduce_vs_torch.py --quick          # runs end to end? (seconds)
    python benchmarks/allreduce_vs_torch.py --world-size 2,4 --runs 3 \
        --algos ring,ring_reused,ring_fast_unsegmented,ring_fast --results benchmarks/RESULTS.md

A thin wrapper around ``mpgpu_edu.measure.bench.bench_allreduce`` (the same as ``mpgpu-edu bench
allreduce``): for every world size, ``--runs K`` whole benches one after another, each
in worker processes of its own (a fresh pool: how fast a pair of processes runs gloo varies
from pool to pool, so runs in one pool would not be independent), each printed as a table.
Within a run, ours and torch's alternate (in a balanced order: each operation runs right
after every other equally often, ``bench.in_turn``) and each run reports, per size, the
median over repeats of ours / torch's in the same repeat (``paired``). Over the runs: the
median of those run medians, with min and max, which shows how much of a difference is the
machine's noise.

The 1-minute load average is printed before and after. ``--results`` writes the summary
into that Markdown file (its own section, between markers), and refuses to when the load
before the bench is above ``MAX_LOAD_PER_CORE`` per core, unless ``--force``. ``--quick``
(tiny sizes, 2 repeats, one run, 2 ranks) only checks that everything runs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from mpgpu_edu.measure.bench import (DEFAULT_REPEATS, QUICK_REPEATS, QUICK_SIZES,  # noqa: E402
                             bench_allreduce, size_label, table)
from mpgpu_edu.measure.recording import (MAX_LOAD_PER_CORE, load_before,  # noqa: E402
                                         replace_section)
from mpgpu_edu.cli.bench import DEFAULT_SIZES, parse_algos, parse_sizes  # noqa: E402
from mpgpu_edu.comm.pool import shutdown_pools  # noqa: E402

MARKER = "<!-- allreduce_vs_torch runs -->"


def summary(reports: list[dict]) -> str:
    """One Markdown table for the runs of one world size: per size and algorithm, the median
    over runs of each run's paired ratio (min / max in brackets), and of the CPU ratio."""
    algos, sizes = reports[0]["algos"], reports[0]["sizes"]
    head = (["size"] + [f"{a}/builtin" for a in algos] + [f"cpu {a}/builtin" for a in algos])
    lines = ["| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
    for i, nbytes in enumerate(sizes):
        cells = [size_label(nbytes)]
        for key in ("paired", "cpu_ratio"):
            for algo in algos:
                values = [r[f"{key}_{algo}"][i] for r in reports]
                cells.append(f"**{statistics.median(values):.2f}** "
                             f"({min(values):.2f}-{max(values):.2f})")
        lines.append("| " + " | ".join(cells) + " |")
    loads = [r["loadavg_start"][0] for r in reports] + [r["loadavg"][0] for r in reports]
    r0 = reports[0]
    return "\n".join([
        f"**{r0['world_size']} ranks**, gloo, fp32, {len(reports)} run(s) of {r0['repeats']} "
        f"interleaved repeats; per run the median of the ratios ours / builtin within a "
        f"repeat, here the median of the run medians (min-max over runs); below 1: ours is "
        f"faster. 1-minute load average {min(loads):.2f}-{max(loads):.2f} on {r0['cpus']} "
        f"cores, torch {r0['torch']}.", "", *lines])


def write_section(path: Path, text: str, command: str) -> None:
    """Replace (or append) this benchmark's section, between two markers, in ``path``."""
    replace_section(path, MARKER, f"{MARKER}\n## All-reduce: ours against "
                    f"torch.distributed.all_reduce (gloo)\n\nCommand: `{command}`\n\n{text}\n"
                    f"{MARKER}")


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", default="2,4", help="comma-separated (default 2,4)")
    parser.add_argument("--repeats", type=int, default=DEFAULT_REPEATS)
    parser.add_argument("--sizes", default=DEFAULT_SIZES)
    parser.add_argument("--algos", default="ring,ring_fast")
    parser.add_argument("--runs", type=int, default=3, help="whole benches per world size")
    parser.add_argument("--results", help="write the summary into this Markdown file")
    parser.add_argument("--force", action="store_true", help="write even on a busy machine")
    parser.add_argument("--quick", action="store_true",
                        help="tiny sizes, 2 repeats, 1 run, 2 ranks: does it run end to end?")
    options = parser.parse_args(argv)
    if options.quick:
        options.world_size, options.runs = "2", 1
        options.repeats = min(options.repeats, QUICK_REPEATS)
        options.sizes = ",".join(str(s) for s in QUICK_SIZES)
    return options


def main(argv: list[str] | None = None) -> int:
    options = parse(argv)
    sizes, algos = parse_sizes(options.sizes), parse_algos(options.algos)
    world_sizes = [int(n) for n in options.world_size.split(",")]
    load = load_before(options.results, options.force)
    if load is None:
        return 2
    parts = []
    for world_size in world_sizes:
        reports = []
        for run in range(options.runs):
            shutdown_pools()  # each run in processes of its own: runs independent of each other
            report = bench_allreduce(world_size, sizes, options.repeats, "gloo", algos)
            reports.append(report)
            print(f"{world_size} ranks, run {run + 1} of {options.runs}")
            print(table(report), end="\n\n")
        parts.append(summary(reports))
        print(parts[-1], end="\n\n")
    print(f"1-minute load average after: {os.getloadavg()[0]:.2f} (before: {load:.2f}; "
          f"recorded only below {MAX_LOAD_PER_CORE} per core)")
    if options.results:
        args = sys.argv[1:] if argv is None else argv
        write_section(Path(options.results), "\n\n".join(parts),
                      " ".join(["python", "benchmarks/allreduce_vs_torch.py", *args]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
