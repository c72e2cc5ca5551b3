"""``mpgpu-edu demo``: the headless tour, as files (see ``mpgpu_edu.explore.tour``).

    mpgpu-edu demo                                  # into ./mpgpu-edu-demo, on 4xRTX4090-pcie
    mpgpu-edu demo --out /tmp/tour --cluster 8xA100-nvlink

Runs one step of the parameter server, DDP (naive and overlapped) and GPipe / 1F1B on four
simulated devices, writes figures (PNG), Chrome traces (open in https://ui.perfetto.dev) and
``summary.json``, reports one line per stage on stderr and prints a short table. ``--json``
prints the summary instead of the table.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from mpgpu_edu.cli import UsageError

DEFAULT_OUT = "mpgpu-edu-demo"
DEFAULT_CLUSTER = "4xRTX4090-pcie"  # kept equal to mpgpu_edu.explore.tour.DEFAULT_CLUSTER (tested)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="the headless tour: figures, traces and a summary",
                       description="Run every strategy on a simulated cluster and write "
                                   "figures, Chrome traces and summary.json.")
    p.add_argument("--out", default=DEFAULT_OUT, metavar="DIR",
                   help=f"where to write the files (default ./{DEFAULT_OUT}; created if "
                        "missing)")
    p.add_argument("--cluster", default=DEFAULT_CLUSTER, metavar="PRESET",
                   help=f"cluster preset (default {DEFAULT_CLUSTER}: four consumer GPUs, "
                        "each on its own PCIe link, copies between them staged through "
                        "host memory, so communication shows); the first four devices "
                        "are used")
    p.add_argument("--json", action="store_true", help="print summary.json on stdout")
    p.set_defaults(func=run)


def _writable(out: Path) -> None:
    """Create ``out`` or raise UsageError saying why it cannot be written."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot create --out {str(out)!r}: {exc.strerror or exc}") from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise UsageError(f"cannot write into --out {str(out)!r}: permission denied")


def run(args: argparse.Namespace) -> int:
    from mpgpu_edu.cluster import Cluster

    if args.cluster not in Cluster.presets():
        raise UsageError(f"unknown cluster preset {args.cluster!r}: choose one of "
                         + ", ".join(Cluster.presets()))
    out = Path(args.out)
    _writable(out)

    from mpgpu_edu.explore.tour import run_tour, table

    def progress(line: str) -> None:
        print(f"demo: {line}", file=sys.stderr, flush=True)

    summary = run_tour(out, args.cluster, progress)
    print(json.dumps(summary, indent=2) if args.json else table(summary))
    if not args.json:
        print(f"\nfiles in {out}: summary.json, trace_*.json (open in https://ui.perfetto.dev)"
              f", {len(summary['figures'])} figures (*.png); {summary['elapsed_s']:.0f} s")
    return 0
