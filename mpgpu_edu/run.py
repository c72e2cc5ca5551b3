"""Run an SPMD function under torchrun, with the same ``comm`` it gets everywhere else.

    torchrun --nproc-per-node 2 -m mpgpu_edu.run allreduce --numel 1000000
    torchrun --nproc-per-node 2 -m mpgpu_edu.run exercises.my_code:my_fn 3 "'text'" --json
    python -m mpgpu_edu.run --list

The target is a name from ``ENTRIES`` (with that entry's own options) or ``module:function``
followed by its arguments, each read as a Python literal (``3``, ``0.5``, ``"'text'"``) or
else passed as a string. Every rank runs ``function(comm, *args)``; rank 0 prints its result
(``--json``: one JSON object). torchrun sets ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``,
``MASTER_PORT`` and ``LOCAL_RANK``; ``--backend nccl`` gives rank r the GPU ``cuda:LOCAL_RANK``.

To add an entry, add a line to ``ENTRIES``: the function's ``module:function``, a one-line
help, and optionally the options it takes and how they become its arguments.
"""

from __future__ import annotations

import argparse
import ast
import datetime
import importlib
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
EXAMPLE = "torchrun --nproc-per-node 2 -m mpgpu_edu.run allreduce"
LOST_PEER_DELAY_S = 2.0


def no_options(parser: argparse.ArgumentParser) -> None:
    """An entry that takes no options of its own."""


def no_arguments(options: argparse.Namespace) -> tuple[tuple, dict]:
    return (), {}


@dataclass(frozen=True)
class Entry:
    """A named program: ``target`` is ``"module:function"``; ``add_options`` adds its options
    to a parser and ``arguments`` turns the parsed options into ``(args, kwargs)``."""

    target: str
    help: str
    add_options: Callable[[argparse.ArgumentParser], None] = field(default=no_options)
    arguments: Callable[[argparse.Namespace], tuple[tuple, dict]] = field(default=no_arguments)


def _numel_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--numel", type=int, default=1_000_000, help="elements per rank")


def _numel_argument(options: argparse.Namespace) -> tuple[tuple, dict]:
    return (), {"numel": options.numel}


def _train_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int, default=5, help="training steps")
    parser.add_argument("--optimizer", default="sgd", choices=["sgd", "adam"])


def _train_arguments(options: argparse.Namespace) -> tuple[tuple, dict]:
    return (), {"steps": options.steps, "optimizer": options.optimizer}


ENTRIES: dict[str, Entry] = {
    "ddp": Entry("mpgpu_edu.dp:train_demo",
                 "DDP (overlapped buckets) on the demo MLP, checked against one device",
                 _train_options, _train_arguments),
    "ps": Entry("mpgpu_edu.ps:train_demo",
                "parameter server (the last rank serves) on the demo MLP, checked against one "
                "device", _train_options, _train_arguments),
    "allreduce": Entry("mpgpu_edu.run:allreduce_check",
                       "ring all-reduce (mpgpu_edu.collectives) checked against the exact sum",
                       _numel_option, _numel_argument),
    "pingpong": Entry("mpgpu_edu.run:ping_pong", "rank 0 and rank 1 bounce a tensor and time it",
                      _numel_option, _numel_argument),
}


# ---- demo programs ---------------------------------------------------------------------------
def allreduce_check(comm: Any, numel: int = 1_000_000) -> dict:
    """Rank r holds ``r + 1`` everywhere; after the ring all-reduce every element must be
    ``N (N + 1) / 2``. Cost: 2(N - 1)/N * numel * 4 bytes sent per rank."""
    from mpgpu_edu.collectives import all_reduce_ring

    tensor = torch.full((numel,), float(comm.rank + 1), device=comm.device)
    start = time.perf_counter()
    all_reduce_ring(comm, tensor, op="sum")
    seconds = time.perf_counter() - start
    expected = comm.world_size * (comm.world_size + 1) / 2
    return {"ok": bool(torch.all(tensor == expected)), "expected": expected,
            "got": tensor[0].item(), "seconds": seconds, "bytes_sent": comm.stats.bytes_sent}


def ping_pong(comm: Any, numel: int = 1_000_000, rounds: int = 5) -> dict:
    """Rank 0 sends to rank 1, which sends it back, ``rounds`` times; other ranks wait."""
    tensor = torch.arange(numel, dtype=torch.float32, device=comm.device)
    start = time.perf_counter()
    for _ in range(rounds):
        if comm.rank == 0:
            comm.send(tensor, 1)
            comm.recv(tensor, 1)
        elif comm.rank == 1:
            comm.recv(tensor, 0)
            comm.send(tensor, 0)
    seconds = (time.perf_counter() - start) / rounds
    ok = bool(tensor[-1].item() == numel - 1)
    return {"ok": ok, "round_trip_seconds": seconds, "bytes": tensor.numel() * 4}


# ---- command line ----------------------------------------------------------------------------
class UsageError(Exception):
    """Bad command line: one line on stderr, exit status 2."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m mpgpu_edu.run", description="Run an SPMD function under torchrun.",
        epilog=f"example: {EXAMPLE}")
    parser.add_argument("target", nargs="?", help="an entry name (see --list) or module:function")
    parser.add_argument("--backend", default="gloo", choices=["gloo", "nccl"])
    parser.add_argument("--json", action="store_true", help="print rank 0's result as JSON")
    parser.add_argument("--timeout", type=float, default=120.0,
                        help="seconds a message may wait before the process group gives up "
                             "and the rank names what it waited for (default 120)")
    parser.add_argument("--list", action="store_true", help="list the named entries")
    return parser


def resolve(target: str, rest: list[str]) -> tuple[Callable[..., Any], tuple, dict]:
    """``(function, args, kwargs)`` for an entry name or ``module:function`` + literals."""
    if target in ENTRIES:
        entry = ENTRIES[target]
        sub = argparse.ArgumentParser(prog=f"mpgpu_edu.run {target}")
        entry.add_options(sub)
        args, kwargs = entry.arguments(sub.parse_args(rest))
        return load(entry.target), args, kwargs
    if ":" not in target:
        raise UsageError(f"unknown entry {target!r}: use one of {', '.join(ENTRIES)}, or "
                         "module:function")
    return load(target), tuple(_literal(a) for a in rest), {}


def load(target: str) -> Callable[..., Any]:
    module_name, _, name = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UsageError(f"cannot import {module_name!r} ({exc}); run from the folder that "
                         "contains it, or set PYTHONPATH") from None
    fn = getattr(module, name, None)
    if not callable(fn):
        raise UsageError(f"module {module_name!r} has no function {name!r}")
    return fn


def _literal(text: str) -> Any:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def _jsonable(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.tolist()
    return str(value)


def run_rank(fn: Callable[..., Any], args: tuple, kwargs: dict, backend: str,
             timeout: float) -> tuple[int, Any]:
    """Join torchrun's process group, run ``fn(comm, ...)`` on this rank: (rank, result)."""
    import torch.distributed as dist

    from mpgpu_edu.comm.dist import DistCommunicator, init_lanes

    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout))
    try:
        comm = DistCommunicator(init_lanes(backend), on_stream_error=_stream_failed)
        comm.start_clock()
        result = fn(comm, *args, **kwargs)
        comm.finish()
        return comm.rank, result
    finally:
        dist.destroy_process_group()


def _stream_failed(exc: BaseException) -> None:
    """A job on the comm stream raised: print it and end the process, so torchrun stops
    every rank (the main thread may be blocked waiting for that job's message)."""
    traceback.print_exception(exc)
    sys.stderr.flush()
    os._exit(1)


def main(argv: list[str] | None = None) -> int:
    options, rest = build_parser().parse_known_args(argv)
    try:
        if options.list or options.target is None:
            if os.environ.get("RANK", "0") == "0":  # under torchrun, every rank runs this
                for name, entry in ENTRIES.items():
                    print(f"{name:12s} {entry.help}")
            return 0
        fn, args, kwargs = resolve(options.target, rest)
        missing = [v for v in TORCHRUN_VARIABLES if v not in os.environ]
        if missing:
            raise UsageError(f"run me under torchrun, e.g. `{EXAMPLE}` ({', '.join(missing)} "
                             "not set)")
    except UsageError as exc:
        print(f"mpgpu_edu.run: error: {exc}", file=sys.stderr)
        return 2
    from mpgpu_edu.comm.dist import PeerLostError

    try:
        rank, result = run_rank(fn, args, kwargs, options.backend, options.timeout)
    except PeerLostError:
        # The peer failed first: fail a little later, so that torchrun (which orders
        # failures by the second they happened) names the peer's error as the root cause.
        time.sleep(LOST_PEER_DELAY_S)
        raise
    if rank == 0:
        print(json.dumps(result, default=_jsonable) if options.json else result)
    return 0


def main_recorded(argv: list[str] | None = None) -> int:
    """``main`` under torch's elastic ``record``: a rank that raises writes its error to the
    file torchrun gives it, so torchrun names the rank that raised first as the root cause,
    not a rank that later lost its peer."""
    from torch.distributed.elastic.multiprocessing.errors import record

    return record(main)(argv)


if __name__ == "__main__":
    sys.exit(main_recorded())
