"""Checks of exercises 3.1 (averaging gradients) and 3.3 (averaging them during backward).

The oracle for averaging is single-device training: the mean of the ranks' gradients on
equal slices of a batch is the gradient of the whole batch. 3.3's all-reduces must be
comm-stream jobs (the router sees which lane each message comes in on); overlap itself is read
off the simulator's timeline, where communication must run while backward is still computing,
and earns no points, since the rank reports its own compute.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from mpgpu_edu.cluster import Cluster
from mpgpu_edu.collectives import all_reduce
from mpgpu_edu.grading.checks import CheckFailure, Evidence
from mpgpu_edu.grading.checks._clock import (cluster_builder, describe_sends, jobs_of,
                                             same_sends, sorted_sends)
from mpgpu_edu.grading.checks._support import (bytes_of, compute_examples, evidence, examples,
                                               expect, expect_close, judge_examples,
                                               judge_flops, judge_jobs_after_compute,
                                               launch_facts, run_spmd, showing, uniform)
from mpgpu_edu.grading.checks.lesson_03.models import _batch, _local_grads, _model, _names

Impl = Callable[..., Any]


# ---- 3.1 averaging ---------------------------------------------------------------------------

WIDTHS = (6, 5, 3)


def _shards(x: torch.Tensor, y: torch.Tensor, n: int) -> list[list[torch.Tensor]]:
    """Each rank's slice of the batch: ``[xs, ys]``, one entry per rank (hidden from the
    other ranks where the ranks run apart)."""
    return [list(torch.tensor_split(x, n)), list(torch.tensor_split(y, n))]


def _averaging_program(impl: Impl, widths: tuple[int, ...], shards: list[list[torch.Tensor]],
                       overlap: bool = False) -> Callable[..., Any]:
    base = _model(widths)  # built here: rank threads must not share the global RNG

    def program(comm: Any) -> list[torch.Tensor]:
        model = copy.deepcopy(base)
        xs, ys = (part[comm.rank] for part in shards)
        loss = nn.functional.mse_loss(model(xs), ys)
        if overlap:
            with comm.compute("backward", "backward"):
                impl(comm, model, loss)
        else:
            loss.backward()
            impl(comm, model)
        return [p.grad.clone() for p in model.parameters()]
    return program


def _averaged(impl: Impl, n: int, widths: tuple[int, ...], n_samples: int,
              overlap: bool = False, cluster: Cluster | None = None) -> dict:
    """compute: every rank's gradients after the learner averaged them, and the traffic."""
    shards = _shards(*_batch(n_samples, widths), n)
    result = run_spmd(_averaging_program(impl, widths, shards, overlap), cluster or uniform(n),
                      hide=shards)
    facts = launch_facts(result)
    facts["grads"] = facts.pop("results")
    return facts


def _expect_mean_close(got: Any, want: torch.Tensor, n: int, what: str) -> None:
    """``expect_close``, saying so when ``got`` is ``n`` times ``want`` (a sum over the ranks
    where their mean was due)."""
    if (n > 1 and isinstance(got, torch.Tensor) and got.shape == want.shape
            and want.abs().max() > 1e-6
            and torch.allclose(got.double(), n * want.double(), rtol=1e-5, atol=1e-6)):
        raise CheckFailure(f"{what}: every value is {n} times the expected one (N = {n} "
                           "ranks)")
    expect_close(got, want, what)


def _judge_mean(data: dict, n: int, widths: tuple[int, ...], n_samples: int) -> None:
    x, y = _batch(n_samples, widths)
    model = _model(widths)
    per_rank = [_local_grads(model, torch.tensor_split(x, n)[r], torch.tensor_split(y, n)[r])
                for r in range(n)]
    want = [torch.stack(grads).mean(0) for grads in zip(*per_rank)]
    expect(len(data["grads"]) == n, f"expected results from {n} ranks")
    for rank, grads in enumerate(data["grads"]):
        for name, got, expected in zip(_names(widths), grads, want):
            _expect_mean_close(got, expected, n, f"N={n}: rank {rank}'s gradient of {name}")


def _judge_overlapped_mean(data: dict, n: int, widths: tuple[int, ...], n_samples: int) -> None:
    """``_judge_mean`` after an overlapped backward, whose likeliest cause of wrong values is
    an all-reduce still running when the learner's function returned."""
    try:
        _judge_mean(data, n, widths, n_samples)
    except CheckFailure as exc:
        raise CheckFailure(f"{exc} (after an overlapped backward: had every all-reduce "
                           "finished when backward_with_overlap returned? wait() on each work "
                           "it started, after loss.backward())") from None


def _judge_single_device(data: dict) -> None:
    x, y = _batch(12, WIDTHS)
    full = _local_grads(_model(WIDTHS), x, y)
    for rank, grads in enumerate(data["grads"]):
        for name, got, want in zip(_names(WIDTHS), grads, full):
            _expect_mean_close(got, want, len(data["grads"]),
                               f"rank {rank}'s gradient of {name} against one device "
                               "training on the whole batch")


def _judge_traffic(data: dict) -> None:
    n = 4
    _judge_mean(data, n, WIDTHS, 12)
    sizes = [p.numel() for p in _model(WIDTHS).parameters()]
    most = sum(2 * (n - 1) * bytes_of(-(-numel // n)) for numel in sizes)
    busiest = max(s["bytes_sent"] for s in data["stats"])
    expect(busiest <= most, f"the busiest rank sent {busiest} bytes; a ring all-reduce of "
                            f"every gradient sends at most {most} per rank (is one rank doing "
                            "all the work, as in a naive all-reduce?)")


AVERAGING_EXAMPLES = examples(8, seed=3, world_size=(1, 5), hidden=(1, 6))


def _averaging_hidden(impl: Impl) -> list[dict]:
    return compute_examples(
        lambda world_size, hidden: _averaged(impl, world_size, (4, hidden, 2),
                                             2 * world_size + 1),
        AVERAGING_EXAMPLES)


def _judge_averaging_hidden(records: list[dict]) -> None:
    judge_examples(records, lambda out, world_size, hidden: _judge_mean(
        out, world_size, (4, hidden, 2), 2 * world_size + 1))


# ---- 3.3 overlap ------------------------------------------------------------------------------

OVERLAP_WIDTHS = (256, 256, 256, 256, 256)
OVERLAP_SAMPLES = 64


@cluster_builder
def _overlap_cluster(n: int) -> Cluster:
    # A slow device on a fast network: backward and the all-reduces take similar time.
    return Cluster.uniform(n, alpha_s=1e-6, beta_Bps=5e10, gpu="CPU-16GB")


def _after_backward(comm: Any, model: nn.Module, loss: torch.Tensor) -> None:
    """The grader's no-overlap baseline: all-reduce every gradient after backward."""
    loss.backward()
    for param in model.parameters():
        all_reduce(comm, param.grad, op="mean")


def _overlapped(comm: Any, model: nn.Module, loss: torch.Tensor) -> None:
    """The grader's overlapped run: each gradient's all-reduce started on the comm stream
    from its hook, as soon as backward made it (no job can start earlier)."""
    works = []

    def hook(param: torch.Tensor) -> None:
        works.append(comm.run_async(all_reduce, comm, param.grad, "mean"))

    handles = [p.register_post_accumulate_grad_hook(hook) for p in model.parameters()]
    loss.backward()
    for handle in handles:
        handle.remove()
    for work in works:
        work.wait()


@functools.lru_cache(maxsize=4)
def _overlapped_jobs(n: int = 2, widths: tuple[int, ...] = OVERLAP_WIDTHS,
                     n_samples: int = OVERLAP_SAMPLES) -> list:
    """The ``jobs`` fact (``_clock.jobs_of``) of the grader's overlapped run on the same data
    as the learner's (by default the timeline case's)."""
    from mpgpu_edu.comm import launch

    shards = _shards(*_batch(n_samples, widths), n)
    run = launch(_averaging_program(_overlapped, widths, shards, True), _overlap_cluster(n))
    return jobs_of(run.op_lists, n)


def _intervals_overlap(trace: Any, device: int, after: float = 0.0,
                       counted: bool = False) -> float:
    """Seconds during which ``device`` computed backward and communicated at once
    (``counted``: only backward regions that count FLOPs)."""
    compute = [(e.start, e.end) for e in trace.on(device, "compute") if e.kind == "backward"
               and (e.flops > 0 or not counted)]
    comm = [(e.start, e.end) for e in trace.on(device, "comm") if e.start >= after]
    return sum(max(0.0, min(a1, b1) - max(a0, b0)) for a0, a1 in compute for b0, b1 in comm)


def _overlap_run(impl: Impl) -> dict:
    """*compute*: the learner's overlapped averaging on the overlap cluster, with its
    timeline (the judge runs the no-overlap baseline itself)."""
    shards = _shards(*_batch(OVERLAP_SAMPLES, OVERLAP_WIDTHS), 2)
    yours = run_spmd(_averaging_program(impl, OVERLAP_WIDTHS, shards, True),
                     _overlap_cluster(2), hide=shards)
    return launch_facts(yours, with_trace=True)


def _plain_overlap_run(n: int = 2, widths: tuple[int, ...] = OVERLAP_WIDTHS,
                       n_samples: int = OVERLAP_SAMPLES) -> Any:
    """The grader's no-overlap baseline on the same data as the learner's overlapped run."""
    shards = _shards(*_batch(n_samples, widths), n)
    return run_spmd(_averaging_program(_after_backward, widths, shards, True),
                    _overlap_cluster(n))


def _expect_one_all_reduce_each(data: dict, baseline: list) -> None:
    rank = same_sends(data["sends"], baseline)
    expect(rank is None, f"rank {rank}'s messages are not one all-reduce per parameter: it "
                         f"sent {describe_sends(data['sends'][rank or 0])}; each "
                         "parameter's all_reduce (op='mean'), as the baseline runs them "
                         f"after backward, sends {describe_sends(baseline[rank or 0])}")


def _judge_overlap_averaged(data: dict, n: int, widths: tuple[int, ...],
                            n_samples: int) -> None:
    """Scored: right values, then the messages the grader's router saw: one all-reduce per
    parameter, as the baseline sends them, every one from a comm-stream job. Where they fall
    against backward is the timeline case's, which earns no points (the compute on it is
    reported by the rank's own process)."""
    _judge_overlapped_mean(data, n, widths, n_samples)
    _expect_one_all_reduce_each(
        data, sorted_sends(_plain_overlap_run(n, widths, n_samples).op_lists, n))
    for rank, sent in enumerate(data["program_bytes"]):
        expect(sent == 0, f"rank {rank} sent {sent} bytes from its own program: an all-reduce "
                          "run there cannot overlap backward; start each one on the comm "
                          "stream (comm.run_async) from its gradient's hook, and wait for it "
                          "after loss.backward()")
    want = [[int(nbytes) for _flops, nbytes in jobs]
            for jobs in _overlapped_jobs(n, tuple(widths), n_samples)]
    for rank, jobs in enumerate(data["jobs"]):
        got = [int(nbytes) for _flops, nbytes in jobs]
        expect(got == want[rank],
               f"rank {rank} started its all-reduce jobs in an order that sent {got} bytes; "
               f"started from each gradient's hook, in the order backward makes them (the last "
               f"layer first), they send {want[rank]}: start each all-reduce from its "
               "parameter's hook (register_post_accumulate_grad_hook)")


def _judge_overlap_timeline(data: dict) -> Evidence:
    plain = _plain_overlap_run()
    baseline = sorted_sends(plain.op_lists, 2)
    shown = evidence({"yours": data["trace"],
                      "no overlap (all-reduce after backward)": plain.trace.to_dict()})
    yours, plain = shown.traces["yours"], shown.traces["no overlap (all-reduce after backward)"]
    with showing(shown):
        judge_flops(data["trace"], [(total, total) for total in (
            sum(e.flops for e in plain.events if e.device == d and e.stream != "comm")
            for d in range(2))], "the overlapped step", _overlap_cluster(2))
        judge_jobs_after_compute(data["jobs"], _overlapped_jobs(), "the overlapped step")
        _expect_one_all_reduce_each(data, baseline)
        backward_end = max((e.end for e in yours.on(0, "compute") if e.kind == "backward"),
                           default=None)
        expect(backward_end is not None, "device 0 shows no backward compute on the timeline")
        first_comm = min((e.start for e in yours.on(0, "comm")), default=float("inf"))
        expect(first_comm < backward_end,
               f"communication starts at {first_comm * 1e6:.1f} us, after backward ends at "
               f"{backward_end * 1e6:.1f} us")
        expect(_intervals_overlap(yours, 0) > 0,
               "communication and backward never run at the same time: every all-reduce "
               "holds backward up until it is done")
        expect(yours.makespan < plain.makespan,
               f"the step takes {yours.makespan * 1e6:.1f} us, no faster than all-reducing "
               f"after backward ({plain.makespan * 1e6:.1f} us)")
    return shown


def _hooks_after(impl: Impl) -> list[dict]:
    """*compute*: two runs, the learner's overlapped step alone and followed by a later plain
    backward; the judge compares the messages the grader counts in each."""
    x, y = _batch(8, WIDTHS)
    base = _model(WIDTHS)

    def program(comm: Any, later: bool) -> None:
        model = copy.deepcopy(base)
        impl(comm, model, nn.functional.mse_loss(model(x), y))
        comm.run_async(lambda: None).wait()  # the comm stream is FIFO: earlier jobs are done
        if later:
            nn.functional.mse_loss(model(x), y).backward()
            comm.run_async(lambda: None).wait()

    return [launch_facts(run_spmd(program, uniform(2), later)) for later in (False, True)]


def _judge_hooks_removed(runs: list[dict]) -> None:
    alone, later = runs
    for rank, (before, after) in enumerate(zip(alone["stats"], later["stats"])):
        extra = after["messages_sent"] - before["messages_sent"]
        expect(extra == 0, f"rank {rank} sent {extra} messages during a later backward, after "
                           "backward_with_overlap had returned")
