"""Checks of lesson 06: choosing a strategy that fits, a swap and a halo exchange that cannot
deadlock, and a straggler found from per-rank logs.

Oracles: ``estimate_memory`` against ``Cluster.capacity_bytes`` for the choice; for the
exchanges, the simulator (which detects a deadlock and names who waits for whom) and the
smoothing done on one device; for the straggler, ``l06.find_straggler_reference`` on logs
the grader generates itself (other world sizes, other slow ranks).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from mpgpu_edu.cluster import Cluster
from mpgpu_edu.grading.checks import Case
from mpgpu_edu.grading.checks._plain import UNPLAIN, type_name
from mpgpu_edu.grading.checks._support import (bytes_of, compute_examples, examples, expect,
                                               expect_close, from_scratch, judge_examples,
                                               launch_facts, run_spmd, uniform)
from mpgpu_edu.lessons import choosing_and_debugging as l06
from mpgpu_edu.memory import estimate_memory

Impl = Callable[..., Any]
GPT2_SMALL, LLAMA_7B, LLAMA_13B = 124_439_808, 6_738_415_616, 13_015_864_320


def _kind(value: Any) -> str:
    if isinstance(value, dict) and UNPLAIN in value:
        return str(value[UNPLAIN])
    return type_name(value)


# ---- 6.1 choosing a strategy ----------------------------------------------------------------

def _reference_choice(n_params: int, cluster: Cluster, optimizer: str, precision: str,
                      activations_bytes: int) -> str:
    n = cluster.world_size
    for strategy in (["single"] if n == 1 else ["dp", "zero1", "zero2", "zero3"]):
        if estimate_memory(n_params, optimizer, precision, strategy, n,
                           activations_bytes).fits(cluster.capacity_bytes(0)):
            return strategy
    return "none"


def _choice_example(n_params: int, preset: str, visible: str | None = None,
                    optimizer: str = "adam", precision: str = "mixed",
                    activations_bytes: int = 0) -> dict[str, Any]:
    return {"n_params": n_params, "preset": preset, "visible": visible, "optimizer": optimizer,
            "precision": precision, "activations_bytes": activations_bytes}


def _choose(impl: Impl, n_params: int, preset: str, visible: str | None, optimizer: str,
            precision: str, activations_bytes: int) -> Any:
    cluster = Cluster.preset(preset, visible=visible)
    return impl(n_params, cluster, optimizer, precision, activations_bytes)


def _judge_choice(got: Any, n_params: int, preset: str, visible: str | None, optimizer: str,
                  precision: str, activations_bytes: int) -> None:
    cluster = Cluster.preset(preset, visible=visible)
    want = _reference_choice(n_params, cluster, optimizer, precision, activations_bytes)
    where = preset + (f" with CUDA_VISIBLE_DEVICES={visible}" if visible is not None else "")
    expect(isinstance(got, str), f"choose_strategy should return a str, got {_kind(got)}")
    expect(got == want, f"{n_params:.3g} parameters, {optimizer} {precision}, "
                        f"{activations_bytes} activation bytes, on {where}: you chose {got!r}, "
                        f"expected {want!r}")


def _choice_case(name: str, points: int, cases: list[dict[str, Any]],
                 hidden: bool = False) -> Case:
    return Case(name, points,
                lambda impl: compute_examples(lambda **e: _choose(impl, **e), cases),
                lambda records: judge_examples(records, _judge_choice), hidden=hidden)


def _random_choices() -> list[dict[str, Any]]:
    presets = ["4xRTX4090-pcie", "8xRTX4090-pcie", "8xA100-nvlink", "4xH100-nvswitch"]
    drawn = examples(40, seed=6, exponent=(60, 110), preset=(0, 3), devices=(1, 4),
                     fp32=(0, 1), activations=(0, 8))
    return [_choice_example(int(10 ** (e["exponent"] / 10)), presets[e["preset"]],
                            ",".join(str(i) for i in range(e["devices"])),
                            precision="fp32" if e["fp32"] else "mixed",
                            activations_bytes=e["activations"] * 2**30) for e in drawn]


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
    cases = [{"partners": p} for p in pairings]
    return Case(name, points,
                lambda impl: compute_examples(lambda **e: _run_swap(impl, **e), cases),
                lambda records: judge_examples(records, _judge_swap))


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
    want = l06.smooth_on_one_device(_blocks(lengths, seed), steps)
    n = len(lengths)
    for rank, got in enumerate(facts["results"]):
        expect_close(got, want[rank], f"{n} rank(s), blocks of {lengths}, {steps} step(s): "
                                      f"rank {rank}'s block", rtol=1e-4, atol=1e-4)


def _smooth_case(name: str, points: int, cases: list[dict[str, Any]],
                 hidden: bool = False) -> Case:
    return Case(name, points,
                lambda impl: compute_examples(lambda **e: _run_smooth(impl, **e), cases),
                lambda records: judge_examples(records, _judge_smooth), hidden=hidden)


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


# ---- 6.4 the straggler, from the logs ---------------------------------------------------------

def _straggler_logs(world_size: int, slow_rank: int, steps: int,
                    slowdown: list[float]) -> list[list[str]]:
    return l06.run_straggler(world_size, slow_rank, steps, tuple(slowdown)).logs


def _run_find(impl: Impl, world_size: int, slow_rank: int, steps: int,
              slowdown: list[float]) -> Any:
    logs = _straggler_logs(world_size, slow_rank, steps, slowdown)
    return impl([list(lines) for lines in logs])


def _judge_find(got: Any, world_size: int, slow_rank: int, steps: int,
                slowdown: list[float]) -> None:
    logs = _straggler_logs(world_size, slow_rank, steps, slowdown)
    rank, seconds = l06.find_straggler_reference(logs)
    where = (f"{world_size} ranks, {steps} step(s), rank {slow_rank} slowed "
             f"{'x'.join(f'{s:g}' for s in slowdown)}")
    expect(isinstance(got, list) and len(got) == 2,
           f"{where}: expected (rank, seconds), got {_kind(got)}"
           + (f" of length {len(got)}" if isinstance(got, list) else ""))
    got_rank, got_seconds = got
    expect(type(got_rank) is int, f"{where}: the rank should be an int, got {_kind(got_rank)}")
    if got_rank != rank and got_rank == l06.longest_waiter(logs):
        expect(False, f"{where}: you named rank {got_rank}, the rank that waited longest in the "
                      f"all-reduces; the straggler is rank {rank}")
    expect(got_rank == rank, f"{where}: you named rank {got_rank}, the straggler is rank {rank}")
    expect(type(got_seconds) in (int, float),
           f"{where}: seconds should be a number, got {_kind(got_seconds)}")
    expect(abs(got_seconds - seconds) <= 1e-6 + 1e-6 * abs(seconds),
           f"{where}: rank {rank} is right, but it computed {seconds * 1e3:.4f} ms longer "
           f"than the median rank over the run, not {got_seconds * 1e3:.4f} ms")


def _find_case(name: str, points: int, cases: list[dict[str, Any]],
               hidden: bool = False) -> Case:
    return Case(name, points,
                lambda impl: compute_examples(lambda **e: _run_find(impl, **e), cases),
                lambda records: judge_examples(records, _judge_find), hidden=hidden)


def _straggler(world_size: int, slow_rank: int, steps: int = 3,
               slowdown: tuple[float, ...] = (3.0,)) -> dict[str, Any]:
    return {"world_size": world_size, "slow_rank": slow_rank, "steps": steps,
            "slowdown": list(slowdown)}


def _random_stragglers() -> list[dict[str, Any]]:
    out = []
    for e in examples(8, seed=64, n=(3, 7), slow=(0, 6), steps=(2, 4), a=(15, 40), b=(11, 40)):
        out.append(_straggler(e["n"], e["slow"] % e["n"], e["steps"],
                              (e["a"] / 10, e["b"] / 10)))
    return out


CASES: dict[str, list[Case]] = {
    "6.1": [
        _choice_case("one device: single, or none", 1,
                     [_choice_example(GPT2_SMALL, "4xRTX4090-pcie", "0"),
                      _choice_example(LLAMA_7B, "4xRTX4090-pcie", "0")]),
        _choice_case("data parallel when a replica fits", 1,
                     [_choice_example(GPT2_SMALL, "8xA100-nvlink"),
                      _choice_example(GPT2_SMALL, "4xRTX4090-pcie")]),
        _choice_case("ZeRO when it does not (7B on 8 GPUs)", 1,
                     [_choice_example(LLAMA_7B, "8xA100-nvlink"),
                      _choice_example(LLAMA_7B, "8xRTX4090-pcie"),
                      _choice_example(LLAMA_13B, "8xRTX4090-pcie"),
                      _choice_example(LLAMA_13B, "8xA100-nvlink")]),
        _choice_case("activations and fp32 count too", 1,
                     [_choice_example(LLAMA_7B, "8xA100-nvlink", None, "adam", "mixed",
                                      50 * 2**30),
                      _choice_example(LLAMA_7B, "8xH100-nvswitch", None, "adam", "fp32", 0),
                      _choice_example(GPT2_SMALL, "4xRTX4090-pcie", "1,2", "sgd", "fp32", 0)]),
        _choice_case("hidden: random models and clusters", 1, _random_choices(), hidden=True),
    ],
    "6.2": [
        _swap_case("two ranks swap", 1, [[1, 0]]),
        _swap_case("pairs and a rank alone", 1, [[1, 0, 3, 2, 4], [0]]),
        _swap_case("any pairing, e.g. ranks 1 and 3", 1, [[0, 3, 2, 1], [3, 2, 1, 0]]),
        Case("traffic: one message to the partner", 1,
             lambda impl: _run_swap(impl, _TRAFFIC_PARTNERS, numel=10), _judge_swap_traffic),
        Case("hidden: random pairings", 1,
             lambda impl: compute_examples(lambda **e: _run_swap(impl, **e),
                                           _random_pairings()),
             lambda records: judge_examples(records, _judge_swap), hidden=True),
    ],
    "6.3": [
        _smooth_case("4 ranks, blocks of 3, one step", 1, [{"lengths": [3] * 4, "steps": 1}]),
        _smooth_case("odd world sizes, uneven blocks, several steps", 2,
                     [{"lengths": [2, 1, 4], "steps": 3},
                      {"lengths": [3, 1, 2, 5, 1], "steps": 2}]),
        _smooth_case("two ranks: left and right neighbour are one rank", 2,
                     [{"lengths": [3, 2], "steps": 2}, {"lengths": [1, 4], "steps": 1}]),
        _smooth_case("one rank: the ring closes on itself", 1,
                     [{"lengths": [5], "steps": 2}]),
        Case("traffic: one element to each neighbour per step", 1,
             lambda impl: _run_smooth(impl, [3, 2, 4, 1, 2], 2),
             lambda facts: _judge_smooth_traffic(facts, [3, 2, 4, 1, 2], 2)),
        Case("7 ranks: no rank waits for a chain of others", 1,
             lambda impl: _run_smooth(impl, **_CHAIN), _judge_no_chain),
        _smooth_case("hidden: world sizes 2-7, uneven blocks, 1-3 steps", 2, _random_rings(),
                     hidden=True),
    ],
    "6.4": [
        _find_case("4 ranks, rank 3 three times slower", 2, [_straggler(4, 3, 1)]),
        _find_case("not the rank that waits longest", 2, [_straggler(5, 1, 3),
                                                          _straggler(3, 0, 2)]),
        _find_case("a straggler that falls further behind: every step counts", 2,
                   [_straggler(6, 2, 3, (1.5, 2.5, 4.0)), _straggler(4, 0, 4, (1.2, 3.0))]),
        _find_case("hidden: other world sizes, slow ranks and slowdowns", 4,
                   _random_stragglers(), hidden=True),
    ],
}
