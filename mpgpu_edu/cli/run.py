"""``mpgpu-edu run``: train the demo model with a strategy and check it against one device.

    mpgpu-edu run ddp --backend sim --world-size 4
    mpgpu-edu run ps --backend gloo --world-size 3 --steps 10 --optimizer adam --json
    mpgpu-edu run ddp --world-size 3 --variant bucketed
    mpgpu-edu run ddp --backend gloo --steps 20000 --timeout 600

Prints the loss curve (first and last loss, ours and the reference's), the largest
parameter difference, and the verdict; exit status 0 when the parameters match
single-device training, 1 when they do not. ``--json`` prints the whole report. The ranks
get ``--timeout`` seconds (default 60) to finish; a longer run needs a larger one.
"""

from __future__ import annotations

import argparse
import json

from mpgpu_edu.cli import UsageError, number
from mpgpu_edu.cli.runners import RUNNERS, run_strategy

BACKENDS = ("sim", "gloo", "nccl")
OPTIMIZERS = ("sgd", "adam")
DEFAULT_TIMEOUT_S = 60.0  # mpgpu_edu.comm.launch's default
DEMO_BATCH = 24  # the largest default batch of the demos (mpgpu_edu.replica.data.DEMO_BATCH)
# Stated limits: every batch is made up front, in memory, and every rank is a thread or a process.
MAX_RANKS, MAX_STEPS, MAX_BATCH, MAX_SAMPLES, MAX_TIMEOUT_S = 64, 100_000, 4096, 2**24, 86_400.0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="train with a strategy and compare with one device",
                       description="Train the course's demo model with a strategy and compare "
                                   "it with single-device training.")
    p.add_argument("strategy", metavar="STRATEGY", help=f"one of: {', '.join(RUNNERS)}")
    p.add_argument("--backend", default="sim", metavar="{" + ",".join(BACKENDS) + "}",
                   help="sim (simulated cluster, default), gloo (CPU processes), nccl")
    p.add_argument("--world-size", type=number(int, 1, MAX_RANKS), default=2,
                   help="number of ranks (default 2)")
    p.add_argument("--steps", type=number(int, 1, MAX_STEPS), default=5,
                   help="training steps (default 5)")
    p.add_argument("--optimizer", default="sgd", metavar="{" + ",".join(OPTIMIZERS) + "}",
                   help="sgd (default) or adam")
    p.add_argument("--batch-size", type=number(int, 1, MAX_BATCH), default=None,
                   help="samples per step")
    p.add_argument("--variant", default=None,
                   help="ddp: naive, bucketed, overlapped (default), accumulated, dataparallel")
    p.add_argument("--servers", type=number(int, 1, MAX_RANKS), default=None,
                   help="ps: number of server ranks (default 1; more: sharded)")
    p.add_argument("--timeout", type=number(float, 0.0, MAX_TIMEOUT_S, above=True),
                   default=DEFAULT_TIMEOUT_S, metavar="SECONDS",
                   help=f"seconds the ranks get to finish, then all are stopped (default "
                        f"{DEFAULT_TIMEOUT_S:g}); raise it for long runs")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def _options(args: argparse.Namespace) -> dict:
    if args.strategy != "ddp" and args.variant is not None:
        raise UsageError("--variant is an option of 'ddp' only")
    if args.strategy != "ps" and args.servers is not None:
        raise UsageError("--servers is an option of 'ps' only")
    options = {"batch_size": args.batch_size, "variant": args.variant,
               "n_servers": args.servers, "timeout": args.timeout}
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
    samples = args.steps * (args.batch_size or DEMO_BATCH)
    if samples > MAX_SAMPLES:
        raise UsageError(f"--steps x --batch-size = {samples} samples, past the limit of "
                         f"{MAX_SAMPLES} (every batch is made up front, in memory): lower "
                         "--steps or --batch-size")
    if args.backend == "nccl":
        import torch

        if torch.cuda.device_count() < args.world_size:
            raise UsageError(f"nccl needs {args.world_size} CUDA devices, this machine has "
                             f"{torch.cuda.device_count()}: use --backend gloo or sim")


def run(args: argparse.Namespace) -> int:
    _check(args)
    from mpgpu_edu.comm.errors import LaunchTimeoutError

    try:
        report = run_strategy(args.strategy, args.backend, args.world_size, args.steps,
                              args.optimizer, **_options(args))
    except LaunchTimeoutError as exc:
        if args.backend == "sim":
            _join_stopped_ranks()
        first = str(exc).splitlines()[0].rstrip(":")
        raise UsageError(f"{first} (--timeout {args.timeout:g}): if the run is just slow, "
                         f"raise it, e.g. --timeout {min(4 * args.timeout, MAX_TIMEOUT_S):g}, "
                         "or lower --steps; "
                         "if it hangs, a rank waits for a message nobody sends") from None
    report = {k: v for k, v in report.items() if k != "trace"}
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(_text(report))
    return 0 if report.get("matches", True) else 1


def _join_stopped_ranks(seconds: float = 10.0) -> None:
    """Give the simulator's stopped rank threads time to leave torch before the interpreter
    exits: a thread still inside torch, or still tearing down its torch state after Python
    saw it end, at exit aborts the process ("terminate called without an active exception")."""
    import threading
    import time

    deadline = time.monotonic() + seconds
    for thread in threading.enumerate():
        if thread.name.startswith("rank-") and thread is not threading.current_thread():
            thread.join(max(0.0, deadline - time.monotonic()))
    time.sleep(0.5)


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
