"""What a ``launch(..., backend="gloo")`` costs: cold, after a fault, and warm.

    python benchmarks/launch_cost.py [--world-size 2] [--repeats 20] [--torchrun]

Each launch runs ``mpgpu_edu.run.ping_pong`` with one 4-byte round trip, so the numbers are
the launcher's overhead, not the work. Rows:

* cold: the first launch in a fresh interpreter (the fork server imports torch, the workers
  start and join a process group);
* restart: the pool is killed (as after a fault) and the next launch starts a new one;
* warm: the pool is already running (median and 90th percentile of ``--repeats``);
* sim: the same function on the simulator, for scale;
* torchrun (``--torchrun``): a whole ``torchrun --nproc-per-node N -m mpgpu_edu.run pingpong``.

Workers are forked by the runtime's fork server (``mpgpu_edu.runtime``); there is no other
way to start them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from mpgpu_edu.comm import launch
from mpgpu_edu.comm import pool as worker_pool
from mpgpu_edu.run import ping_pong


def timed(fn, *args, **kwargs) -> float:
    start = time.perf_counter()
    fn(*args, **kwargs)
    return time.perf_counter() - start


def gloo_launch(world_size: int) -> None:
    result = launch(ping_pong, world_size, 1, 1, backend="gloo", timeout=60)
    assert result.results[0]["ok"]


def torchrun_seconds(world_size: int) -> float:
    torchrun = Path(sys.executable).with_name("torchrun")
    command = [str(torchrun), "--nproc-per-node", str(world_size), "-m", "mpgpu_edu.run",
               "pingpong", "--numel", "1"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return timed(subprocess.run, command, check=True, capture_output=True, env=env)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--torchrun", action="store_true", help="also time a torchrun run")
    options = parser.parse_args()
    n = options.world_size
    rows = [("cold (first launch)", timed(gloo_launch, n))]
    worker_pool.get_pool(n, "gloo").kill()
    rows.append(("restart (after a fault)", timed(gloo_launch, n)))
    warm = sorted(timed(gloo_launch, n) for _ in range(options.repeats))
    rows.append((f"warm, median of {options.repeats}", statistics.median(warm)))
    rows.append((f"warm, p90 of {options.repeats}", warm[int(0.9 * (len(warm) - 1))]))
    sim = sorted(timed(launch, ping_pong, n, 1, 1) for _ in range(options.repeats))
    rows.append((f"sim, median of {options.repeats}", statistics.median(sim)))
    if options.torchrun:
        rows.append(("torchrun, whole run", torchrun_seconds(n)))
    worker_pool.shutdown_pools()

    print(f"launch cost, gloo, {n} ranks, workers from the runtime's fork server "
          f"({os.cpu_count()} CPUs)")
    print(f"{'launch':28s} {'seconds':>10s}")
    for name, seconds in rows:
        print(f"{name:28s} {seconds:10.4f}")


if __name__ == "__main__":
    main()
