"""Our all-reduce against ``torch.distributed.all_reduce``, timed in the same processes.

``bench_allreduce(2)`` starts (or reuses) a gloo worker pool and, in each worker, runs our
ring and naive all-reduces (``mpgpu_edu.collectives``, written on send/recv) and the built-in
``torch.distributed.all_reduce`` on the same fp32 tensor and the same process group.

How it is timed, so that the comparison is fair on a busy machine:

- one thread per rank for torch's own kernels (``torch.set_num_threads(1)`` during the
  bench, restored after), as ``torchrun`` does for several processes on one machine: two
  ranks of two OpenMP threads each on two cores made one ``add_`` of a 512 KiB chunk take
  20 ms instead of 0.1 ms. gloo's built-in reduction is single-threaded anyway;
- warm-up: every operation runs on known data once, checked against the exact sum (a wrong
  answer cannot look fast), then twice more before any timing;
- interleaved repeats: repeat r runs the operations in row r of a balanced order
  (``in_turn``), so a burst of load from another program hits every operation alike, and
  each follows every other equally often;
- a barrier before each timed operation, so every rank starts together;
- per repeat, an operation's time is the *slowest* rank's (a collective is done when its
  last rank is); over repeats, the median, which ignores a few disturbed runs;
- CPU time too (``time.process_time``: every thread of the rank's process, gloo's own
  included), summed over ranks: on a machine busy with other work the wall clock measures
  mostly how long each process waited for a core, while CPU time still measures the work.

- per repeat also the ratio ours / builtin of that repeat's two neighbouring runs, and its
  median over repeats (``paired_<algo>``): a slow drift in the machine's load cancels out;
- the 1-minute load average before and after (``loadavg_start``, ``loadavg``): a result
  taken above ``MAX_LOAD_PER_CORE`` per core is not one to record (``check_idle``; both in
  ``mpgpu_edu.measure.recording``, with the writing of ``RESULTS.md``).

The tensor holds zeros while it is timed: repeated sums neither overflow nor change the work.
Besides ``ring`` and ``naive``, ``algos=`` can time ``ring_reused`` (the same ring, keeping its
scratch buffer between calls), ``ring_fast`` (``mpgpu_edu.collectives.ring_fast``) and
``ring_fast_unsegmented`` (the same, one message per chunk): each engineering step alone;
``ring_fast_bare`` is ``ring_fast`` posted straight on ``torch.distributed``, without the
course's communicator (no size check, no records): what the communicator costs on top;
``ring_fast_unchecked`` is ``ring_fast`` on a communicator with its message-size checks off
(as ``MPGPU_EDU_CHECK_MESSAGES=0`` sets them): records and board kept, no envelope. The
course runs checked by default, so ``ring_fast`` is what a learner's program gets; the
other two columns say where the difference to gloo's own all-reduce goes.
"""

from __future__ import annotations

import itertools
import os
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from mpgpu_edu.collectives import all_reduce_naive, all_reduce_ring, cost
from mpgpu_edu.collectives.ring_fast import RingAllReduce
from mpgpu_edu.comm.dist_work import MAIN
from mpgpu_edu.measure.progress import Progress

FP32_BYTES = 4
BUILTIN = "builtin"
ALGOS = ("ring", "naive", "ring_reused", "ring_fast", "ring_fast_unsegmented",
         "ring_fast_bare", "ring_fast_unchecked")
DEFAULT_SIZES = [4**k * 2**10 for k in range(9)]  # 1 KiB, 4 KiB, ..., 64 MiB
DEFAULT_REPEATS = 10
WARMUP = 2
QUICK_SIZES = [4, 4100]  # --quick: does the bench run end to end? (not: how fast)
QUICK_REPEATS = 2
Op = Callable[[Any, torch.Tensor], None]


def all_reduce_ring_reused(comm: Any, tensor: torch.Tensor, buffer: torch.Tensor) -> None:
    """``all_reduce_ring`` (sum) with a scratch ``buffer`` that the caller keeps between
    calls, at least as long as the ring's longest chunk. A fresh 32 MiB buffer per call is
    fresh memory that the receive must fault in page by page."""
    all_reduce_ring(comm, tensor, "sum", buffer=buffer)


def ring_fast_bare(ring: RingAllReduce) -> Op:
    """``ring``'s algorithm, plan and scratch, its messages posted straight with
    ``dist.isend``/``dist.irecv`` on ``comm``'s process groups: no size check, no record, no
    board, on the same connections (a message to a lower rank on the lane's second one, and
    messages dealt out over the lane's channels in turn, as ``comm.neighbours`` sends
    them). Not for use: it shows what the course's communicator costs on top (sum only)."""
    def op(comm: Any, tensor: torch.Tensor) -> None:
        flat, n, lanes, tag = tensor.view(-1), comm.world_size, comm.lanes, ring.tag
        right, left = (comm.rank + 1) % n, (comm.rank - 1) % n
        to, source = lanes.channels(MAIN, comm.rank, right), lanes.channels(MAIN, left, comm.rank)
        sent, received = itertools.cycle(to), itertools.cycle(source)
        ring._reduce(flat, "sum", n, ring.reserve(comm, flat),
                     lambda t: dist.isend(t, right, group=next(sent), tag=tag),
                     lambda t: dist.irecv(t, left, group=next(received), tag=tag))
    return op


def ring_fast_unchecked(ring: RingAllReduce) -> Op:
    """``ring`` on a communicator like ``comm`` (same process groups and board) whose
    message-size checks are off: no envelope, everything else as the course runs it."""
    made: list[Any] = []  # made on first use, beside the rank's own communicator

    def op(comm: Any, tensor: torch.Tensor) -> None:
        if not made:
            from mpgpu_edu.comm.dist import DistCommunicator
            made.append(DistCommunicator(comm.lanes, board=comm.board, check_messages=False))
        ring(made[0], tensor)
    return op


def builtin_all_reduce(comm: Any, tensor: torch.Tensor) -> None:
    """``torch.distributed.all_reduce`` (sum) on the process group under ``comm``."""
    dist.all_reduce(tensor, group=comm.lanes.main)


def operations(algos: Sequence[str], numel: int, world_size: int,
               device: torch.device) -> dict[str, Op]:
    """The operations to time for a tensor of ``numel`` elements: ``algos``, then builtin.
    ``ring_reused`` gets its scratch buffer here, once per size."""
    chunk = -(-numel // world_size)
    made: dict[str, Op] = {"ring": all_reduce_ring, "naive": all_reduce_naive,
                           "ring_fast": RingAllReduce(),
                           "ring_fast_unsegmented": RingAllReduce(segment_bytes=None)}
    if "ring_fast_bare" in algos:
        made["ring_fast_bare"] = ring_fast_bare(RingAllReduce())
    if "ring_fast_unchecked" in algos:
        made["ring_fast_unchecked"] = ring_fast_unchecked(RingAllReduce())
    if "ring_reused" in algos:
        buffer = torch.empty(chunk, device=device)
        made["ring_reused"] = lambda comm, t: all_reduce_ring_reused(comm, t, buffer)
    return {**{name: made[name] for name in algos}, BUILTIN: builtin_all_reduce}


def in_turn(names: list[str], r: int) -> list[str]:
    """The order of repeat ``r``: row ``r`` of a Williams design (Williams, Aust. J. Sci.
    Res. 1949), repeated. Over its rows (n of them for n names, 2n when n is odd) every name
    runs in every place equally often, and *follows* every other name equally often: an
    operation that leaves the machine slower or faster for the next one (its caches, its
    sockets' state) favours nobody. (Turning one order round, ``names[r:] + names[:r]``,
    gives each name the same predecessor every time.)"""
    n = len(names)
    first = [0]
    for j in range(1, n):
        first.append((j + 1) // 2 if j % 2 else n - j // 2)
    rows = [[(k + i) % n for k in first] for i in range(n)]
    if n % 2:
        rows += [row[::-1] for row in rows]
    return [names[k] for k in rows[r % len(rows)]]


def auto_timeout(world_size: int, sizes: Sequence[int], repeats: int,
                 algos: Sequence[str]) -> float:
    """``bench_allreduce``'s default limit, generous: a minute, plus a second per 10 MB that
    any operation moves."""
    return 60.0 + sum(sizes) * (len(algos) + 1) * (repeats + WARMUP + 1) * world_size / 1e7


def time_allreduce(comm: Any, sizes: list[int], repeats: int, algos: Sequence[str] = ALGOS[:2],
                   threads: int = 1, progress: bool = False
                   ) -> dict[str, dict[str, list[list[float]]]]:
    """SPMD, on a ``torch.distributed`` backend: this rank's measurements of every operation,
    size and repeat, ``{"wall": {name: [[s of repeat 0, ...] for each size]}, "cpu": ...}``:
    wall-clock seconds, and CPU seconds of this process (all its threads, gloo's included),
    which a busy machine disturbs far less. ``sizes`` are bytes, multiples of 4 (fp32)."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    names = [*algos, BUILTIN]
    out: dict[str, dict[str, list[list[float]]]] = {kind: {name: [] for name in names}
                                                     for kind in ("wall", "cpu")}
    told = Progress(comm, "bench allreduce", len(sizes), progress)
    try:
        for nbytes in sizes:
            measured = _time_size(comm, nbytes, repeats, algos)
            told.step(f"{size_label(nbytes)} timed")
            for kind, per_name in out.items():
                for name in names:
                    per_name[name].append(measured[kind][name])
    finally:
        torch.set_num_threads(before)
    return out


def _time_size(comm: Any, nbytes: int, repeats: int,
               algos: Sequence[str]) -> dict[str, dict[str, list[float]]]:
    tensor = torch.zeros(nbytes // FP32_BYTES, device=comm.device)
    ops = operations(algos, tensor.numel(), comm.world_size, comm.device)
    for name, op in ops.items():
        check_sum(comm, op, tensor, name)
    tensor.zero_()
    for _ in range(WARMUP):
        for op in ops.values():
            op(comm, tensor)
    out: dict[str, dict[str, list[float]]] = {"wall": {name: [] for name in ops},
                                              "cpu": {name: [] for name in ops}}
    for r in range(repeats):
        for name in in_turn(list(ops), r):
            wall, cpu = timed(comm, ops[name], tensor)
            out["wall"][name].append(wall)
            out["cpu"][name].append(cpu)
    return out


def timed(comm: Any, op: Op, tensor: torch.Tensor) -> tuple[float, float]:
    """After a barrier, ``op(comm, tensor)``'s (wall-clock, process CPU) seconds."""
    dist.barrier(group=comm.lanes.main)
    comm.sync()
    start, cpu_start = time.perf_counter(), time.process_time()
    op(comm, tensor)
    comm.sync()
    return time.perf_counter() - start, time.process_time() - cpu_start


def check_sum(comm: Any, op: Op, tensor: torch.Tensor, name: str) -> None:
    """Rank r fills ``tensor`` with r + 1; after ``op`` it must hold N (N + 1) / 2."""
    tensor.fill_(comm.rank + 1)
    op(comm, tensor)
    want = comm.world_size * (comm.world_size + 1) / 2
    if not bool(torch.all(tensor == want)):
        raise AssertionError(f"{name} all-reduce gave {tensor.flatten()[0].item()}, not {want}")


def combine(per_rank: list[dict[str, list[list[float]]]],
            across: Callable[[Iterable[float]], float] = max) -> dict[str, list[float]]:
    """Per operation and size: ``across`` the ranks for each repeat (``max``: the slowest
    rank, for wall clock; ``sum``: all ranks' CPU time), then the median over repeats."""
    return {name: [statistics.median(across(rank[name][i][r] for rank in per_rank)
                                     for r in range(len(per_size[i])))
                   for i in range(len(per_size))]
            for name, per_size in per_rank[0].items()}


def paired(per_rank: list[dict[str, list[list[float]]]], name: str) -> list[float]:
    """Per size: the median over repeats of ours / builtin *within* a repeat (the two ran
    next to each other), each the slowest rank's time."""
    def slowest(op: str, i: int, r: int) -> float:
        return max(rank[op][i][r] for rank in per_rank)

    return [statistics.median(slowest(name, i, r) / slowest(BUILTIN, i, r)
                              for r in range(len(per_size)))
            for i, per_size in enumerate(per_rank[0][name])]


def ratios(ours: Sequence[float], builtin: Sequence[float]) -> list[float]:
    """``ours / builtin`` per size: below 1, ours is faster."""
    return [a / b for a, b in zip(ours, builtin)]


def fp32_sizes(sizes: Sequence[int]) -> list[int]:
    """Sizes in bytes rounded up to whole fp32 elements; each must be positive."""
    for nbytes in sizes:
        if nbytes <= 0:
            raise ValueError(f"sizes must be positive, got {nbytes} bytes")
    return [-(-nbytes // FP32_BYTES) * FP32_BYTES for nbytes in sizes]


def bench_allreduce(world_size: int, sizes: Sequence[int] = DEFAULT_SIZES,
                    repeats: int = DEFAULT_REPEATS, backend: str = "gloo",
                    algos: Sequence[str] = ALGOS[:2], threads: int = 1,
                    timeout: float | None = None, progress: bool = False) -> dict:
    """Time our all-reduces (``algos``) against ``torch.distributed.all_reduce`` on
    ``world_size`` worker processes and return the report (``mpgpu-edu bench allreduce
    --json``): ``sizes`` (bytes), ``<algo>_s`` and ``builtin_s`` (median seconds),
    ``ratio_<algo>`` (ours / builtin, of the medians), ``paired_<algo>`` (median of the
    ratios within a repeat), ``<algo>_cpu_s`` and ``cpu_ratio_<algo>`` (CPU seconds
    of all ranks together, and ours / builtin), ``busbw_<algo>`` and ``busbw_builtin`` (B/s),
    ``world_size``, ``backend``, ``repeats``, ``threads``, ``loadavg`` (1, 5 and 15 minute
    load averages at the end) and ``loadavg_start``. ``timeout``: seconds the ranks get
    (default ``auto_timeout``); ``progress``: rank 0 tells each size done on stderr
    (``measure.progress``)."""
    from mpgpu_edu.comm import launch

    _check(world_size, repeats, algos, threads)
    sizes = fp32_sizes(sizes)
    load_start = os.getloadavg()
    if timeout is None:
        timeout = auto_timeout(world_size, sizes, repeats, algos)
    result = launch(time_allreduce, world_size, sizes, repeats, tuple(algos), threads,
                    progress, backend=backend, timeout=timeout)
    medians = combine([r["wall"] for r in result.results])
    cpu = combine([r["cpu"] for r in result.results], across=sum)
    names = [*algos, BUILTIN]
    report: dict[str, Any] = {"sizes": sizes}
    report.update({f"{name}_s": medians[name] for name in names})
    report.update({f"ratio_{name}": ratios(medians[name], medians[BUILTIN]) for name in algos})
    report.update({f"{name}_cpu_s": cpu[name] for name in names})
    report.update({f"cpu_ratio_{name}": ratios(cpu[name], cpu[BUILTIN]) for name in algos})
    wall = [r["wall"] for r in result.results]
    report.update({f"paired_{name}": paired(wall, name) for name in algos})
    report.update({f"busbw_{name}": [cost.busbw(s, t, world_size)
                                     for s, t in zip(sizes, medians[name])] for name in names})
    report.update(algos=list(algos), world_size=world_size, backend=backend, repeats=repeats,
                  threads=threads, loadavg=list(os.getloadavg()),
                  loadavg_start=list(load_start), cpus=os.cpu_count(), torch=torch.__version__)
    return report


def _check(world_size: int, repeats: int, algos: Sequence[str], threads: int) -> None:
    if world_size < 2:
        raise ValueError(f"an all-reduce bench needs at least 2 ranks, got {world_size}")
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    if threads < 1:
        raise ValueError(f"threads must be at least 1, got {threads}")
    unknown = [name for name in algos if name not in ALGOS]
    if unknown or not algos or len(set(algos)) != len(algos):
        raise ValueError(f"algorithms must be distinct names from {', '.join(ALGOS)}; "
                         f"got {', '.join(algos) or 'none'}")


def table(report: dict) -> str:
    """The report as a text table: one row per size, times in ms, ratios ours / builtin of
    the median wall-clock times, the median of the ratios within a repeat (``paired``), of
    CPU time, and the bus bandwidth (GB/s) of our first algorithm and of the built-in one;
    then the 1-minute load average before and after."""
    algos = report["algos"]
    head = (["size"] + [f"{a} ms" for a in [*algos, BUILTIN]] + [f"{a}/builtin" for a in algos]
            + [f"paired {a}/builtin" for a in algos] + [f"cpu {a}/builtin" for a in algos]
            + [f"busbw {algos[0]}", "busbw builtin"])
    rows = [head]
    for i, nbytes in enumerate(report["sizes"]):
        rows.append([size_label(nbytes)]
                    + [f"{report[f'{a}_s'][i] * 1e3:.3f}" for a in [*algos, BUILTIN]]
                    + [f"{report[f'ratio_{a}'][i]:.2f}" for a in algos]
                    + [f"{report[f'paired_{a}'][i]:.2f}" for a in algos]
                    + [f"{report[f'cpu_ratio_{a}'][i]:.2f}" for a in algos]
                    + [f"{report[f'busbw_{a}'][i] / 1e9:.3f}" for a in (algos[0], BUILTIN)])
    widths = [max(len(row[c]) for row in rows) for c in range(len(head))]
    lines = ["  ".join(cell.rjust(w) for cell, w in zip(row, widths)) for row in rows]
    load = ", ".join(f"{x:.2f}" for x in report["loadavg"])
    return (f"all-reduce, {report['world_size']} ranks, {report['backend']}, fp32, median of "
            f"{report['repeats']} interleaved repeats (slowest rank each), {report['threads']} "
            "torch thread(s) per rank\n" + "\n".join(lines)
            + "\ncpu: CPU time of all ranks' processes, ours / builtin. busbw: GB/s, size / time "
              f"x 2(N-1)/N. 1-minute load average before {report['loadavg_start'][0]:.2f}, "
              f"after {report['loadavg'][0]:.2f}; at the end {load} "
              f"(1, 5, 15 min; {report['cpus']} CPUs)")


def size_label(nbytes: int) -> str:
    """``1024`` -> ``"1 KiB"``, ``4100`` -> ``"4100 B"``: exact, in the largest unit that
    divides it."""
    for unit, scale in (("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"
