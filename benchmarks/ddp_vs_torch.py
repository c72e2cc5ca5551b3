"""Our DDP (``ddp_step_overlapped``: gradients as bucket views, torch's bucket rule, the
engineered ring written on send/recv) against ``torch.nn.parallel.DistributedDataParallel``,
on gloo, with the same model and data.

    python benchmarks/ddp_vs_torch.py --quick             # runs end to end? (seconds)
    python benchmarks/ddp_vs_torch.py --world-size 2,4 --runs 3 --results benchmarks/RESULTS.md

Both run in the same processes, one step at a time, alternating (ours, theirs, theirs,
ours, ...) so that a change in machine load hits both alike; each timed step starts after a
barrier. Per run we report the medians and the median of the ratios of neighbouring steps
(ours / torch, less sensitive to slow drifts in load; below 1 means ours is faster), and
check that both ended with the same parameters (same start, data and number of steps).
Over ``--runs`` runs: the median of the run medians (and min-max). The 1-minute load
average is printed before and after; ``--results`` refuses to write when it is above
``MAX_LOAD_PER_CORE`` per core before the bench, unless ``--force``. ``--quick`` (a tiny
MLP, 2 timed steps, one run, 2 ranks) only checks that everything runs. By default our DDP
runs as a learner's does, with the course's message-size checks on; ``--unchecked`` turns
them off (``MPGPU_EDU_CHECK_MESSAGES=0``) and writes its own section, so that the check's
cost is seen apart.
This is a benchmark, not a test: its numbers depend on the machine and on its load.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

from mpgpu_edu.measure.recording import (MAX_LOAD_PER_CORE, load_before,  # noqa: E402
                                         replace_section)
from mpgpu_edu.comm import launch  # noqa: E402
from mpgpu_edu.replica.data import loss_fn, make_batch, make_mlp, shard  # noqa: E402
from mpgpu_edu.dp.ddp import DEFAULT_BUCKET_BYTES, ddp_step_overlapped  # noqa: E402

MARKER = "<!-- ddp_vs_torch -->"
UNCHECKED_MARKER = "<!-- ddp_vs_torch unchecked -->"
NOTES = """\
Both sides do the same work per step: forward and backward of the same replica on the same
shard, gradients averaged in buckets while backward runs (torch's bucket rule on both
sides: a 1 MiB first bucket, then buckets closed once past the cap), the same SGD update
(the parameters agree to rounding; on 2 ranks to the last bit). Both keep the gradients as
views into the buckets
(ours: `GradBuckets`; torch: its reducer's bucket views). What differs is the all-reduce:
ours is `RingAllReduce` (`mpgpu_edu.collectives.ring_fast`), written on `isend`/`irecv` in
Python on a comm-stream thread; torch's is gloo's native C++ all-reduce. Both run two
all-reduces at a time at most: torch's gloo process group has two worker threads, and ours
runs the bucket completed last on the rank's own thread beside the stream
(`comm.collectives_at_once`). Our rings cut 8 MiB segments on gloo
(`ring_fast.GLOO_SEGMENT_BYTES`): fewer messages, each of which costs CPU time that
backward needs; and they deal them out over two connections per direction
(`Lanes.channels`)."""


def bench(comm, sizes: list[int], batch: int, warmup: int, repeats: int,  # noqa: ANN001
          bucket_bytes: int, threads: int) -> dict:
    """Every rank: time ``repeats`` steps of each, interleaved; returns this rank's times."""
    torch.set_num_threads(threads)
    data = make_batch(batch * comm.world_size, sizes[0], sizes[-1], seed=0)
    ours = make_mlp(sizes, seed=0)
    ours_opt = torch.optim.SGD(ours.parameters(), lr=0.01)
    theirs_model = make_mlp(sizes, seed=0)
    # torch starts with a 1 MiB bucket only when bucket_cap_mb is left at its default
    cap_mb = None if bucket_bytes == DEFAULT_BUCKET_BYTES else bucket_bytes / 2**20
    theirs = torch.nn.parallel.DistributedDataParallel(theirs_model, bucket_cap_mb=cap_mb,
                                                       gradient_as_bucket_view=True)
    theirs_opt = torch.optim.SGD(theirs.parameters(), lr=0.01)
    (x, y), _ = shard(data, comm.rank, comm.world_size)

    def step_ours() -> None:
        ddp_step_overlapped(comm, ours, ours_opt, data, bucket_bytes)

    def step_theirs() -> None:
        loss_fn(theirs(x), y).backward()
        theirs_opt.step()
        theirs_opt.zero_grad(set_to_none=False)

    times: dict[str, list[float]] = {"ours": [], "torch": []}
    for i in range(warmup + repeats):
        pair = [("ours", step_ours), ("torch", step_theirs)]
        for name, step in pair if i % 2 == 0 else pair[::-1]:
            dist.barrier()
            start = time.perf_counter()
            step()
            if i >= warmup:
                times[name].append(time.perf_counter() - start)
    diff = max((a - b).abs().max().item()
               for a, b in zip(ours.parameters(), theirs_model.parameters()))
    return {"times": times, "max_param_diff": diff}


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="1024,2048,2048,2048,1024", help="MLP layer sizes")
    p.add_argument("--batch", default="64,256",
                   help="samples per rank per step; several (comma-separated): one run each")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeats", type=int, default=20, help="timed steps of each, per run")
    p.add_argument("--runs", type=int, default=3, help="launches per configuration")
    p.add_argument("--bucket-mb", type=float, default=DEFAULT_BUCKET_BYTES / 2**20,
                   help="bucket size, both sides (default 25, torch's)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per process")
    p.add_argument("--world-size", default="2,4", help="comma-separated (default 2,4)")
    p.add_argument("--results", help="write the tables into this markdown file's section")
    p.add_argument("--force", action="store_true", help="write even on a busy machine")
    p.add_argument("--unchecked", action="store_true",
                   help="message-size checks off (MPGPU_EDU_CHECK_MESSAGES=0) for our DDP")
    p.add_argument("--quick", action="store_true",
                   help="tiny MLP, 2 timed steps, 1 run, 2 ranks: does it run end to end?")
    args = p.parse_args(argv)
    if args.quick:
        args.sizes, args.batch, args.world_size = "32,64,32", "4", "2"
        args.warmup, args.repeats, args.runs = 1, 2, 1
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    load = load_before(args.results, args.force)
    if load is None:
        return 2
    if args.unchecked:  # the launcher reads it at every launch
        os.environ["MPGPU_EDU_CHECK_MESSAGES"] = "0"
    tables = []
    for world_size in (int(n) for n in args.world_size.split(",")):
        for batch in (int(b) for b in args.batch.split(",")):
            tables.append(run_config(args, world_size, batch))
            print(tables[-1], end="\n\n")
    print(f"1-minute load average after: {os.getloadavg()[0]:.2f} (before: {load:.2f}; "
          f"recorded only below {MAX_LOAD_PER_CORE} per core)")
    if args.results:
        command = " ".join(["python", "benchmarks/ddp_vs_torch.py",
                            *(sys.argv[1:] if argv is None else argv)])
        write_section(Path(args.results), "\n\n".join(tables), command, args.unchecked)
    return 0


def run_config(args: argparse.Namespace, world_size: int, batch: int) -> str:
    """One configuration, ``args.runs`` launches: a Markdown row per run, then the median
    over runs of the run medians of the neighbouring ratios."""
    import ddp_vs_torch  # workers import the benchmark by module name, not as __main__

    sizes = [int(s) for s in args.sizes.split(",")]
    n_params = sum(a * b + b for a, b in zip(sizes, sizes[1:]))
    rows, paired = [], []
    for run_index in range(args.runs):
        load_before = os.getloadavg()[0]
        run = launch(ddp_vs_torch.bench, world_size, sizes, batch, args.warmup, args.repeats,
                     int(args.bucket_mb * 2**20), args.threads, backend="gloo", timeout=3600)
        times = run.results[0]["times"]
        ours, theirs = statistics.median(times["ours"]), statistics.median(times["torch"])
        paired.append(statistics.median(a / b for a, b in zip(times["ours"], times["torch"])))
        rows.append(f"| {run_index + 1} | {ours * 1e3:.1f} | {theirs * 1e3:.1f} | "
                    f"{ours / theirs:.3f} | {paired[-1]:.3f} | "
                    f"{run.results[0]['max_param_diff']:.2g} | {load_before:.2f} / "
                    f"{os.getloadavg()[0]:.2f} |")
    return "\n".join([
        f"MLP {sizes} ({n_params / 1e6:.1f} M parameters, {4 * n_params / 2**20:.0f} MiB of "
        f"gradients), **{world_size} ranks, {batch} samples per rank**, gloo, {args.threads} "
        f"torch thread(s) each, buckets of {args.bucket_mb:g} MiB; per run {args.repeats} "
        f"timed steps each after {args.warmup} warm-up, interleaved; ours with the "
        f"course's message-size checks {'off' if args.unchecked else 'on (the default)'}",
        "",
        "| run | ours median (ms) | torch median (ms) | ratio of medians | median of "
        "neighbouring ratios | max param diff | 1-min load before / after |",
        "|---:|---:|---:|---:|---:|---:|---:|",
        *rows,
        "",
        f"ours / torch, median over {args.runs} run(s) of the run medians of neighbouring "
        f"ratios: **{statistics.median(paired):.3f}** (min {min(paired):.3f}, max "
        f"{max(paired):.3f}; below 1: ours is faster); {os.cpu_count()} cores",
    ])


def write_section(path: Path, table: str, command: str, unchecked: bool = False) -> None:
    """Replace (or append) this benchmark's section, between two markers, in ``path``
    (the unchecked runs have a section of their own)."""
    marker = UNCHECKED_MARKER if unchecked else MARKER
    title = ("DDP, message-size checks off: ours against torch DistributedDataParallel (gloo)"
             if unchecked else "DDP: ours against torch DistributedDataParallel (gloo)")
    replace_section(path, marker, f"{marker}\n## {title}\n\nCommand: `{command}`\n\n"
                    f"{table}\n\n{NOTES}\n{marker}")


if __name__ == "__main__":
    raise SystemExit(main())
