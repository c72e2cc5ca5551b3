"""Measure this machine's alpha and beta, and check the simulator against reality.

The simulator times a message of n bytes as ``alpha + n / beta`` (``collectives.cost``).
``calibrate(2)`` measures both on real worker processes: ranks 0 and 1 bounce a message of
each size back and forth (ping-pong) with ``comm.send`` / ``comm.recv``, the same calls our
collectives make, so alpha includes this package's own per-message overhead. One way is half
a round trip; per size we keep the median over repeats.

The fit. Sizes run from 0 B to 64 MiB, so times span three or four orders of magnitude. Plain
least squares weighs each point by its absolute error: the 64 MiB point (tens of ms) decides
everything, a 1% wobble there is larger than alpha itself, and alpha can come out negative.
``fit_alpha_beta`` minimises the *relative* error instead, ``sum(((alpha + n/beta) - t)/t)^2``:
every size has the same say, so the small sizes pin alpha and the large ones pin beta. (The
other common recipe, alpha from the smallest sizes and beta from the slope of the largest,
gives nearly the same numbers when the model fits, and ignores the middle when it does not.)

Two messages at once. A ring step sends and receives at the same time, so the ranks also
*exchange* a message of each size (both send at once, as ``ring_step``). Between processes
on one machine both directions are copies made by the same few CPU cores: on a 2-core machine
an exchange took 1.8-2.9x as long as one message from 4 MiB up, where NVLink would take 1x.
So a gloo profile loads as a ``shared_host`` topology, in which every transfer holds one
resource, the host's copy bandwidth; an nccl profile as a uniform one (a port per device).

The reductions. A ring all-reduce is not only messages: every reduce-scatter step adds the
received chunk into the rank's own (read two chunks, write one), and on a CPU that add streams
through the same memory the copies use. Without it the simulated ring came out 19-48% faster
than the measured one from 4 MiB up on a 2-core machine. So each repeat also times one
``add_`` of two fp32 tensors per size of ``ADD_SIZES`` on every rank at once (as in a ring
step, where all ranks add together), and the same relative-error fit gives
``t(n) = op_overhead + n / memory_Bps`` with ``n`` = 3 x the tensor's bytes. The profile
carries both, and ``load_calibrated`` charges every op with them (the roofline of
``mpgpu_edu.cluster``), so the simulated ring pays its adds as ours does.

Per-message work. On a GPU link alpha is mostly a delay: messages in flight one behind
another overlap their latencies. Between processes on one CPU it is work (system calls, the
transport's bookkeeping) done by the same cores that copy the bytes, so a gloo profile's
routes say that alpha holds them (``Route.alpha_holds``): a rank's pipelined messages each
pay it, one after another. Two ranks do part of that work side by side, on their own cores,
and part of it competes with the copies for the cores they share: the exchanges measure how
much (``fit_shared_alpha``: ``exchange(n) = (1 + alpha_shared) alpha + 2 n / beta``), and
``alpha_shared`` of every alpha holds the host as the bytes do. Without that, the simulated
engineered ring (then with 2 MiB segments, many messages in flight) came out 19-26% faster
than the measured one at 16 and 64 MiB.

Checking the model. The same job also times our two rings (the readable
``all_reduce_ring`` and ``RingAllReduce``, the engineered one DDP uses) and torch.distributed's
all-reduce, on all ranks, and every repeat runs all of it, messages and all-reduces, one after
another: on a machine whose load changes from minute to minute, the calibration and the
all-reduces it is checked against then see the same load. ``compare`` simulates both rings on
the calibrated cluster and sets them beside the measurements. The readable ring allocates a
fresh receive buffer on every call, and on a CPU the first write to fresh memory costs page
faults that the simulator does not model (a GPU's caching allocator makes them free): from
64 MiB up it runs well behind its prediction, where the engineered ring, whose buffers are
kept, does not. The engineered ring on gloo deals its messages over two connections per
direction (``Lanes.channels``), which the simulator's one link per direction does not model:
since then it predicts that ring about 10% slower than measured (+1% to +16% by size, the
median over runs). ``benchmarks/calibrate_vs_measured.py`` repeats the whole check and records
it in ``benchmarks/RESULTS.md``.

The profile is a JSON file (``save_profile``); ``load_calibrated(path)`` turns it into a
``Cluster``, so that ``launch(fn, load_calibrated(path))`` predicts this machine. Both live in
``mpgpu_edu.measure.calibrated`` (the profile's side) and are importable from here too.
"""

from __future__ import annotations

import datetime
import os
import statistics
import time
from collections.abc import Sequence
from typing import Any

import torch

from mpgpu_edu.measure.calibrated import (FORMAT, default_profile_path,  # noqa: F401
                                          load_calibrated, read_profile, save_profile,
                                          shared_host)
from mpgpu_edu.cluster import Cluster

ALLREDUCE_SIZES = [4**k * 2**10 for k in range(9)]  # 1 KiB, 4 KiB, ..., 64 MiB
DEFAULT_SIZES = [0, *ALLREDUCE_SIZES]
ADD_SIZES = [2**12, 2**16, 2**20, 2**24]  # bytes of each operand of one add_
DEFAULT_REPEATS = 10
WARMUP = 2


def measure(comm: Any, sizes: list[int], allreduce_sizes: list[int], repeats: int,
            warmup: int = WARMUP, add_sizes: Sequence[int] = ADD_SIZES,
            progress: bool = False) -> dict[str, list[list[float]]]:
    """SPMD. Each repeat: for every size, ranks 0 and 1 ping-pong a message (one way = round
    trip / 2) and then exchange one (both send at once); every rank times one ``add_`` of
    two fp32 tensors of each of ``add_sizes`` bytes; then every rank runs our ring
    all-reduce and torch.distributed's on each of ``allreduce_sizes`` (fp32, bytes), in an
    order that alternates. Returns this rank's seconds per size and repeat: ``one_way`` and
    ``exchange`` (filled on rank 0 only), ``add``, ``ring`` and ``builtin``. ``progress``:
    rank 0 tells each repeat done on stderr (``measure.progress``)."""
    from mpgpu_edu.measure.bench import builtin_all_reduce, check_sum, in_turn, timed
    from mpgpu_edu.collectives import all_reduce_ring
    from mpgpu_edu.collectives.ring_fast import RingAllReduce
    from mpgpu_edu.measure.progress import Progress

    told = Progress(comm, "calibrate", warmup + repeats, progress)
    sends = [torch.zeros(n, dtype=torch.uint8, device=comm.device) for n in sizes]
    receives = [torch.empty_like(message) for message in sends]
    tensors = [torch.zeros(n // 4, device=comm.device) for n in allreduce_sizes]
    ops = {"ring": all_reduce_ring, "ring_fast": RingAllReduce(), "builtin": builtin_all_reduce}
    out = {key: [[] for _ in sizes] for key in ("one_way", "exchange")}
    out.update({key: [[] for _ in allreduce_sizes] for key in ops})
    addends = [(torch.zeros(max(n // 4, 1), device=comm.device),
                torch.ones(max(n // 4, 1), device=comm.device)) for n in add_sizes]
    out["add"] = [[] for _ in add_sizes]
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread per rank, as in mpgpu_edu.measure.bench
    try:
        for tensor in tensors:
            for name, op in ops.items():
                check_sum(comm, op, tensor, name)
            tensor.zero_()
        for r in range(warmup + repeats):
            for i, (message, into) in enumerate(zip(sends, receives)):
                seconds = _bounce(comm, message, into) if comm.rank < 2 else (0.0, 0.0)
                if r >= warmup and comm.rank == 0:
                    out["one_way"][i].append(seconds[0])
                    out["exchange"][i].append(seconds[1])
            comm.barrier()  # every rank adds at once, as in a ring step
            for i, (mine, received) in enumerate(addends):
                seconds = _timed_add(comm, mine, received)
                if r >= warmup:
                    out["add"][i].append(seconds)
            for i, tensor in enumerate(tensors):
                for name in in_turn(list(ops), r):
                    wall, _ = timed(comm, ops[name], tensor)
                    if r >= warmup:
                        out[name][i].append(wall)
            told.step("warm-up round done" if r < warmup else "timed round done")
    finally:
        torch.set_num_threads(before)
    return out


def _bounce(comm: Any, message: torch.Tensor, into: torch.Tensor) -> tuple[float, float]:
    """Ranks 0 and 1: (one-way seconds of a ping-pong, seconds of an exchange)."""
    peer = 1 - comm.rank
    start = time.perf_counter()
    if comm.rank == 0:
        comm.send(message, peer)
        comm.recv(message, peer)
    else:
        comm.recv(message, peer)
        comm.send(message, peer)
    middle = time.perf_counter()
    work = comm.isend(message, peer)
    comm.recv(into, peer)
    work.wait()
    return (middle - start) / 2, time.perf_counter() - middle


def _timed_add(comm: Any, mine: torch.Tensor, received: torch.Tensor) -> float:
    """Seconds of one ``mine.add_(received)``, as a ring's reduce-scatter step runs it."""
    comm.sync()
    start = time.perf_counter()
    mine.add_(received)
    comm.sync()
    return time.perf_counter() - start


def fit_alpha_beta(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """``(alpha_s, beta_Bps)`` of ``t(n) = alpha + n / beta`` through ``(bytes, seconds)``
    points, by least squares on relative error (see the module's docstring). Exact when the
    points lie on such a line. A negative alpha (noise) is clamped to 0 and beta refitted."""
    import numpy as np

    if len({n for n, _ in points}) < 2 or any(t <= 0 for _, t in points):
        raise ValueError("the fit needs positive times at two or more distinct sizes")
    n = np.array([p[0] for p in points], dtype=float)
    t = np.array([p[1] for p in points], dtype=float)
    scale = max(n.max(), 1.0)  # columns of similar size: a well-conditioned solve
    rows = np.stack([1 / t, n / scale / t], axis=1)  # each row divided by its t: relative
    (alpha, slope), *_ = np.linalg.lstsq(rows, np.ones_like(t), rcond=None)
    if alpha < 0:
        alpha = 0.0
        slope = float(rows[:, 1] @ np.ones_like(t) / (rows[:, 1] @ rows[:, 1]))
    if slope <= 0:
        raise ValueError("the times do not grow with the size: no bandwidth to fit (too few "
                         "or too small sizes, or a very noisy machine)")
    return float(alpha), float(scale / slope)


def fit_shared_alpha(points: Sequence[tuple[float, float, float]], alpha: float,
                     beta: float) -> float:
    """The fraction ``sigma`` of alpha that two ranks exchanging messages cannot do side by
    side, from ``(bytes, one-way seconds, exchange seconds)`` points: least squares on
    relative error of ``exchange(n) = (1 + sigma) alpha + 2 n / beta`` (both messages' bytes
    go through the one host; of the two alphas, one is paid and sigma of the other), clamped
    to [0, 1]. 1 when alpha is 0 (nothing to split)."""
    if alpha <= 0:
        return 1.0
    num = den = 0.0
    for n, _, x in points:
        if x <= 0:
            continue
        a, c = alpha / x, (alpha + 2 * n / beta - x) / x
        num, den = num - a * c, den + a * a
    return min(1.0, max(0.0, num / den)) if den else 1.0


def auto_timeout(world_size: int, sizes: Sequence[int], allreduce_sizes: Sequence[int],
                 repeats: int, add_sizes: Sequence[int] = ADD_SIZES) -> float:
    """``calibrate``'s default limit, generous: a minute, plus a second per 10 MB moved."""
    moved = 4 * sum(sizes) + 3 * world_size * (sum(allreduce_sizes) + sum(add_sizes))
    return 60.0 + moved * (repeats + WARMUP) / 1e7


def calibrate(world_size: int = 2, sizes: Sequence[int] = DEFAULT_SIZES,
              repeats: int = DEFAULT_REPEATS, backend: str = "gloo",
              allreduce_sizes: Sequence[int] = ALLREDUCE_SIZES,
              add_sizes: Sequence[int] = ADD_SIZES, timeout: float | None = None,
              progress: bool = False) -> dict:
    """Run ``measure`` on ``world_size`` worker processes and fit alpha and beta: the profile
    (``alpha_s``, ``beta_Bps``, ``topology``, ``points`` with the median one-way and exchange
    seconds per size, ``allreduce`` with the median ring and builtin seconds per size, the
    slowest rank each repeat, ``memory_Bps`` and ``op_overhead_s`` fitted to ``add_points``
    (bytes an add moves, its median seconds on the slowest rank; both ``None`` when the
    times do not fit), ``backend``, ``world_size``, ``repeats``, ``date``, ``torch``,
    ``cpus``, ``loadavg``). ``timeout``: seconds the ranks get (default: a minute, plus a
    second per 10 MB moved); ``progress``: rank 0 tells each repeat done on stderr."""
    from mpgpu_edu.measure.bench import combine, fp32_sizes
    from mpgpu_edu.comm import launch

    if world_size < 2:
        raise ValueError(f"a ping-pong needs at least 2 ranks, got {world_size}")
    if repeats < 1 or any(n < 0 for n in sizes):
        raise ValueError("repeats must be >= 1 and sizes >= 0 bytes")
    allreduce_sizes = fp32_sizes(allreduce_sizes)
    if len(set(add_sizes)) < 2 or any(n < 4 for n in add_sizes):
        raise ValueError("add_sizes needs two or more distinct sizes of at least 4 bytes")
    if timeout is None:
        timeout = auto_timeout(world_size, sizes, allreduce_sizes, repeats, add_sizes)
    result = launch(measure, world_size, list(sizes), allreduce_sizes, repeats, WARMUP,
                    list(add_sizes), progress, backend=backend, timeout=timeout)
    mine = result.results[0]
    points = [(n, statistics.median(ts)) for n, ts in zip(sizes, mine["one_way"])]
    alpha, beta = fit_alpha_beta(points)
    shared = fit_shared_alpha([(n, t, statistics.median(x)) for (n, t), x
                               in zip(points, mine["exchange"])], alpha, beta)
    medians = combine([{k: r[k] for k in ("ring", "ring_fast", "builtin", "add")}
                       for r in result.results])
    add_points = [(3 * 4 * max(n // 4, 1), t) for n, t in zip(add_sizes, medians["add"])]
    try:
        overhead, memory = fit_alpha_beta(add_points)
    except ValueError:  # a machine too noisy to tell: the profile leaves adds unmodelled
        overhead, memory = None, None
    return {"format": FORMAT, "backend": backend, "world_size": world_size,
            "alpha_s": alpha, "beta_Bps": beta, "alpha_shared": shared,
            "fit": "t(n) = alpha + n / beta, least squares on relative error",
            "exchange_fit": ("exchange(n) = (1 + alpha_shared) alpha + 2 n / beta, least "
                             "squares on relative error"),
            "topology": "shared_host" if backend == "gloo" else "uniform",
            "points": [{"bytes": n, "seconds": t, "exchange_seconds": statistics.median(x)}
                       for (n, t), x in zip(points, mine["exchange"])],
            "allreduce": {"sizes": allreduce_sizes, "ring_s": medians["ring"],
                          "ring_fast_s": medians["ring_fast"],
                          "builtin_s": medians["builtin"]},
            "memory_Bps": memory, "op_overhead_s": overhead,
            "memory_fit": ("t(n) = op_overhead + n / memory_Bps, n = bytes one add_ reads "
                           "and writes (3 x an operand), least squares on relative error"),
            "add_points": [{"bytes": n, "seconds": t} for n, t in add_points],
            "repeats": repeats,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "torch": torch.__version__, "cpus": os.cpu_count(),
            "loadavg": list(os.getloadavg())}



def _ring_on_meta(comm: Any, numel: int, algo: str = "ring") -> None:
    from mpgpu_edu.collectives import all_reduce_ring
    from mpgpu_edu.collectives.ring_fast import GLOO_SEGMENT_BYTES, RingAllReduce

    # the engineered ring with the segments it cuts on gloo, where it was measured
    ring = all_reduce_ring if algo == "ring" else RingAllReduce(GLOO_SEGMENT_BYTES)
    ring(comm, torch.empty(numel, dtype=torch.float32, device="meta"))


def predict_ring(cluster: Cluster, nbytes: int, algo: str = "ring") -> float:
    """Simulated seconds of ``all_reduce_ring`` (``algo="ring"``) or of the engineered
    ``RingAllReduce`` (``"ring_fast"``, with its segments on gloo:
    ``ring_fast.GLOO_SEGMENT_BYTES``) of ``nbytes`` (fp32) on ``cluster``."""
    from mpgpu_edu.comm import launch

    return launch(_ring_on_meta, cluster, nbytes // 4, algo).trace.makespan


def compare(profile: dict, cluster: Cluster) -> dict:
    """Ring all-reduce per size of ``profile["allreduce"]``: simulated on ``cluster`` beside
    the measured times. ``error`` is (predicted - measured) / measured, negative where the
    simulator is optimistic; ``error_builtin`` compares with torch.distributed's all-reduce,
    to tell the model's error from our ring's own overheads."""
    measured = profile["allreduce"]
    predicted = [predict_ring(cluster, n) for n in measured["sizes"]]
    fast = [predict_ring(cluster, n, "ring_fast") for n in measured["sizes"]]
    fast_measured = measured.get("ring_fast_s") or [float("nan")] * len(fast)
    return {"sizes": measured["sizes"], "predicted_s": predicted,
            "measured_s": measured["ring_s"], "builtin_s": measured["builtin_s"],
            "error": [(p - m) / m for p, m in zip(predicted, measured["ring_s"])],
            "error_builtin": [(p - m) / m for p, m in zip(predicted, measured["builtin_s"])],
            "fast_predicted_s": fast, "fast_measured_s": fast_measured,
            "fast_error": [(p - m) / m for p, m in zip(fast, fast_measured)],
            "world_size": cluster.world_size, "repeats": profile["repeats"],
            "loadavg": profile["loadavg"]}
