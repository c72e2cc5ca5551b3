"""``mpgpu-edu run``: train the demo model with a strategy and check it against one device.

    mpgpu-edu run ddp --backend sim --world-size 4
    mpgpu-edu run ps --backend gloo --world-size 3 --steps 10 --optimizer adam --json
    mpgpu-edu run ddp --world-size 3 --variant bucketed

Prints the loss curve (first and last loss, ours and the reference's), the largest
parameter difference, and the verdict; exit status 0 when the parameters match
single-device training, 1 when they do not. ``--json`` prints the whole report.
"""

from __future__ import annotations

import argparse
import json

from mpgpu_edu.cli import UsageError
from mpgpu_edu.runners import RUNNERS, run_strategy

BACKENDS = ("sim", "gloo", "nccl")
OPTIMIZERS = ("sgd", "adam")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="train with a strategy and compare with one device",
                       description="Train the course's demo model with a strategy and compare "
                                   "it with single-device training.")
    p.add_argument("strategy", metavar="STRATEGY", help=f"one of: {', '.join(RUNNERS)}")
    p.add_argument("--backend", default="sim", metavar="{" + ",".join(BACKENDS) + "}",
                   help="sim (simulated cluster, default), gloo (CPU processes), nccl")
    p.add_argument("--world-size", type=int, default=2, help="number of ranks (default 2)")
    p.add_argument("--steps", type=int, default=5, help="training steps (default 5)")
    p.add_argument("--optimizer", default="sgd", metavar="{" + ",".join(OPTIMIZERS) + "}",
                   help="sgd (default) or adam")
    p.add_argument("--batch-size", type=int, default=None, help="samples per step")
    p.add_argument("--variant", default=None,
                   help="ddp: naive, bucketed, overlapped (default), accumulated, dataparallel")
    p.add_argument("--servers", type=int, default=None,
                   help="ps: number of server ranks (default 1; more: sharded)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def _options(args: argparse.Namespace) -> dict:
    if args.strategy != "ddp" and args.variant is not None:
        raise UsageError("--variant is an option of 'ddp' only")
    if args.strategy != "ps" and args.servers is not None:
        raise UsageError("--servers is an option of 'ps' only")
    options = {"batch_size": args.batch_size, "variant": args.variant,
               "n_servers": args.servers}
    return {k: v for k, v in options.items() if v is not None}


def _check(args: argparse.Namespace) -> None:
    if args.strategy not in RUNNERS:
        raise UsageError(f"unknown strategy {args.strategy!r}: choose one of "
                         + ", ".join(RUNNERS))
    if args.backend not in BACKENDS:
        raise UsageError(f"unknown backend {args.backend!r}: choose one of "
                         + ", ".join(BACKENDS))
    if args.optimizer not in OPTIMIZERS:
        raise UsageError(f"unknown optimizer {args.optimizer!r}: choose one of "
                         + ", ".join(OPTIMIZERS))
    if args.world_size < 1:
        raise UsageError(f"world size must be at least 1 device, got {args.world_size}")
    if args.steps < 1:
        raise UsageError(f"steps must be at least 1, got {args.steps}")
    if args.batch_size is not None and args.batch_size < 1:
        raise UsageError(f"batch size must be at least 1, got {args.batch_size}")
    if args.backend == "nccl":
        import torch

        if torch.cuda.device_count() < args.world_size:
            raise UsageError(f"nccl needs {args.world_size} CUDA devices, this machine has "
                             f"{torch.cuda.device_count()}: use --backend gloo or sim")


def run(args: argparse.Namespace) -> int:
    _check(args)
    report = run_strategy(args.strategy, args.backend, args.world_size, args.steps,
                          args.optimizer, **_options(args))
    report = {k: v for k, v in report.items() if k != "trace"}
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(_text(report))
    return 0 if report.get("matches", True) else 1


def _text(r: dict) -> str:
    how = r.get("variant") or (f"{r['n_servers']} server(s)" if "n_servers" in r else "")
    losses, ref = r["losses"], r["reference_losses"]
    verdict = ("matches single-device training" if r.get("matches", True)
               else "DIFFERS from single-device training")
    return "\n".join([
        f"{r['strategy']}{f' ({how})' if how else ''} on {r['backend']}, world size "
        f"{r['world_size']}, {r['steps']} steps, {r.get('optimizer', '')}",
        f"loss:       {losses[0]:.6f} -> {losses[-1]:.6f}",
        f"reference:  {ref[0]:.6f} -> {ref[-1]:.6f}",
        f"max |parameter - reference| = {r['max_abs_param_diff']:.3g}"
        + (f" (tolerance {r['tolerance']:g})" if "tolerance" in r else ""),
        f"verdict: {verdict}",
    ])
