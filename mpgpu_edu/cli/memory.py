"""``mpgpu-edu memory``: bytes per device by category, for a model size and a strategy.

    mpgpu-edu memory --model llama-7b --optimizer adam --precision mixed \\
        --strategy zero3 --devices 8 --gpu RTX4090-24GB

Prints a per-device table (binary GiB and decimal GB side by side: a "24 GB" card holds
24 GiB, a "7B" model in fp16 is 14 GB), the formula behind each line and, with ``--gpu`` or
``--gpu-memory``, whether it fits. ``--json`` prints one object instead.

With ``--model``, ``--batch`` and ``--seq`` it adds the activations of Korthikanti et al.
2022 (see ``mpgpu_edu.memory.models.layer_activation_bytes``)::

    mpgpu-edu memory --model llama-7b --batch 1 --seq 4096 --attention flash --recompute none

``--attention eager`` (the default, what the lessons print) keeps the s x s attention scores;
``flash`` (what current training uses) does not. ``--recompute selective`` drops the scores
too, ``full`` keeps only each layer's input. ``--logits`` adds the embedding and the output
layer (fp32 logits for the loss). Under ``--strategy tensor`` the activations are split over
the ``--devices`` as Megatron's tensor parallelism splits them (no sequence parallelism).
"""

from __future__ import annotations

import argparse
import json
import math
import re

from mpgpu_edu.cli import UsageError, number, parse_size
from mpgpu_edu.cluster.ledger import format_bytes
from mpgpu_edu.memory.estimate import (
    OPTIMIZERS,
    PRECISIONS,
    STRATEGIES,
    MemoryEstimate,
    estimate_memory,
    explain,
    unknown_strategy,
)
from mpgpu_edu.memory.models import ATTENTIONS, PRESETS, RECOMPUTES, activation_terms, spec_params

_SUFFIXES = {"": 1, "K": 10**3, "M": 10**6, "B": 10**9, "G": 10**9, "T": 10**12}
MAX_PARAMS = 10**15  # a thousand times the largest models trained
MAX_DEVICES, MAX_BATCH, MAX_SEQ = 2**20, 2**20, 2**24


def parse_count(text: str) -> int:
    """``"124M"``, ``"7B"``, ``"1.5e9"``, ``"350000"`` -> a parameter count, at most
    ``MAX_PARAMS``. Raises UsageError on anything else, negative counts included."""
    match = re.fullmatch(r"\s*([-+]?[0-9.]+(?:e[-+]?[0-9]+)?)\s*([kmbgt]?)\s*", text, re.I)
    if not match:
        raise UsageError(f"--params {text!r}: cannot read a parameter count; write e.g. 124M, "
                         "7B or 1.5e9")
    try:
        value = float(match.group(1)) * _SUFFIXES[match.group(2).upper()]
    except ValueError:
        raise UsageError(f"--params {text!r}: cannot read a parameter count; write e.g. 124M, "
                         "7B or 1.5e9")
    if value <= 0:
        raise UsageError(f"--params must be a positive parameter count, got {text!r}")
    if not math.isfinite(value) or value > MAX_PARAMS:
        raise UsageError(f"--params {text!r} is past the limit of 1e15 (a thousand "
                         "times the largest models trained): give e.g. 7B or 175B")
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
    p.add_argument("--devices", type=number(int, 1, MAX_DEVICES), default=1,
                   help="number of devices (default 1)")
    p.add_argument("--activations", help="activation bytes per device, e.g. 2GiB")
    p.add_argument("--batch", type=number(int, 1, MAX_BATCH),
                   help="micro-batch per device (with --model and --seq: activations from "
                   "Korthikanti et al. 2022, all layers, added per device)")
    p.add_argument("--seq", type=number(int, 1, MAX_SEQ), help="sequence length (with --batch)")
    p.add_argument("--attention", metavar="{" + ",".join(ATTENTIONS) + "}",
                   help="with --batch/--seq: eager keeps the s x s scores (default); flash, "
                   "what current training uses, does not")
    p.add_argument("--recompute", metavar="{" + ",".join(RECOMPUTES) + "}",
                   help="with --batch/--seq: none (default); selective recomputes the "
                   "attention core; full keeps only each layer's input")
    p.add_argument("--logits", action="store_true",
                   help="with --batch/--seq: add the embedding and the output layer "
                   "(fp32 logits for the loss, 4*s*b*vocab bytes)")
    p.add_argument("--gpu", help="a GPU profile from mpgpu_edu.cluster.hardware, e.g. "
                                 "RTX4090-24GB")
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


def _activation_terms(args: argparse.Namespace) -> dict | None:
    """The activation terms from --batch/--seq (None without them), with their settings."""
    if args.batch is None and args.seq is None:
        if args.attention is not None or args.recompute is not None or args.logits:
            raise UsageError("--attention, --recompute and --logits need --model, --batch "
                             "and --seq")
        return None
    if args.activations is not None:
        raise UsageError("give --activations or --batch/--seq, not both")
    if args.model is None or args.batch is None or args.seq is None:
        raise UsageError("--batch and --seq need each other and --model")
    if args.batch <= 0 or args.seq <= 0:
        raise UsageError(f"--batch and --seq must be positive, got {args.batch}, {args.seq}")
    attention = _choice(args.attention or "eager", ATTENTIONS, "attention")
    recompute = _choice(args.recompute or "none", RECOMPUTES, "recompute")
    t = args.devices if args.strategy == "tensor" else 1
    terms = activation_terms(args.model, args.batch, args.seq, args.precision, attention,
                             recompute, t)
    total = terms["layers"] + (terms["embedding"] + terms["output"] if args.logits else 0)
    return {"attention": attention, "recompute": recompute, "tensor_parallel": t,
            "logits": bool(args.logits), **terms, "total": total}


def _activations(args: argparse.Namespace, terms: dict | None) -> int:
    if terms is not None:
        return terms["total"]
    return (parse_size(args.activations, what="--activations")  # 0 B: none, as the default
            if args.activations is not None else 0)


def _gpu_memory(args: argparse.Namespace) -> tuple[str | None, int | None]:
    if args.gpu is not None and args.gpu_memory is not None:
        raise UsageError("give --gpu or --gpu-memory, not both")
    if args.gpu_memory is not None:
        size = parse_size(args.gpu_memory, what="--gpu-memory")
        if size <= 0:
            raise UsageError(f"--gpu-memory must be positive, got {args.gpu_memory!r}")
        return args.gpu_memory, size
    if args.gpu is None:
        return None, None
    try:
        from mpgpu_edu.cluster.hardware import GPUS
    except ImportError:
        raise UsageError("no GPU profiles available; use --gpu-memory SIZE") from None
    if args.gpu not in GPUS:
        raise UsageError(f"unknown GPU {args.gpu!r}: choose one of {', '.join(GPUS)}")
    return args.gpu, int(GPUS[args.gpu].memory_bytes)


def _estimate(args: argparse.Namespace) -> tuple[MemoryEstimate, dict | None]:
    n_params = _n_params(args)
    _choice(args.optimizer, OPTIMIZERS, "optimizer")
    _choice(args.precision, PRECISIONS, "precision")
    if args.strategy not in STRATEGIES:
        raise UsageError(unknown_strategy(args.strategy))
    if args.devices < 1:
        raise UsageError(f"--devices must be at least 1, got {args.devices}")
    if args.strategy == "single" and args.devices != 1:
        raise UsageError(f"strategy 'single' uses one device, got --devices {args.devices}: "
                         "choose dp, zero1..3, pipeline or tensor")
    terms = _activation_terms(args)
    return estimate_memory(n_params, args.optimizer, args.precision, args.strategy,
                           args.devices, _activations(args, terms)), terms


def format_decimal(n: float) -> str:
    """``format_decimal(14e9) == "14.00 GB"``: decimal units, as spec sheets and model names."""
    for unit, scale in (("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{int(n)} B"


def _both(n: int) -> str:
    return f"{format_bytes(n):>12} {format_decimal(n):>12}"


def _activation_lines(terms: dict, model: str) -> list[str]:
    """How the activations were counted, for the formulas block."""
    where = (f", split over {terms['tensor_parallel']} tensor-parallel devices"
             if terms["tensor_parallel"] > 1 else "")
    n_layers = terms["layers"] // terms["per_layer"]
    lines = [f"activations: {terms['attention']} attention, recompute {terms['recompute']}"
             f"{where} (Korthikanti et al. 2022)",
             f"  per layer {format_bytes(terms['per_layer'])} x {n_layers} layers of {model} "
             f"= {format_bytes(terms['layers'])}"]
    extra = f"embedding {format_bytes(terms['embedding'])}, output layer with fp32 logits " \
            f"{format_bytes(terms['output'])}"
    lines.append(f"  {'+ ' + extra if terms['logits'] else extra + ' (not added: --logits)'}")
    return lines


def _text(est: MemoryEstimate, model: str | None, gpu: str | None, capacity: int | None,
          terms: dict | None = None) -> str:
    name = f"{model} ({est.n_params:,} parameters)" if model else f"{est.n_params:,} parameters"
    lines = [f"{name}, {est.optimizer}, {est.precision} precision, {est.strategy} on "
             f"{est.devices} device{'s' if est.devices > 1 else ''}", "",
             f"per device:    {'binary':>12} {'decimal':>12}"]
    for category, nbytes in est.per_device.items():
        lines.append(f"  {category:<13} {_both(nbytes)}")
    lines += [f"  {'total':<13} {_both(est.per_device_total)}",
              f"all devices:    {_both(est.total_all_devices)}", "", "formulas:"]
    lines += [f"  {line}" for line in explain(est).splitlines()]
    if terms is not None:
        lines += [f"  {line}" for line in _activation_lines(terms, model or "")]
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
    est, terms = _estimate(args)
    gpu, capacity = _gpu_memory(args)
    if args.json:
        out = est.to_dict()
        out.update(model=args.model, gpu=gpu, gpu_memory_bytes=capacity,
                   fits=None if capacity is None else est.fits(capacity),
                   activation_terms=terms,
                   per_device_total_gib=est.per_device_total / 2**30,
                   per_device_total_gb=est.per_device_total / 1e9,
                   total_all_devices_gib=est.total_all_devices / 2**30,
                   total_all_devices_gb=est.total_all_devices / 1e9)
        print(json.dumps(out, indent=2))
    else:
        print(_text(est, args.model, gpu, capacity, terms))
    return 0
