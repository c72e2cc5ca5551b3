"""``mpgpu-edu memory``: bytes per device by category, for a model size and a strategy.

    mpgpu-edu memory --model llama-7b --optimizer adam --precision mixed \\
        --strategy zero3 --devices 8 --gpu RTX4090-24GB

Prints a per-device table, the formula behind each line and, with ``--gpu`` or
``--gpu-memory``, whether it fits. ``--json`` prints one object instead.
"""

from __future__ import annotations

import argparse
import json
import re

from mpgpu_edu.cli import UsageError, parse_size
from mpgpu_edu.cluster.ledger import format_bytes
from mpgpu_edu.memory.estimate import (
    OPTIMIZERS,
    PRECISIONS,
    STRATEGIES,
    MemoryEstimate,
    estimate_memory,
    explain,
)
from mpgpu_edu.memory.models import PRESETS, activation_bytes, spec_params

_SUFFIXES = {"": 1, "K": 10**3, "M": 10**6, "B": 10**9, "G": 10**9, "T": 10**12}


def parse_count(text: str) -> int:
    """``"124M"``, ``"7B"``, ``"1.5e9"``, ``"350000"`` -> a parameter count.
    Raises UsageError on anything else, negative counts included."""
    match = re.fullmatch(r"\s*([-+]?[0-9.]+(?:e[-+]?[0-9]+)?)\s*([kmbgt]?)\s*", text, re.I)
    if not match:
        raise UsageError(f"cannot read parameter count {text!r}: write e.g. 124M, 7B or 1.5e9")
    try:
        value = float(match.group(1)) * _SUFFIXES[match.group(2).upper()]
    except ValueError:
        raise UsageError(f"cannot read parameter count {text!r}: write e.g. 124M, 7B or 1.5e9")
    if value <= 0:
        raise UsageError(f"parameter count must be positive, got {text!r}")
    return round(value)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("memory", help="bytes per device by category, per strategy",
                       description="Estimate training memory per device, by category.")
    p.add_argument("--params", help="parameter count: 124M, 7B, 1.5e9")
    p.add_argument("--model", help=f"a preset: {', '.join(PRESETS)}")
    p.add_argument("--optimizer", default="adam", metavar="{" + ",".join(OPTIMIZERS) + "}",
                   help="optimizer (default adam)")
    p.add_argument("--precision", default="mixed", metavar="{" + ",".join(PRECISIONS) + "}",
                   help="fp32, or mixed: 16-bit weights and gradients, fp32 master (default)")
    p.add_argument("--strategy", default="single", metavar="{" + ",".join(STRATEGIES) + "}",
                   help="how state is split over devices (default single)")
    p.add_argument("--devices", type=int, default=1, help="number of devices (default 1)")
    p.add_argument("--activations", help="activation bytes per device, e.g. 2GiB")
    p.add_argument("--batch", type=int, help="micro-batch per device (with --model and --seq: "
                   "activations from Korthikanti et al. 2022, all layers, added per device)")
    p.add_argument("--seq", type=int, help="sequence length (with --batch)")
    p.add_argument("--gpu", help="a GPU profile from mpgpu_edu.hardware, e.g. RTX4090-24GB")
    p.add_argument("--gpu-memory", help="device memory to check against, e.g. 24GiB or 80GiB")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def _choice(value: str, allowed: tuple[str, ...], what: str) -> str:
    if value not in allowed:
        raise UsageError(f"unknown {what} {value!r}: choose one of {', '.join(allowed)}")
    return value


def _n_params(args: argparse.Namespace) -> int:
    if (args.params is None) == (args.model is None):
        raise UsageError("give exactly one of --params N or --model PRESET")
    if args.model is not None:
        _choice(args.model, tuple(PRESETS), "model")
        return spec_params(args.model)
    return parse_count(args.params)


def _activations(args: argparse.Namespace) -> int:
    if args.batch is None and args.seq is None:
        return parse_size(args.activations) if args.activations is not None else 0
    if args.activations is not None:
        raise UsageError("give --activations or --batch/--seq, not both")
    if args.model is None or args.batch is None or args.seq is None:
        raise UsageError("--batch and --seq need each other and --model")
    if args.batch <= 0 or args.seq <= 0:
        raise UsageError(f"--batch and --seq must be positive, got {args.batch}, {args.seq}")
    return activation_bytes(args.model, args.batch, args.seq, args.precision)


def _gpu_memory(args: argparse.Namespace) -> tuple[str | None, int | None]:
    if args.gpu is not None and args.gpu_memory is not None:
        raise UsageError("give --gpu or --gpu-memory, not both")
    if args.gpu_memory is not None:
        size = parse_size(args.gpu_memory)
        if size <= 0:
            raise UsageError(f"--gpu-memory must be positive, got {args.gpu_memory!r}")
        return args.gpu_memory, size
    if args.gpu is None:
        return None, None
    try:
        from mpgpu_edu.hardware import GPUS
    except ImportError:
        raise UsageError("no GPU profiles available; use --gpu-memory SIZE") from None
    if args.gpu not in GPUS:
        raise UsageError(f"unknown GPU {args.gpu!r}: choose one of {', '.join(GPUS)}")
    return args.gpu, int(GPUS[args.gpu].memory_bytes)


def _estimate(args: argparse.Namespace) -> MemoryEstimate:
    n_params = _n_params(args)
    _choice(args.optimizer, OPTIMIZERS, "optimizer")
    _choice(args.precision, PRECISIONS, "precision")
    _choice(args.strategy, STRATEGIES, "strategy")
    if args.devices < 1:
        raise UsageError(f"--devices must be at least 1, got {args.devices}")
    if args.strategy == "single" and args.devices != 1:
        raise UsageError(f"strategy 'single' uses one device, got --devices {args.devices}: "
                         "choose dp, zero1..3, pipeline or tensor")
    return estimate_memory(n_params, args.optimizer, args.precision, args.strategy,
                           args.devices, _activations(args))


def _text(est: MemoryEstimate, model: str | None, gpu: str | None, capacity: int | None) -> str:
    name = f"{model} ({est.n_params:,} parameters)" if model else f"{est.n_params:,} parameters"
    lines = [f"{name}, {est.optimizer}, {est.precision} precision, {est.strategy} on "
             f"{est.devices} device{'s' if est.devices > 1 else ''}", "", "per device:"]
    for category, nbytes in est.per_device.items():
        lines.append(f"  {category:<13} {format_bytes(nbytes):>12}")
    lines += [f"  {'total':<13} {format_bytes(est.per_device_total):>12}",
              f"all devices:    {format_bytes(est.total_all_devices):>12}", "", "formulas:"]
    lines += [f"  {line}" for line in explain(est).splitlines()]
    lines += ["", f"convention: {est.convention}"]
    if capacity is not None:
        need, left = format_bytes(est.per_device_total), capacity - est.per_device_total
        verdict = (f"fits: {need} per device, {format_bytes(left)} left" if left >= 0
                   else f"does NOT fit: {need} per device, {format_bytes(-left)} too much")
        lines.append(f"{gpu} ({format_bytes(capacity)}): {verdict}")
        if est.devices > 1:   # the seed's pitfall: the sum of the cards is not one big card
            lines.append(f"the {est.devices} devices hold {format_bytes(est.devices * capacity)}"
                         f" together, but each one must hold its own {need}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    est = _estimate(args)
    gpu, capacity = _gpu_memory(args)
    if args.json:
        out = est.to_dict()
        out.update(model=args.model, gpu=gpu, gpu_memory_bytes=capacity,
                   fits=None if capacity is None else est.fits(capacity))
        print(json.dumps(out, indent=2))
    else:
        print(_text(est, args.model, gpu, capacity))
    return 0
