"""Checks of lesson 06: choosing a strategy that fits, and a swap that cannot deadlock.

Oracle for the choice: ``estimate_memory`` against ``Cluster.capacity_bytes``, in the order
the docstring gives. The swap runs on the simulator, which detects a deadlock and names the
ranks that wait on each other.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from mpgpu_edu.cluster import Cluster
from mpgpu_edu.grading.checks import Case
from mpgpu_edu.grading.checks._support import (bytes_of, expect, expect_close, property_check,
                                               run_spmd, uniform)
from mpgpu_edu.memory import estimate_memory

Impl = Callable[..., Any]
GPT2_SMALL, LLAMA_7B, LLAMA_13B = 124_439_808, 6_738_415_616, 13_015_864_320


def _reference_choice(n_params: int, cluster: Cluster, optimizer: str, precision: str,
                      activations_bytes: int) -> str:
    n = cluster.world_size
    for strategy in (["single"] if n == 1 else ["dp", "zero1", "zero2", "zero3"]):
        if estimate_memory(n_params, optimizer, precision, strategy, n,
                           activations_bytes).fits(cluster.capacity_bytes(0)):
            return strategy
    return "none"


def _choice_agrees(impl: Impl, n_params: int, preset: str, visible: str | None = None,
                   optimizer: str = "adam", precision: str = "mixed",
                   activations_bytes: int = 0) -> None:
    cluster = Cluster.preset(preset, visible=visible)
    got = impl(n_params, cluster, optimizer, precision, activations_bytes)
    want = _reference_choice(n_params, cluster, optimizer, precision, activations_bytes)
    where = preset + (f" with CUDA_VISIBLE_DEVICES={visible}" if visible is not None else "")
    expect(got == want, f"{n_params:.3g} parameters, {optimizer} {precision}, "
                        f"{activations_bytes} activation bytes, on {where}: you chose {got!r}, "
                        f"expected {want!r}")


def _choice_cases(examples: list[tuple[Any, ...]]) -> Callable[[Impl], None]:
    def run(impl: Impl) -> None:
        for example in examples:
            _choice_agrees(impl, *example)
    return run


def _choice_property(impl: Impl) -> None:
    from hypothesis import strategies as st

    presets = ["4xRTX4090-pcie", "8xRTX4090-pcie", "8xA100-nvlink", "4xH100-nvswitch"]

    def body(exponent: float, preset: str, devices: int, fp32: bool, activations: int) -> None:
        visible = ",".join(str(i) for i in range(devices))
        _choice_agrees(impl, int(10 ** exponent), preset, visible,
                       precision="fp32" if fp32 else "mixed",
                       activations_bytes=activations * 2**30)

    property_check(body, max_examples=40, exponent=st.floats(6, 11), preset=st.sampled_from(
        presets), devices=st.integers(1, 4), fp32=st.booleans(), activations=st.integers(0, 8))


# ---- 6.2 a swap that cannot deadlock -------------------------------------------------------

def _run_swap(impl: Impl, partners: list[int], numel: int = 6) -> Any:
    n = len(partners)
    inputs = [torch.full((numel,), float(rank)) for rank in range(n)]

    def program(comm: Any) -> Any:
        return impl(comm, inputs[comm.rank].clone(), partners[comm.rank])

    result = run_spmd(program, uniform(n))
    for rank, got in enumerate(result.results):
        expect_close(got, inputs[partners[rank]], f"partners {partners}: what rank {rank} got")
    return result


def _swap_cases(pairings: list[list[int]]) -> Callable[[Impl], None]:
    def run(impl: Impl) -> None:
        for partners in pairings:
            _run_swap(impl, partners)
    return run


def _swap_traffic(impl: Impl) -> None:
    partners = [3, 2, 1, 0, 4]
    result = _run_swap(impl, partners, numel=10)
    for rank, stats in enumerate(result.stats):
        want = {} if partners[rank] == rank else {partners[rank]: bytes_of(10)}
        expect(dict(stats.sent_to) == want, f"rank {rank} sent {dict(stats.sent_to)} (bytes "
                                            f"per peer), expected {want}")


def _swap_property(impl: Impl) -> None:
    from hypothesis import strategies as st

    def body(order: list[int], lone: int) -> None:
        partners = list(range(len(order)))
        paired = order[: len(order) - min(lone, len(order))]
        for a, b in zip(paired[::2], paired[1::2]):
            partners[a], partners[b] = b, a
        _run_swap(impl, partners)

    property_check(body, max_examples=25,
                   order=st.integers(1, 6).flatmap(lambda n: st.permutations(range(n))),
                   lone=st.integers(0, 2))


CASES: dict[str, list[Case]] = {
    "6.1": [
        Case("one device: single, or none", 1,
             _choice_cases([(GPT2_SMALL, "4xRTX4090-pcie", "0"),
                            (LLAMA_7B, "4xRTX4090-pcie", "0")])),
        Case("data parallel when a replica fits", 1,
             _choice_cases([(GPT2_SMALL, "8xA100-nvlink"), (GPT2_SMALL, "4xRTX4090-pcie")])),
        Case("ZeRO when it does not (7B on 8 GPUs)", 1,
             _choice_cases([(LLAMA_7B, "8xA100-nvlink"), (LLAMA_7B, "8xRTX4090-pcie"),
                            (LLAMA_13B, "8xRTX4090-pcie"), (LLAMA_13B, "8xA100-nvlink")])),
        Case("activations and fp32 count too", 1,
             _choice_cases([(LLAMA_7B, "8xA100-nvlink", None, "adam", "mixed", 50 * 2**30),
                            (LLAMA_7B, "8xH100-nvswitch", None, "adam", "fp32", 0),
                            (GPT2_SMALL, "4xRTX4090-pcie", "1,2", "sgd", "fp32", 0)])),
        Case("hidden: random models and clusters", 1, _choice_property, hidden=True),
    ],
    "6.2": [
        Case("two ranks swap", 1, _swap_cases([[1, 0]])),
        Case("pairs and a rank alone", 1, _swap_cases([[1, 0, 3, 2, 4], [0]])),
        Case("any pairing, e.g. ranks 1 and 3", 1, _swap_cases([[0, 3, 2, 1], [3, 2, 1, 0]])),
        Case("traffic: one message to the partner", 1, _swap_traffic),
        Case("hidden: random pairings", 1, _swap_property, hidden=True),
    ],
}
