"""``mpgpu-edu simulate step``: one training step of a model preset on a cluster preset.

    mpgpu-edu simulate step --model gpt2-small --cluster 8xA100-nvlink --strategy dp \\
        --micro-batch 8 --seq 1024 --accumulate 4
    mpgpu-edu simulate step --model gpt-22b --strategy tensor --micro-batch 4 --seq 2048 \\
        --recompute selective --timeline step.png --json
    mpgpu-edu simulate step --model llama-7b --cluster 2x8xH100-ib --strategy tensor --tp 8 \\
        --micro-batch 8 --seq 2048 --visible 0,1,2,3,8,9,10,11,4,5,6,7,12,13,14,15

Runs ``mpgpu_edu.estimate.simulate_step``: each layer's forward and backward timed on the
GPU's roofline, every message a real collective on meta tensors, timed by the simulator on the
preset's links. Prints step time, tokens/s, MFU (model FLOPs over step time x devices x bf16
peak), how the devices spent the step (computing, communicating with nothing to compute,
idle) and memory per device; ``--timeline PATH`` saves the step's timeline as a PNG.
``--tp T`` (strategy tensor) makes groups of T consecutive ranks, data-parallel replicas of
each other; ``--visible`` orders the preset's GPUs as CUDA_VISIBLE_DEVICES does, so it places
those groups (on 2 nodes of 8: inside a node, or spread over both).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from mpgpu_edu.cli import UsageError, number
from mpgpu_edu.cluster import Cluster, format_bytes
from mpgpu_edu.cluster.visible import check_visible

MAX_TOKENS_PER_STEP = 2**24  # per device and micro-batch x micro-batches: keeps a run in seconds


def add_step_parser(what: argparse._SubParsersAction) -> None:
    from mpgpu_edu.estimate import STRATEGIES
    from mpgpu_edu.memory.models import ATTENTIONS, PRESETS, RECOMPUTES

    p = what.add_parser("step", help="one training step of a model preset: time, MFU, memory",
                        description="Simulate one training step of a model preset on a "
                                    "cluster preset with one parallel strategy.")
    p.add_argument("--model", default="gpt2-small", metavar="PRESET",
                   help="model preset (default gpt2-small); one of: " + ", ".join(PRESETS))
    p.add_argument("--cluster", default="8xA100-nvlink", metavar="PRESET",
                   help="cluster preset (default 8xA100-nvlink)")
    p.add_argument("--strategy", default="dp", metavar="{" + ",".join(STRATEGIES) + "}",
                   help="how the N devices split the work (default dp)")
    p.add_argument("--micro-batch", type=number(int, 1, 2**20), default=8, metavar="B",
                   help="sequences per device per micro-batch (default 8)")
    p.add_argument("--seq", type=number(int, 1, 2**24), default=1024, metavar="S",
                   help="tokens per sequence (default 1024)")
    p.add_argument("--accumulate", type=number(int, 1, 1024), default=1, metavar="K",
                   help="micro-batches per step (default 1; the pipeline's microbatches)")
    p.add_argument("--attention", default="flash", metavar="{" + ",".join(ATTENTIONS) + "}",
                   help="attention kernel (default flash)")
    p.add_argument("--recompute", default="none", metavar="{" + ",".join(RECOMPUTES) + "}",
                   help="activation recomputation (default none)")
    p.add_argument("--tp", type=number(int, 1, 2**20), default=None, metavar="T",
                   help="strategy tensor: ranks per tensor-parallel group, dividing the "
                        "device count (default: all of them); the groups are data-parallel "
                        "replicas")
    p.add_argument("--visible", default=None, metavar="IDS",
                   help="CUDA_VISIBLE_DEVICES on the cluster preset: which GPUs, in which "
                        "order (default: all, in order)")
    p.add_argument("--timeline", metavar="PATH", help="save the step's timeline as a PNG")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def run_step(args: argparse.Namespace) -> int:
    from mpgpu_edu.estimate import StepSetup, simulate_step

    setup = check_step_args(args)
    timeline = Path(args.timeline) if args.timeline else None
    if timeline is not None and not timeline.parent.resolve().is_dir():
        raise UsageError(f"--timeline: folder {str(timeline.parent)!r} does not exist: "
                         "create it or pick another path")
    report, trace = simulate_step(StepSetup(**setup))
    if timeline is not None:
        report["timeline"] = str(save_timeline(trace, report, timeline))
    print(json.dumps(report, indent=2) if args.json else step_text(report))
    return 0


def check_step_args(args: argparse.Namespace) -> dict:
    """Validate before simulating; returns ``StepSetup``'s arguments."""
    from mpgpu_edu.estimate import STRATEGIES
    from mpgpu_edu.memory.models import ATTENTIONS, PRESETS, RECOMPUTES

    for value, known, flag in ((args.model, PRESETS, "--model"),
                               (args.cluster, Cluster.presets(), "--cluster"),
                               (args.strategy, STRATEGIES, "--strategy"),
                               (args.attention, ATTENTIONS, "--attention"),
                               (args.recompute, RECOMPUTES, "--recompute")):
        if value not in known:
            raise UsageError(f"{flag}: unknown {value!r}: choose one of {', '.join(known)}")
    tp, visible = getattr(args, "tp", None) or 0, getattr(args, "visible", None)
    if tp and args.strategy != "tensor":
        raise UsageError(f"--tp applies to --strategy tensor, not {args.strategy}: drop --tp "
                         "or pick tensor")
    if visible is not None:
        warnings = check_visible(visible, Cluster.preset(args.cluster).n_physical)
        if warnings:
            raise UsageError(f"--visible {visible}: {warnings[0]}")
    devices = Cluster.preset(args.cluster, visible=visible).world_size
    if devices < 1:
        raise UsageError(f"--visible {visible!r} leaves no device of {args.cluster}")
    if tp and devices % tp:
        raise UsageError(f"--tp {tp} must divide the {devices} devices of {args.cluster}"
                         + (f" under --visible {visible}" if visible is not None else ""))
    if args.micro_batch * args.seq * args.accumulate > MAX_TOKENS_PER_STEP:
        raise UsageError(f"--micro-batch x --seq x --accumulate is "
                         f"{args.micro_batch * args.seq * args.accumulate:,} tokens per "
                         f"device, above the {MAX_TOKENS_PER_STEP:,} this command simulates: "
                         "lower one of them")
    return {"model": args.model, "cluster": args.cluster, "strategy": args.strategy,
            "micro_batch": args.micro_batch, "seq": args.seq, "accumulate": args.accumulate,
            "attention": args.attention, "recompute": args.recompute, "tp": tp,
            "visible": visible}


def save_timeline(trace: object, report: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    from mpgpu_edu.viz.timeline import plot_timeline

    fig = plot_timeline(trace, title=f"{report['model']}, {report['strategy']} on "
                                     f"{report['cluster']}: one step, "
                                     f"{report['step_s'] * 1e3:.1f} ms")
    fig.savefig(path, dpi=110, bbox_inches="tight")
    return path


def step_text(r: dict) -> str:
    """The human-readable report of ``simulate_step``."""
    memory = ", ".join(f"{k} {format_bytes(v)}" for k, v in r["memory_per_device"].items() if v)
    fits = "fits" if r["fits"] else "DOES NOT FIT"
    lines = [f"{r['model']}, {r['strategy']} on {r['cluster']} ({r['devices']} x {r['gpu']}): "
             f"micro-batch {r['micro_batch']} x {r['seq']} tokens, {r['accumulate']} "
             f"micro-batch(es) per step, attention {r['attention']}, recompute "
             f"{r['recompute']}"
             + (f", tensor-parallel groups of {r['tp']}" if r.get("tp") else "")
             + (f", CUDA_VISIBLE_DEVICES={r['visible']}" if r.get("visible") else ""),
             f"step          {r['step_s'] * 1e3:.1f} ms for {r['tokens_per_step']:,} tokens",
             f"throughput    {r['tokens_per_s']:,.0f} tokens/s",
             f"MFU           {r['mfu']:.1%} (model FLOPs / (step x {r['devices']} x bf16 peak))",
             f"devices spent {r['compute_fraction']:.0%} computing, "
             f"{r['comm_exposed_fraction']:.0%} communicating with nothing to compute, "
             f"{r['idle_fraction']:.0%} idle (averaged over devices)",
             f"memory        {format_bytes(r['memory_total'])} per device of "
             f"{format_bytes(r['capacity'])} ({fits}): {memory}"]
    if r.get("timeline"):
        lines.append(f"timeline      {r['timeline']}")
    return "\n".join(lines)
