"""Who sends what to whom in lesson 01's all-reduces: everything through rank 0 (1.2), the
ring's 2(N-1)/N of the tensor to the right neighbour (1.3, and 1.7 padded), each rank to its
parent and children in the binary tree (1.6). Each judge reads the simulator's bytes and
messages per rank (``launch_facts``' ``stats``)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from mpgpu_edu.grading.checks import FEEDBACK, Case
from mpgpu_edu.grading.checks._support import bytes_of, counting_calls, expect
from mpgpu_edu.grading.checks.lesson_01.all_reduce import (_all_reduce_facts, _count, _judge_sums,
                                                           _spec, judge_waited)
from mpgpu_edu.lessons.communication import tree_children

Impl = Callable[..., Any]
Facts = dict[str, Any]


# ---- 1.2 naive ------------------------------------------------------------------------------

def _judge_naive_traffic(facts: Facts, n: int, numel: int) -> None:
    size = bytes_of(numel)
    stats = facts["stats"]
    expect(stats[0]["bytes_received"] == (n - 1) * size
           and stats[0]["bytes_sent"] == (n - 1) * size,
           f"rank 0 should receive and send (N-1) x {size} bytes, it received "
           f"{stats[0]['bytes_received']} and sent {stats[0]['bytes_sent']}")
    for rank in range(1, n):
        expect(stats[rank]["sent_to"] == {0: size},
               f"rank {rank} should send its {size} bytes to rank 0 only, it sent "
               f"{stats[rank]['sent_to']} (bytes per peer)")
        expect(stats[rank]["bytes_received"] == size,
               f"rank {rank} should receive the sum once ({size} bytes), it received "
               f"{stats[rank]['bytes_received']}")
    exchanged = stats[0]["messages_sent"] + stats[0]["messages_received"]
    expect(exchanged == 2 * (n - 1), f"rank 0 should exchange 2(N-1) = {2 * (n - 1)} messages,"
                                     f" it exchanged {exchanged}")


def _naive_traffic() -> Case:
    def compute(impl: Impl) -> Facts:
        return _all_reduce_facts(impl, "1.2", 4, 1000)

    def judge(facts: Facts) -> None:
        _judge_sums(facts, 4, 1000)
        _judge_naive_traffic(facts, 4, 1000)
        judge_waited(facts, 4)
    return Case("traffic: everything goes through rank 0, every message waited", 1, compute,
                judge)


def _judge_naive_hidden(facts: Facts, world_size: int, numel: int, seed: int) -> None:
    _judge_sums(facts, world_size, numel, seed)
    if world_size > 1:
        _judge_naive_traffic(facts, world_size, numel)


# ---- 1.3 ring (and 1.7, which must move the ring's bytes) -----------------------------------

def _judge_ring_traffic(facts: Facts, n: int, numel: int, padded: bool = False) -> None:
    chunk = -(-numel // n)  # ceil(numel / N)
    low = 2 * (n - 1) * bytes_of(chunk if padded else numel // n)
    high = 2 * (n - 1) * bytes_of(chunk)
    if padded:
        want = (f"padded to N chunks of ceil(numel/N) = ceil({numel}/{n}) = {chunk} elements, "
                f"it sends 2(N-1) = {2 * (n - 1)} chunks of {bytes_of(chunk)} bytes, {low} "
                f"bytes")
    else:
        want = f"a ring sends 2(N-1)/N of the tensor, {low}..{high} bytes"
    for rank, stats in enumerate(facts["stats"]):
        right = (rank + 1) % n
        if n > 1:
            expect(set(stats["sent_to"]) == {right},
                   f"N={n}: rank {rank} sent to ranks {sorted(stats['sent_to'])}; on a ring it "
                   f"sends to its right neighbour {right} only")
        expect(low <= stats["bytes_sent"] <= high,
               f"N={n}, {numel} elements ({bytes_of(numel)} bytes): rank {rank} sent "
               f"{stats['bytes_sent']} bytes; {want}")
        expect(stats["messages_sent"] == 2 * (n - 1),
               f"N={n}: rank {rank} sent {_count(stats['messages_sent'], 'message')}; a ring "
               f"takes 2(N-1) = {2 * (n - 1)} steps of one message each")


def _judge_padded_ring_traffic(facts: Facts, n: int, numel: int) -> None:
    _judge_ring_traffic(facts, n, numel, padded=True)


RING_TRAFFIC = [(4, 1000), (3, 1000), (5, 12), (6, 1001), (4, (2, 500))]  # 2-D: flattened


def _traffic_case(name: str, points: int, exercise: str, padded: bool = False) -> Case:
    def compute(impl: Impl) -> list[Facts]:
        return [_all_reduce_facts(impl, exercise, n, numel) for n, numel in RING_TRAFFIC]

    def judge(runs: list[Facts]) -> None:
        for facts, (n, size) in zip(runs, RING_TRAFFIC):
            _judge_sums(facts, n, size)
            _judge_ring_traffic(facts, n, math.prod(_spec(size)[0]), padded)
    return Case(name, points, compute, judge)


def _composed_case(exercise: str, parts: tuple[str, ...]) -> Case:
    """Whether each rank calls each of the learner's own functions ``parts`` (1.4, 1.5) once
    per all-reduce. Only the rank's own process sees its calls, so the case tells the
    learner and earns no points: the messages of a composed ring and of one written out are
    the same."""
    def compute(impl: Impl) -> list[dict]:
        runs = []
        for n, numel in RING_TRAFFIC[:3]:
            with counting_calls(impl, parts) as calls:
                _all_reduce_facts(impl, exercise, n, numel)
            runs.append({name: [calls[name].count(r) for r in range(n)] for name in parts})
        return runs

    def judge(runs: list[dict]) -> None:
        for counted, (n, _size) in zip(runs, RING_TRAFFIC):
            for part, per_rank in counted.items():
                expect(per_rank == [1] * n,
                       f"N={n}: each rank should call your {part} once per all-reduce (the "
                       f"exercise composes the all-reduce of 1.4 and 1.5); the ranks called "
                       f"it {per_rank} times")
    return Case("built of your " + " and ".join(parts) + " " + FEEDBACK, 0, compute, judge)


def _judge_ring_hidden(padded: bool) -> Callable[..., None]:
    def judge_one(facts: Facts, world_size: int, numel: int, seed: int) -> None:
        _judge_sums(facts, world_size, numel, seed)
        _judge_ring_traffic(facts, world_size, numel, padded)
    return judge_one


# ---- 1.6 tree --------------------------------------------------------------------------------

def _judge_tree_traffic(facts: Facts, n: int, numel: int) -> None:
    size = bytes_of(numel)
    for rank, stats in enumerate(facts["stats"]):
        peers = tree_children(rank, n) + ([(rank - 1) // 2] if rank > 0 else [])
        kin = ("its children" if rank == 0 else "its parent and children" if
               tree_children(rank, n) else "its parent")
        want = {peer: size for peer in sorted(peers)}
        got = {int(k): v for k, v in sorted(stats["sent_to"].items())}
        expect(got == want, f"N={n}: rank {rank} sent {got} (bytes per peer); in the binary "
                            f"tree it sends the whole tensor ({size} bytes) once to each of "
                            f"{kin} {sorted(peers)}")
        expect(stats["messages_sent"] == len(peers) and
               stats["messages_received"] == len(peers),
               f"N={n}: rank {rank} sent {_count(stats['messages_sent'], 'message')} and "
               f"received {stats['messages_received']}; with {kin} {sorted(peers)} it sends "
               f"and receives {len(peers)}")


def _tree_traffic() -> Case:
    sizes = [(7, 100), (6, 30), (5, 9), (4, 8), (2, 3)]

    def compute(impl: Impl) -> list[Facts]:
        return [_all_reduce_facts(impl, "1.6", n, numel) for n, numel in sizes]

    def judge(runs: list[Facts]) -> None:
        for facts, (n, numel) in zip(runs, sizes):
            _judge_sums(facts, n, numel)
            _judge_tree_traffic(facts, n, numel)
            judge_waited(facts, n)
    return Case("traffic: each rank talks to its parent and children only, every message "
                "waited", 3, compute, judge)


def _judge_tree_hidden(facts: Facts, world_size: int, numel: int, seed: int) -> None:
    _judge_sums(facts, world_size, numel, seed)
    _judge_tree_traffic(facts, world_size, numel)
