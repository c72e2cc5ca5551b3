"""Checks of exercises 1.4 (ring reduce-scatter) and 1.5 (ring all-gather): what each rank's
input and returned value are afterwards, whether a returned tensor is a new one, and the
N-1 messages each rank sends to its right neighbour."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from mpgpu_edu.grading.checks import Case, CheckFailure
from mpgpu_edu.grading.checks._plain import is_tensor, type_name
from mpgpu_edu.grading.checks._support import (bytes_of, expect, expect_close, from_scratch,
                                               launch_facts, rank_inputs, run_spmd, uniform)
from mpgpu_edu.grading.checks.lesson_01.all_reduce import _count, _hidden_case, judge_waited

Impl = Callable[..., Any]
Facts = dict[str, Any]


def _collective_facts(impl: Impl, exercise: str, n: int, shape: tuple[int, ...],
                      seed: int = 0, dtype: str = "float32") -> Facts:
    """compute: what each rank's input and returned value are afterwards, and (``shares``)
    whether each returned tensor shares memory with the rank's input tensor."""
    inputs = _inputs(n, shape, seed, dtype)

    def program(comm: Any) -> tuple[torch.Tensor, Any, list[bool]]:
        tensor = inputs[comm.rank].clone()
        got = impl(comm, tensor)
        parts = got if isinstance(got, (list, tuple)) else [got]
        shares = [isinstance(p, torch.Tensor) and _same_memory(p, tensor) for p in parts]
        return tensor, got, shares

    with from_scratch(impl, exercise):
        result = run_spmd(program, uniform(n), hide=[inputs])
    facts = launch_facts(result)
    facts["shares"] = [row[2] for row in facts["results"]]
    facts["results"] = [row[:2] for row in facts["results"]]
    return facts


def _same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def _inputs(n: int, shape: tuple[int, ...], seed: int, dtype: str = "float32"
            ) -> list[torch.Tensor]:
    """Rank r's input; in float64 plus sevenths, which float32 cannot hold."""
    numel = 1
    for dim in shape:
        numel *= dim
    tensors = [t.reshape(shape) for t in rank_inputs(n, numel, seed)]
    if dtype == "float64":
        tensors = [t.double() + (r + 1) / 7 for r, t in enumerate(tensors)]
    return tensors


def _expect_like(got: Any, want: torch.Tensor, what: str) -> None:
    """``got`` has ``want``'s dtype and values (float64: to float64's precision)."""
    if is_tensor(got) and got.dtype != want.dtype:
        raise CheckFailure(f"{what}: {str(got.dtype).replace('torch.', '')} for "
                           f"{str(want.dtype).replace('torch.', '')} inputs; make every buffer "
                           "with the input's dtype (torch.empty_like, tensor.new_empty)")
    tight = want.dtype == torch.float64
    expect_close(got, want, what, *((1e-12, 1e-12) if tight else ()))


def _judge_reduce_scatter(facts: Facts, n: int, shape: tuple[int, ...], seed: int = 0,
                          dtype: str = "float32") -> None:
    inputs = _inputs(n, shape, seed, dtype)
    chunks = torch.tensor_split(torch.stack(inputs).sum(0).reshape(-1), n)
    for rank, (_tensor, got) in enumerate(facts["results"]):
        _expect_like(got, chunks[rank], f"N={n}, {dtype} of shape {list(shape)}, rank {rank}'s "
                                        "chunk")


def _expect_input_kept(facts: Facts, n: int, inputs: list[torch.Tensor], what: str) -> None:
    """Feedback only (seen inside each rank's process): every rank's input tensor as the
    caller passed it, and no returned tensor sharing its memory."""
    for rank, (tensor, _got) in enumerate(facts["results"]):
        expect(is_tensor(tensor) and torch.equal(tensor, inputs[rank]),
               f"N={n}: rank {rank}'s input tensor was changed; {what} must leave it as it was")
        for entry, shared in enumerate(facts["shares"][rank]):
            expect(not shared, f"N={n}: rank {rank}'s returned tensor"
                               + (f" (entry {entry})" if len(facts["shares"][rank]) > 1 else "")
                               + " is its input tensor itself (or a view of it), not a new "
                               "tensor: changing one changes the other (clone it)")


def _judge_reduce_scatter_kept(facts: Facts, n: int, shape: tuple[int, ...], seed: int = 0,
                               dtype: str = "float32") -> None:
    _judge_reduce_scatter(facts, n, shape, seed, dtype)
    _expect_input_kept(facts, n, _inputs(n, shape, seed, dtype), "reduce-scatter")


def _judge_all_gather(facts: Facts, n: int, shape: tuple[int, ...], seed: int = 0,
                      dtype: str = "float32") -> None:
    inputs = _inputs(n, shape, seed, dtype)
    for rank, (_tensor, got) in enumerate(facts["results"]):
        expect(isinstance(got, list) and len(got) == n,
               f"rank {rank} should return a list of {n} tensors, got {type_name(got)}"
               + (f" of length {len(got)}" if isinstance(got, list) else ""))
        for source in range(n):
            _expect_like(got[source], inputs[source],
                         f"N={n}, {dtype}: rank {rank}'s entry {source} (rank {source}'s "
                         "tensor)")


def _judge_new_tensors(facts: Facts, n: int, shape: tuple[int, ...], seed: int = 0,
                       dtype: str = "float32") -> None:
    _judge_all_gather(facts, n, shape, seed, dtype)
    _expect_input_kept(facts, n, _inputs(n, shape, seed, dtype), "all-gather")


def _values_case(name: str, exercise: str, judge_one: Callable[..., None],
                 runs: list[tuple], points: int = 2) -> Case:
    """``runs``: ``(N, shape)`` in float32, or ``(N, shape, dtype)``."""
    typed = [(run[0], run[1], run[2] if len(run) > 2 else "float32") for run in runs]

    def compute(impl: Impl) -> list[Facts]:
        return [_collective_facts(impl, exercise, n, shape, dtype=dtype)
                for n, shape, dtype in typed]

    def judge(all_facts: list[Facts]) -> None:
        for facts, (n, shape, dtype) in zip(all_facts, typed):
            judge_one(facts, n, shape, dtype=dtype)
    return Case(name, points, compute, judge)


def _judge_half_traffic(facts: Facts, n: int, want: int, what: str) -> None:
    for rank, stats in enumerate(facts["stats"]):
        expect(set(stats["sent_to"]) == {(rank + 1) % n} and stats["bytes_sent"] == want
               and stats["messages_sent"] == n - 1,
               f"rank {rank} sent {_count(stats['messages_sent'], 'message')}, "
               f"{stats['bytes_sent']} "
               f"bytes to {sorted(stats['sent_to'])}; a ring {what} sends N-1 = {n - 1} "
               f"messages, {want} bytes, to rank {(rank + 1) % n}")


def _half_traffic_case(name: str, points: int, exercise: str, judge_one: Callable[..., None],
                       what: str) -> Case:
    n, numel = 4, 1000

    def compute(impl: Impl) -> Facts:
        facts = _collective_facts(impl, exercise, n, (numel,))
        facts["meta"] = _meta_run(impl, exercise, 3, META_NUMEL)
        return facts

    def judge(facts: Facts) -> None:
        judge_one(facts, n, (numel,))
        per = numel // n if exercise == "1.4" else numel
        _judge_half_traffic(facts, n, (n - 1) * bytes_of(per), what)
        judge_waited(facts, n)
        meta = facts["meta"]
        expect(not meta["error"], f"on 3 ranks with a meta tensor of {META_NUMEL} elements "
                                  f"(shapes without data, what the lesson's figures and 1.7's "
                                  f"check run) {meta['error']}. Make every buffer where the "
                                  "input lives: torch.empty_like, tensor.new_empty(...), or "
                                  "device=tensor.device")
        expect(meta["run"]["carried_data"] is not True,
               "on meta tensors your function's messages carried data: it ran on real "
               "tensors made in the meta tensor's place, not on the one it was given")
        per = META_NUMEL // 3 if exercise == "1.4" else META_NUMEL
        try:  # the meta run sends what a real one does (a figure of nothing draws nothing)
            _judge_half_traffic(meta["run"], 3, 2 * bytes_of(per), what)
        except CheckFailure as exc:
            raise CheckFailure(f"on meta tensors (what the lesson's figures run): {exc}"
                               ) from None
    return Case(name + ", every message waited, meta tensors too", points, compute, judge)


META_NUMEL = 12  # the meta run's tensor: N = 3 chunks of 4


def _meta_run(impl: Impl, exercise: str, n: int, numel: int) -> Facts:
    """compute: the learner's half on meta tensors: ``error`` '' when it ran and returned
    meta tensors, else what went wrong; ``run`` the run's record (its messages)."""
    def program(comm: Any) -> str:
        got = impl(comm, torch.empty(numel, device="meta"))
        parts = got if isinstance(got, (list, tuple)) else [got]
        where = {str(p.device) for p in parts if isinstance(p, torch.Tensor)}
        return "" if where == {"meta"} else f"returned tensors on {sorted(where)}"

    try:
        with from_scratch(impl, exercise):
            result = run_spmd(program, uniform(n))
    except Exception as exc:  # noqa: BLE001 - reported to the judge as text
        if "meta" not in str(exc) and "device" not in str(exc):
            raise
        return {"error": f"your function raised {type(exc).__name__}: "
                         f"{str(exc).splitlines()[0]}"}
    return {"error": next((r for r in result.results if r), ""), "run": launch_facts(result)}


def _half_hidden(exercise: str, judge_one: Callable[..., None]) -> Case:
    def facts_of(impl: Impl, ex_id: str, n: int, numel: int, seed: int) -> Facts:
        return _collective_facts(impl, ex_id, n, (numel,), seed)

    def judge_hidden(facts: Facts, world_size: int, numel: int, seed: int) -> None:
        judge_one(facts, world_size, (numel,), seed)
        for rank, stats in enumerate(facts["stats"]):
            expect(stats["messages_sent"] == world_size - 1,
                   f"N={world_size}: rank {rank} sent "
                   f"{_count(stats['messages_sent'], 'message')}, not "
                   f"N-1 = {world_size - 1}")
    return _hidden_case(exercise, facts_of, judge_hidden, numel=(1, 30))
