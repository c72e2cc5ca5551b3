"""Checks of exercises 6.2 (a swap) and 6.3 (a halo exchange), neither of which may deadlock:
the simulator detects a deadlock and names who waits for whom; the values are held to the
partners' tensors and to the smoothing done on one device, the traffic to one message per
partner or neighbour."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from mpgpu_edu.grading.checks import Case
from mpgpu_edu.grading.checks._support import (bytes_of, each, examples, expect, expect_close,
                                               from_scratch, launch_facts, run_spmd, uniform)
from mpgpu_edu.lessons import choosing_and_debugging as cd

Impl = Callable[..., Any]


# ---- 6.2 a swap that cannot deadlock -------------------------------------------------------

def _swap_inputs(partners: list[int], numel: int) -> list[torch.Tensor]:
    return [torch.full((numel,), float(rank)) for rank in range(len(partners))]


def _shares_memory(out: Any, given: torch.Tensor) -> bool:
    """Whether ``out`` is ``given`` or a view of its storage (not the new tensor promised)."""
    return (isinstance(out, torch.Tensor)
            and out.untyped_storage().data_ptr() == given.untyped_storage().data_ptr())


def _run_swap(impl: Impl, partners: list[int], numel: int = 6) -> dict[str, Any]:
    inputs = _swap_inputs(partners, numel)

    def program(comm: Any) -> dict[str, Any]:
        given = inputs[comm.rank].clone()
        out = impl(comm, given, partners[comm.rank])
        return {"got": out, "is_input": _shares_memory(out, given)}

    return launch_facts(run_spmd(program, uniform(len(partners))))


def _judge_swap(facts: dict[str, Any], partners: list[int], numel: int = 6) -> None:
    inputs = _swap_inputs(partners, numel)
    for rank, record in enumerate(facts["results"]):
        where = f"partners {partners}: rank {rank}"
        expect_close(record["got"], inputs[partners[rank]], f"{where}: what it got")
        alone = " (it has no partner)" if partners[rank] == rank else ""
        expect(not record["is_input"], f"{where}{alone} returned the tensor it was given "
                                       "(or a view of it), not a new tensor")


def _swap_case(name: str, points: int, pairings: list[list[int]]) -> Case:
    return Case(name, points, *each([{"partners": p} for p in pairings], _run_swap, _judge_swap))


_TRAFFIC_PARTNERS = [3, 2, 1, 0, 4]


def _judge_swap_traffic(facts: dict[str, Any]) -> None:
    _judge_swap(facts, _TRAFFIC_PARTNERS, 10)
    for rank, stats in enumerate(facts["stats"]):
        partner = _TRAFFIC_PARTNERS[rank]
        want = {} if partner == rank else {partner: bytes_of(10)}
        sent = {int(k): v for k, v in stats["sent_to"].items() if v}
        expect(sent == want, f"rank {rank} sent {sent} (bytes per peer), expected {want}")


def _random_pairings() -> list[dict[str, Any]]:
    import random

    out = []
    for e in examples(25, seed=62, n=(1, 6), lone=(0, 2), shuffle=(0, 1000)):
        order = list(range(e["n"]))
        random.Random(e["shuffle"]).shuffle(order)
        partners = list(range(e["n"]))
        paired = order[: e["n"] - min(e["lone"], e["n"])]
        for a, b in zip(paired[::2], paired[1::2]):
            partners[a], partners[b] = b, a
        out.append({"partners": partners})
    return out


# ---- 6.3 a halo exchange that cannot deadlock ------------------------------------------------

def _blocks(lengths: list[int], seed: int = 0) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(-8, 9, (k,), generator=generator).float() for k in lengths]


def _run_smooth(impl: Impl, lengths: list[int], steps: int, seed: int = 0) -> dict[str, Any]:
    blocks = _blocks(lengths, seed)

    def program(comm: Any) -> Any:
        return impl(comm, blocks[comm.rank].clone(), steps)

    with from_scratch(impl, "6.3"):
        return launch_facts(run_spmd(program, uniform(len(lengths))))


def _judge_smooth(facts: dict[str, Any], lengths: list[int], steps: int,
                  seed: int = 0) -> None:
    want = cd.smooth_on_one_device(_blocks(lengths, seed), steps)
    n = len(lengths)
    for rank, got in enumerate(facts["results"]):
        expect_close(got, want[rank], f"{n} rank(s), blocks of {lengths}, {steps} step(s): "
                                      f"rank {rank}'s block", rtol=1e-4, atol=1e-4)


def _smooth_case(name: str, points: int, cases: list[dict[str, Any]],
                 hidden: bool = False) -> Case:
    return Case(name, points, *each(cases, _run_smooth, _judge_smooth), hidden=hidden)


def _judge_smooth_traffic(facts: dict[str, Any], lengths: list[int], steps: int) -> None:
    _judge_smooth(facts, lengths, steps)
    n = len(lengths)
    for rank, stats in enumerate(facts["stats"]):
        want: dict[int, int] = {}
        for peer in ((rank - 1) % n, (rank + 1) % n):
            if peer != rank:
                want[peer] = want.get(peer, 0) + steps * bytes_of(1)
        sent = {int(k): v for k, v in stats["sent_to"].items() if v}
        expect(sent == want, f"{n} ranks, {steps} steps: rank {rank} sent {sent} (bytes per "
                             f"peer), expected one element to each neighbour per step: {want}")


_CHAIN = {"lengths": [2] * 7, "steps": 2}


def _judge_no_chain(facts: dict[str, Any]) -> None:
    _judge_smooth(facts, **_CHAIN)
    message = 1e-5 + bytes_of(1) / 1e9  # one message on the grader's cluster
    per_step = facts["makespan"] / _CHAIN["steps"]
    expect(per_step <= 4 * message,
           f"7 ranks: a step took {per_step * 1e6:.0f} us, {per_step / message:.1f} message "
           f"times, where a few should do whatever the world size: some ranks wait for "
           f"a chain of others before they can move")


def _random_rings() -> list[dict[str, Any]]:
    import random

    out = []
    for e in examples(20, seed=63, n=(2, 7), steps=(1, 3), seed_=(0, 999)):
        rng = random.Random(e["seed_"])
        out.append({"lengths": [rng.randint(1, 5) for _ in range(e["n"])],
                    "steps": e["steps"], "seed": e["seed_"]})
    return out
