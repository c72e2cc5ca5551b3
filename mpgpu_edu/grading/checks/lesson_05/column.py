"""Checks of exercise 5.1, the column-parallel linear: the full output on every rank against
``torch.nn.functional.linear`` (its dtype too: float64 in, float64 out), the caller's tensors
left as they were, 1/N of the FLOPs per rank (the simulator's compute events), and no more
traffic than an all-gather of the output."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.nn import functional as F

from mpgpu_edu.grading.checks import _support
from mpgpu_edu.grading.checks._support import (bytes_of, expect, expect_close, launch_facts,
                                               run_spmd, uniform)

Impl = Callable[..., Any]


def _column_inputs(n: int, batch: int, d_in: int, k: int, bias: int, seed: int = 0,
                   dtype: str = "float32"
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    generator = torch.Generator().manual_seed(_support.secret_seed(seed))
    kind = getattr(torch, dtype)
    x = torch.randn(batch, d_in, generator=generator, dtype=kind)
    weight = torch.randn(n * k, d_in, generator=generator, dtype=kind)
    b = torch.randn(n * k, generator=generator, dtype=kind) if bias else None
    return x, weight, b


def _column_compute(impl: Impl, n: int, batch: int, d_in: int, k: int, bias: int = 1,
                    seed: int = 0, dtype: str = "float32") -> dict[str, Any]:
    x, weight, b = _column_inputs(n, batch, d_in, k, bias, seed, dtype)
    weights = [weight[r * k:(r + 1) * k] for r in range(n)]  # each rank's rows: its own
    biases = [b[r * k:(r + 1) * k] if b is not None else None for r in range(n)]

    def program(comm: Any) -> dict[str, Any]:
        given = {"x": x.clone(), "weight_shard": weights[comm.rank].clone(),
                 "bias_shard": (biases[comm.rank].clone() if biases[comm.rank] is not None
                                else None)}
        with comm.compute("forward", "column-parallel linear"):
            out = impl(comm, given["x"], given["weight_shard"], given["bias_shard"])
        # the caller's tensors as the function left them (the judge compares)
        return {"out": out, "after": {name: t.detach().clone() for name, t in given.items()
                                      if t is not None}}

    result = run_spmd(program, uniform(n), hide=[weights, biases])
    facts = launch_facts(result)
    facts["flops"] = [float(sum(e.flops for e in result.trace.on(r, "compute")))
                      for r in range(n)]
    return facts


def _column_values(facts: dict, n: int, batch: int, d_in: int, k: int, bias: int = 1,
                   seed: int = 0, dtype: str = "float32") -> None:
    x, weight, b = _column_inputs(n, batch, d_in, k, bias, seed, dtype)
    want = F.linear(x, weight, b)
    where = (f"N={n}, x {list(x.shape)}, W {list(weight.shape)}{'' if bias else ', no bias'}"
             f"{'' if dtype == 'float32' else ', ' + dtype}")
    for rank, record in enumerate(facts["results"]):
        got = record["out"]
        expect_close(got, want, f"{where}: rank {rank}'s output")
        expect(got.dtype == want.dtype,
               f"{where}: rank {rank} returned {str(got.dtype).removeprefix('torch.')} for "
               f"{dtype} inputs; return the unsplit layer's dtype, which is the inputs' "
               "(no cast)")


def _column_keeps(facts: dict, n: int, batch: int, d_in: int, k: int, bias: int = 1,
                  seed: int = 0, dtype: str = "float32") -> None:
    """The output (in the inputs' dtype), and the caller's tensors as they were passed."""
    _column_values(facts, n, batch, d_in, k, bias, seed, dtype)
    x, weight, b = _column_inputs(n, batch, d_in, k, bias, seed, dtype)
    where = f"N={n}, x {list(x.shape)}, W {list(weight.shape)}, {dtype}"
    for rank, record in enumerate(facts["results"]):
        rows = slice(rank * k, (rank + 1) * k)
        given = {"x": x, "weight_shard": weight[rows], "bias_shard": b[rows] if bias else None}
        for name, before in given.items():
            if before is not None:
                expect(torch.equal(record["after"][name], before),
                       f"{where}: after the call, rank {rank}'s {name} no longer holds what "
                       "the caller passed in; compute on new tensors and leave the caller's "
                       "as they were")


def _column_flops(facts: dict, n: int, batch: int, d_in: int, k: int, **example: Any) -> None:
    _column_values(facts, n, batch, d_in, k, **example)
    share = 2 * batch * d_in * k
    for rank, flops in enumerate(facts["flops"]):
        expect(flops <= 1.5 * share,
               f"rank {rank} spent {flops:.0f} FLOPs; its slice of the layer is {share} "
               f"(1/{n} of {n * share})")


def _column_traffic(facts: dict, n: int, batch: int, d_in: int, k: int,
                    **example: Any) -> None:
    _column_values(facts, n, batch, d_in, k, **example)
    want = (n - 1) * bytes_of(batch * k)
    for rank, stats in enumerate(facts["stats"]):
        sent = stats["bytes_sent"]
        expect(sent <= want, f"rank {rank} sent {sent} bytes; all-gathering the output "
                             f"slices (N-1 of {bytes_of(batch * k)} bytes) takes {want}")


_COLUMN_SHAPES = [dict(n=4, batch=3, d_in=6, k=2), dict(n=2, batch=5, d_in=4, k=3),
                  dict(n=1, batch=2, d_in=3, k=4), dict(n=3, batch=2, d_in=5, k=2, bias=0)]
_COLUMN_KEEPS = [dict(n=4, batch=3, d_in=6, k=2), dict(n=2, batch=3, d_in=4, k=2, bias=0),
                 dict(n=2, batch=3, d_in=4, k=2, dtype="float64")]
_COLUMN_BIG = [dict(n=4, batch=8, d_in=16, k=4)]
