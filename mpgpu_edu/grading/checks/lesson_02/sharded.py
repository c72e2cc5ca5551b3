"""Exercise 2.4: every rank a worker and the server of one shard. The judge rebuilds one SGD
step on the mean gradient and the bytes each rank sends each peer (its gradient's shard k to
rank k, its own updated shard to every rank)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from mpgpu_edu.grading.checks import Case
from mpgpu_edu.grading.checks._support import (bytes_of, compute_examples, counting_calls,
                                               examples, expect, expect_close, expect_waited,
                                               from_scratch, judge_examples, launch_facts,
                                               run_spmd)
from mpgpu_edu.grading.checks.lesson_02.steps import (LR, _one_step, judge_updates,
                                                      start_and_grads, tolerance)
from mpgpu_edu.grading.checks.lesson_02.training import _hidden_training

Impl = Callable[..., Any]


def _run_sharded(impl: Impl, n: int, numel: int, seed: int = 0, dtype: str = "float32"
                 ) -> dict:
    """compute: the learner's sharded step on every rank (the grader counts each rank's
    works, started and waited, from the run's record: ``works``)."""
    params, grads = start_and_grads(n, numel, seed, dtype)
    changed: list[Any] = [False] * n

    def program(comm: Any) -> torch.Tensor:
        mine, grad = params.clone(), grads[comm.rank].clone()
        impl(comm, mine, grad, LR)
        changed[comm.rank] = not torch.equal(grad, grads[comm.rank])
        return mine

    with from_scratch(impl, "2.4"), counting_calls(impl, ["sgd_update"]) as calls:
        facts = launch_facts(run_spmd(program, n, hide=[grads], collect=[changed]))
    facts["grad_changed"] = changed
    facts["updates"] = [calls["sgd_update"].count(r) for r in range(n)]
    return facts


def _judge_sharded_waits(facts: dict, n: int, numel: int) -> None:
    _judge_sharded(facts, n, numel)
    for rank, works in enumerate(facts["works"]):
        expect_waited(works, f"N={n}: rank {rank}")


def _judge_sharded_grad_kept(facts: dict, n: int) -> None:
    """Feedback only: whether a rank changed the caller's gradient is seen only in its own
    process (what it sent was right either way)."""
    for rank in range(n):
        expect(not facts["grad_changed"][rank],
               f"N={n}: rank {rank} changed the gradient it was handed (grad is the caller's): "
               "add the other ranks' shards into a tensor of your own, not into a view of "
               "grad")


def _judge_sharded_updates(facts: dict, n: int) -> None:
    """Feedback only: the calls of ``sgd_update`` are counted inside each rank's process."""
    for rank in range(n):
        judge_updates(facts["updates"][rank], 1, f"N={n}: rank {rank}")


def _judge_sharded(facts: dict, n: int, numel: int, seed: int = 0, dtype: str = "float32"
                   ) -> None:
    want = _one_step(n, numel, None, seed, dtype)
    for rank, got in enumerate(facts["results"]):
        expect_close(got, want, f"N={n}, {numel} parameters, {dtype}: rank {rank}'s parameters "
                                "after the step" + (" (kept to float64's precision: make "
                                "buffers with the parameters' dtype)" if tolerance(dtype)
                                else ""), *tolerance(dtype))
    sizes = [len(piece) for piece in torch.tensor_split(torch.arange(numel), n)]
    for rank, stats in enumerate(facts["stats"]):
        want_sent = {k: bytes_of(sizes[k] + sizes[rank], getattr(torch, dtype)) for k in range(n)
                     if k != rank and sizes[k] + sizes[rank] > 0}
        got_sent = {k: v for k, v in stats["sent_to"].items() if v}
        expect(got_sent == want_sent,
               f"N={n}, {numel} parameters (shards of {sizes} elements): rank {rank} should "
               f"send each rank k its gradient's shard k and its own updated shard "
               f"{rank}, {want_sent} bytes per peer; it sent {got_sent}")


def _hidden_sharded() -> Case:
    steps = examples(12, 3, world_size=(2, 6), numel=(1, 23), data=(0, 3))
    training = _hidden_training("2.4")

    def compute(impl: Impl) -> dict:
        def body(world_size: int, numel: int, data: int) -> dict:
            return _run_sharded(impl, world_size, numel, data)
        return {"steps": compute_examples(body, steps), "training": training[0](impl)}

    def judge(facts: dict) -> None:
        judge_examples(facts["steps"], lambda out, world_size, numel, data: _judge_sharded(
            out, world_size, numel, data))
        training[1](facts["training"])
    return compute, judge
