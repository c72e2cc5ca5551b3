"""``mpgpu-edu bench allreduce``: our all-reduce against torch.distributed's, measured.

    mpgpu-edu bench allreduce --backend gloo --world-size 2
    mpgpu-edu bench allreduce --world-size 4 --sizes 1KiB,1MiB,64MiB --repeats 20 --json
    mpgpu-edu bench allreduce --algos ring,ring_reused,ring_fast_unsegmented,ring_fast
    mpgpu-edu bench allreduce --quick      # tiny sizes, 2 repeats: does it run? (no timings)
    mpgpu-edu bench allreduce --sizes 1GiB --timeout 1800

Rank 0 says on stderr as each size is timed. The ranks get ``--timeout`` seconds (default a
minute, plus a second per 10 MB that any operation moves), then all are stopped.

In the same worker processes (``launch(..., backend=...)``), times our ring and naive
all-reduces (``mpgpu_edu.collectives``) and ``torch.distributed.all_reduce`` on fp32 tensors,
interleaved, and prints one row per size: the median times, ours / built-in (below 1: ours
is faster) of the medians, within each repeat (``paired``, the median) and in CPU time,
and nccl-tests' bus bandwidth, then the 1-minute load average before and after. How it is
timed: ``mpgpu_edu.measure.bench``. ``--json`` prints ``sizes`` (bytes), ``<algo>_s`` and
``builtin_s`` (seconds), ``ratio_<algo>``, ``<algo>_cpu_s``, ``cpu_ratio_<algo>``,
``busbw_<algo>`` (bytes/s), ``world_size``, ``backend`` and ``loadavg`` (the machine's 1, 5,
15 minute load averages: wall-clock timings on a busy machine are noisy).
"""

from __future__ import annotations

import argparse
import json

from mpgpu_edu.cli import UsageError, add_command_group, number, parse_size

BACKENDS = ("gloo", "nccl")
DEFAULT_SIZES = "1KiB,4KiB,16KiB,64KiB,256KiB,1MiB,4MiB,16MiB,64MiB"
# mpgpu_edu.measure.bench.ALGOS and QUICK_SIZES, without importing torch
ALGOS = ("ring", "naive", "ring_reused", "ring_fast", "ring_fast_unsegmented",
         "ring_fast_bare", "ring_fast_unchecked")
QUICK_SIZES = "4,4100"
# Stated limits: every rank is a process and allocates its tensors for real.
MAX_RANKS, MAX_REPEATS, MAX_THREADS, MAX_SIZE = 64, 10_000, 256, 16 * 2**30
MAX_TIMEOUT_S = 86_400.0  # a day


def add_parser(sub: argparse._SubParsersAction) -> None:
    what = add_command_group(sub, "bench", run,
                             help="measure our collectives against torch.distributed",
                             description="Measure our collectives against torch.distributed's "
                                         "on real worker processes.")
    p = what.add_parser("allreduce", help="ring and naive all-reduce vs torch.distributed",
                        description="Time our all-reduces against torch.distributed.all_reduce "
                                    "in the same processes, per size.")
    add_launch_arguments(p, "number of ranks, at least 2 (default 2)")
    p.add_argument("--sizes", default=DEFAULT_SIZES, metavar="LIST",
                   help=f"comma-separated tensor sizes per rank (default {DEFAULT_SIZES}); "
                        "rounded up to whole fp32 elements; at most 16GiB each")
    p.add_argument("--repeats", type=number(int, 1, MAX_REPEATS), default=10, metavar="R",
                   help="timed repeats per size and operation (default 10)")
    p.add_argument("--algos", default="ring,naive", metavar="LIST",
                   help="our algorithms to time (default ring,naive); also ring_reused (the "
                        "ring keeping its scratch buffer between calls), ring_fast and "
                        "ring_fast_unsegmented (mpgpu_edu.collectives.ring_fast)")
    p.add_argument("--threads", type=number(int, 1, MAX_THREADS), default=1,
                   help="torch threads per rank while timing (default 1, as torchrun sets)")
    p.add_argument("--quick", action="store_true",
                   help=f"sizes {QUICK_SIZES} and 2 repeats: checks that the bench runs end "
                        "to end; its numbers mean nothing")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def add_launch_arguments(p: argparse.ArgumentParser, world_size_help: str) -> None:
    """``--backend`` and ``--world-size``, as ``bench`` and ``calibrate`` take them."""
    p.add_argument("--backend", default="gloo", metavar="{" + ",".join(BACKENDS) + "}",
                   help="torch.distributed backend (default gloo)")
    p.add_argument("--world-size", type=number(int, 1, MAX_RANKS), default=2, metavar="N",
                   help=world_size_help)
    p.add_argument("--timeout", type=number(float, 0.0, MAX_TIMEOUT_S, above=True),
                   metavar="SECONDS",
                   help="seconds the ranks get to finish, then all are stopped (default: a "
                        "minute, plus a second per 10 MB moved); raise it for long runs")


def timed_out(exc: Exception, timeout: float, fix: str) -> UsageError:
    """A bench's or a calibration's ``LaunchTimeoutError`` as one line: what ran out, and
    ``fix`` (what to lower) beside a larger ``--timeout``."""
    first = str(exc).splitlines()[0].rstrip(":")
    return UsageError(f"{first} (--timeout {timeout:g}): if the run is just slow, raise it, "
                      f"e.g. --timeout {min(4 * timeout, MAX_TIMEOUT_S):g}, or {fix}; if it "
                      "hangs, a rank waits for a message nobody sends")


def run(args: argparse.Namespace) -> int:
    sizes, algos = check_args(args)  # before torch is imported: bad input fails at once
    from mpgpu_edu.comm.errors import LaunchTimeoutError
    from mpgpu_edu.measure.bench import auto_timeout, bench_allreduce, fp32_sizes, table

    repeats = min(args.repeats, 2) if args.quick else args.repeats
    timeout = args.timeout or auto_timeout(args.world_size, fp32_sizes(sizes), repeats, algos)
    try:
        report = bench_allreduce(args.world_size, sizes, repeats, args.backend, algos,
                                 args.threads, timeout=timeout, progress=True)
    except LaunchTimeoutError as exc:
        raise timed_out(exc, timeout, "lower --repeats or --sizes") from None
    print(json.dumps(report, indent=2) if args.json else table(report))
    return 0


def check_args(args: argparse.Namespace) -> tuple[list[int], list[str]]:
    """Validate the options before any process starts: (sizes in bytes, algorithm names)."""
    check_launch(args, "an all-reduce needs two ranks",
                 " (`mpgpu-edu simulate allreduce` simulates)")
    if args.threads < 1:
        raise UsageError(f"--threads must be at least 1, got {args.threads}")
    sizes = QUICK_SIZES if args.quick else args.sizes
    return parse_sizes(sizes), parse_algos(args.algos)


def check_launch(args: argparse.Namespace, why_two: str, backend_tip: str = "") -> None:
    """What ``bench`` and ``calibrate`` refuse before any process starts: a backend not in
    ``BACKENDS`` (``backend_tip`` follows the list), fewer than two ranks (``why_two``: what
    needs them), fewer than one repeat."""
    if args.backend not in BACKENDS:
        raise UsageError(f"unknown backend {args.backend!r}: choose one of "
                         f"{', '.join(BACKENDS)}{backend_tip}")
    if args.world_size < 2:
        raise UsageError(f"--world-size must be at least 2 ({why_two}), got {args.world_size}")
    if args.repeats < 1:
        raise UsageError(f"--repeats must be at least 1, got {args.repeats}")


def parse_sizes(text: str, flag: str = "--sizes", zero: bool = False) -> list[int]:
    """``"1KiB,4MiB"`` -> ``[1024, 4194304]``; every size positive (``zero``: 0 allowed) and
    at most ``MAX_SIZE`` (the tensors are allocated for real, on every rank)."""
    items = [item.strip() for item in text.split(",") if item.strip()]
    if not items:
        raise UsageError(f"{flag} is empty: give sizes such as 1KiB,1MiB")
    sizes = [parse_size(item, MAX_SIZE, flag, " per rank (allocated for real on every rank)")
             for item in items]
    for item, nbytes in zip(items, sizes):
        if nbytes <= 0 and not (zero and nbytes == 0):
            raise UsageError(f"{flag}: sizes must be positive, got {item!r}")
    return sizes


def parse_algos(text: str) -> list[str]:
    algos = [item.strip() for item in text.split(",") if item.strip()]
    unknown = [a for a in algos if a not in ALGOS]
    if unknown or not algos or len(set(algos)) != len(algos):
        raise UsageError(f"--algos takes distinct names from {', '.join(ALGOS)}, got {text!r}")
    return algos
