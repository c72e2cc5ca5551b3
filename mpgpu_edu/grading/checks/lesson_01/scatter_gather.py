"""Checks of exercises 1.4 (ring reduce-scatter) and 1.5 (ring all-gather): what each rank's
input and returned value are afterwards, whether a returned tensor is a new one, and the
N-1 messages each rank sends to its right neighbour."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from mpgpu_edu.grading.checks import Case
from mpgpu_edu.grading.checks._plain import is_tensor, type_name
from mpgpu_edu.grading.checks._support import (bytes_of, expect, expect_close, from_scratch,
                                               launch_facts, rank_inputs, run_spmd, uniform)
from mpgpu_edu.grading.checks.lesson_01.all_reduce import (_count, _hidden_case, _runs_case,
                                                           judge_waited)

Impl = Callable[..., Any]
Facts = dict[str, Any]


def _collective_facts(impl: Impl, exercise: str, n: int, shape: tuple[int, ...],
                      seed: int = 0) -> Facts:
    """compute: what each rank's input and returned value are afterwards, and (``shares``)
    whether each returned tensor shares memory with the rank's input tensor."""
    inputs = _inputs(n, shape, seed)
    shares: list[Any] = [None] * n

    def program(comm: Any) -> tuple[torch.Tensor, Any]:
        tensor = inputs[comm.rank].clone()
        got = impl(comm, tensor)
        parts = got if isinstance(got, (list, tuple)) else [got]
        shares[comm.rank] = [isinstance(p, torch.Tensor) and _same_memory(p, tensor)
                             for p in parts]
        return tensor, got

    with from_scratch(impl, exercise):
        result = run_spmd(program, uniform(n))
    facts = launch_facts(result)
    facts["shares"] = shares
    return facts


def _same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def _inputs(n: int, shape: tuple[int, ...], seed: int) -> list[torch.Tensor]:
    numel = 1
    for dim in shape:
        numel *= dim
    return [t.reshape(shape) for t in rank_inputs(n, numel, seed)]


def _judge_reduce_scatter(facts: Facts, n: int, shape: tuple[int, ...], seed: int = 0) -> None:
    inputs = _inputs(n, shape, seed)
    chunks = torch.tensor_split(torch.stack(inputs).sum(0).reshape(-1), n)
    for rank, (tensor, got) in enumerate(facts["results"]):
        expect(is_tensor(tensor) and torch.equal(tensor, inputs[rank]),
               f"N={n}: rank {rank}'s input tensor was changed; reduce-scatter must leave it "
               "as it was")
        expect_close(got, chunks[rank], f"N={n}, shape {list(shape)}, rank {rank}'s chunk")


def _judge_all_gather(facts: Facts, n: int, shape: tuple[int, ...], seed: int = 0) -> None:
    inputs = _inputs(n, shape, seed)
    for rank, (tensor, got) in enumerate(facts["results"]):
        expect(is_tensor(tensor) and torch.equal(tensor, inputs[rank]),
               f"rank {rank}'s input tensor was changed")
        expect(isinstance(got, list) and len(got) == n,
               f"rank {rank} should return a list of {n} tensors, got {type_name(got)}"
               + (f" of length {len(got)}" if isinstance(got, list) else ""))
        for source in range(n):
            expect_close(got[source], inputs[source],
                         f"N={n}: rank {rank}'s entry {source} (rank {source}'s tensor)")


def _judge_new_tensors(facts: Facts, n: int, shape: tuple[int, ...], seed: int = 0) -> None:
    _judge_all_gather(facts, n, shape, seed)
    for rank, shares in enumerate(facts["shares"]):
        for entry, shared in enumerate(shares):
            expect(not shared, f"N={n}: rank {rank}'s entry {entry} is its input tensor itself "
                               f"(or a view of it), not a new tensor: changing one changes "
                               f"the other")


def _values_case(name: str, exercise: str, judge_one: Callable[..., None],
                 runs: list[tuple[int, tuple[int, ...]]], points: int = 2) -> Case:
    return _runs_case(name, points, exercise, runs, _collective_facts, judge_one)


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
        return _collective_facts(impl, exercise, n, (numel,))

    def judge(facts: Facts) -> None:
        judge_one(facts, n, (numel,))
        per = numel // n if exercise == "1.4" else numel
        _judge_half_traffic(facts, n, (n - 1) * bytes_of(per), what)
        judge_waited(facts, n)
    return Case(name + ", every message waited", points, compute, judge)


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
