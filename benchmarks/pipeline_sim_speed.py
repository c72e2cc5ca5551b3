"""How long the simulated 8-stage x 64-microbatch pipeline step takes to compute, with its
timeline, in a fresh process (the first call included).

    python benchmarks/pipeline_sim_speed.py               # 8 stages, 64 microbatches
    python benchmarks/pipeline_sim_speed.py --executor    # also the full simulator run
    python benchmarks/pipeline_sim_speed.py --quick       # 4 x 8: does it run?

Two things are timed, each for GPipe and 1F1B, in this order in one fresh process:

- ``timeline``: ``schedule_timeline`` of the schedule (every step as soon as its device is
  free and its input has arrived, sends costing the cluster's link time) and its
  ``timeline_trace``: what lesson 04 draws before anything runs (``lessons.pipeline.timed_trace``,
  here without importing the plotting of the lesson).
  The target: under 0.5 s, the first call included.
- ``executor`` (``--executor``): the same step run by the pipeline executor on the
  simulator, 8 rank threads with real tensors (``mpgpu-edu simulate pipeline``).

Prints seconds: the import of the package, the first call, then the median of the repeats.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

TARGET_S = 0.5
CLUSTER = "8xH100-nvswitch"
ACTIVATION_BYTES = 64 * 1024 * 4  # a microbatch of 64 samples x 1024 fp32 features


def timed(fn: Callable[[], object], repeats: int) -> tuple[float, float]:
    """(seconds of the first call, median seconds of ``repeats`` more)."""
    start = time.perf_counter()
    fn()
    first = time.perf_counter() - start
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return first, statistics.median(times) if times else float("nan")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--stages", type=int, default=8)
    p.add_argument("--microbatches", type=int, default=64)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--executor", action="store_true", help="also time the simulator run")
    p.add_argument("--quick", action="store_true", help="4 stages x 8 microbatches, 1 repeat")
    args = p.parse_args(argv)
    if args.quick:
        args.stages, args.microbatches, args.repeats = 4, 8, 1
    print(f"1-minute load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    start = time.perf_counter()
    from mpgpu_edu.cluster import Cluster
    from mpgpu_edu.pipeline import gpipe, one_f_one_b
    from mpgpu_edu.pipeline.timing import schedule_timeline, timeline_trace
    print(f"import: {time.perf_counter() - start:.3f} s")
    p_, m, cluster = args.stages, args.microbatches, CLUSTER
    ok = True
    for name, make in (("gpipe", gpipe), ("1f1b", one_f_one_b)):
        def timeline(make=make) -> object:  # noqa: ANN001 - lesson 04's timed_trace, no plots
            send_s = Cluster.preset(cluster).route(0, 1).seconds(ACTIVATION_BYTES)
            return timeline_trace(schedule_timeline(make(p_, m), 1e-3, 2e-3, send_s), p_)

        first, again = timed(timeline, args.repeats)
        ok = ok and first < TARGET_S
        print(f"timeline {name} {p_} stages x {m} microbatches: first call {first:.3f} s, "
              f"then {again:.3f} s (median of {args.repeats}); target < {TARGET_S} s: "
              + ("met" if first < TARGET_S else "NOT met"))
    if args.executor:
        from mpgpu_edu.cli.simulate import simulate_pipeline

        for name in ("gpipe", "1f1b"):
            first, again = timed(lambda name=name: simulate_pipeline(name, p_, m, cluster),
                                 args.repeats)
            print(f"executor {name} {p_} stages x {m} microbatches on the simulator: first "
                  f"call {first:.3f} s, then {again:.3f} s (median of {args.repeats})")
    print(f"1-minute load average after: {os.getloadavg()[0]:.2f}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
