"""Checks of lesson 05: column-parallel linear, ZeRO-1 Adam, the DP x PP mesh.

Oracles: ``torch.nn.functional.linear`` on the whole weight, ``torch.optim.Adam`` on the
whole parameter vector with the mean gradient, ``mpgpu_edu.hybrid.Mesh`` for the groups.
Structure: FLOPs per rank from the simulator's compute events (1/N of the layer), bytes per
rank, optimizer state per rank.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from mpgpu_edu.grading.checks import Case, CheckFailure
from mpgpu_edu.grading.checks._support import (bytes_of, expect, expect_close, property_check,
                                               run_spmd, uniform)
from mpgpu_edu.hybrid import Mesh

Impl = Callable[..., Any]


# ---- 5.1 column-parallel linear -------------------------------------------------------------

def _run_column(impl: Impl, n: int, batch: int, d_in: int, k: int, bias: bool = True,
                seed: int = 0) -> Any:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, d_in, generator=generator)
    weight = torch.randn(n * k, d_in, generator=generator)
    b = torch.randn(n * k, generator=generator) if bias else None
    want = torch.nn.functional.linear(x, weight, b)

    def program(comm: Any) -> Any:
        rows = slice(comm.rank * k, (comm.rank + 1) * k)
        shard = weight[rows].clone()
        bias_shard = b[rows].clone() if b is not None else None
        with comm.compute("forward", "column-parallel linear"):
            return impl(comm, x.clone(), shard, bias_shard)

    result = run_spmd(program, uniform(n))
    for rank, got in enumerate(result.results):
        expect_close(got, want, f"N={n}, x {list(x.shape)}, W {list(weight.shape)}"
                                f"{'' if bias else ', no bias'}: rank {rank}'s output")
    return result


def _column_values(impl: Impl) -> None:
    _run_column(impl, 4, 3, 6, 2)
    _run_column(impl, 2, 5, 4, 3)
    _run_column(impl, 1, 2, 3, 4)


def _column_no_bias(impl: Impl) -> None:
    _run_column(impl, 3, 2, 5, 2, bias=False)


def _column_flops(impl: Impl) -> None:
    n, batch, d_in, k = 4, 8, 16, 4
    result = _run_column(impl, n, batch, d_in, k)
    share = 2 * batch * d_in * k
    for rank in range(n):
        flops = sum(e.flops for e in result.trace.on(rank, "compute"))
        expect(flops <= 1.5 * share,
               f"rank {rank} spent {flops:.0f} FLOPs; its slice of the layer is {share} "
               f"(1/{n} of {n * share}): compute only this rank's output features")


def _column_traffic(impl: Impl) -> None:
    n, batch, d_in, k = 4, 8, 16, 4
    result = _run_column(impl, n, batch, d_in, k)
    want = (n - 1) * bytes_of(batch * k)
    for rank, sent in enumerate(result.bytes_sent_per_rank):
        expect(sent <= want, f"rank {rank} sent {sent} bytes; all-gathering the output "
                             f"slices (N-1 of {bytes_of(batch * k)} bytes) takes {want}")


def _column_property(impl: Impl) -> None:
    from hypothesis import strategies as st

    def body(world_size: int, batch: int, d_in: int, k: int, bias: bool) -> None:
        _run_column(impl, world_size, batch, d_in, k, bias)

    property_check(body, world_size=st.integers(1, 4), batch=st.integers(1, 4),
                   d_in=st.integers(1, 5), k=st.integers(1, 3), bias=st.booleans())


# ---- 5.2 ZeRO-1 ----------------------------------------------------------------------------------

LR = 0.01


def _run_zero1(impl: Impl, n: int, shard: int, steps: int, seed: int = 0) -> Any:
    numel = n * shard
    generator = torch.Generator().manual_seed(seed)
    start = torch.randn(numel, generator=generator)
    grads = [[torch.randn(numel, generator=generator) for _ in range(n)] for _ in range(steps)]

    def program(comm: Any) -> tuple[torch.Tensor, dict]:
        params, state = start.clone(), {}
        for step in range(steps):
            impl(comm, params, grads[step][comm.rank].clone(), state, LR)
        return params, state

    result = run_spmd(program, uniform(n))
    reference = start.clone().requires_grad_(True)
    optimizer = torch.optim.Adam([reference], lr=LR)
    for step in range(steps):
        reference.grad = torch.stack(grads[step]).mean(0)
        optimizer.step()
    for rank, (params, _) in enumerate(result.results):
        expect_close(params, reference.detach(), f"N={n}, {numel} parameters, {steps} steps: "
                                                 f"rank {rank}'s parameters against "
                                                 "torch.optim.Adam on the mean gradient")
    return result


def _zero1_values(impl: Impl) -> None:
    _run_zero1(impl, 4, 3, 3)
    _run_zero1(impl, 1, 5, 2)


def _zero1_state(impl: Impl) -> None:
    n, shard = 4, 5
    result = _run_zero1(impl, n, shard, 2)
    for rank, (_, state) in enumerate(result.results):
        expect(isinstance(state, dict), f"rank {rank}: state should stay a dict")
        tensors = [v for v in state.values() if isinstance(v, torch.Tensor)]
        held = sum(t.numel() for t in tensors)
        expect(held == 2 * shard, f"rank {rank} keeps {held} numbers of optimizer state; "
                                  f"Adam's two moments for its shard of {shard} parameters are "
                                  f"{2 * shard} (1/{n} of the {2 * n * shard} plain Adam keeps)")


def _zero1_traffic(impl: Impl) -> None:
    n, shard, steps = 4, 6, 2
    result = _run_zero1(impl, n, shard, steps)
    want = steps * 2 * (n - 1) * bytes_of(shard)
    for rank, sent in enumerate(result.bytes_sent_per_rank):
        expect(sent <= want, f"rank {rank} sent {sent} bytes in {steps} steps; a "
                             f"reduce-scatter and an all-gather per step send {want}")


def _zero1_property(impl: Impl) -> None:
    from hypothesis import strategies as st

    property_check(lambda world_size, shard, steps: _run_zero1(impl, world_size, shard, steps),
                   max_examples=15, world_size=st.integers(1, 4), shard=st.integers(1, 4),
                   steps=st.integers(1, 3))


# ---- 5.3 the mesh --------------------------------------------------------------------------------

def _reference_groups(world_size: int, pp_size: int) -> tuple[list, list]:
    mesh = Mesh(world_size // pp_size, pp_size)
    return ([mesh.replica_ranks(d) for d in range(mesh.dp)],
            [mesh.stage_ranks(s) for s in range(mesh.pp)])


def _groups_agree(impl: Impl, world_size: int, pp_size: int) -> None:
    got = impl(world_size, pp_size)
    want = _reference_groups(world_size, pp_size)
    got = tuple(got) if isinstance(got, list) else got
    expect(got == want, f"hybrid_groups({world_size}, {pp_size}) returned {got}, expected "
                        f"{want} (pipeline groups, data groups)")


def _groups_cases(examples: list[tuple[int, int]]) -> Callable[[Impl], None]:
    def run(impl: Impl) -> None:
        for world_size, pp_size in examples:
            _groups_agree(impl, world_size, pp_size)
    return run


def _groups_bad(impl: Impl) -> None:
    for world_size, pp_size in [(6, 4), (4, 0)]:
        try:
            got = impl(world_size, pp_size)
        except ValueError:
            continue
        raise CheckFailure(f"hybrid_groups({world_size}, {pp_size}) returned {got}; raise "
                           "ValueError when pp_size does not divide world_size")


def _groups_property(impl: Impl) -> None:
    from hypothesis import strategies as st

    property_check(lambda replicas, pp_size: _groups_agree(impl, replicas * pp_size, pp_size),
                   replicas=st.integers(1, 4), pp_size=st.integers(1, 4))


CASES: dict[str, list[Case]] = {
    "5.1": [
        Case("the full output on every rank", 2, _column_values),
        Case("without a bias", 1, _column_no_bias),
        Case("each rank computes 1/N of the FLOPs", 1, _column_flops),
        Case("traffic: an all-gather of the output", 1, _column_traffic),
        Case("hidden: random shapes", 1, _column_property, hidden=True),
    ],
    "5.2": [
        Case("matches torch.optim.Adam on the mean gradient", 3, _zero1_values),
        Case("optimizer state per rank is 1/N", 2, _zero1_state),
        Case("traffic: a reduce-scatter and an all-gather", 2, _zero1_traffic),
        Case("hidden: random sizes", 1, _zero1_property, hidden=True),
    ],
    "5.3": [
        Case("the docstring's example", 1, _groups_cases([(4, 2)])),
        Case("8 ranks as 2 x 4 and 4 x 2; 1 stage; 1 replica", 1,
             _groups_cases([(8, 4), (8, 2), (3, 1), (3, 3)])),
        Case("pp_size must divide world_size", 1, _groups_bad),
        Case("hidden: random meshes", 1, _groups_property, hidden=True),
    ],
}
