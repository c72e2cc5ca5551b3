"""Checks of exercises 6.2 (a swap) and 6.3 (a halo exchange), neither of which may deadlock:
the simulator detects a deadlock and names who waits for whom; the values are held to the
partners' tensors (bit for bit, every digit printed) and to the smoothing done on one device
(in the input's dtype, as a new tensor also after 0 steps, the caller's left unchanged), the
traffic to one message per partner or neighbour. From the grader's record of the run: 6.2
posts no ``isend``/``irecv`` (blocking calls only), neither leaves a work unwaited, and a
``comm.barrier()`` (its empty messages carry reserved tags) is named as such."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from mpgpu_edu.comm.base import RESERVED_TAG
from mpgpu_edu.grading.checks import Case, _support
from mpgpu_edu.grading.checks._support import (bytes_of, each, examples, expect, expect_close,
                                               from_scratch, launch_facts, run_spmd, uniform)
from mpgpu_edu.lessons import choosing_and_debugging as cd

Impl = Callable[..., Any]


# ---- what both exchanges share -------------------------------------------------------------

def _shares_memory(out: Any, given: torch.Tensor) -> bool:
    """Whether ``out`` is ``given`` or a view of its storage (not the new tensor promised)."""
    return (isinstance(out, torch.Tensor)
            and out.untyped_storage().data_ptr() == given.untyped_storage().data_ptr())


def _dtype(tensor: torch.Tensor) -> str:
    return str(tensor.dtype).removeprefix("torch.")


def _barrier_ranks(facts: dict[str, Any]) -> list[int]:
    """The ranks that sent a ``comm.barrier()``'s messages (the only ones with reserved tags),
    read from the grader's timeline; [] without one."""
    found = set()
    for event in facts.get("trace", {}).get("events", []):
        words = str(event.get("label", "")).split()
        if (event.get("kind") == "send" and len(words) == 2 and words[0] == "tag"
                and words[1].isdigit() and int(words[1]) >= RESERVED_TAG):
            found.add(int(event["device"]))
    return sorted(found)


def _judge_no_barrier(facts: dict[str, Any], what: str) -> None:
    ranks = _barrier_ranks(facts)
    expect(not ranks, f"rank {ranks[0] if ranks else 0} called comm.barrier() (its empty "
                      f"messages are in the run): {what} needs no barrier, its own messages "
                      "are all the waiting it must do; remove it")


def _judge_all_waited(facts: dict[str, Any]) -> None:
    for rank, works in enumerate(facts["works"]):
        for kind in ("isend", "irecv"):
            left = works[f"{kind}_unwaited"]
            expect(not left, f"rank {rank} never waited on {left} of its {kind} works: call "
                             f".wait() on every work that {kind} returns before the rank moves "
                             "on (until then its buffer may still be in use)")


# ---- 6.2 a swap that cannot deadlock -------------------------------------------------------

def _swap_inputs(partners: list[int], numel: int, shape: list[int] | None = None,
                 dtype: str = "float32") -> list[torch.Tensor]:
    """Rank r's tensor, of ``shape`` (default ``[numel]``) and ``dtype``: r plus a multiple of
    16 drawn for each element (the grader's key in the seed), plus in float64 sevenths that
    float32 cannot hold."""
    size = shape if shape is not None else [numel]
    fraction = torch.zeros(size, dtype=torch.float64)
    if dtype == "float64":
        fraction = torch.arange(fraction.numel(), dtype=torch.float64).reshape(size) / 7
    generator = torch.Generator().manual_seed(_support.secret_seed(
        1000 * len(partners) + fraction.numel()))
    return [(rank + fraction + 16 * torch.randint(0, 64, size, generator=generator))
            .to(getattr(torch, dtype)) for rank in range(len(partners))]


def _run_swap(impl: Impl, partners: list[int], numel: int = 6, shape: list[int] | None = None,
              dtype: str = "float32") -> dict[str, Any]:
    inputs = _swap_inputs(partners, numel, shape, dtype)

    def program(comm: Any) -> dict[str, Any]:
        given = inputs[comm.rank].clone()
        out = impl(comm, given, partners[comm.rank])
        return {"got": out, "is_input": _shares_memory(out, given)}

    return launch_facts(run_spmd(program, uniform(len(partners)), hide=[inputs]),
                        with_trace=True)


def _judge_swap(facts: dict[str, Any], partners: list[int], numel: int = 6,
                shape: list[int] | None = None, dtype: str = "float32") -> None:
    _judge_no_barrier(facts, "a swap")
    for rank, works in enumerate(facts["works"]):
        used = works["isend"] + works["irecv"]
        unwaited = works["isend_unwaited"] + works["irecv_unwaited"]
        expect(not used, f"rank {rank} used isend/irecv"
                         + (f" and never waited on {unwaited} of its works" if unwaited else "")
                         + ": exercise 6.2 is the blocking comm.send and comm.recv only, "
                         "in an order that cannot deadlock (one rank of the pair sends first, "
                         "the other receives first)")
    inputs = _swap_inputs(partners, numel, shape, dtype)
    for rank, record in enumerate(facts["results"]):
        where = f"partners {partners}: rank {rank}"
        got, want = record["got"], inputs[partners[rank]]
        if isinstance(got, torch.Tensor):
            expect(got.dtype == want.dtype,
                   f"{where} returned {_dtype(got)} for a {_dtype(want)} tensor: receive into "
                   "a buffer of the tensor's own dtype and shape (torch.empty_like(tensor))")
        _expect_exactly(got, want, f"{where}: what it got")


def _judge_swap_new(facts: dict[str, Any], partners: list[int]) -> None:
    """Feedback only: whether the returned tensor is the one given is seen only inside the
    rank's process."""
    for rank, record in enumerate(facts["results"]):
        alone = " (it has no partner)" if partners[rank] == rank else ""
        expect(not record["is_input"], f"partners {partners}: rank {rank}{alone} returned the "
                                       "tensor it was given (or a view of it), not a new tensor")


def _expect_exactly(got: Any, want: torch.Tensor, what: str) -> None:
    """``got`` equals ``want`` bit for bit; a value that differs is printed with every digit
    its dtype holds, and one rounded through float32 on the way is named as such."""
    if (isinstance(got, torch.Tensor) and got.shape == want.shape and got.dtype == want.dtype
            and not torch.equal(got, want)):
        flat_got, flat_want = got.reshape(-1), want.reshape(-1)
        worst = int((flat_got.double() - flat_want.double()).abs().argmax())
        values = (f"element {worst} is {flat_got[worst].item()!r}, expected "
                  f"{flat_want[worst].item()!r}")
        rounded = (want.dtype == torch.float64
                   and torch.equal(got, want.to(torch.float32).to(want.dtype)))
        expect(not rounded, f"{what} is right to float32's precision only ({values}): the "
                            "tensor went through float32 on the way; send it and receive it "
                            "in its own dtype (torch.empty_like(tensor))")
        expect(False, f"{what}: wrong values, e.g. {values}")
    expect_close(got, want, what, rtol=0, atol=0)


def _swap_case(name: str, points: int, pairings: list[list[int]]) -> Case:
    return Case(name, points, *each([{"partners": p} for p in pairings], _run_swap, _judge_swap))


_DTYPES_AND_SHAPES = [{"partners": [1, 0], "shape": [2, 3], "dtype": "float64"},
                      {"partners": [2, 3, 0, 1], "shape": [3, 2, 2], "dtype": "bfloat16"},
                      {"partners": [0, 2, 1], "shape": [2, 2], "dtype": "int64"}]


def _swap_dtypes_case(name: str, points: int) -> Case:
    return Case(name, points, *each(_DTYPES_AND_SHAPES, _run_swap, _judge_swap))


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

def _blocks(lengths: list[int], seed: int = 0, dtype: str = "float32") -> list[torch.Tensor]:
    """Rank r's block of ``lengths[r]`` small integers (the grader's secret in the seed)."""
    generator = torch.Generator().manual_seed(_support.secret_seed(seed))
    return [torch.randint(-8, 9, (k,), generator=generator).to(getattr(torch, dtype))
            for k in lengths]


def _run_smooth(impl: Impl, lengths: list[int], steps: int, seed: int = 0,
                dtype: str = "float32", with_trace: bool = False) -> dict[str, Any]:
    blocks = _blocks(lengths, seed, dtype)

    def program(comm: Any) -> dict[str, Any]:
        given = blocks[comm.rank].clone()
        out = impl(comm, given, steps)
        return {"got": out, "block_after": given, "is_input": _shares_memory(out, given)}

    with from_scratch(impl, "6.3"):
        return launch_facts(run_spmd(program, uniform(len(lengths)), hide=[blocks]),
                            with_trace=with_trace)


def _smoothed(blocks: list[torch.Tensor], steps: int) -> list[torch.Tensor]:
    """The oracle in each block's own dtype: float32 blocks as ``cd.smooth_on_one_device``
    gives them, float64 ones smoothed in float64 throughout."""
    if all(b.dtype == torch.float32 for b in blocks):
        return cd.smooth_on_one_device(blocks, steps)
    x = torch.cat(blocks).double()
    for _ in range(steps):
        x = (torch.roll(x, 1) + x + torch.roll(x, -1)) / 3
    return [part.to(b.dtype) for part, b in zip(torch.split(x, [len(b) for b in blocks]),
                                                blocks)]


def _smoothed_swapped(blocks: list[torch.Tensor], steps: int) -> list[torch.Tensor]:
    """What every rank ends with when its two halos trade places each step: the left
    neighbour's element lands on the right end and the right one's on the left (with 2 ranks,
    a program that tells the two halos apart by the order they arrive, not by tag)."""
    xs = [b.double() for b in blocks]
    n = len(xs)
    for _ in range(steps):
        padded = [torch.cat([xs[(r + 1) % n][:1], xs[r], xs[(r - 1) % n][-1:]])
                  for r in range(n)]
        xs = [(p[:-2] + p[1:-1] + p[2:]) / 3 for p in padded]
    return [x.to(b.dtype) for x, b in zip(xs, blocks)]


def _judge_smooth(facts: dict[str, Any], lengths: list[int], steps: int, seed: int = 0,
                  dtype: str = "float32") -> None:
    _judge_all_waited(facts)
    blocks = _blocks(lengths, seed, dtype)
    want = _smoothed(blocks, steps)
    n = len(lengths)
    exact = dtype == "float64"
    for rank, record in enumerate(facts["results"]):
        got, what = record["got"], (f"{n} rank(s), {dtype} blocks of {lengths}, {steps} "
                                    f"step(s): rank {rank}'s block")
        if isinstance(got, torch.Tensor):
            expect(got.dtype == want[rank].dtype,
                   f"{what} came back {_dtype(got)}: keep the block's dtype ({dtype}), halo "
                   "buffers included (torch.empty_like(block[:1]))")
            swapped = _smoothed_swapped(blocks, steps)[rank]
            expect(n < 2 or steps < 1 or got.shape != swapped.shape
                   or not torch.allclose(got.double(), swapped.double(), rtol=1e-4, atol=1e-4)
                   or torch.allclose(got.double(), want[rank].double(), rtol=1e-4, atol=1e-4),
                   f"{what} is what it would be with its two halos swapped: the left "
                   "neighbour's last element went to the right end and the right one's first "
                   "to the left. " + (
                       "With 2 ranks both come from the same peer, so the order they arrive "
                       "in cannot tell them apart: send each direction under a tag of its own "
                       "and receive each halo with the tag of the direction it travels"
                       if n == 2 else "Pad the block as [from the left, block, from the "
                       "right]"))
        expect_close(got, want[rank], what, rtol=1e-4, atol=1e-4)
        if exact:
            expect(torch.allclose(got, want[rank], rtol=1e-12, atol=1e-12),
                   f"{what} is right to float32's precision only: its halos (or the "
                   f"smoothing) went through float32; keep everything {dtype}, halo buffers "
                   "included (torch.empty_like(block[:1]))")


def _judge_smooth_kept(facts: dict[str, Any], lengths: list[int], steps: int,
                       seed: int = 0, dtype: str = "float32") -> None:
    """Feedback only: whether the returned block is the one given, and whether that one
    changed, are seen only inside the rank's process."""
    blocks = _blocks(lengths, seed, dtype)
    for rank, record in enumerate(facts["results"]):
        what = f"{len(lengths)} ranks, {steps} steps: rank {rank}"
        expect(not record["is_input"], f"{what}: it returned the block it was given (or a "
                                       "view of it), not a new tensor"
                                       + (": with 0 steps too, return a copy (block.clone())"
                                          if steps == 0 else ""))
        expect(torch.equal(record["block_after"], blocks[rank]),
               f"{what}: it changed the block it was given in place; smooth a copy "
               "(block.clone()) and leave the caller's tensor as it was")


def _smooth_case(name: str, points: int, cases: list[dict[str, Any]],
                 hidden: bool = False) -> Case:
    return Case(name, points, *each(cases, _run_smooth, _judge_smooth), hidden=hidden)


def _judge_smooth_traffic(facts: dict[str, Any], lengths: list[int], steps: int) -> None:
    _judge_smooth(facts, lengths, steps)
    _judge_no_barrier(facts, "a step")
    n = len(lengths)
    for rank, stats in enumerate(facts["stats"]):
        want: dict[int, int] = {}
        for peer in ((rank - 1) % n, (rank + 1) % n):
            if peer != rank:
                want[peer] = want.get(peer, 0) + steps * bytes_of(1)
        sent = {int(k): v for k, v in stats["sent_to"].items() if v}
        expect(sent == want, f"{n} ranks, {steps} steps: rank {rank} sent {sent} (bytes per "
                             f"peer), expected one element to each neighbour per step: {want}")
        count = stats["messages_sent"]
        expect(count == 2 * steps, f"{n} ranks, {steps} steps: rank {rank} sent {count} "
                                   f"messages, expected {2 * steps}: one to each neighbour "
                                   "per step and nothing else")


_CHAIN = {"lengths": [2] * 7, "steps": 2}


def _judge_no_chain(facts: dict[str, Any]) -> None:
    _judge_smooth(facts, **_CHAIN)
    _judge_no_barrier(facts, "a step")
    # The timeline places a comm-stream job's messages from its submission on, whatever the
    # job really waited for; 6.3 is built from send/recv/isend/irecv alone, so no job is due.
    for rank, jobs in enumerate(facts["jobs"]):
        expect(not jobs, f"rank {rank} started {len(jobs)} comm-stream job(s) "
                         "(comm.run_async): smooth_ring is built from comm.send/recv/isend/"
                         "irecv only; post the halos with isend/irecv and wait on them")
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
