"""Checks of exercise 5.4, Megatron's MLP: against an unsplit MLP under autograd on the whole
weights (output, input gradient, each rank's shards of the weight gradients), also where x
feeds the loss outside the block too (a residual) or goes through the block twice, and the
bytes sent in the forward and in the backward (an all-reduce of S bytes on N ranks sends
2 (N - 1) S in all, whatever its algorithm)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.nn import functional as F

from mpgpu_edu.grading.checks import CheckFailure
from mpgpu_edu.grading.checks._plain import is_tensor
from mpgpu_edu.grading.checks import _support
from mpgpu_edu.grading.checks._support import (bytes_of, examples, expect, expect_close,
                                               launch_facts, run_spmd, uniform)

Impl = Callable[..., Any]


def _mlp_inputs(n: int, batch: list[int], d_in: int, hidden: int, d_out: int, bias: int,
                seed: int) -> dict[str, Any]:
    generator = torch.Generator().manual_seed(_support.secret_seed(seed))
    tensors = {"x": torch.randn(*batch, d_in, generator=generator),
               "w1": torch.randn(hidden, d_in, generator=generator) / d_in ** 0.5,
               "b1": torch.randn(hidden, generator=generator) if bias else None,
               "w2": torch.randn(d_out, hidden, generator=generator) / hidden ** 0.5,
               "b2": torch.randn(d_out, generator=generator) if bias else None,
               "dy": torch.randn(*batch, d_out, generator=generator)}
    tensors["residual"] = torch.randn(*batch, d_in, generator=generator)
    return tensors


REUSES = ("", "residual", "twice")  # x used by the block once; also outside it; by it twice


def _loss(out: torch.Tensor, again: torch.Tensor | None, x: torch.Tensor,
          t: dict[str, Any], reuse: str) -> torch.Tensor:
    """``(out * dy).sum()``, plus ``(x * residual).sum()`` with ``reuse="residual"`` (x
    reaches the loss outside the block too), plus ``(again * dy).sum()`` with ``"twice"``
    (the block's second output on the same x)."""
    loss = (out * t["dy"]).sum()
    if reuse == "residual":
        loss = loss + (x * t["residual"]).sum()
    if again is not None:
        loss = loss + (again * t["dy"]).sum()
    return loss


def _mlp_compute(impl: Impl, n: int, batch: list[int], d_in: int, hidden: int, d_out: int,
                 bias: int = 1, seed: int = 0, reuse: str = "") -> dict[str, Any]:
    t = _mlp_inputs(n, batch, d_in, hidden, d_out, bias, seed)
    # each rank's shards of the weights: its own (the full weights are in no rank's hands)
    shards = [{"w1": torch.tensor_split(t["w1"], n, 0)[r],
               "b1": torch.tensor_split(t["b1"], n)[r] if bias else None,
               "w2": torch.tensor_split(t["w2"], n, 1)[r]} for r in range(n)]

    def program(comm: Any, backward: bool) -> dict[str, Any]:
        own = shards[comm.rank]
        mine = {"x": t["x"].clone(), "w1": own["w1"].clone(),
                "b1": own["b1"].clone() if bias else None, "w2": own["w2"].clone(),
                "b2": t["b2"].clone() if bias else None}
        for leaf in mine.values():
            if leaf is not None:
                leaf.requires_grad_(True)
        out = impl(comm, mine["x"], mine["w1"], mine["b1"], mine["w2"], mine["b2"])
        record: dict[str, Any] = {"out": out}
        if not (isinstance(out, torch.Tensor) and out.requires_grad
                and out.shape == t["dy"].shape):
            record["no_backward"] = True
            return record
        if not backward:
            return record
        if not reuse:
            out.backward(t["dy"].clone())
        else:
            again = (impl(comm, mine["x"], mine["w1"], mine["b1"], mine["w2"], mine["b2"])
                     if reuse == "twice" else None)
            if again is not None and not (isinstance(again, torch.Tensor)
                                          and again.requires_grad):
                record["no_backward"] = True
                return record
            _loss(out, again, mine["x"], t, reuse).backward()
        record["grads"] = {name: (leaf.grad if leaf is not None else "no tensor")
                           for name, leaf in mine.items()}
        return record

    # Two runs, forward alone and forward with backward: the grader counts each one's bytes.
    return dict(launch_facts(run_spmd(program, uniform(n), True, hide=[shards])),
                forward_only=launch_facts(run_spmd(program, uniform(n), False,
                                                   hide=[shards])))


def _mlp_reference(n: int, batch: list[int], d_in: int, hidden: int, d_out: int,
                   bias: int, seed: int, reuse: str = ""
                   ) -> tuple[dict[str, Any], torch.Tensor, dict]:
    t = _mlp_inputs(n, batch, d_in, hidden, d_out, bias, seed)
    leaves = {k: v.clone().requires_grad_(True) for k, v in t.items()
              if k not in ("dy", "residual") and v is not None}

    def block() -> torch.Tensor:
        return F.linear(F.gelu(F.linear(leaves["x"], leaves["w1"], leaves.get("b1"))),
                        leaves["w2"], leaves.get("b2"))

    out = block()
    _loss(out, block() if reuse == "twice" else None, leaves["x"], t, reuse).backward()
    return t, out.detach(), {k: v.grad for k, v in leaves.items()}


def _where(n: int, batch: list[int], d_in: int, hidden: int, d_out: int, bias: int) -> str:
    return (f"N={n}, x {[*batch, d_in]}, {hidden} hidden features, {d_out} outputs"
            f"{'' if bias else ', no biases'}")


def _mlp_forward(facts: dict, n: int, batch: list[int], d_in: int, hidden: int, d_out: int,
                 bias: int = 1, seed: int = 0) -> None:
    _, want, _ = _mlp_reference(n, batch, d_in, hidden, d_out, bias, seed)
    where = _where(n, batch, d_in, hidden, d_out, bias)
    for rank, record in enumerate(facts["results"]):
        expect_close(record["out"], want, f"{where}: rank {rank}'s output against the unsplit "
                                          "MLP", rtol=1e-4, atol=1e-5)


def _backward_ran(record: dict, rank: int, where: str) -> None:
    expect(not record.get("no_backward"),
           f"{where}: rank {rank}'s output is not attached to the autograd graph of its "
           "inputs, so no backward can reach x and the shards")


def _after_backward(facts: dict, n: int, batch: list[int], d_in: int, hidden: int, d_out: int,
                    bias: int, seed: int) -> Iterator[tuple[int, dict, dict, str]]:
    """Each rank's record, once its backward is known to have run (rank by rank, so the
    first rank that fails is the one reported), with the unsplit MLP's gradients and the
    example in words: ``(rank, record, grads, where)``."""
    _, _, grads = _mlp_reference(n, batch, d_in, hidden, d_out, bias, seed)
    where = _where(n, batch, d_in, hidden, d_out, bias)
    for rank, record in enumerate(facts["results"]):
        _backward_ran(record, rank, where)
        yield rank, record, grads, where


def _mlp_input_grad(facts: dict, n: int, batch: list[int], d_in: int, hidden: int,
                    d_out: int, bias: int = 1, seed: int = 0) -> None:
    for rank, record, grads, where in _after_backward(facts, n, batch, d_in, hidden, d_out,
                                                      bias, seed):
        got = record["grads"]["x"]
        expect(is_tensor(got), f"{where}: after backward, rank {rank}'s x has no gradient")
        expect_close(got, grads["x"], f"{where}: rank {rank}'s x.grad against the unsplit "
                                      "MLP's input gradient", rtol=1e-4, atol=1e-5)


def _mlp_reused_input_grad(facts: dict, n: int, batch: list[int], d_in: int, hidden: int,
                           d_out: int, bias: int = 1, seed: int = 0, reuse: str = "") -> None:
    """x.grad where x reaches the loss outside the block too, or through it twice: only the
    block's own share of x's gradient is a sum over the ranks."""
    _, _, grads = _mlp_reference(n, batch, d_in, hidden, d_out, bias, seed, reuse)
    where = _where(n, batch, d_in, hidden, d_out, bias) + (
        ", the loss also adds x * r (a residual)" if reuse == "residual"
        else ", the block called twice on the same x")
    for rank, record in enumerate(facts["results"]):
        _backward_ran(record, rank, where)
        got = record["grads"]["x"]
        expect(is_tensor(got), f"{where}: after backward, rank {rank}'s x has no gradient")
        try:
            expect_close(got, grads["x"], f"{where}: rank {rank}'s x.grad against the "
                                          "unsplit MLP's", rtol=1e-4, atol=1e-5)
        except CheckFailure as exc:
            raise CheckFailure(f"{exc}. Only the block's own share of x's gradient is a sum "
                               "over the ranks: sum it in f's backward (an autograd.Function "
                               "on x inside the block), not in a hook on x, which gets all of "
                               "x's gradient") from None


def _mlp_weight_grads(facts: dict, n: int, batch: list[int], d_in: int, hidden: int,
                      d_out: int, bias: int = 1, seed: int = 0) -> None:
    for rank, record, grads, where in _after_backward(facts, n, batch, d_in, hidden, d_out,
                                                      bias, seed):
        wants = {"w1": torch.tensor_split(grads["w1"], n, 0)[rank],
                 "w2": torch.tensor_split(grads["w2"], n, 1)[rank]}
        if bias:
            wants["b1"] = torch.tensor_split(grads["b1"], n)[rank]
            wants["b2"] = grads["b2"]
        for name, want in wants.items():
            got = record["grads"][name]
            what = "the whole" if name == "b2" else f"shard {rank} of the"
            expect(is_tensor(got), f"{where}: after backward, rank {rank}'s {name} has no "
                                   f"gradient (expected {what} unsplit MLP's)")
            expect_close(got, want, f"{where}: rank {rank}'s {name}.grad against {what} "
                                    f"unsplit MLP's {name} gradient", rtol=1e-4, atol=1e-5)


def _one_all_reduce_each_way(facts: dict, n: int, batch: list[int], d_in: int, hidden: int,
                             d_out: int, bias: int = 1, seed: int = 0) -> None:
    _mlp_forward(facts, n, batch, d_in, hidden, d_out, bias, seed)
    where = _where(n, batch, d_in, hidden, d_out, bias)
    tokens = 1
    for size in batch:
        tokens *= size
    records = facts["results"]
    forward_sent = sum(s["bytes_sent"] for s in facts["forward_only"]["stats"])
    sent_in = {"forward": forward_sent,
               "backward": sum(s["bytes_sent"] for s in facts["stats"]) - forward_sent}
    for phase, numel, what in (("forward", tokens * d_out, "output"),
                               ("backward", tokens * d_in, "input's gradient")):
        if phase == "backward":
            for rank, record in enumerate(records):
                _backward_ran(record, rank, where)
        sent = sent_in[phase]
        one = 2 * (n - 1) * bytes_of(numel)
        if sent != one:
            count = f" ({sent / one:.2g} all-reduces' worth)" if one else ""
            raise CheckFailure(f"{where}: the {phase} sent {sent} bytes in all{count}; one "
                               f"all-reduce of the {bytes_of(numel)}-byte {what} sends "
                               f"2(N-1) x {bytes_of(numel)} = {one} on {n} ranks")


def _mlp_everything(facts: dict, **example: Any) -> None:
    _mlp_forward(facts, **example)
    _mlp_input_grad(facts, **example)
    _mlp_weight_grads(facts, **example)
    _one_all_reduce_each_way(facts, **example)


_MLP_MAIN = [dict(n=4, batch=[3], d_in=6, hidden=8, d_out=5),
             dict(n=2, batch=[4], d_in=3, hidden=6, d_out=2)]
_MLP_REUSED = [dict(n=4, batch=[3], d_in=6, hidden=8, d_out=5, reuse="residual"),
               dict(n=2, batch=[4], d_in=3, hidden=6, d_out=2, reuse="twice")]
_MLP_UNEVEN = [dict(n=4, batch=[2], d_in=5, hidden=7, d_out=3),
               dict(n=4, batch=[3], d_in=4, hidden=3, d_out=2),
               dict(n=3, batch=[2], d_in=3, hidden=4, d_out=3, bias=0)]


def _mlp_hidden_examples() -> list[dict[str, Any]]:
    drawn = examples(12, 54, n=(1, 5), b=(1, 3), t=(1, 3), d_in=(1, 6), hidden=(1, 12),
                     d_out=(1, 5), bias=(0, 1))
    return [dict(n=e["n"], batch=[e["b"], e["t"]] if e["t"] > 1 else [e["b"]],
                 d_in=e["d_in"], hidden=e["hidden"], d_out=e["d_out"], bias=e["bias"],
                 seed=i) for i, e in enumerate(drawn)]
