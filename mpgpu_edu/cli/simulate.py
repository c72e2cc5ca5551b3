"""``mpgpu-edu simulate WHAT``: what a collective (or, later, a schedule) costs on a preset.

    mpgpu-edu simulate allreduce --algo ring --world-size 8 --bytes 1GiB --cluster 8xA100-nvlink
    mpgpu-edu simulate allreduce --algo naive --world-size 4 --bytes 64MiB \\
        --cluster 4xRTX4090-pcie --json

``allreduce`` runs the chosen all-reduce of ``mpgpu_edu.collectives`` on the simulator, on
the first N devices of the preset (``CUDA_VISIBLE_DEVICES=0,...,N-1``), with a *meta* fp32
tensor of the given size: meta tensors carry a shape and no data, so even a 1 GiB message
costs no memory and no time to simulate. It prints the simulated time, nccl-tests' algbw
and busbw, the bytes each rank sent and received, and the closed form on a uniform link of
the same alpha and beta for comparison; a simulated time above it is contention.
``--json`` gives ``time_s`` in seconds and ``algbw``/``busbw`` in bytes/s (``algbw_GBps``,
``busbw_GBps``: the same in 10^9 bytes/s; null when the time is zero, on one rank).

Each ``WHAT`` is a pair of functions below, ``add_WHAT_parser`` and ``run_WHAT``, listed in
``PARSERS`` and ``HANDLERS``.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

import torch

from mpgpu_edu.cli import UsageError, parse_size
from mpgpu_edu.cluster import Cluster, format_bytes
from mpgpu_edu.collectives import ALGORITHMS, all_reduce
from mpgpu_edu.collectives import cost
from mpgpu_edu.comm import Communicator, launch

DEFAULT_CLUSTER = "8xA100-nvlink"
DEFAULT_BYTES = "64MiB"
FP32_BYTES = 4


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("simulate", help="cost of a collective (or a schedule) on a preset",
                            description="Simulate a collective (or a schedule) on a preset "
                                        "cluster and report its cost.")
    what = parser.add_subparsers(dest="what", metavar="WHAT")
    what.required = True
    for add in PARSERS.values():
        add(what)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    return HANDLERS[args.what](args)


# ---- simulate allreduce ---------------------------------------------------------------------

def add_allreduce_parser(what: argparse._SubParsersAction) -> None:
    p = what.add_parser("allreduce", help="time of one all-reduce: naive, tree or ring",
                        description="Run one all-reduce of a meta fp32 tensor on the simulator.")
    p.add_argument("--algo", default="ring", metavar="{" + ",".join(ALGORITHMS) + "}",
                   help="all-reduce algorithm (default ring)")
    p.add_argument("--world-size", type=int, default=None, metavar="N",
                   help="number of ranks: the first N devices of the preset (default: all)")
    p.add_argument("--bytes", default=DEFAULT_BYTES, metavar="SIZE",
                   help=f"tensor size per rank, e.g. 4096, 64KiB, 1GiB (default "
                        f"{DEFAULT_BYTES}); rounded up to whole fp32 elements")
    p.add_argument("--cluster", default=DEFAULT_CLUSTER, metavar="PRESET",
                   help=f"cluster preset (default {DEFAULT_CLUSTER}); one of: "
                        + ", ".join(Cluster.presets()))
    p.add_argument("--json", action="store_true", help="print one JSON object")


def run_allreduce(args: argparse.Namespace) -> int:
    report = simulate_allreduce(args.algo, args.world_size, args.bytes, args.cluster)
    print(json.dumps(report, indent=2) if args.json else allreduce_text(report))
    return 0


def _allreduce_meta(comm: Communicator, algo: str, numel: int) -> None:
    all_reduce(comm, torch.empty(numel, dtype=torch.float32, device="meta"), algo=algo)


def simulate_allreduce(algo: str, world_size: int | None, size: str, preset: str) -> dict:
    """Simulate one all-reduce and return the report (the ``--json`` object)."""
    if algo not in ALGORITHMS:
        raise UsageError(f"unknown algorithm {algo!r}: choose one of {', '.join(ALGORITHMS)}")
    n = _world_size(preset, world_size)
    requested = parse_size(size)
    numel = -(-requested // FP32_BYTES)  # round up to whole fp32 elements
    nbytes = numel * FP32_BYTES
    cluster = Cluster.preset(preset, visible=",".join(str(i) for i in range(n)))
    result = launch(_allreduce_meta, cluster, algo, numel)
    seconds = result.trace.makespan
    route = cluster.route(0, 1) if n > 1 else None
    alpha, beta = (route.alpha_s, route.beta_Bps) if route else (0.0, 1.0)
    closed = cost.allreduce_time(algo, n, nbytes, alpha, beta)
    algbw = cost.algbw(nbytes, seconds) if seconds > 0 else None
    busbw = cost.busbw(nbytes, seconds, n) if seconds > 0 else None
    return {
        "algo": algo, "world_size": n, "bytes": nbytes, "bytes_requested": requested,
        "dtype": "fp32", "cluster": preset, "gpu": cluster.gpu.display_name,
        "time_s": seconds,
        "algbw": algbw, "busbw": busbw,
        "algbw_GBps": None if algbw is None else algbw / 1e9,
        "busbw_GBps": None if busbw is None else busbw / 1e9,
        "bytes_sent_per_rank": result.bytes_sent_per_rank,
        "bytes_received_per_rank": result.bytes_received_per_rank,
        "link_alpha_s": alpha if route else None, "link_beta_Bps": beta if route else None,
        "closed_form_s": closed, "closed_form": cost.ALLREDUCE_FORMULA[algo],
        "slowdown_vs_closed_form": seconds / closed if closed > 0 else None,
    }


def _world_size(preset: str, world_size: int | None) -> int:
    """The number of ranks: ``world_size``, or every device of ``preset`` when None."""
    if preset not in Cluster.presets():
        raise UsageError(f"unknown cluster preset {preset!r}: choose one of "
                         + ", ".join(Cluster.presets()))
    n_max = Cluster.preset(preset).n_physical
    n = n_max if world_size is None else world_size
    if not 1 <= n <= n_max:
        raise UsageError(f"--world-size must be between 1 and {n_max} (the devices of "
                         f"{preset}), got {n}")
    return n


def allreduce_text(r: dict) -> str:
    """The human-readable report of ``simulate_allreduce``."""
    n, size = r["world_size"], format_bytes(r["bytes"])
    lines = [f"{r['algo']} all-reduce of {size} ({r['bytes']} bytes, fp32) on {n} x "
             f"{r['gpu']} ({r['cluster']}, devices 0..{n - 1})"]
    if r["bytes"] != r["bytes_requested"]:
        lines.append(f"  note: {r['bytes_requested']} bytes rounded up to {r['bytes']}, "
                     "whole fp32 elements (4 bytes each)")
    lines.append(f"  time      {_ms(r['time_s'])}")
    if r["algbw"] is None:
        lines.append("  algbw     n/a (nothing crosses a link: zero time)")
    else:
        lines.append(f"  algbw     {r['algbw_GBps']:.2f} GB/s   bytes / time")
        lines.append(f"  busbw     {r['busbw_GBps']:.2f} GB/s   algbw x 2(N-1)/N "
                     "(nccl-tests' bus bandwidth)")
    lines.append("  sent      " + _per_rank(r["bytes_sent_per_rank"]))
    lines.append("  received  " + _per_rank(r["bytes_received_per_rank"]))
    if r["link_alpha_s"] is not None:
        lines.append(f"closed form on a uniform link of alpha {r['link_alpha_s'] * 1e6:g} us, "
                     f"beta {r['link_beta_Bps'] / 1e9:g} GB/s: {r['closed_form']} = "
                     f"{_ms(r['closed_form_s'])}")
    slowdown = r["slowdown_vs_closed_form"]
    if slowdown is not None:
        why = ("transfers queued for a shared resource (contention)" if slowdown > 1 + 1e-9
               else "no contention")
        lines.append(f"  simulated / closed form = {slowdown:.3f}: {why}")
    return "\n".join(lines)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.4f} ms"


def _per_rank(values: list[int]) -> str:
    if len(set(values)) == 1:
        return f"{format_bytes(values[0])} by every rank ({values[0]} bytes)"
    return ", ".join(f"rank {i}: {format_bytes(v)}" for i, v in enumerate(values))


# ---- simulate pipeline ----------------------------------------------------------------------

PIPELINE_LAYERS, PIPELINE_WIDTH, PIPELINE_BATCH = 8, 64, 64


def add_pipeline_parser(what: argparse._SubParsersAction) -> None:
    p = what.add_parser(
        "pipeline", help="one training step of a pipeline schedule: bubbles, idle, memory",
        description="Run one training step of a small model (LAYERS Linear layers of WIDTH "
                    "features) through the pipeline executor on the simulator. Compute takes "
                    "explicit seconds per layer (--forward-ms, --backward-ms), so equal "
                    "stages show the textbook bubble (P-1)/(M+P-1); messages carry the real "
                    "activations and cost what the preset's links charge.")
    p.add_argument("--schedule", default="gpipe", metavar="{naive,gpipe,1f1b}",
                   help="pipeline schedule (default gpipe)")
    p.add_argument("--stages", type=int, default=4, metavar="P",
                   help="pipeline stages, one per device (default 4)")
    p.add_argument("--microbatches", type=int, default=None, metavar="M",
                   help="microbatches per batch (default 4; naive runs 1)")
    p.add_argument("--cluster", default=DEFAULT_CLUSTER, metavar="PRESET",
                   help=f"cluster preset (default {DEFAULT_CLUSTER}); one of: "
                        + ", ".join(Cluster.presets()))
    p.add_argument("--layers", type=int, default=PIPELINE_LAYERS,
                   help=f"Linear layers in the model (default {PIPELINE_LAYERS})")
    p.add_argument("--width", type=int, default=PIPELINE_WIDTH,
                   help=f"features of every layer (default {PIPELINE_WIDTH})")
    p.add_argument("--batch-size", type=int, default=PIPELINE_BATCH,
                   help=f"samples per batch (default {PIPELINE_BATCH})")
    p.add_argument("--forward-ms", type=float, default=1.0,
                   help="forward time of one layer on one microbatch, ms (default 1)")
    p.add_argument("--backward-ms", type=float, default=2.0,
                   help="backward time of one layer on one microbatch, ms (default 2)")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def run_pipeline(args: argparse.Namespace) -> int:
    report = simulate_pipeline(args.schedule, args.stages, args.microbatches, args.cluster,
                               args.layers, args.width, args.batch_size,
                               args.forward_ms / 1e3, args.backward_ms / 1e3)
    print(json.dumps(report, indent=2) if args.json else pipeline_text(report))
    return 0


def _pipeline_step(comm: Communicator, model: torch.nn.Sequential, placement: Any,
                   schedule: Any, batch: torch.Tensor, seconds: list[tuple[float, float]]) -> None:
    """Forward and backward of one batch through the pipeline (the optimizer step adds no
    time to a schedule, so it is left out)."""
    from mpgpu_edu.pipeline import split_module
    from mpgpu_edu.pipeline.executor import pipeline_forward_backward

    pipeline_forward_backward(comm, split_module(model, placement), schedule, batch, batch,
                              stage_seconds=seconds[comm.rank])


def simulate_pipeline(schedule_name: str, n_stages: int, n_microbatches: int | None,
                      preset: str, n_layers: int = PIPELINE_LAYERS,
                      width: int = PIPELINE_WIDTH, batch_size: int = PIPELINE_BATCH,
                      forward_s: float = 1e-3, backward_s: float = 2e-3) -> dict:
    """Simulate one pipeline training step and return the report (the ``--json`` object).
    Stage p takes (its layers) x ``forward_s`` per forward, x ``backward_s`` per backward."""
    from mpgpu_edu.pipeline import bubble_fraction, partition_balanced
    from mpgpu_edu.pipeline.runner import SCHEDULES, make_schedule

    if schedule_name not in SCHEDULES:
        raise UsageError(f"unknown schedule {schedule_name!r}: choose one of "
                         + ", ".join(SCHEDULES))
    if preset not in Cluster.presets():
        raise UsageError(f"unknown cluster preset {preset!r}: choose one of "
                         + ", ".join(Cluster.presets()))
    m = n_microbatches if n_microbatches is not None else (1 if schedule_name == "naive" else 4)
    n_devices = Cluster.preset(preset).n_physical
    _check_pipeline_input(n_stages, m, n_layers, n_devices, preset, width, batch_size,
                          forward_s, backward_s)
    try:
        schedule = make_schedule(schedule_name, n_stages, m)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    cluster = Cluster.preset(preset, visible=",".join(str(i) for i in range(n_stages)))
    torch.manual_seed(0)
    model = torch.nn.Sequential(*(torch.nn.Linear(width, width) for _ in range(n_layers)))
    placement = partition_balanced(model, n_stages)
    seconds = [(len(s.layers) * forward_s, len(s.layers) * backward_s)
               for s in placement.stages]
    batch = torch.randn(batch_size, width)
    trace = launch(_pipeline_step, cluster, model, placement, schedule, batch, seconds).trace
    idle = [trace.idle_fraction(d) for d in range(n_stages)]
    held = [_peak_activations(trace, d) for d in range(n_stages)]
    return {
        "schedule": schedule_name, "stages": n_stages, "microbatches": m, "cluster": preset,
        "gpu": cluster.gpu.display_name, "layers_per_stage": [len(s.layers)
                                                             for s in placement.stages],
        "stage_seconds": [list(pair) for pair in seconds],
        "makespan_s": trace.makespan,
        "bubble_fraction": sum(idle) / n_stages,
        "bubble_fraction_formula": (n_stages - 1) / (m + n_stages - 1),
        "bubble_fraction_grid": bubble_fraction(schedule),
        "idle_fraction_per_device": idle,
        "peak_activations": [count for count, _ in held],
        "peak_activation_bytes": [nbytes for _, nbytes in held],
        "bytes_sent_per_device": trace.bytes_sent(),
        "grid": str(schedule),
    }


def _peak_activations(trace: Any, device: int) -> tuple[int, int]:
    """(most microbatches held at once, most activation bytes held at once) on ``device``:
    the executor records one "activations" entry per microbatch forward, freed by its
    backward."""
    count = nbytes = peak_count = peak_bytes = 0
    for event in sorted(trace.memory, key=lambda e: e.time):
        if event.device == device and event.category == "activations":
            count += 1 if event.delta > 0 else -1
            nbytes += event.delta
            peak_count, peak_bytes = max(peak_count, count), max(peak_bytes, nbytes)
    return peak_count, peak_bytes


def _check_pipeline_input(n_stages: int, m: int, n_layers: int, n_devices: int, preset: str,
                          width: int, batch_size: int, forward_s: float,
                          backward_s: float) -> None:
    if n_stages < 1:
        raise UsageError(f"--stages must be at least 1, got {n_stages}")
    if m < 1:
        raise UsageError(f"--microbatches must be at least 1, got {m}")
    if n_layers < 1 or width < 1:
        raise UsageError(f"--layers and --width must be at least 1, got {n_layers}, {width}")
    if n_stages > n_layers:
        raise UsageError(f"--stages {n_stages} is more than the model's {n_layers} layers: "
                         "every stage needs a layer; use fewer stages or more --layers")
    if n_stages > n_devices:
        raise UsageError(f"--stages {n_stages} needs {n_stages} devices, but {preset} has "
                         f"{n_devices}: use fewer stages or a larger preset")
    if not m <= batch_size:
        raise UsageError(f"--microbatches {m} is more than the batch's {batch_size} samples: "
                         "raise --batch-size")
    if forward_s < 0 or backward_s < 0:
        raise UsageError("--forward-ms and --backward-ms must not be negative")


def pipeline_text(r: dict) -> str:
    """The human-readable report of ``simulate_pipeline``."""
    p, m = r["stages"], r["microbatches"]
    lines = [f"{r['schedule']}: {p} stages x {m} microbatches on {p} x {r['gpu']} "
             f"({r['cluster']}, devices 0..{p - 1}); layers per stage {r['layers_per_stage']}",
             r["grid"],
             f"makespan  {_ms(r['makespan_s'])}",
             f"bubble    {r['bubble_fraction']:.1%} of device time idle; "
             f"(P-1)/(M+P-1) = {r['bubble_fraction_formula']:.1%} for equal stages and free "
             "sends"]
    for d in range(p):
        lines.append(f"  device {d}: idle {r['idle_fraction_per_device'][d]:.1%}, holds at "
                     f"most {r['peak_activations'][d]} microbatches of activations "
                     f"({format_bytes(r['peak_activation_bytes'][d])})")
    return "\n".join(lines)


# ---- the table of WHATs: add a pair here for each new ``simulate WHAT`` --------------------

PARSERS: dict[str, Callable[[argparse._SubParsersAction], None]] = {
    "allreduce": add_allreduce_parser,
    "pipeline": add_pipeline_parser,
}
HANDLERS: dict[str, Callable[[argparse.Namespace], int]] = {
    "allreduce": run_allreduce,
    "pipeline": run_pipeline,
}
