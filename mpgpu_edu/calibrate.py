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

The profile is a JSON file (``save_profile``); ``load_calibrated(path)`` turns it into a
``Cluster`` whose every pair of devices has the measured alpha and beta, so that
``launch(fn, load_calibrated(path))`` predicts this machine. ``compare`` then simulates ring
all-reduce on that cluster and measures it (``mpgpu_edu.bench``), per size.
"""

from __future__ import annotations

import datetime
import json
import os
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from mpgpu_edu.cluster import Cluster, topology
from mpgpu_edu.hardware import GPUS

FORMAT = "mpgpu-edu calibration 1"
DEFAULT_SIZES = [0] + [4**k * 2**10 for k in range(9)]  # 0 B, 1 KiB, 4 KiB, ..., 64 MiB
DEFAULT_REPEATS = 10
WARMUP = 2


def default_profile_path() -> Path:
    """``.mpgpu/calibration.json`` in the repository (the folder holding ``pyproject.toml``
    next to the package), else in the current directory."""
    root = Path(__file__).resolve().parents[1]
    if not (root / "pyproject.toml").exists():
        root = Path.cwd()
    return root / ".mpgpu" / "calibration.json"


def ping_pong(comm: Any, sizes: list[int], repeats: int,
              warmup: int = WARMUP) -> list[list[float]] | None:
    """SPMD: rank 0 sends a message of each size to rank 1, which sends it back. Repeat r
    bounces every size once, so a burst of load from another program hits all sizes alike.
    Rank 0 returns the one-way seconds (round trip / 2) of every timed repeat, per size; the
    other ranks return None (ranks above 1 only wait at the barrier)."""
    messages = [torch.zeros(n, dtype=torch.uint8, device=comm.device) for n in sizes]
    times: list[list[float]] = [[] for _ in sizes]
    comm.barrier()
    for r in range(warmup + repeats):
        for message, one_way in zip(messages, times):
            if comm.rank == 0:
                start = time.perf_counter()
                comm.send(message, 1)
                comm.recv(message, 1)
                if r >= warmup:
                    one_way.append((time.perf_counter() - start) / 2)
            elif comm.rank == 1:
                comm.recv(message, 0)
                comm.send(message, 0)
    return times if comm.rank == 0 else None


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


def calibrate(world_size: int = 2, sizes: Sequence[int] = DEFAULT_SIZES,
              repeats: int = DEFAULT_REPEATS, backend: str = "gloo") -> dict:
    """Ping-pong on ``world_size`` worker processes and fit alpha and beta: the profile
    (``alpha_s``, ``beta_Bps``, ``points`` of one-way median seconds, ``backend``,
    ``world_size``, ``date``, ``torch``, ``cpus``, ``loadavg``)."""
    from mpgpu_edu.comm import launch

    if world_size < 2:
        raise ValueError(f"a ping-pong needs at least 2 ranks, got {world_size}")
    if repeats < 1 or any(n < 0 for n in sizes):
        raise ValueError("repeats must be >= 1 and sizes >= 0 bytes")
    timeout = 60.0 + 2 * sum(sizes) * (repeats + WARMUP) / 1e7
    result = launch(ping_pong, world_size, list(sizes), repeats, backend=backend,
                    timeout=timeout)
    points = [(n, statistics.median(ts)) for n, ts in zip(sizes, result.results[0])]
    alpha, beta = fit_alpha_beta(points)
    return {"format": FORMAT, "backend": backend, "world_size": world_size,
            "alpha_s": alpha, "beta_Bps": beta,
            "fit": "t(n) = alpha + n / beta, least squares on relative error",
            "points": [{"bytes": n, "seconds": t} for n, t in points],
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "torch": torch.__version__, "cpus": os.cpu_count(),
            "loadavg": list(os.getloadavg())}


def save_profile(profile: dict, path: str | Path) -> Path:
    """Write ``profile`` as JSON at ``path`` (folders created); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(profile, indent=2) + "\n")
    return path


def read_profile(path: str | Path) -> dict:
    """The profile at ``path``, checked; ``ValueError`` saying what is wrong otherwise."""
    try:
        profile = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read calibration profile {str(path)!r}: {exc}") from None
    if not isinstance(profile, dict) or profile.get("format") != FORMAT:
        raise ValueError(f"{str(path)!r} is not a calibration profile (run `mpgpu-edu "
                         "calibrate` to make one)")
    alpha, beta = profile.get("alpha_s"), profile.get("beta_Bps")
    if not (isinstance(alpha, (int, float)) and isinstance(beta, (int, float))
            and alpha >= 0 and beta > 0):
        raise ValueError(f"{str(path)!r}: alpha_s must be >= 0 and beta_Bps > 0, got "
                         f"{alpha!r} and {beta!r}")
    return profile


def load_calibrated(path: str | Path | None = None, world_size: int | None = None,
                    gpu: str | None = None) -> Cluster:
    """A ``Cluster`` of ``world_size`` devices (default: the profile's) in which every pair
    has the measured alpha and beta (a uniform topology: each device its own port in and
    out). ``gpu`` names the device profile for compute (default ``CPU-16GB`` for a gloo
    profile; name one for an nccl profile). Compute costs peak x 1.0, as ``Cluster.uniform``."""
    profile = read_profile(path or default_profile_path())
    n = world_size or int(profile["world_size"])
    backend = profile.get("backend", "gloo")
    if gpu is None and backend != "gloo":
        raise ValueError(f"the profile measured {backend}: name the GPU, e.g. "
                         "load_calibrated(path, gpu='H100-SXM-80GB')")
    wiring = topology.uniform(n, profile["alpha_s"], profile["beta_Bps"],
                              spec_name=f"loopback-{backend} (calibrated)")
    return Cluster(f"calibrated-{n}x{backend}", GPUS[gpu or "CPU-16GB"], wiring,
                   efficiency=1.0, launch_overhead_s=0.0)


def _ring_on_meta(comm: Any, numel: int) -> None:
    from mpgpu_edu.collectives import all_reduce_ring

    all_reduce_ring(comm, torch.empty(numel, dtype=torch.float32, device="meta"))


def predict_ring(cluster: Cluster, nbytes: int) -> float:
    """Simulated seconds of ``all_reduce_ring`` of ``nbytes`` (fp32) on ``cluster``."""
    from mpgpu_edu.comm import launch

    return launch(_ring_on_meta, cluster, nbytes // 4).trace.makespan


def compare(cluster: Cluster, sizes: Sequence[int], repeats: int = DEFAULT_REPEATS,
            backend: str = "gloo") -> dict:
    """Ring all-reduce per size: simulated on ``cluster`` and measured on as many worker
    processes. ``error`` is (predicted - measured) / measured: negative, the simulator is
    optimistic."""
    from mpgpu_edu.bench import bench_allreduce

    measured = bench_allreduce(cluster.world_size, sizes, repeats, backend, algos=("ring",))
    predicted = [predict_ring(cluster, n) for n in measured["sizes"]]
    return {"sizes": measured["sizes"], "predicted_s": predicted,
            "measured_s": measured["ring_s"], "builtin_s": measured["builtin_s"],
            "error": [(p - m) / m for p, m in zip(predicted, measured["ring_s"])],
            "world_size": cluster.world_size, "backend": backend, "repeats": repeats,
            "loadavg": measured["loadavg"]}
