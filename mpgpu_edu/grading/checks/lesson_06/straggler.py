"""Checks of exercise 6.4, the straggler found from per-rank logs: against
``cd.find_straggler_reference`` on logs the grader generates itself (other world sizes,
other slow ranks; ``_busy_steps``: two ranks exactly as slow, a tie, a rank that loads data
between steps, so that it waits least without computing most, a rank with the slowest single
step but not the most compute, and steps long enough that the time stamps pass 10 000 ms),
naming the mistakes of picking the rank that waited longest or least or had the slowest step,
of breaking a tie upwards, and of measuring waits instead of compute."""

from __future__ import annotations

import re
import statistics
from collections.abc import Callable
from typing import Any

import torch

from mpgpu_edu.collectives import all_reduce
from mpgpu_edu.comm import Communicator, launch
from mpgpu_edu.grading.checks import Case
from mpgpu_edu.grading.checks._plain import type_name
from mpgpu_edu.grading.checks._support import each, examples, expect
from mpgpu_edu.lessons import choosing_and_debugging as cd

Impl = Callable[..., Any]


def _busy_steps(comm: Communicator, slow_ranks: list[int], steps: int,
                slowdown: list[float], loader: int | None, load_seconds: float,
                step_seconds: float = 0.02, spiky: int | None = None, spike: float = 1.0,
                grad_numel: int = 1 << 20) -> None:
    """``cd.straggler_steps`` with three twists: every rank of ``slow_ranks`` computes exactly
    what the first one does (equally slow: a tie); ``loader`` loads its batch for
    ``load_seconds`` before each step's compute, saying so in its log (time between steps, not
    compute: it arrives late at the all-reduce and waits least); and ``spiky`` computes
    ``spike`` times longer in its last step only (the slowest single step, not the most
    compute over the run)."""
    grads = torch.empty(grad_numel, dtype=torch.float32, device="meta")
    like = slow_ranks[0] if comm.rank in slow_ranks else comm.rank
    for step in range(steps):
        seconds = step_seconds * (1 + 0.1 * ((3 * like + 5 * step) % 7) / 6)
        if comm.rank in slow_ranks:
            seconds *= slowdown[step % len(slowdown)]
        if comm.rank == spiky and step == steps - 1:
            seconds *= spike
        if comm.rank == loader:
            comm.log(f"step {step}: loading the batch")
            with comm.compute("data", f"load batch {step}", seconds=load_seconds):
                pass
        comm.log(f"step {step}: compute start")
        with comm.compute("forward", f"step {step}", seconds=seconds):
            pass
        comm.log(f"step {step}: compute done, waiting in all-reduce")
        all_reduce(comm, grads, op="mean", algo="ring")
        comm.log(f"step {step}: all-reduce done")
        if comm.rank == 0:
            comm.log(f"step {step}: gradients averaged over {comm.world_size} ranks")


def _straggler_logs(world_size: int, slow_rank: int, steps: int, slowdown: list[float],
                    also_slow: int | None = None, loader: int | None = None,
                    load_ms: float = 0.0, step_ms: float = 20.0, spiky: int | None = None,
                    spike: float = 1.0) -> list[list[str]]:
    if also_slow is None and loader is None and spiky is None and step_ms == 20.0:
        return cd.run_straggler(world_size, slow_rank, steps, tuple(slowdown)).logs
    slow = [slow_rank] + ([also_slow] if also_slow is not None else [])
    return launch(_busy_steps, cd.straggler_cluster(world_size), slow, steps,
                  list(slowdown), loader, load_ms / 1e3, step_ms / 1e3, spiky, spike).logs


_STEP = re.compile(r"^\[\s*([0-9.]+) ms\] step (\d+): compute (start|done)")


def _slowest_steps(logs: list[list[str]]) -> list[float]:
    """Per rank, its longest single step's compute in seconds (what a reader who takes the
    slowest step instead of the sum would compare)."""
    out = []
    for lines in logs:
        started: dict[int, float] = {}
        longest = 0.0
        for line in lines:
            match = _STEP.match(line)
            if match and match[3] == "start":
                started[int(match[2])] = float(match[1]) / 1e3
            elif match:
                longest = max(longest, float(match[1]) / 1e3 - started[int(match[2])])
        out.append(longest)
    return out


def _run_find(impl: Impl, world_size: int, slow_rank: int, steps: int,
              slowdown: list[float], also_slow: int | None = None, loader: int | None = None,
              load_ms: float = 0.0, step_ms: float = 20.0, spiky: int | None = None,
              spike: float = 1.0) -> Any:
    logs = _straggler_logs(world_size, slow_rank, steps, slowdown, also_slow, loader, load_ms,
                           step_ms, spiky, spike)
    return impl([list(lines) for lines in logs])


def _judge_find(got: Any, world_size: int, slow_rank: int, steps: int,
                slowdown: list[float], also_slow: int | None = None, loader: int | None = None,
                load_ms: float = 0.0, step_ms: float = 20.0, spiky: int | None = None,
                spike: float = 1.0) -> None:
    logs = _straggler_logs(world_size, slow_rank, steps, slowdown, also_slow, loader, load_ms,
                           step_ms, spiky, spike)
    rank, seconds = cd.find_straggler_reference(logs)
    phases = cd.phase_seconds(logs)
    totals = [p["compute"] for p in phases]
    waits = [p["wait"] for p in phases]
    where = (f"{world_size} ranks, {steps} step(s)"
             + (f" of about {step_ms:g} ms" if step_ms != 20.0 else "")
             + f", rank {slow_rank} slowed {'x'.join(f'{s:g}' for s in slowdown)}"
             + (f" and rank {also_slow} exactly as much" if also_slow is not None else "")
             + (f", rank {loader} loading data for {load_ms:g} ms before each step's compute"
                if loader is not None else "")
             + (f", rank {spiky} {spike:g} times slower in its last step only"
                if spiky is not None else ""))
    expect(isinstance(got, list) and len(got) == 2,
           f"{where}: expected (rank, seconds), got {type_name(got)}"
           + (f" of length {len(got)}" if isinstance(got, list) else ""))
    got_rank, got_seconds = got
    expect(type(got_rank) is int, f"{where}: the rank should be an int, got {type_name(got_rank)}")
    tied = [r for r, total in enumerate(totals) if total == totals[rank]]
    if got_rank != rank and got_rank in tied:
        expect(False, f"{where}: ranks {tied} computed equally long ({totals[rank] * 1e3:.4f} "
                      f"ms each) and you named rank {got_rank}; on a tie the straggler is the "
                      f"lowest rank, {rank}")
    slowest = _slowest_steps(logs)
    if got_rank != rank and got_rank == max(range(len(slowest)), key=slowest.__getitem__):
        expect(False, f"{where}: you named rank {got_rank}, whose slowest single step "
                      f"({slowest[got_rank] * 1e3:.4f} ms) is the longest; the straggler "
                      f"computes the most summed over every step: rank {rank}, "
                      f"{totals[rank] * 1e3:.4f} ms in all against rank {got_rank}'s "
                      f"{totals[got_rank] * 1e3:.4f} ms")
    if got_rank != rank and got_rank == cd.longest_waiter(logs):
        expect(False, f"{where}: you named rank {got_rank}, the rank that waited longest in the "
                      f"all-reduces; the straggler is rank {rank}")
    if got_rank != rank and got_rank == min(range(len(waits)), key=waits.__getitem__):
        expect(False, f"{where}: you named rank {got_rank}, the rank that waited least in the "
                      "all-reduces: it arrived late because it spent time between steps, which "
                      "is not compute. The straggler, the rank whose \"compute start\" to "
                      f"\"compute done\" adds up to the most, is rank {rank}")
    expect(got_rank == rank, f"{where}: you named rank {got_rank}, the straggler is rank {rank}")
    expect(type(got_seconds) in (int, float),
           f"{where}: seconds should be a number, got {type_name(got_seconds)}")
    close = abs(got_seconds - seconds) <= 1e-6 + 1e-6 * abs(seconds)
    from_waits = statistics.median(waits) - waits[rank]
    if not close and abs(got_seconds - from_waits) <= 1e-6 + 1e-6 * abs(from_waits):
        expect(False, f"{where}: rank {rank} is right, but {got_seconds * 1e3:.4f} ms is how "
                      "much less it waited in the all-reduces than the median rank; the "
                      "answer is how much longer it computed than the median rank: "
                      f"{seconds * 1e3:.4f} ms")
    expect(close, f"{where}: rank {rank} is right, but it computed {seconds * 1e3:.4f} ms "
                  f"longer than the median rank over the run, not {got_seconds * 1e3:.4f} ms")


def _find_case(name: str, points: int, cases: list[dict[str, Any]],
               hidden: bool = False) -> Case:
    return Case(name, points, *each(cases, _run_find, _judge_find), hidden=hidden)


def _straggler(world_size: int, slow_rank: int, steps: int = 3,
               slowdown: tuple[float, ...] = (3.0,), also_slow: int | None = None,
               loader: int | None = None, load_ms: float = 0.0, step_ms: float = 20.0,
               spiky: int | None = None, spike: float = 1.0) -> dict[str, Any]:
    """An example: ``also_slow``, ``loader`` and ``load_ms``, ``step_ms`` (a step's compute
    before any slowdown), ``spiky`` and ``spike`` only where they are used, so the example a
    failure names says only what its logs hold."""
    example: dict[str, Any] = {"world_size": world_size, "slow_rank": slow_rank,
                               "steps": steps, "slowdown": list(slowdown)}
    if also_slow is not None:
        example["also_slow"] = also_slow
    if loader is not None:
        example.update(loader=loader, load_ms=load_ms)
    if step_ms != 20.0:
        example["step_ms"] = step_ms
    if spiky is not None:
        example.update(spiky=spiky, spike=spike)
    return example


def _random_stragglers() -> list[dict[str, Any]]:
    out = []
    for e in examples(8, seed=64, n=(3, 7), slow=(0, 6), steps=(2, 4), a=(15, 40), b=(11, 40)):
        out.append(_straggler(e["n"], e["slow"] % e["n"], e["steps"],
                              (e["a"] / 10, e["b"] / 10)))
    # ties only where they are exact (the visible case): the all-reduce may end a fraction of
    # a log's 0.1 us resolution apart on two ranks, and two equally slow ranks' totals then
    # differ in the last digit
    for e in examples(6, seed=65, n=(3, 7), slow=(0, 6), other=(1, 5), steps=(2, 4),
                      a=(12, 30), load=(5, 30)):
        slow, loader = e["slow"] % e["n"], (e["slow"] + e["other"]) % e["n"]
        loader = loader if loader != slow else (slow + 1) % e["n"]
        out.append(_straggler(e["n"], slow, e["steps"], (e["a"] / 10,), loader=loader,
                              load_ms=float(e["load"])))
    return out
