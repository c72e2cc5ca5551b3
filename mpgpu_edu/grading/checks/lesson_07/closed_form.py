"""Checks of exercise 7.2: the hierarchical all-reduce's closed form, against
``collectives.cost.hierarchical_allreduce_time``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mpgpu_edu.collectives import cost
from mpgpu_edu.grading.checks import CheckFailure
from mpgpu_edu.grading.checks._plain import type_name
from mpgpu_edu.grading.checks._support import examples, expect

Impl = Callable[..., Any]


def _form_compute(impl: Impl, nodes: int, per_node: int, nbytes: float, alphas: tuple,
                  betas: tuple) -> Any:
    return impl(nodes, per_node, nbytes, alphas[0], betas[0], alphas[1], betas[1])


def _form_agree(got: Any, nodes: int, per_node: int, nbytes: float, alphas: tuple,
                betas: tuple) -> None:
    want = cost.hierarchical_allreduce_time(nodes, per_node, nbytes, alphas[0], betas[0],
                                            alphas[1], betas[1])
    expect(isinstance(got, (int, float)) and not isinstance(got, bool),
           f"expected a number of seconds, got {type_name(got)}")
    # judge_examples names the example (nodes, per_node, nbytes, alphas, betas) once
    expect(abs(got - want) <= 1e-9 * max(want, 1e-30),
           f"expected {want:.6g} s, got {got:.6g} s"
           + _diagnosis(got, nodes, per_node, nbytes, alphas, betas))


def _diagnosis(got: float, nodes: int, per_node: int, nbytes: float, alphas: tuple,
               betas: tuple) -> str:
    """Name the usual slip when ``got`` equals it: the rail's all-reduce charged for the whole
    tensor, or for its chunk without splitting it over the nodes; a ring phase counted once
    where the ring all-reduce has two (reduce-scatter, then all-gather)."""
    (a, a2), (b, b2) = alphas, betas
    g, m, s = per_node, nodes, nbytes
    inside = 2 * (g - 1) * (a + s / (g * b))
    rail = 2 * (m - 1) * (a2 + s / (g * m * b2))
    slips = [
        (inside + 2 * (m - 1) * (a2 + s / (m * b2)),
         "your network term moves the whole tensor across; each rail's all-reduce carries "
         "only its node's chunk, S / per_node, so its ring steps move S / (per_node x nodes)"),
        (inside + 2 * (m - 1) * (a2 + s / (g * b2)),
         "your network term moves the node's whole chunk in every ring step; a ring over the "
         "M nodes splits that chunk M ways, so each step moves S / (per_node x nodes)"),
        ((inside + rail) / 2,
         "half the expected time: a ring all-reduce is two phases of N-1 steps (reduce-"
         "scatter, then all-gather), 2(N-1) steps in all, inside the node and on the rail"),
        (inside / 2 + rail,
         "your NVLink term counts G-1 steps; phases 1 and 3 are G-1 steps each, 2(G-1) in "
         "all"),
        (inside + rail / 2,
         "your network term counts M-1 steps; the rail's ring all-reduce takes 2(M-1)"),
    ]
    if not isinstance(got, (int, float)) or per_node < 2 or nodes < 2:
        return ""
    for value, why in slips:
        if abs(got - value) <= 1e-9 * abs(value):
            return f": {why}"
    return ""


_FORM_MAIN = [dict(nodes=2, per_node=8, nbytes=2.0**28, alphas=(3e-6, 8e-6),
                   betas=(370e9, 47e9)),
              dict(nodes=4, per_node=2, nbytes=1e6, alphas=(1e-5, 1e-4), betas=(1e9, 1e8)),
              dict(nodes=1, per_node=4, nbytes=1e6, alphas=(1e-5, 1e-4), betas=(1e9, 1e8)),
              dict(nodes=3, per_node=1, nbytes=1e6, alphas=(1e-5, 1e-4), betas=(1e9, 1e8))]


def _judge_forms_hidden(records: list[dict]) -> None:
    """*judge* of 7.2's hidden case: the first failing example by its shape only (its size
    and links stay hidden, and are not printed twice)."""
    for i, record in enumerate(records):
        try:
            _form_agree(record["out"], **record["example"])
        except AssertionError as exc:
            e = record["example"]
            raise CheckFailure(f"fails on hidden example {i + 1} of {len(records)} "
                               f"({e['nodes']} nodes x {e['per_node']} GPUs; its size and "
                               f"links stay hidden): {exc}") from None


def _form_examples() -> list[dict[str, Any]]:
    drawn = examples(12, 72, nodes=(1, 6), per_node=(1, 8), kib=(1, 2**20), a=(1, 50),
                     b=(1, 400))
    return [dict(nodes=e["nodes"], per_node=e["per_node"], nbytes=float(e["kib"] * 1024),
                 alphas=(e["a"] * 1e-6, e["a"] * 3e-6), betas=(e["b"] * 1e9, e["b"] * 1e8))
            for e in drawn]
