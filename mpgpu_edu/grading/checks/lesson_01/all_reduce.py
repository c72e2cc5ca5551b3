"""What lesson 01's all-reduce exercises (1.2, 1.3, 1.6, 1.7) share: running the learner's
all-reduce from scratch on the simulator, and the cases every one of them has (the sums, the
waits, the meta tensors of the lesson's figures, the time against a reference, the hidden
examples)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from mpgpu_edu.cluster import Cluster
from mpgpu_edu.cluster.topology import LinkInfo, Route, Topology
from mpgpu_edu.grading.checks import Case, CheckFailure, Evidence
from mpgpu_edu.grading.checks._clock import cluster_builder
from mpgpu_edu.grading.checks._plain import is_tensor
from mpgpu_edu.grading.checks._support import (ALPHA, BETA, bytes_of, compute_examples,
                                               evidence, examples, expect, expect_close,
                                               expect_waited,
                                               from_scratch, judge_examples, launch_facts,
                                               left_unchanged,
                                               rank_inputs, run_spmd, showing, uniform)
from mpgpu_edu.lessons.communication import all_reduce_meta

Impl = Callable[..., Any]
Facts = dict[str, Any]


def _count(number: int, noun: str) -> str:
    """``1 message``, ``3 messages``."""
    return f"{number} {noun}" + ("" if number == 1 else "s")


@cluster_builder
def fully_connected(n: int) -> Cluster:
    """The uniform cluster's alpha and beta, but a wire of its own for every ordered pair of
    devices (as on a board where every pair of GPUs has direct links): a rank can receive
    from two peers at once at full speed, so a tree whose subtrees work at once is faster."""
    def route_of(s: int, d: int) -> Route:
        return Route(ALPHA, BETA, (f"wire{s}-{d}",))

    links = [LinkInfo(f"gpu{a}", f"gpu{b}", "direct", BETA) for a in range(n)
             for b in range(a + 1, n)]
    topology = Topology("fully_connected", n, route_of, links, {"all": tuple(range(n))})
    return Cluster(f"fully-connected-{n}", uniform(n).gpu, topology, None,
                   efficiency=1.0, launch_overhead_s=0.0, memory_Bps=0.0)


def _all_reduce_program(impl: Impl, inputs: list[torch.Tensor]) -> Callable[..., Any]:
    def program(comm: Any) -> tuple[torch.Tensor, Any]:
        tensor = inputs[comm.rank].clone()
        returned = impl(comm, tensor)
        return tensor, returned
    return program


def _spec(size: Any) -> tuple[tuple[int, ...], str]:
    """A run's size: a number of elements (1-D float32), or a tuple of dimensions, with a
    dtype name last where it is not float32: ``12``, ``(2, 5)``, ``(7, "float64")``."""
    if isinstance(size, int):
        return (size,), "float32"
    dims = tuple(d for d in size if isinstance(d, int))
    return dims, next((d for d in size if isinstance(d, str)), "float32")


def _describe(size: Any) -> str:
    shape, dtype = _spec(size)
    what = f"{shape[0]} elements" if len(shape) == 1 else f"shape {list(shape)}"
    return what if dtype == "float32" else f"{what}, {dtype}"


def _inputs_of(n: int, size: Any, seed: int = 0) -> list[torch.Tensor]:
    """Rank r's tensor of ``size`` (``_spec``); float64 ones hold sevenths, which float32
    cannot."""
    shape, dtype = _spec(size)
    tensors = [t.reshape(shape) for t in rank_inputs(n, math.prod(shape), seed)]
    if dtype == "float64":
        tensors = [t.double() + (r + 1) / 7 for r, t in enumerate(tensors)]
    return tensors


def _all_reduce_facts(impl: Impl, exercise: str, n: int, numel: Any, seed: int = 0,
                      with_trace: bool = False,
                      cluster: Callable[[int], Cluster] = uniform) -> Facts:
    """compute: the learner's all-reduce on ``n`` ranks of ``cluster(n)`` (uniform);
    ``numel``: a size as ``_spec`` reads it."""
    inputs = _inputs_of(n, numel, seed)
    with from_scratch(impl, exercise):
        result = run_spmd(_all_reduce_program(impl, inputs), cluster(n), hide=[inputs])
    return launch_facts(result, with_trace)


def _waits_facts(impl: Impl, exercise: str, n: int, numel: int) -> Facts:
    """compute: the learner's all-reduce: what each rank holds; the grader counts from the
    run's record how many of its isend/irecv works each rank waited on (``works``)."""
    return _all_reduce_facts(impl, exercise, n, numel)


def _waits_case(exercise: str, points: int, sizes: list[tuple[int, int]]) -> Case:
    def compute(impl: Impl) -> list[Facts]:
        return [_waits_facts(impl, exercise, n, numel) for n, numel in sizes]

    def judge(runs: list[Facts]) -> None:
        for facts, (n, numel) in zip(runs, sizes):
            _judge_sums(facts, n, numel)
            judge_waited(facts, n)
    return Case("waits: every isend and irecv is waited on before returning", points,
                compute, judge)


def judge_waited(facts: Facts, n: int) -> None:
    """Every isend and irecv work of every rank waited on (the grader's ``works``)."""
    for rank, works in enumerate(facts["works"]):
        expect_waited(works, f"N={n}: rank {rank}")


def _judge_sums(facts: Facts, n: int, numel: Any, seed: int = 0) -> None:
    inputs = _inputs_of(n, numel, seed)
    want = torch.stack(inputs).sum(0)
    tight = (1e-12, 1e-12) if want.dtype == torch.float64 else ()  # float32 rounding fails
    for rank, (tensor, returned) in enumerate(facts["results"]):
        if is_tensor(tensor) and left_unchanged(tensor, inputs[rank], want):
            hint = " (you returned the result instead)" if is_tensor(returned) else ""
            expect(False, f"rank {rank}'s tensor is unchanged: the all-reduce works in "
                          f"place{hint}")
        expect_close(tensor, want, f"rank {rank} of {n}, {_describe(numel)}"
                     + (" (kept to float64's precision: make buffers with the tensor's dtype)"
                        if tight else ""), *tight)


def _runs_case(name: str, points: int, exercise: str, runs: list[tuple[Any, Any]],
               facts_of: Callable[..., Facts], judge_one: Callable[..., None]) -> Case:
    """``facts_of(impl, exercise, n, size)`` on every run ``(n, size)``, then
    ``judge_one(facts, n, size)`` on each, in order."""
    def compute(impl: Impl) -> list[Facts]:
        return [facts_of(impl, exercise, n, size) for n, size in runs]

    def judge(all_facts: list[Facts]) -> None:
        for facts, (n, size) in zip(all_facts, runs):
            judge_one(facts, n, size)
    return Case(name, points, compute, judge)


def _sums_case(name: str, points: int, exercise: str, sizes: list[tuple[int, int]]) -> Case:
    return _runs_case(name, points, exercise, sizes, _all_reduce_facts, _judge_sums)


def _hidden_case(exercise: str, facts_of: Callable[..., Facts], judge_one: Callable[..., None],
                 numel: tuple[int, int] = (1, 40), points: int = 1) -> Case:
    """Random world sizes 1..7 (3, 5, 6 and 7 always among them) and sizes; the judge
    reports the first failing example."""
    fixed = [{"world_size": n, "numel": m, "values": 1} for n, m in ((3, 10), (5, 7), (6, 13),
                                                                    (7, 9))]
    cases = examples(14, int(exercise.replace(".", "")), world_size=(1, 7), numel=numel,
                     values=(0, 3)) + fixed

    def compute(impl: Impl) -> list[dict]:
        return compute_examples(lambda world_size, numel, values: facts_of(
            impl, exercise, world_size, numel, values), cases)

    def judge(records: list[dict]) -> None:
        judge_examples(records, lambda facts, world_size, numel, values: judge_one(
            facts, world_size, numel, values))
    # Seven launches, each run twice where the ranks run apart (the second with changed
    # messages), each rank a process of its own: about 6 s on an idle machine, three times
    # that under load, so a minute before it counts as endless.
    return Case("hidden: random sizes and world sizes 1-7", points, compute, judge, hidden=True,
                timeout_s=60.0)


def _time_case(name: str, exercise: str, reference: Impl, what: str,
               runs: list[tuple[int, int]], why: str, points: int = 2,
               cluster: Callable[[int], Cluster] = uniform, faster: str = "") -> Case:
    """On every run (N, numel) the learner's all-reduce must give the right sums and take at
    most 1.1 x the reference's time; with ``faster`` (what a much faster one must be), also
    at least 0.9 x. A run that crashes fails the case like any other."""
    def compute(impl: Impl) -> list[Facts]:
        return [_all_reduce_facts(impl, exercise, n, numel, with_trace=True, cluster=cluster)
                for n, numel in runs]

    def judge(all_facts: list[Facts]) -> Evidence:
        shown = Evidence()
        for facts, (n, numel) in zip(all_facts, runs):
            _judge_sums(facts, n, numel)
            inputs = rank_inputs(n, numel)
            ref = run_spmd(lambda comm: reference(comm, inputs[comm.rank].clone()), cluster(n))
            shown = evidence({"yours": facts["trace"],
                              f"reference ({what})": ref.trace.to_dict()})
            yours_ms, ref_ms = facts["makespan"] * 1e3, ref.trace.makespan * 1e3
            where = (f"your all-reduce of {numel} elements ({bytes_of(numel)} bytes) on {n} "
                     f"ranks of {cluster(n).name} takes {yours_ms:.3f} ms, the {what} "
                     f"{ref_ms:.3f} ms")
            with showing(shown):
                expect(facts["makespan"] <= 1.1 * ref.trace.makespan, f"{where}: {why}")
                expect(not faster or facts["makespan"] >= 0.9 * ref.trace.makespan,
                       f"{where}, faster than {faster}")
        return shown
    return Case(name, points, compute, judge)


# ---- every all-reduce also runs on meta tensors, as the lesson's figures do -----------------

def _meta_case(exercise: str, traffic: Callable[[Facts, int, int], None],
               runs: tuple[tuple[int, int], ...] = ((4, 1000), (3, 10))) -> Case:
    """The lesson's figures run the learner's all-reduce on meta tensors (shapes without
    data, so that 1 GiB costs nothing): a buffer made with ``torch.zeros(n)`` instead of
    ``tensor.new_zeros(n)`` lives on the CPU, and copying a meta tensor into it fails. The
    meta run must also send what the exercise sends (``traffic``, on the grader's record of
    its messages): a function that returns at once on a meta tensor draws no figure."""
    def compute(impl: Impl) -> list[Facts]:
        out: list[Facts] = []
        for n, numel in runs:
            try:
                with from_scratch(impl, exercise):
                    result = run_spmd(all_reduce_meta, uniform(n), impl, numel)
            except NotImplementedError as exc:
                if "meta" not in str(exc):
                    raise  # the stub itself
                out.append({"error": f"{type(exc).__name__}: {str(exc).splitlines()[0]}"})
            except Exception as exc:  # noqa: BLE001 - only a failure that meta tensors cause
                if "meta" not in str(exc):
                    raise
                out.append({"error": f"{type(exc).__name__}: {str(exc).splitlines()[0]}"})
            else:
                out.append({"error": "", "run": launch_facts(result)})
        return out

    def judge(all_facts: list[Facts]) -> None:
        for facts, (n, numel) in zip(all_facts, runs):
            expect(not facts["error"],
                   f"on {n} ranks with a meta tensor of {numel} elements (shapes without "
                   f"data: what the lesson's figures run) your function raised "
                   f"{facts['error']}. Make every buffer where the input lives: "
                   f"tensor.new_zeros(...), tensor.new_empty(...), or device=tensor.device")
            expect(facts["run"]["carried_data"] is not True,
                   f"on {n} ranks with a meta tensor of {numel} elements, your function's "
                   "messages carried data: it ran on real tensors made in its place, not on "
                   "the meta tensor it was given (what the lesson's figures need: 1 GiB "
                   "without the memory)")
            try:
                traffic(facts["run"], n, numel)
            except CheckFailure as exc:
                raise CheckFailure(f"on meta tensors (what the lesson's figures run), N={n}, "
                                   f"{numel} elements: {exc}") from None
    return Case("runs on meta tensors, as the lesson's figures do", 1, compute, judge)
