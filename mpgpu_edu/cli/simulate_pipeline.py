"""``mpgpu-edu simulate pipeline``: one training step of a pipeline schedule on a preset.

    mpgpu-edu simulate pipeline --schedule 1f1b --stages 4 --microbatches 8
    mpgpu-edu simulate pipeline --stages 8 --cluster 8xA100-nvlink --forward-ms 0 --json
    mpgpu-edu simulate pipeline --schedule interleaved --chunks 2 --stages 4 --microbatches 8

A small model (``--layers`` Linear layers of ``--width`` features) runs through the pipeline
executor on the simulator; compute takes explicit seconds per layer, so equal stages show the
textbook bubble (P-1)/(M+P-1); interleaved 1F1B with V chunks per device cuts the model
into P V virtual stages and its bubble to (P-1)/(V M+P-1) of the time, (P-1)/(V M) of the
compute. Registered by ``mpgpu_edu.cli.simulate`` (its ``PARSERS``).
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

import torch

from mpgpu_edu.cli import UsageError, number
from mpgpu_edu.cluster import Cluster, format_bytes
from mpgpu_edu.comm import Communicator, launch

DEFAULT_CLUSTER = "8xA100-nvlink"  # as ``simulate allreduce``
MAX_RANKS = 1024  # the presets are far smaller; the check states the preset's own limit

PIPELINE_LAYERS, PIPELINE_WIDTH, PIPELINE_BATCH = 8, 64, 64
# Stated limits, refused before anything runs, so that no run takes minutes: every microbatch
# is simulated message by message on every stage (4096 stage-microbatches take about 10 s on
# one core), and the model runs for real on this CPU (batch x width^2 x layers multiply-adds
# per forward: 2^35 take a few seconds).
MAX_MICROBATCHES, MAX_LAYERS, MAX_WIDTH, MAX_BATCH = 1024, 1024, 8192, 65536
MAX_STAGE_MICROBATCHES, MAX_WORK = 4096, 2**35
MAX_MS = 3.6e6  # one hour per layer and microbatch
SCHEDULE_NAMES = ("naive", "gpipe", "1f1b", "interleaved")
MAX_CHUNKS = 64


def add_pipeline_parser(what: argparse._SubParsersAction) -> None:
    p = what.add_parser(
        "pipeline", help="one training step of a pipeline schedule: bubbles, idle, memory",
        description="Run one training step of a small model (LAYERS Linear layers of WIDTH "
                    "features) through the pipeline executor on the simulator. Compute takes "
                    "explicit seconds per layer (--forward-ms, --backward-ms), so equal "
                    "stages show the textbook bubble (P-1)/(M+P-1); messages carry the real "
                    "activations and cost what the preset's links charge.")
    p.add_argument("--schedule", default="gpipe", metavar="{naive,gpipe,1f1b,interleaved}",
                   help="pipeline schedule (default gpipe)")
    p.add_argument("--chunks", type=number(int, 1, MAX_CHUNKS), default=None, metavar="V",
                   help="model chunks per device for --schedule interleaved (default 2; "
                        "the other schedules run 1)")
    p.add_argument("--stages", type=number(int, 1, MAX_RANKS), default=4, metavar="P",
                   help="pipeline stages, one per device (default 4)")
    p.add_argument("--microbatches", default=None, metavar="M",
                   type=number(int, 1, MAX_MICROBATCHES,
                               hint="each microbatch is simulated message by message; lower "
                                    "--microbatches"),
                   help=f"microbatches per batch (default 4; naive runs 1; at most "
                        f"{MAX_MICROBATCHES})")
    p.add_argument("--cluster", default=DEFAULT_CLUSTER, metavar="PRESET",
                   help=f"cluster preset (default {DEFAULT_CLUSTER}); one of: "
                        + ", ".join(Cluster.presets()))
    real = "the model runs for real on this CPU; lower it"
    p.add_argument("--layers", type=number(int, 1, MAX_LAYERS, hint=real),
                   default=PIPELINE_LAYERS,
                   help=f"Linear layers in the model (default {PIPELINE_LAYERS})")
    p.add_argument("--width", type=number(int, 1, MAX_WIDTH, hint=real), default=PIPELINE_WIDTH,
                   help=f"features of every layer (default {PIPELINE_WIDTH})")
    p.add_argument("--batch-size", type=number(int, 1, MAX_BATCH, hint=real),
                   default=PIPELINE_BATCH, help=f"samples per batch (default {PIPELINE_BATCH})")
    # 0 ms is allowed: free compute leaves only the communication on the timeline.
    p.add_argument("--forward-ms", type=number(float, 0.0, MAX_MS), default=1.0,
                   help="forward time of one layer on one microbatch, ms (default 1)")
    p.add_argument("--backward-ms", type=number(float, 0.0, MAX_MS), default=2.0,
                   help="backward time of one layer on one microbatch, ms (default 2)")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def run_pipeline(args: argparse.Namespace) -> int:
    report = simulate_pipeline(args.schedule, args.stages, args.microbatches, args.cluster,
                               args.layers, args.width, args.batch_size,
                               args.forward_ms / 1e3, args.backward_ms / 1e3,
                               n_chunks=args.chunks)
    print(json.dumps(report, indent=2) if args.json else pipeline_text(report))
    return 0


def _pipeline_step(comm: Communicator, model: torch.nn.Sequential, placement: Any,
                   schedule: Any, batch: torch.Tensor, seconds: list[Any]) -> None:
    """Forward and backward of one batch through the pipeline (the optimizer step adds no
    time to a schedule, so it is left out)."""
    from mpgpu_edu.pipeline import split_module
    from mpgpu_edu.pipeline.executor import pipeline_forward_backward

    pipeline_forward_backward(comm, split_module(model, placement), schedule, batch, batch,
                              stage_seconds=seconds[comm.rank])


def simulate_pipeline(schedule_name: str, n_stages: int, n_microbatches: int | None,
                      preset: str, n_layers: int = PIPELINE_LAYERS,
                      width: int = PIPELINE_WIDTH, batch_size: int = PIPELINE_BATCH,
                      forward_s: float = 1e-3, backward_s: float = 2e-3,
                      n_chunks: int | None = None) -> dict:
    """Simulate one pipeline training step and return the report (the ``--json`` object).
    Stage p takes (its layers) x ``forward_s`` per forward, x ``backward_s`` per backward;
    with ``schedule_name="interleaved"`` each of the P ``n_chunks`` virtual stages does."""
    from mpgpu_edu.pipeline import bubble_fraction, bubble_overhead, partition_balanced

    if schedule_name not in SCHEDULE_NAMES:
        raise UsageError(f"unknown schedule {schedule_name!r}: choose one of "
                         + ", ".join(SCHEDULE_NAMES))
    interleaved = schedule_name == "interleaved"
    if n_chunks is not None and n_chunks != 1 and not interleaved:
        raise UsageError(f"--chunks {n_chunks} needs --schedule interleaved ({schedule_name} "
                         "runs one chunk per device): drop --chunks or use interleaved")
    v = (n_chunks or 2) if interleaved else 1
    if preset not in Cluster.presets():
        raise UsageError(f"unknown cluster preset {preset!r}: choose one of "
                         + ", ".join(Cluster.presets()))
    m = n_microbatches if n_microbatches is not None else _default_microbatches(
        schedule_name, n_stages)
    n_devices = Cluster.preset(preset).n_physical
    _check_pipeline_input(n_stages, m, n_layers, n_devices, preset, width, batch_size,
                          forward_s, backward_s)
    if v > 1 and n_stages * v > n_layers:
        raise UsageError(f"--stages {n_stages} x --chunks {v} = {n_stages * v} virtual stages "
                         f"is more than the model's {n_layers} layers: every chunk needs a "
                         "layer; use fewer chunks or more --layers")
    if n_stages * m * v > MAX_STAGE_MICROBATCHES:
        raise UsageError(f"--stages {n_stages} x --microbatches {m} x --chunks {v} = "
                         f"{n_stages * m * v} is past the limit of {MAX_STAGE_MICROBATCHES} "
                         "(each is simulated message by message): lower one of them")
    try:
        schedule = _make_schedule(schedule_name, n_stages, m, v)
    except ValueError as exc:
        raise UsageError(str(exc).replace("n_microbatches=", "--microbatches ")) from None
    cluster = Cluster.preset(preset, visible=",".join(str(i) for i in range(n_stages)))
    torch.manual_seed(0)
    model = torch.nn.Sequential(*(torch.nn.Linear(width, width) for _ in range(n_layers)))
    placement = partition_balanced(model, n_stages * v)
    virtual = [(len(s.layers) * forward_s, len(s.layers) * backward_s)
               for s in placement.stages]
    seconds = virtual if v == 1 else [virtual[p::n_stages] for p in range(n_stages)]
    batch = torch.randn(batch_size, width)
    trace = launch(_pipeline_step, cluster, model, placement, schedule, batch, seconds).trace
    idle = [trace.idle_fraction(d) for d in range(n_stages)]
    busy = sum(1 - share for share in idle)
    held = [_peak_activations(trace, d) for d in range(n_stages)]
    return {
        "schedule": schedule_name, "stages": n_stages, "microbatches": m, "chunks": v,
        "cluster": preset,
        "gpu": cluster.gpu.display_name, "layers_per_stage": [len(s.layers)
                                                             for s in placement.stages],
        "stage_seconds": [list(pair) for pair in virtual],
        "makespan_s": trace.makespan,
        "bubble_fraction": sum(idle) / n_stages,
        "bubble_fraction_formula": (n_stages - 1) / (v * m + n_stages - 1),
        "bubble_overhead": (n_stages - busy) / busy if busy else 0.0,
        "bubble_overhead_formula": (n_stages - 1) / (v * m),
        "bubble_fraction_grid": bubble_fraction(schedule),
        "bubble_overhead_grid": bubble_overhead(schedule),
        "idle_fraction_per_device": idle,
        "peak_activations": [count for count, _ in held],
        "peak_activation_bytes": [nbytes for _, nbytes in held],
        "bytes_sent_per_device": trace.bytes_sent(),
        "grid": str(schedule),
    }


def _default_microbatches(name: str, n_stages: int) -> int:
    """1 for naive, 4 for gpipe and 1f1b, and for interleaved the least multiple of the
    stages from 4 up (it runs microbatches in rounds of P)."""
    if name == "naive":
        return 1
    return n_stages * -(-4 // n_stages) if name == "interleaved" else 4


def _make_schedule(name: str, n_stages: int, m: int, n_chunks: int) -> Any:
    from mpgpu_edu.pipeline import interleaved_1f1b
    from mpgpu_edu.pipeline.runner import make_schedule

    if name == "interleaved":
        return interleaved_1f1b(n_stages, m, n_chunks)
    return make_schedule(name, n_stages, m)


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
    if not 1 <= m <= MAX_MICROBATCHES:
        raise UsageError(f"--microbatches must be from 1 to {MAX_MICROBATCHES}, got {m}")
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
    if not all(math.isfinite(t) and 0 <= t <= MAX_MS / 1e3 for t in (forward_s, backward_s)):
        raise UsageError(f"--forward-ms and --backward-ms must be finite, from 0 to "
                         f"{MAX_MS:g} ms, got {forward_s * 1e3:g} and {backward_s * 1e3:g}")
    if n_stages * m > MAX_STAGE_MICROBATCHES:
        raise UsageError(f"--stages {n_stages} x --microbatches {m} = {n_stages * m} is past the "
                         f"limit of {MAX_STAGE_MICROBATCHES} (each is simulated message by "
                         "message): lower --microbatches or --stages")
    work = batch_size * width * width * n_layers
    if work > MAX_WORK:
        raise UsageError(f"--batch-size {batch_size} x --width {width}^2 x --layers {n_layers} "
                         f"= {work:.3g} multiply-adds per forward, past the limit of 2^35 = "
                         f"{MAX_WORK:.3g} (the model runs for real on this CPU): lower "
                         "--batch-size, --width or --layers")


def pipeline_text(r: dict) -> str:
    """The human-readable report of ``simulate_pipeline``."""
    p, m, v = r["stages"], r["microbatches"], r["chunks"]
    chunks = f" x {v} chunks" if v > 1 else ""
    vm = "V M" if v > 1 else "M"
    lines = [f"{r['schedule']}: {p} stages{chunks} x {m} microbatches on {p} x {r['gpu']} "
             f"({r['cluster']}, devices 0..{p - 1}); layers per stage {r['layers_per_stage']}",
             r["grid"],
             f"makespan  {_ms(r['makespan_s'])}",
             f"bubble    {r['bubble_fraction']:.1%} of device time idle; "
             f"(P-1)/({vm}+P-1) = {r['bubble_fraction_formula']:.1%} for equal stages and free "
             "sends",
             f"          {r['bubble_overhead']:.1%} of the compute time; (P-1)/({vm}) = "
             f"{r['bubble_overhead_formula']:.1%}"]
    held = "microbatch-chunks" if v > 1 else "microbatches"
    for d in range(p):
        lines.append(f"  device {d}: idle {r['idle_fraction_per_device'][d]:.1%}, holds at "
                     f"most {r['peak_activations'][d]} {held} of activations "
                     f"({format_bytes(r['peak_activation_bytes'][d])})")
    return "\n".join(lines)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.4f} ms"
