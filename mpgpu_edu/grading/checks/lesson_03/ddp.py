"""Checks of exercise 3.5, the capstone: a DDP wrapper. Its ranks start from different
replicas and must end where single-device training ends; the messages each rank sent (the
grader's record) must be those of the contract's collectives, one broadcast and one
all-reduce per bucket, which the grader runs itself to know them; the timeline must show
all-reduces launched during backward. Every call of the package's ``all_reduce`` and
``broadcast`` is also recorded in the rank's process (which rank, how many elements, while
constructing or during the steps): that feedback case earns no points."""

from __future__ import annotations

import contextlib
import copy
import functools
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from mpgpu_edu.cluster import Cluster
from mpgpu_edu.grading.checks import CheckFailure, Evidence
from mpgpu_edu.grading.checks._clock import contract_sends, describe_sends, jobs_of, same_sends
from mpgpu_edu.grading.checks._support import (compute_examples, evidence, examples, expect,
                                               expect_close, judge_examples, judge_flops,
                                               judge_jobs_after_compute, launch_facts,
                                               model_flops,
                                               rebound, run_spmd, showing, uniform)
from mpgpu_edu.grading.checks.lesson_03.averaging import (OVERLAP_SAMPLES, OVERLAP_WIDTHS,
                                                          _intervals_overlap, _overlap_cluster)
from mpgpu_edu.grading.checks.lesson_03.buckets import _reference_buckets
from mpgpu_edu.grading.checks.lesson_03.models import _batch, _model, _names

Impl = Callable[..., Any]


@contextlib.contextmanager
def _recording(impl: Impl) -> Iterator[dict[str, list]]:
    """While inside, every call of the package's ``all_reduce`` and ``broadcast`` (also under
    the names the learner's module imported) is recorded: ``{"all_reduce": [(rank, numel,
    phase)], "broadcast": [...]}``, where phase is what ``phase[0]`` held at the call."""
    import mpgpu_edu.collectives as collectives
    from mpgpu_edu.collectives import allreduce, basic

    calls: dict[str, list] = {"all_reduce": [], "broadcast": [], "phase": ["construct"]}
    originals = {"all_reduce": allreduce.all_reduce, "broadcast": basic.broadcast}

    def recorder(kind: str) -> Impl:
        def record(comm: Any, tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            calls[kind].append((comm.rank, tensor.numel(), calls["phase"][0]))
            return originals[kind](comm, tensor, *args, **kwargs)
        return record

    owners = [collectives, allreduce, basic, getattr(impl, "__globals__", {})]
    with rebound(owners, [(fn, recorder(kind)) for kind, fn in originals.items()]):
        yield calls


DDP_LR = 0.1


def _ddp_inputs(n: int, widths: tuple[int, ...], norm: bool, n_samples: int, steps: int
                ) -> tuple[list[nn.Module], list[list[tuple[torch.Tensor, torch.Tensor]]]]:
    """Rank r's replica (rank 0's is the start) and its slice of every step's batch: one
    entry per rank, hidden from the other ranks where the ranks run apart."""
    replicas = [_model(widths, seed=0 if r == 0 else 100 + r, norm=norm) for r in range(n)]
    batches = [_batch(n_samples, widths, seed=10 + s) for s in range(steps)]
    shards = [[(torch.tensor_split(x, n)[r], torch.tensor_split(y, n)[r]) for x, y in batches]
              for r in range(n)]
    return replicas, shards


def _ddp_program(impl: Impl, replicas: list[nn.Module], shards: list[list[Any]],
                 n_samples: int, cap: int, calls: dict) -> Callable[..., Any]:
    def program(comm: Any) -> dict:
        model = copy.deepcopy(replicas[comm.rank])
        wrapper = impl(comm, model, cap)
        start = [p.detach().clone() for p in model.parameters()]
        comm.barrier()  # every rank has finished constructing: now the steps
        calls["phase"][0] = "steps"
        optimizer = torch.optim.SGD(model.parameters(), lr=DDP_LR)
        for xs, ys in shards[comm.rank]:
            share = len(xs) / n_samples
            with comm.compute("forward", "forward"):
                out = wrapper(xs)
            loss = nn.functional.mse_loss(out, ys) * share * comm.world_size
            with comm.compute("backward", "backward"):
                loss.backward()
            wrapper.finish()
            optimizer.step()
            optimizer.zero_grad()
        mine = {kind: [c for c in calls[kind] if c[0] == comm.rank]
                for kind in ("all_reduce", "broadcast")}  # made in this rank's process
        return {"start": start, "params": [p.detach().clone() for p in model.parameters()],
                "calls": mine}
    return program


def _ddp_run(impl: Impl, n: int, widths: tuple[int, ...], cap: int, *, norm: bool = False,
             n_samples: int = 12, steps: int = 3, cluster: Cluster | None = None,
             with_trace: bool = False) -> dict:
    """compute: the learner's DDP trains ``steps`` SGD steps on ``n`` ranks; what each rank
    holds after construction and at the end, what it all-reduced and broadcast, and when."""
    replicas, shards = _ddp_inputs(n, widths, norm, n_samples, steps)
    with _recording(impl) as calls:
        result = run_spmd(_ddp_program(impl, replicas, shards, n_samples, cap, calls),
                          cluster or uniform(n), hide=[replicas, shards])
    facts = launch_facts(result, with_trace=with_trace)
    for kind in ("all_reduce", "broadcast"):
        facts[kind] = [list(c) for rank in facts["results"]
                       for c in (rank["calls"][kind] if isinstance(rank, dict) else [])]
    facts["results"] = [{k: v for k, v in rank.items() if k != "calls"}
                        if isinstance(rank, dict) else rank for rank in facts["results"]]
    return facts


def _reference_training(widths: tuple[int, ...], norm: bool, n_samples: int,
                        steps: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    model = _model(widths, seed=0, norm=norm)
    start = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.SGD(model.parameters(), lr=DDP_LR)
    for s in range(steps):
        x, y = _batch(n_samples, widths, seed=10 + s)
        optimizer.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    return start, [p.detach().clone() for p in model.parameters()]


def _bucket_numels(widths: tuple[int, ...], norm: bool, cap: int) -> list[int]:
    sizes = [p.numel() for p in _model(widths, norm=norm).parameters()]
    return [sum(sizes[i] for i in bucket)
            for bucket in _reference_buckets([4 * s for s in sizes], cap)]


def _judge_ddp_values(data: dict, n: int, widths: tuple[int, ...], cap: int, norm: bool = False,
                      n_samples: int = 12, steps: int = 3) -> None:
    start, final = _reference_training(widths, norm, n_samples, steps)
    names = _names(widths, norm)
    expect(len(data["results"]) == n, f"expected results from {n} ranks")
    for rank, held in enumerate(data["results"]):
        for name, got, want in zip(names, held["start"], start):
            expect_close(got, want, f"when wrap_ddp returned, rank {rank}'s {name} was not "
                                    "rank 0's")
    for rank, held in enumerate(data["results"]):
        for name, got, want in zip(names, held["params"], final):
            try:
                expect_close(got, want, f"after {steps} SGD steps on {n} ranks, rank {rank}'s "
                                        f"{name} differs from one device's training on the "
                                        "whole batches", rtol=1e-4, atol=1e-6)
            except CheckFailure as exc:
                raise CheckFailure(f"{exc}{_fewer_later(data, rank, widths, cap, norm, steps)}")


def _fewer_later(data: dict, rank: int, widths: tuple[int, ...], cap: int, norm: bool,
                 steps: int) -> str:
    """A note when the rank launched fewer all-reduces than one per bucket in every step: the
    wrapper's per-step state (which buckets are ready) was not reset by ``finish``."""
    buckets = len(_bucket_numels(widths, norm, cap))
    launched = sum(1 for r, _numel, phase in data["all_reduce"] if r == rank and phase == "steps")
    if launched >= steps * buckets:
        return ""
    return (f" (rank {rank} launched {launched} all-reduces in {steps} steps, {steps * buckets} "
            f"expected: one per bucket per step. After the first step, were the buckets still "
            "counted as launched? finish() resets what a step changed)")


@functools.lru_cache(maxsize=64)
def _contract_traffic(n: int, widths: tuple[int, ...], cap: int, norm: bool, steps: int,
                      algo: str) -> list[list[tuple[int, int]]]:
    """Each rank's messages (``_clock.contract_sends``) when the contract's calls run: one
    broadcast of every parameter element from rank 0, the check's barrier, then per step one
    ``all_reduce(algo)`` per bucket, in the buckets' order."""
    from mpgpu_edu.collectives import all_reduce, broadcast

    total = sum(p.numel() for p in _model(widths, norm=norm).parameters())
    buckets = _bucket_numels(widths, norm, cap)

    def program(comm: Any) -> None:
        broadcast(comm, torch.empty(total, device="meta"), 0)
        comm.barrier()
        for _step in range(steps):
            for numel in buckets:
                all_reduce(comm, torch.empty(numel, device="meta"), "mean", algo)
    return contract_sends(n, program)


def _judge_ddp_messages(data: dict, n: int, widths: tuple[int, ...], cap: int,
                        norm: bool = False, steps: int = 3) -> None:
    """The contract's collectives, read from the messages the grader saw: every rank sent
    what one broadcast of all the parameters and, per step, one all-reduce per bucket (the
    contract's buckets) send, and nothing else; any one of the package's all-reduce
    algorithms, the same for every bucket."""
    from mpgpu_edu.collectives.allreduce import ALGORITHMS

    want = _contract_traffic(n, tuple(widths), cap, norm, steps, "ring")
    if any(same_sends(data["sends"], _contract_traffic(n, tuple(widths), cap, norm, steps, algo))
           is None for algo in ["ring", *[a for a in ALGORITHMS if a != "ring"]]):
        return
    rank = same_sends(data["sends"], want)
    assert rank is not None
    buckets = _bucket_numels(widths, norm, cap)
    total = sum(p.numel() for p in _model(widths, norm=norm).parameters())
    raise CheckFailure(
        f"rank {rank}'s messages are not those of the contract's collectives: it sent "
        f"{describe_sends(data['sends'][rank])}; one broadcast of all {total} parameter "
        f"elements from rank 0 at construction and, in each of {steps} steps, one all_reduce "
        f"per bucket (cap {cap} bytes: buckets of {buckets} elements, in that order) send "
        f"{describe_sends(want[rank])}. Are the buckets the contract's (reverse order, closed "
        "once past the cap), each all-reduced once, and the broadcast one call on all the "
        "parameters?")


def _judge_ddp_structure(data: dict, n: int, widths: tuple[int, ...], cap: int,
                         norm: bool = False, steps: int = 3) -> None:
    """Feedback only: the calls of ``all_reduce`` and ``broadcast`` as each rank's own process
    recorded them (which phase, which sizes, in which order)."""
    want = _bucket_numels(widths, norm, cap)
    total = sum(p.numel() for p in _model(widths, norm=norm).parameters())
    for rank in range(n):
        sent = [numel for r, numel, phase in data["all_reduce"] if r == rank and phase == "steps"]
        per_step = len(sent) // steps if sent else 0
        expect(len(sent) == steps * len(want) and sent == want * steps,
               f"rank {rank} all-reduced tensors of {sent[:per_step] if per_step else sent} "
               f"elements in a step (bucket cap {cap} bytes over {len(want)} buckets); the "
               f"contract's buckets hold {want} elements, in that order")
        during = [c for c in data["broadcast"] if c[0] == rank and c[2] == "steps"]
        expect(not during, f"rank {rank} broadcast {len(during)} times during training: the "
                           "parameters are broadcast once, when the wrapper is built")
        built = [c for c in data["all_reduce"] if c[0] == rank and c[2] == "construct"]
        expect(not built, f"rank {rank} all-reduced while the wrapper was being built")
        sent = [numel for r, numel, phase in data["broadcast"]
                if r == rank and phase == "construct"]
        expect(sent == [total],
               f"rank {rank} broadcast {len(sent)} tensor(s) while the wrapper was being built "
               f"(of {sent[:8]}{' ...' if len(sent) > 8 else ''} elements); the contract "
               f"says one broadcast, at construction, of all {total} parameter elements")


DDP_WIDTHS = (6, 8, 5, 3)  # parameters of 48, 8, 40, 5, 15, 3 elements
DDP_CAP = 180  # bytes: reverse order buckets of 23, 40, 8, 48 elements; forward: 18, 45, 8, 48


def _ddp_basic(impl: Impl) -> dict:
    return _ddp_run(impl, 3, DDP_WIDTHS, DDP_CAP)


def _judge_ddp_basic(data: dict) -> None:
    _judge_ddp_values(data, 3, DDP_WIDTHS, DDP_CAP)


def _judge_ddp_buckets(data: dict) -> None:
    _judge_ddp_values(data, 3, DDP_WIDTHS, DDP_CAP)
    _judge_ddp_messages(data, 3, DDP_WIDTHS, DDP_CAP)
    _judge_ddp_on_stream(data, 3, DDP_WIDTHS, DDP_CAP)


def _judge_ddp_on_stream(data: dict, n: int, widths: tuple[int, ...], cap: int) -> None:
    """The all-reduces run as comm-stream jobs: a rank's program sent at most what the
    broadcast at construction and the check's barrier send (the router saw which lane each
    message came in on)."""
    construct = _contract_traffic(n, tuple(widths), cap, False, 0, "ring")
    for rank, sent in enumerate(data["program_bytes"]):
        most = sum(nbytes for _peer, nbytes in construct[rank])
        expect(sent <= most,
               f"rank {rank} sent {sent} bytes from its own program, where the broadcast at "
               f"construction sends {most}: a bucket's all-reduce ran there, holding backward "
               "up until it was done; start each on the comm stream (comm.run_async) and "
               "wait for them in finish()")


def _judge_ddp_calls(data: dict) -> None:
    _judge_ddp_structure(data, 3, DDP_WIDTHS, DDP_CAP)


def _ddp_uneven(impl: Impl) -> dict:
    return _ddp_run(impl, 4, DDP_WIDTHS, DDP_CAP, n_samples=14)


def _judge_ddp_uneven(data: dict) -> None:
    _judge_ddp_values(data, 4, DDP_WIDTHS, DDP_CAP, n_samples=14)


DDP_TIMELINE_CAP = 300_000  # about one 256 x 256 layer per bucket


def _ddp_timeline(impl: Impl) -> dict:
    return _ddp_run(impl, 2, OVERLAP_WIDTHS, DDP_TIMELINE_CAP, n_samples=OVERLAP_SAMPLES,
                    steps=1, cluster=_overlap_cluster(2), with_trace=True)


@functools.lru_cache(maxsize=1)
def _wrapper_jobs() -> list:
    """The ``jobs`` fact (``_clock.jobs_of``) of the package's own DDP wrapper on the
    timeline case's step, run by the grader: each bucket's all-reduce starts from the hook
    of its last gradient, as soon as the bucket is complete."""
    from mpgpu_edu.comm import launch
    from mpgpu_edu.dp.wrapper import wrap_ddp

    replicas, shards = _ddp_inputs(2, OVERLAP_WIDTHS, False, OVERLAP_SAMPLES, 1)
    calls: dict[str, list] = {"all_reduce": [], "broadcast": [], "phase": ["construct"]}
    run = launch(_ddp_program(wrap_ddp, replicas, shards, OVERLAP_SAMPLES, DDP_TIMELINE_CAP,
                              calls), _overlap_cluster(2))
    return jobs_of(run.op_lists, 2)


def _judge_ddp_timeline(data: dict) -> Evidence:
    shown = evidence({"yours": data["trace"]})
    trace = shown.traces["yours"]
    _replicas, shards = _ddp_inputs(2, OVERLAP_WIDTHS, False, OVERLAP_SAMPLES, 1)
    want = [(sum(f), sum(f)) for f in (model_flops(_model(OVERLAP_WIDTHS), *shards[rank][0])
                                       for rank in range(2))]
    with showing(shown):
        judge_flops(data["trace"], want, "the DDP step", _overlap_cluster(2))
        _judge_ddp_messages(data, 2, OVERLAP_WIDTHS, DDP_TIMELINE_CAP, steps=1)
        judge_jobs_after_compute(data["jobs"], _wrapper_jobs(), "the DDP step")
        for device in range(2):
            forward = min((e.start for e in trace.on(device, "compute")
                           if e.kind == "forward"), default=None)
            # The model's backward: its regions that count FLOPs (a region of the kind
            # "backward" that counts none, an empty comm.compute(seconds=...), is not it).
            backward_end = max((e.end for e in trace.on(device, "compute")
                                if e.kind == "backward" and e.flops > 0), default=None)
            expect(forward is not None and backward_end is not None,
                   f"device {device} shows no {'forward' if forward is None else 'backward'} "
                   "compute on the timeline: the model's forward and backward run inside the "
                   "step's regions, counted where they run")
            comm = [e.start for e in trace.on(device, "comm") if e.start >= forward]
            expect(bool(comm), f"device {device} did not communicate during the step")
            expect(min(comm) < backward_end,
                   f"device {device}: the step's first message starts at "
                   f"{min(comm) * 1e6:.1f} us, after backward ends at "
                   f"{backward_end * 1e6:.1f} us: no all-reduce was launched during backward")
            expect(_intervals_overlap(trace, device, after=forward, counted=True) > 0,
                   f"device {device}: communication and backward never run at the same time: "
                   "each all-reduce holds backward up until it is done")
    return shown


DDP_EXAMPLES = examples(6, seed=7, world_size=(2, 5), hidden=(3, 9), cap=(13, 140))


def _ddp_example(world_size: int, hidden: int, cap: int) -> tuple[tuple[int, ...], bool, int]:
    widths = (5, hidden, hidden + 2, 2)
    return widths, hidden % 2 == 0, 6 * world_size - 1  # even widths: with a LayerNorm


def _ddp_hidden(impl: Impl) -> list[dict]:
    def body(world_size: int, hidden: int, cap: int) -> dict:
        widths, norm, n_samples = _ddp_example(world_size, hidden, cap)
        return _ddp_run(impl, world_size, widths, cap, norm=norm, n_samples=n_samples,
                        steps=2)
    return compute_examples(body, DDP_EXAMPLES)


def _judge_ddp_hidden(records: list[dict]) -> None:
    def one(out: dict, world_size: int, hidden: int, cap: int) -> None:
        widths, norm, n_samples = _ddp_example(world_size, hidden, cap)
        _judge_ddp_values(out, world_size, widths, cap, norm, n_samples, steps=2)
        _judge_ddp_messages(out, world_size, widths, cap, norm, steps=2)
    judge_examples(records, one)
