"""``mpgpu-edu calibrate``: measure this machine's alpha and beta, and check the simulator.

    mpgpu-edu calibrate --backend gloo
    mpgpu-edu calibrate --world-size 2 --out my_laptop.json --json

Ranks 0 and 1 bounce messages from 0 B to 64 MiB (ping-pong); a least-squares fit on relative
error gives ``t(n) = alpha + n / beta`` (``mpgpu_edu.measure.calibrate``). They also exchange
messages (both send at once), which shows why a gloo profile is a shared host: the two
directions take turns. The profile is written as JSON (default ``.mpgpu/calibration.json`` in
the repository) and loads as a simulated cluster with
``mpgpu_edu.measure.calibrated.load_calibrated(path)``. Then ring all-reduce is simulated on
that cluster and measured on the worker processes, per size: the table shows how far the model
is from reality, and from torch.distributed's all-reduce. Every rank also times ``add_`` at a
few sizes: the fit gives this machine's memory bandwidth and per-op overhead, with which the
simulated ring pays for its reduction adds. ``--json`` prints the profile and the comparison as
one object. Rank 0 says on stderr as each repeat is done; the ranks get ``--timeout`` seconds
(default a minute, plus a second per 10 MB moved).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from mpgpu_edu.cli import UsageError, number
from mpgpu_edu.cli.bench import (DEFAULT_SIZES, MAX_REPEATS, add_launch_arguments, check_launch,
                                 parse_sizes, timed_out)

PING_SIZES = "0," + DEFAULT_SIZES


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("calibrate", help="measure alpha and beta; check the simulator",
                       description="Measure this machine's latency (alpha) and bandwidth "
                                   "(beta) by ping-pong, write a cluster profile, and compare "
                                   "simulated ring all-reduce with the measured one.")
    add_launch_arguments(p, "ranks: the ping-pong uses ranks 0 and 1, the all-reduce all N "
                            "(default 2)")
    p.add_argument("--out", metavar="PATH",
                   help="where to write the profile (default .mpgpu/calibration.json in the "
                        "repository)")
    p.add_argument("--sizes", default=PING_SIZES, metavar="LIST",
                   help=f"ping-pong message sizes (default {PING_SIZES})")
    p.add_argument("--allreduce-sizes", default=DEFAULT_SIZES, metavar="LIST",
                   help=f"all-reduce sizes to compare (default {DEFAULT_SIZES})")
    p.add_argument("--repeats", type=number(int, 1, MAX_REPEATS), default=10, metavar="R",
                   help="timed repeats per size (default 10)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    ping_sizes, allreduce_sizes = check_args(args)
    from mpgpu_edu.comm.errors import LaunchTimeoutError
    from mpgpu_edu.measure.bench import fp32_sizes
    from mpgpu_edu.measure.calibrate import auto_timeout, calibrate, compare
    from mpgpu_edu.measure.calibrated import default_profile_path, load_calibrated, save_profile

    timeout = args.timeout or auto_timeout(args.world_size, ping_sizes,
                                           fp32_sizes(allreduce_sizes), args.repeats)
    try:
        profile = calibrate(args.world_size, ping_sizes, args.repeats, args.backend,
                            allreduce_sizes, timeout=timeout, progress=True)
    except LaunchTimeoutError as exc:
        raise timed_out(exc, timeout, "lower --repeats, --sizes or --allreduce-sizes") from None
    path = save_profile(profile, args.out or default_profile_path())
    comparison = compare(profile, load_calibrated(path, gpu="CPU-16GB"))
    report = {"profile_path": str(path), **profile, "comparison": comparison}
    print(json.dumps(report, indent=2) if args.json else text(report))
    return 0


def check_args(args: argparse.Namespace) -> tuple[list[int], list[int]]:
    """Validate before any process starts: (ping-pong sizes, all-reduce sizes), in bytes."""
    check_launch(args, "a ping-pong needs two ranks")
    if args.out and Path(args.out).is_dir():
        raise UsageError(f"--out {args.out!r} is a folder: give a file name, e.g. "
                         f"{str(Path(args.out) / 'calibration.json')!r}")
    ping = parse_sizes(args.sizes, "--sizes", zero=True)  # 0 B measures alpha alone
    if len(set(ping)) < 2:
        raise UsageError("--sizes needs at least two different sizes to fit alpha and beta")
    return ping, parse_sizes(args.allreduce_sizes, "--allreduce-sizes")


def text(report: dict) -> str:
    """The human-readable report: the fit, its residuals, and the simulator's error."""
    alpha, beta = report["alpha_s"], report["beta_Bps"]
    lines = [f"{report['backend']}, ranks 0 and 1 of {report['world_size']}: alpha "
             f"{alpha * 1e6:.1f} us, beta {beta / 1e9:.3f} GB/s ({report['fit']}); "
             f"topology {report['topology']}",
             f"exchanges: {report.get('alpha_shared', 1.0):.0%} of alpha is work the two "
             f"ranks cannot do side by side ({report.get('exchange_fit', '')})",
             _memory_line(report),
             f"profile written to {report['profile_path']}",
             "", "ping-pong, one way, and exchange (both send at once), medians",
             f"{'size':>10}  {'one way ms':>11}  {'fit ms':>9}  {'fit error':>9}  "
             f"{'exchange ms':>11}  {'exchange/one way':>16}"]
    for point in report["points"]:
        t, x = point["seconds"], point["exchange_seconds"]
        fit = alpha + point["bytes"] / beta
        lines.append(f"{_size(point['bytes']):>10}  {t * 1e3:11.4f}  {fit * 1e3:9.4f}  "
                     f"{(fit - t) / t:+9.1%}  {x * 1e3:11.4f}  {x / t:16.2f}")
    c = report["comparison"]
    lines += ["", f"ring all-reduce on {c['world_size']} ranks: simulated on the calibrated "
              f"cluster vs measured in the same job (median of {c['repeats']}); ring: the "
              f"readable all_reduce_ring, fast: RingAllReduce (the one DDP uses)",
              f"{'size':>10}  {'ring sim ms':>11}  {'ring ms':>9}  {'error':>7}  "
              f"{'fast sim ms':>11}  {'fast ms':>9}  {'error':>7}  {'builtin ms':>10}"]
    for i, size in enumerate(c["sizes"]):
        lines.append(f"{_size(size):>10}  {c['predicted_s'][i] * 1e3:11.4f}  "
                     f"{c['measured_s'][i] * 1e3:9.4f}  {c['error'][i]:+7.1%}  "
                     f"{c['fast_predicted_s'][i] * 1e3:11.4f}  "
                     f"{c['fast_measured_s'][i] * 1e3:9.4f}  {c['fast_error'][i]:+7.1%}  "
                     f"{c['builtin_s'][i] * 1e3:10.4f}")
    load = ", ".join(f"{x:.2f}" for x in c["loadavg"])
    lines.append(f"error = (predicted - measured) / measured. Load average {load} "
                 f"(1, 5, 15 min; {report['cpus']} CPUs)")
    return "\n".join(lines)


def _memory_line(report: dict) -> str:
    memory, overhead = report.get("memory_Bps"), report.get("op_overhead_s")
    if not memory:
        return "adds: the times did not fit a line; the simulated ring's adds are free"
    return (f"adds (every rank at once): memory {memory / 1e9:.2f} GB/s, "
            f"{overhead * 1e6:.1f} us per op ({report['memory_fit']})")


def _size(nbytes: int) -> str:
    from mpgpu_edu.measure.bench import size_label

    return size_label(nbytes)
