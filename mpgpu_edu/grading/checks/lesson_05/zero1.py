"""Checks of exercise 5.2, ZeRO-1 Adam: against ``torch.optim.Adam`` on the whole parameter
vector with the *mean* gradient (its moments too: Adam's update hides a gradient's scale, its
moments do not), the caller's gradient left as it was, optimizer state per rank, and the bytes
of a reduce-scatter and an all-gather per step."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from mpgpu_edu.grading.checks._plain import is_tensor, type_name
from mpgpu_edu.grading.checks import _support
from mpgpu_edu.grading.checks._support import (bytes_of, expect, expect_close, launch_facts,
                                               run_spmd, uniform)

Impl = Callable[..., Any]


LR = 0.01


def _zero1_inputs(n: int, shard: int, steps: int, seed: int
                  ) -> tuple[torch.Tensor, list[list[torch.Tensor]]]:
    generator = torch.Generator().manual_seed(_support.secret_seed(seed))
    start = torch.randn(n * shard, generator=generator)
    grads = [[torch.randn(n * shard, generator=generator) for _ in range(n)]
             for _ in range(steps)]
    return start, grads


def _zero1_compute(impl: Impl, n: int, shard: int, steps: int, seed: int = 0
                   ) -> dict[str, Any]:
    start, grads = _zero1_inputs(n, shard, steps, seed)
    mine = [[grads[step][r] for step in range(steps)] for r in range(n)]  # rank r's gradients

    def program(comm: Any) -> dict[str, Any]:
        params, state, grads_after = start.clone(), {}, []
        for step in range(steps):
            grad = mine[comm.rank][step].clone()
            impl(comm, params, grad, state, LR)
            grads_after.append(grad.clone())  # the caller's gradient, as the step left it
        return {"params": params, "state": state, "grads_after": grads_after}

    return launch_facts(run_spmd(program, uniform(n), hide=[mine]))


def _zero1_reference(n: int, shard: int, steps: int, seed: int) -> tuple[torch.Tensor, dict]:
    start, grads = _zero1_inputs(n, shard, steps, seed)
    reference = start.clone().requires_grad_(True)
    optimizer = torch.optim.Adam([reference], lr=LR)
    for step in range(steps):
        reference.grad = torch.stack(grads[step]).mean(0)
        optimizer.step()
    return reference.detach(), optimizer.state[reference]


def _zero1_params(facts: dict, n: int, shard: int, steps: int, seed: int = 0) -> None:
    want, _ = _zero1_reference(n, shard, steps, seed)
    for rank, out in enumerate(facts["results"]):
        expect_close(out["params"], want, f"N={n}, {n * shard} parameters, {steps} steps: "
                                          f"rank {rank}'s parameters against "
                                          "torch.optim.Adam on the mean gradient")


def _zero1_keeps_grad(facts: dict, n: int, shard: int, steps: int, seed: int = 0) -> None:
    _, grads = _zero1_inputs(n, shard, steps, seed)
    for rank, out in enumerate(facts["results"]):
        for step, after in enumerate(out["grads_after"]):
            expect(torch.equal(after, grads[step][rank]),
                   f"N={n}: after step {step + 1}, rank {rank}'s grad is not what it passed in; "
                   "leave grad as it is (the caller may still need it) and reduce a copy, or "
                   "let reduce_scatter average")


def _zero1_moments(facts: dict, n: int, shard: int, steps: int, seed: int = 0) -> None:
    _, ref_state = _zero1_reference(n, shard, steps, seed)
    for rank, out in enumerate(facts["results"]):
        state = out["state"]
        expect(isinstance(state, dict), f"rank {rank}: state is a {type_name(state)}, not "
                                        "the dict it was given")
        for key, meaning in (("exp_avg", "first moment"), ("exp_avg_sq", "second moment")):
            expect(is_tensor(state.get(key)), f"rank {rank}'s state holds no tensor "
                                              f"{key!r} (Adam's {meaning}, as adam_update "
                                              "keeps it)")
            want = torch.tensor_split(ref_state[key], n)[rank]
            expect_close(state[key], want, f"N={n}, {steps} steps: rank {rank}'s {key} "
                                           f"against torch.optim.Adam's {key} of shard {rank} "
                                           "on the mean gradient")


def _zero1_state(facts: dict, n: int, shard: int, **_: Any) -> None:
    for rank, out in enumerate(facts["results"]):
        state = out["state"]
        expect(isinstance(state, dict), f"rank {rank}: state is a {type_name(state)}, not "
                                        "the dict it was given")
        held = sum(v.numel() for v in state.values() if is_tensor(v))
        expect(held == 2 * shard, f"rank {rank} keeps {held} numbers of optimizer state; "
                                  f"Adam's two moments for its shard of {shard} parameters are "
                                  f"{2 * shard} (1/{n} of the {2 * n * shard} plain Adam keeps)")


def _zero1_traffic(facts: dict, n: int, shard: int, steps: int, **rest: Any) -> None:
    _zero1_params(facts, n, shard, steps, rest.get("seed", 0))  # sending less is no answer
    want = steps * 2 * (n - 1) * bytes_of(shard)
    for rank, stats in enumerate(facts["stats"]):
        sent = stats["bytes_sent"]
        expect(sent <= want, f"rank {rank} sent {sent} bytes in {steps} steps; a "
                             f"reduce-scatter and an all-gather per step send {want}")


def _zero1_all(facts: dict, **example: Any) -> None:
    """The hidden case: values only (how much state a rank holds is seen only inside its
    process: the feedback case's)."""
    _zero1_params(facts, **example)
    _zero1_moments(facts, **example)


_ZERO1_VALUES = [dict(n=4, shard=3, steps=3), dict(n=1, shard=5, steps=2)]
