"""Our all-reduce against ``torch.distributed.all_reduce``, timed in the same processes.

``bench_allreduce(2, [2**20])`` starts (or reuses) a gloo worker pool and, in each worker,
runs our ring and naive all-reduces (``mpgpu_edu.collectives``, written on send/recv) and the
built-in ``torch.distributed.all_reduce`` on the same fp32 tensor, on the same process group.

How it is timed, so that the comparison is fair on a busy machine:

- warm-up: every operation runs twice per size before any timing (and once on known data,
  checked against the exact sum, so a wrong answer cannot look fast);
- interleaved repeats: repeat r runs the operations in an order rotated by r (ring, naive,
  builtin; then naive, builtin, ring; ...), so a burst of load from another program hits
  every operation alike instead of the one that happened to run during it;
- a barrier before each timed operation, so every rank starts together;
- per repeat, the time of an operation is the *slowest* rank's (a collective is done when
  its last rank is); over repeats we take the median, which ignores a few disturbed runs.

The tensor holds zeros while it is timed: sums of zeros stay zeros, so repeated all-reduces
neither overflow nor change the work, and the arithmetic costs the same as on real data.
Cost line and bus bandwidth: ``mpgpu_edu.collectives.cost``.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from mpgpu_edu.collectives import all_reduce_naive, all_reduce_ring, cost

FP32_BYTES = 4
BUILTIN = "builtin"
OURS: dict[str, Callable[[Any, torch.Tensor], None]] = {
    "ring": all_reduce_ring,
    "naive": all_reduce_naive,
}
DEFAULT_SIZES = [4**k * 2**10 for k in range(9)]  # 1 KiB, 4 KiB, ..., 64 MiB
DEFAULT_REPEATS = 10
WARMUP = 2


def builtin_all_reduce(comm: Any, tensor: torch.Tensor) -> None:
    """``torch.distributed.all_reduce`` (sum) on the process group under ``comm``."""
    dist.all_reduce(tensor, group=comm.lanes.main)


def operations(algos: Sequence[str]) -> dict[str, Callable[[Any, torch.Tensor], None]]:
    """Our algorithms named in ``algos``, then the built-in one."""
    return {**{name: OURS[name] for name in algos}, BUILTIN: builtin_all_reduce}


def rotated(names: list[str], r: int) -> list[str]:
    """``names`` starting at index ``r % len(names)``: the order of repeat ``r``."""
    k = r % len(names)
    return names[k:] + names[:k]


def time_allreduce(comm: Any, sizes: list[int], repeats: int,
                   algos: Sequence[str] = ("ring", "naive"),
                   warmup: int = WARMUP) -> dict[str, list[list[float]]]:
    """SPMD, on a ``torch.distributed`` backend: this rank's seconds for every operation,
    size and repeat, ``{name: [[s of repeat 0, ...] for each size]}``. ``sizes`` are bytes,
    multiples of 4 (fp32)."""
    ops = operations(algos)
    names = list(ops)
    times: dict[str, list[list[float]]] = {name: [] for name in names}
    for nbytes in sizes:
        tensor = torch.zeros(nbytes // FP32_BYTES, device=comm.device)
        for name, op in ops.items():
            _check_sum(comm, op, tensor, name)
        tensor.zero_()
        for _ in range(warmup):
            for op in ops.values():
                op(comm, tensor)
        per_repeat: dict[str, list[float]] = {name: [] for name in names}
        for r in range(repeats):
            for name in rotated(names, r):
                per_repeat[name].append(_timed(comm, ops[name], tensor))
        for name in names:
            times[name].append(per_repeat[name])
    return times


def _timed(comm: Any, op: Callable[[Any, torch.Tensor], None], tensor: torch.Tensor) -> float:
    dist.barrier(group=comm.lanes.main)
    comm.sync()
    start = time.perf_counter()
    op(comm, tensor)
    comm.sync()
    return time.perf_counter() - start


def _check_sum(comm: Any, op: Callable[[Any, torch.Tensor], None], tensor: torch.Tensor,
               name: str) -> None:
    tensor.fill_(comm.rank + 1)
    op(comm, tensor)
    want = comm.world_size * (comm.world_size + 1) / 2
    if tensor.numel() and not bool(torch.all(tensor == want)):
        raise AssertionError(f"{name} all-reduce gave {tensor.flatten()[0].item()}, not {want}")


def combine(per_rank: list[dict[str, list[list[float]]]]) -> dict[str, list[float]]:
    """Per operation and size: the slowest rank of each repeat, then the median over repeats."""
    out: dict[str, list[float]] = {}
    for name in per_rank[0]:
        n_sizes = len(per_rank[0][name])
        out[name] = [statistics.median(map(max, zip(*(rank[name][i] for rank in per_rank))))
                     for i in range(n_sizes)]
    return out


def ratios(ours: list[float], builtin: list[float]) -> list[float]:
    """``ours / builtin`` per size: below 1, ours is faster."""
    return [a / b for a, b in zip(ours, builtin)]


def fp32_sizes(sizes: Sequence[int]) -> list[int]:
    """Sizes in bytes rounded up to whole fp32 elements; each must be positive."""
    for nbytes in sizes:
        if nbytes <= 0:
            raise ValueError(f"sizes must be positive, got {nbytes} bytes")
    return [-(-nbytes // FP32_BYTES) * FP32_BYTES for nbytes in sizes]


def launch_timeout(sizes: list[int], repeats: int, n_ops: int) -> float:
    """A generous limit for one bench: 1 s per 10 MB moved per op, plus a minute."""
    return 60.0 + sum(sizes) * n_ops * (repeats + WARMUP + 1) / 10e6


def bench_allreduce(world_size: int, sizes: Sequence[int] = DEFAULT_SIZES,
                    repeats: int = DEFAULT_REPEATS, backend: str = "gloo",
                    algos: Sequence[str] = ("ring", "naive")) -> dict:
    """Time our all-reduces (``algos``) against ``torch.distributed.all_reduce`` on
    ``world_size`` worker processes; returns the report (``mpgpu-edu bench allreduce --json``):
    ``sizes`` (bytes), ``<algo>_s`` and ``builtin_s`` (median seconds), ``ratio_<algo>``,
    ``busbw_<algo>`` and ``busbw_builtin`` (bytes/s), ``world_size``, ``backend``, ``repeats``,
    ``loadavg`` (1, 5, 15 min, at the end) and ``loadavg_start``."""
    from mpgpu_edu.comm import launch

    if world_size < 2:
        raise ValueError(f"an all-reduce bench needs at least 2 ranks, got {world_size}")
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    for name in algos:
        if name not in OURS:
            raise ValueError(f"unknown algorithm {name!r}: choose from {', '.join(OURS)}")
    sizes = fp32_sizes(sizes)
    load_start = os.getloadavg()
    timeout = launch_timeout(sizes, repeats, len(algos) + 1)
    result = launch(time_allreduce, world_size, sizes, repeats, tuple(algos), backend=backend,
                    timeout=timeout)
    medians = combine(result.results)
    report: dict[str, Any] = {"sizes": sizes}
    for name in [*algos, BUILTIN]:
        report[f"{name}_s"] = medians[name]
    for name in algos:
        report[f"ratio_{name}"] = ratios(medians[name], medians[BUILTIN])
    for name in [*algos, BUILTIN]:
        report[f"busbw_{name}"] = [cost.busbw(s, t, world_size)
                                   for s, t in zip(sizes, medians[name])]
    report.update(world_size=world_size, backend=backend, repeats=repeats,
                  loadavg=list(os.getloadavg()), loadavg_start=list(load_start),
                  cpus=os.cpu_count(), torch=torch.__version__)
    return report
