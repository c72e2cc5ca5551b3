"""Our DDP (overlapped, bucketed, ring all-reduce written on send/recv) against
``torch.nn.parallel.DistributedDataParallel``, on gloo, with the same model and data.

    python benchmarks/ddp_vs_torch.py                      # 2 processes, defaults below
    python benchmarks/ddp_vs_torch.py --repeats 30 --results benchmarks/RESULTS.md

Both run in the same two processes, one step at a time, alternating (ours, theirs, theirs,
ours, ...) so that a change in machine load hits both alike; each timed step starts after a
barrier. We report the medians and their ratio (ours / torch: below 1 means ours is faster),
and check that both ended with the same parameters (same start, data and number of steps).
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

from mpgpu_edu.comm import launch  # noqa: E402
from mpgpu_edu.data import loss_fn, make_batch, make_mlp, shard  # noqa: E402
from mpgpu_edu.dp.ddp import ddp_step_overlapped  # noqa: E402

MARKER = "<!-- ddp_vs_torch -->"


def bench(comm, sizes: list[int], batch: int, warmup: int, repeats: int,  # noqa: ANN001
          bucket_bytes: int, threads: int) -> dict:
    """Every rank: time ``repeats`` steps of each, interleaved; returns this rank's times."""
    torch.set_num_threads(threads)
    data = make_batch(batch * comm.world_size, sizes[0], sizes[-1], seed=0)
    ours = make_mlp(sizes, seed=0)
    ours_opt = torch.optim.SGD(ours.parameters(), lr=0.01)
    theirs_model = make_mlp(sizes, seed=0)
    theirs = torch.nn.parallel.DistributedDataParallel(
        theirs_model, bucket_cap_mb=bucket_bytes / 2**20)
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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="1024,2048,2048,2048,1024", help="MLP layer sizes")
    p.add_argument("--batch", type=int, default=64, help="samples per rank per step")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeats", type=int, default=20, help="timed steps of each")
    p.add_argument("--bucket-mb", type=float, default=25.0, help="bucket size, both sides")
    p.add_argument("--threads", type=int, default=1, help="torch threads per process")
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--results", help="write the table into this markdown file's section")
    args = p.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    import ddp_vs_torch  # workers import the benchmark by module name, not as __main__

    run = launch(ddp_vs_torch.bench, args.world_size, sizes, args.batch, args.warmup, args.repeats,
                 int(args.bucket_mb * 2**20), args.threads, backend="gloo", timeout=1800)
    times = run.results[0]["times"]
    ours, theirs = statistics.median(times["ours"]), statistics.median(times["torch"])
    n_params = sum(a * b + b for a, b in zip(sizes, sizes[1:]))
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    table = "\n".join([
        f"model: MLP {sizes} ({n_params / 1e6:.1f} M parameters, "
        f"{4 * n_params / 2**20:.0f} MiB of gradients), {args.batch} samples per rank, "
        f"{args.world_size} gloo processes, {args.threads} torch thread(s) each, "
        f"buckets of {args.bucket_mb:g} MiB; {args.repeats} timed steps each after "
        f"{args.warmup} warm-up, interleaved",
        "",
        "| implementation | median step (ms) | min (ms) | max (ms) |",
        "|---|---|---|---|",
        *(f"| {name} | {statistics.median(t) * 1e3:.1f} | {min(t) * 1e3:.1f} | "
          f"{max(t) * 1e3:.1f} |" for name, t in (("ours (ddp_step_overlapped)", times["ours"]),
                                                   ("torch DistributedDataParallel",
                                                    times["torch"]))),
        "",
        f"ratio ours / torch (medians): **{ours / theirs:.3f}**; "
        f"largest parameter difference after training: {run.results[0]['max_param_diff']:.2g}; "
        f"1-minute load average at the end: {load:.1f} on {os.cpu_count()} cores",
    ])
    print(table)
    if args.results:
        write_section(Path(args.results), table, " ".join(["python", *sys.argv]))
    return 0


def write_section(path: Path, table: str, command: str) -> None:
    """Replace (or append) this benchmark's section, between two markers, in ``path``."""
    section = (f"{MARKER}\n## DDP: ours against torch DistributedDataParallel (gloo)\n\n"
               f"Command: `{command}`\n\n{table}\n{MARKER}")
    text = path.read_text() if path.exists() else "# Benchmark results\n"
    if text.count(MARKER) == 2:
        before, _, rest = text.partition(MARKER)
        _, _, after = rest.partition(MARKER)
        text = before + section + after
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    path.write_text(text)


if __name__ == "__main__":
    raise SystemExit(main())
