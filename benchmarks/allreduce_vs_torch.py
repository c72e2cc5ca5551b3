"""Our ring and naive all-reduce against ``torch.distributed.all_reduce``, in the same processes.

    python benchmarks/allreduce_vs_torch.py [--world-size 2] [--repeats 10] [--sizes 1KiB,...]
        [--algos ring,naive,ring_reused] [--runs 1] [--markdown]

A thin wrapper around ``mpgpu_edu.bench.bench_allreduce`` (the same as ``mpgpu-edu bench
allreduce``), for repeated runs: ``--runs K`` runs the whole bench K times and prints each
table, then each algorithm's ratio ours / built-in per size over the runs (min, median,
max), which shows how much of a difference is the machine's noise. ``--markdown`` prints
the tables as Markdown, for ``benchmarks/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import statistics

from mpgpu_edu.bench import DEFAULT_REPEATS, bench_allreduce, size_label, table
from mpgpu_edu.cli.bench import DEFAULT_SIZES, parse_algos, parse_sizes


def markdown(report: dict) -> str:
    """The report as a Markdown table (times in ms, busbw in GB/s; cpu: CPU time of all
    ranks' processes, ours / builtin)."""
    algos = report["algos"]
    head = (["size"] + [f"{a} ms" for a in algos] + ["builtin ms"]
            + [f"{a}/builtin" for a in algos] + [f"cpu {a}/builtin" for a in algos]
            + [f"busbw {algos[0]} GB/s", "busbw builtin GB/s"])
    lines = ["| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
    for i, nbytes in enumerate(report["sizes"]):
        cells = ([size_label(nbytes)]
                 + [f"{report[f'{a}_s'][i] * 1e3:.3f}" for a in [*algos, "builtin"]]
                 + [f"{report[f'ratio_{a}'][i]:.2f}" for a in algos]
                 + [f"{report[f'cpu_ratio_{a}'][i]:.2f}" for a in algos]
                 + [f"{report[f'busbw_{a}'][i] / 1e9:.3f}" for a in (algos[0], "builtin")])
        lines.append("| " + " | ".join(cells) + " |")
    load = ", ".join(f"{x:.2f}" for x in report["loadavg_start"])
    load_end = ", ".join(f"{x:.2f}" for x in report["loadavg"])
    lines.append(f"\nLoad average (1, 5, 15 min) before: {load}; after: {load_end}; "
                 f"{report['cpus']} CPUs, torch {report['torch']}.")
    return "\n".join(lines)


def spread(reports: list[dict]) -> str:
    """Per algorithm and size: min / median / max over the runs of the wall-clock ratio and
    of the CPU-time ratio."""
    lines = ["ours / builtin over runs: min / median / max"]
    for key in ("ratio", "cpu_ratio"):
        for algo in reports[0]["algos"]:
            cells = []
            for i, nbytes in enumerate(reports[0]["sizes"]):
                values = [r[f"{key}_{algo}"][i] for r in reports]
                cells.append(f"{size_label(nbytes)} {min(values):.2f}/"
                             f"{statistics.median(values):.2f}/{max(values):.2f}")
            lines.append(f"  {key} {algo}: " + ", ".join(cells))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=DEFAULT_REPEATS)
    parser.add_argument("--sizes", default=DEFAULT_SIZES)
    parser.add_argument("--algos", default="ring,naive")
    parser.add_argument("--runs", type=int, default=1, help="whole benches, one after another")
    parser.add_argument("--markdown", action="store_true", help="print Markdown tables")
    options = parser.parse_args()
    sizes, algos = parse_sizes(options.sizes), parse_algos(options.algos)
    reports = []
    for run in range(options.runs):
        report = bench_allreduce(options.world_size, sizes, options.repeats, "gloo", algos)
        reports.append(report)
        print(f"run {run + 1} of {options.runs}")
        print(markdown(report) if options.markdown else table(report), end="\n\n")
    if options.runs > 1:
        print(spread(reports))


if __name__ == "__main__":
    main()
