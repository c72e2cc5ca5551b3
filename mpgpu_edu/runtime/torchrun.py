"""Several ``torchrun`` launchers on this machine, one per "node", as on several real hosts
(``--nnodes N --node-rank K --master-addr 127.0.0.1 --master-port PORT``): ``launch_nodes``
starts them, each running ``python -m MODULE`` on every rank, and collects the report each
rank prints (``report_rank``: its node, local rank, global rank and the result of one
all-reduce on gloo); ``check_reports`` says what is wrong with them. Only the standard
library at import (a rank imports torch inside ``report_rank``).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass

from mpgpu_edu.runtime.server import children_of, kill_tree

REPORT_PREFIX = "MPGPU_RANK_REPORT "


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


def torchrun_command(node_rank: int, nnodes: int, nproc_per_node: int, port: int,
                     module: str) -> list[str]:
    """The launcher of one node: ``torchrun --nnodes N --node-rank K --nproc-per-node P
    --master-addr 127.0.0.1 --master-port PORT -m MODULE``."""
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nnodes),
            "--node-rank", str(node_rank), "--nproc-per-node", str(nproc_per_node),
            "--master-addr", "127.0.0.1", "--master-port", str(port), "-m", module]


def launch_nodes(module: str, nproc_per_node: int = 2, nnodes: int = 2, timeout: float = 90.0,
                 visible: tuple[str, ...] | None = None) -> TorchrunResult:
    """Start ``nnodes`` torchrun launchers of ``python -m module`` (a module whose ranks call
    ``report_rank``) on this machine, each as if on its own host, and collect every rank's
    report. ``visible[k]`` is node k's ``CUDA_VISIBLE_DEVICES`` (by default ``0,...,P-1`` on
    every node: each host numbers its own GPUs from 0). Every launcher and the workers it
    started are killed on the way out (timeout or not); a launcher that fails or a missing
    report raises ``RuntimeError`` with its output."""
    if nproc_per_node < 1 or nnodes < 1:
        raise ValueError(f"nproc_per_node and nnodes must be >= 1, got {nproc_per_node} and "
                         f"{nnodes}")
    visible = visible or tuple(",".join(map(str, range(nproc_per_node)))
                               for _ in range(nnodes))
    port, start = free_port(), time.monotonic()
    commands = [torchrun_command(k, nnodes, nproc_per_node, port, module)
                for k in range(nnodes)]
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
            _kill_launcher(proc)
    for k, (proc, out) in enumerate(zip(procs, outputs)):
        if proc.returncode != 0:
            raise RuntimeError(f"node {k}'s torchrun exited with status {proc.returncode}:\n"
                               + out[-3000:])
    reports = read_reports(outputs)
    if len(reports) != nnodes * nproc_per_node:
        raise RuntimeError(f"expected {nnodes * nproc_per_node} rank reports, got "
                           f"{len(reports)}:\n" + "\n".join(o[-1500:] for o in outputs))
    return TorchrunResult(sorted(reports, key=lambda r: r.rank), commands,
                          time.monotonic() - start)


def read_reports(outputs: list[str]) -> list[RankReport]:
    """Every rank's report in the launchers' outputs, wherever it sits: the workers of one
    launcher share its stdout, so a report need not start a line of its own."""
    pattern = re.escape(REPORT_PREFIX) + r"(\{[^{}]*\})"
    return [RankReport(**json.loads(found)) for out in outputs
            for found in re.findall(pattern, out)]


def _kill_launcher(proc: subprocess.Popen) -> None:
    """Kill the launcher and every worker it started. torchrun starts each worker in a
    session of its own (``start_new_session``), so killing the launcher's process group
    alone would leave running workers behind, waiting for peers that never come. The
    launcher is stopped first, so that it cannot start another worker while its
    descendants are gathered (from /proc); then each of them and its group is killed."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(proc.pid, signal.SIGSTOP)
    for pid in [proc.pid, *_descendants(proc.pid)]:
        kill_tree(pid)
    proc.wait()


def _descendants(root: int) -> list[int]:
    """Every live process below ``root``: its children, their children, ..."""
    found, todo = [], [root]
    while todo:
        for child in children_of(todo.pop()):
            if child not in found:
                found.append(child)
                todo.append(child)
    return found


def torchrun_table(result: TorchrunResult) -> str:
    """One line per rank: node, local rank, global rank, CUDA_VISIBLE_DEVICES, the sum."""
    lines = ["node  local rank  global rank  CUDA_VISIBLE_DEVICES  all-reduce of (rank + 1)"]
    lines += [f"{r.node:>4}  {r.local_rank:>10}  {r.rank:>11}  {r.visible:>20}  "
              f"{r.all_reduce:g}" for r in result.reports]
    return "\n".join(lines)


def report_rank() -> None:
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
        # One write of the whole line: print() writes the text and its newline separately,
        # and unbuffered, the ranks of one launcher could run their reports together.
        sys.stdout.write(REPORT_PREFIX + json.dumps(report.__dict__) + "\n")
        sys.stdout.flush()
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
