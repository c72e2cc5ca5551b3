"""Lesson 07 (many machines): the programs and figures the notebook calls.

- ``two_node_torchrun``: two ``torchrun`` launchers on this machine, one per "node", as on
  two real hosts (``--nnodes 2 --node-rank 0|1 --master-addr ... --master-port ...``); every
  rank reports its node, local rank, global rank and the result of one all-reduce on gloo.
- ``allreduce_traces`` / ``plot_allreduce_timelines``: one all-reduce across 2 x 8 GPUs, a
  flat ring against the hierarchical all-reduce, on the simulator.
- ``placement_rows`` / ``plot_placements``: where each kind of parallelism goes on a 2-node
  mesh, by simulated step time (``mpgpu_edu.estimate.step``).

Run as ``python -m mpgpu_edu.lessons.many_machines`` it is the worker that each rank of the
torchrun demo runs (it reads torchrun's environment variables).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass

REPORT_PREFIX = "MPGPU_RANK_REPORT "


# ---- a real two-"node" torchrun on localhost --------------------------------------------------

@dataclass(frozen=True)
class RankReport:
    """What one torchrun worker saw: its node (``GROUP_RANK``), its local and global rank,
    the world size, its ``CUDA_VISIBLE_DEVICES`` and the all-reduce of ``rank + 1``."""

    node: int
    local_rank: int
    rank: int
    world_size: int
    local_world_size: int
    visible: str
    all_reduce: float
    pid: int


@dataclass(frozen=True)
class TorchrunResult:
    """The reports of every rank (sorted by global rank) and each launcher's command."""

    reports: list[RankReport]
    commands: list[list[str]]
    seconds: float


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def torchrun_command(node_rank: int, nnodes: int, nproc_per_node: int, port: int) -> list[str]:
    """The launcher of one node: ``torchrun --nnodes N --node-rank K --nproc-per-node P
    --master-addr 127.0.0.1 --master-port PORT -m mpgpu_edu.lessons.many_machines``."""
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nnodes),
            "--node-rank", str(node_rank), "--nproc-per-node", str(nproc_per_node),
            "--master-addr", "127.0.0.1", "--master-port", str(port),
            "-m", "mpgpu_edu.lessons.many_machines"]


def two_node_torchrun(nproc_per_node: int = 2, nnodes: int = 2, timeout: float = 90.0,
                      visible: tuple[str, ...] | None = None) -> TorchrunResult:
    """Start ``nnodes`` torchrun launchers on this machine, each as if on its own host, and
    collect every rank's report. ``visible[k]`` is node k's ``CUDA_VISIBLE_DEVICES`` (by
    default ``0,...,P-1`` on every node: each host numbers its own GPUs from 0). Every
    launcher runs in its own process group, killed on the way out (timeout or not); a
    launcher that fails or a missing report raises ``RuntimeError`` with its output."""
    if nproc_per_node < 1 or nnodes < 1:
        raise ValueError(f"nproc_per_node and nnodes must be >= 1, got {nproc_per_node} and "
                         f"{nnodes}")
    visible = visible or tuple(",".join(map(str, range(nproc_per_node)))
                               for _ in range(nnodes))
    port, start = free_port(), time.monotonic()
    commands = [torchrun_command(k, nnodes, nproc_per_node, port) for k in range(nnodes)]
    procs: list[subprocess.Popen] = []
    try:
        for k, command in enumerate(commands):
            env = dict(os.environ, CUDA_VISIBLE_DEVICES=visible[k], PYTHONUNBUFFERED="1",
                       OMP_NUM_THREADS="1")
            procs.append(subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, text=True,
                                          start_new_session=True))
        outputs = []
        for proc in procs:
            left = max(1.0, timeout - (time.monotonic() - start))
            try:
                outputs.append(proc.communicate(timeout=left)[0])
            except subprocess.TimeoutExpired:
                raise RuntimeError(f"torchrun did not finish within {timeout:g} s (a "
                                   "launcher waiting for the other node?); both were "
                                   "stopped") from None
    finally:
        for proc in procs:
            _kill_group(proc)
    for k, (proc, out) in enumerate(zip(procs, outputs)):
        if proc.returncode != 0:
            raise RuntimeError(f"node {k}'s torchrun exited with status {proc.returncode}:\n"
                               + out[-3000:])
    reports = [RankReport(**json.loads(line[len(REPORT_PREFIX):]))
               for out in outputs for line in out.splitlines()
               if line.startswith(REPORT_PREFIX)]
    if len(reports) != nnodes * nproc_per_node:
        raise RuntimeError(f"expected {nnodes * nproc_per_node} rank reports, got "
                           f"{len(reports)}:\n" + "\n".join(o[-1500:] for o in outputs))
    return TorchrunResult(sorted(reports, key=lambda r: r.rank), commands,
                          time.monotonic() - start)


def _kill_group(proc: subprocess.Popen) -> None:
    """Kill the launcher and every worker it started (its own process group)."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def torchrun_table(result: TorchrunResult) -> str:
    """One line per rank: node, local rank, global rank, CUDA_VISIBLE_DEVICES, the sum."""
    lines = ["node  local rank  global rank  CUDA_VISIBLE_DEVICES  all-reduce of (rank + 1)"]
    lines += [f"{r.node:>4}  {r.local_rank:>10}  {r.rank:>11}  {r.visible:>20}  "
              f"{r.all_reduce:g}" for r in result.reports]
    return "\n".join(lines)


def _worker() -> None:
    """One rank under torchrun: join the job on gloo, all-reduce ``rank + 1``, report."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    try:
        rank = dist.get_rank()
        t = torch.tensor([float(rank + 1)])
        dist.all_reduce(t)
        report = RankReport(node=int(os.environ["GROUP_RANK"]),
                            local_rank=int(os.environ["LOCAL_RANK"]), rank=rank,
                            world_size=dist.get_world_size(),
                            local_world_size=int(os.environ["LOCAL_WORLD_SIZE"]),
                            visible=os.environ.get("CUDA_VISIBLE_DEVICES", ""),
                            all_reduce=float(t.item()), pid=os.getpid())
        print(REPORT_PREFIX + json.dumps(report.__dict__), flush=True)
    finally:
        dist.destroy_process_group()


def _expected_global_rank(node: int, local_rank: int, nproc_per_node: int) -> int:
    return node * nproc_per_node + local_rank


def check_reports(result: TorchrunResult, nproc_per_node: int) -> list[str]:
    """What is wrong with the reports (empty when every rank is where it should be): global
    rank = node x nproc_per_node + local rank, every rank once, the same sum everywhere."""
    reports, problems = result.reports, []
    n = len(reports)
    if sorted(r.rank for r in reports) != list(range(n)):
        problems.append(f"global ranks {[r.rank for r in reports]} are not 0..{n - 1}")
    for r in reports:
        if r.rank != _expected_global_rank(r.node, r.local_rank, nproc_per_node):
            problems.append(f"rank {r.rank} is local rank {r.local_rank} of node {r.node}")
    want = n * (n + 1) / 2
    problems += [f"rank {r.rank} got {r.all_reduce:g}, not {want:g}" for r in reports
                 if r.all_reduce != want]
    return problems


if __name__ == "__main__":
    _worker()
