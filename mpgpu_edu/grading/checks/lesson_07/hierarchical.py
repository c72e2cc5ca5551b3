"""Checks of exercise 7.2, the hierarchical all-reduce, run with every built-in collective
switched off (``from_scratch``) on a two-level cluster: NVSwitch-like links inside each node,
one NIC per GPU between nodes, free additions, so that its simulated time must equal the
closed form. Oracles: the sum (or mean) of every rank's tensor for the values,
``cost.hierarchical_bytes_sent`` for the bytes each rank sends inside its node and across
the network; a flat ring, or whole tensors sent across, or the groups swapped, send the
wrong bytes on the wrong links."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from mpgpu_edu.cluster import Cluster
from mpgpu_edu.cluster import topology as topo
from mpgpu_edu.collectives import cost
from mpgpu_edu.grading.checks._clock import cluster_builder
from mpgpu_edu.grading.checks._support import (bytes_of, examples, expect, expect_close,
                                               from_scratch, launch_facts, left_unchanged,
                                               rank_inputs, run_spmd)
from mpgpu_edu.cluster.hardware import GPUS, LinkSpec

Impl = Callable[..., Any]


# Inside a node: 2 us, 8 GB/s; a NIC: 6 us, 1 GB/s (8 us between nodes: both latencies).
INTRA_ALPHA, INTRA_BETA, NIC_ALPHA, NIC_BETA = 2e-6, 8e9, 6e-6, 1e9


@cluster_builder
def two_level(nodes: int, per_node: int) -> Cluster:
    """``nodes`` nodes of ``per_node`` devices, one NIC per device, additions free."""
    wiring = topo.multi_node(nodes, per_node, LinkSpec("intra", INTRA_ALPHA, INTRA_BETA, "check"),
                             LinkSpec("nic", NIC_ALPHA, NIC_BETA, "check"),
                             nics_per_node=per_node)
    return Cluster(f"{nodes}x{per_node}-two-level", GPUS["H100-SXM-80GB"], wiring,
                   efficiency=1.0, launch_overhead_s=0.0, memory_Bps=0.0)


def _hier_compute(impl: Impl, nodes: int, per_node: int, numel: int, op: str = "sum",
                  seed: int = 0, shape: tuple[int, ...] | None = None) -> dict[str, Any]:
    inputs = rank_inputs(nodes * per_node, numel, seed)

    def program(comm: Any) -> torch.Tensor:
        tensor = inputs[comm.rank].clone().view(shape or (numel,))
        impl(comm, tensor, per_node, op)
        return tensor

    with from_scratch(impl, "7.2"):
        return launch_facts(run_spmd(program, two_level(nodes, per_node), hide=[inputs]))


def _shifted_phase_one(inputs: list[torch.Tensor], nodes: int, per_node: int, op: str,
                       gather_from_next: bool) -> list[torch.Tensor]:
    """What every rank ends with when phase 1 is lesson 01's reduce-scatter loop, which
    leaves local rank i holding its node's sum of chunk i + 1, while phase 2 all-reduces
    chunk i on the rail. Phase 3 is the all-gather that sends chunk i first
    (``gather_from_next`` False) or lesson 01's, which sends chunk i + 1 first. Chunks are
    ``torch.tensor_split``'s, as the solved ring halves take them (uneven sizes included)."""
    g, n = per_node, nodes * per_node
    chunks = [list(torch.tensor_split(t.clone().view(-1), g)) for t in inputs]
    for node in range(nodes):
        ranks = [node * g + i for i in range(g)]
        for k in range(g - 1):  # lesson 01: local rank i sends chunk i - k, adds into i - k - 1
            sent = [chunks[r][(i - k) % g].clone() for i, r in enumerate(ranks)]
            for i, r in enumerate(ranks):
                chunks[r][(i - k - 1) % g] += sent[(i - 1) % g]
    for i in range(g):  # the rail's all-reduce of chunk i (of partial sums)
        rail = [k * g + i for k in range(nodes)]
        total = sum(chunks[r][i] for r in rail)
        for r in rail:
            chunks[r][i] = total / n if op == "mean" else total.clone()
    shift = 1 if gather_from_next else 0
    for node in range(nodes):
        ranks = [node * g + i for i in range(g)]
        for k in range(g - 1):
            sent = [chunks[r][(i + shift - k) % g].clone() for i, r in enumerate(ranks)]
            for i, r in enumerate(ranks):
                chunks[r][(i - 1 + shift - k) % g] = sent[(i - 1) % g]
    return [torch.cat(c) for c in chunks]


def _phase_one_shifted(results: list[Any], inputs: list[torch.Tensor], nodes: int,
                       per_node: int, op: str) -> bool:
    """Whether every rank's result is what lesson 01's reduce-scatter loop in phase 1 gives."""
    if per_node < 2 or not all(isinstance(r, torch.Tensor) for r in results):
        return False
    for gather_from_next in (False, True):
        trap = _shifted_phase_one(inputs, nodes, per_node, op, gather_from_next)
        if len(trap) == len(results) and all(
                r.shape == t.shape and torch.allclose(r.view(-1), t, rtol=1e-4, atol=1e-4)
                for r, t in zip(results, trap)):
            return True
    return False


def _hier_values(facts: dict, nodes: int, per_node: int, numel: int, op: str = "sum",
                 seed: int = 0, shape: tuple[int, ...] | None = None) -> None:
    n = nodes * per_node
    inputs = rank_inputs(n, numel, seed)
    total = torch.stack(inputs).sum(0)
    want = (total / n if op == "mean" else total).view(shape or (numel,))
    right = all(isinstance(r, torch.Tensor) and r.shape == want.shape
                and torch.allclose(r, want, rtol=1e-4, atol=1e-4) for r in facts["results"])
    expect(right or not _phase_one_shifted(facts["results"], inputs, nodes, per_node, op),
           "phase 2 must all-reduce on the rail the chunk that phase 1 (the reduce-scatter "
           "inside the node) finished on this rank: lesson 01's loop leaves local rank i "
           "with chunk (i + 1) % per_node finished, but your rail summed another chunk, one "
           "of partial sums")
    if not right:
        expect(not _one_flat_ring(facts), "wrong values, and every rank sent only to rank + 1 "
                                          "of comm: a ring over all the ranks, not the three "
                                          "phases on the node's group and the rail's group")
        stray = _off_rail(facts, per_node)
        expect(stray is None, f"wrong values, and rank {stray and stray[0]} sent across the "
                              f"network to rank(s) {stray and stray[1]}, not on its rail: did "
                              "phase 2 run on comm instead of the rail's group? "
                              "ring_all_reduce(rail, ...) with rail = comm.group(<local rank i "
                              "of every node>)")
    for rank, got in enumerate(facts["results"]):
        if not right and left_unchanged(got, inputs[rank], want):
            expect(False, f"rank {rank}'s tensor is unchanged: the all-reduce works in place "
                          "(a clone or a new tensor leaves the caller's as it was; copy the "
                          "result back with tensor.copy_(...))")
        expect_close(got, want, f"rank {rank}'s tensor")


def _sent(stats: dict, rank: int, per_node: int) -> tuple[int, dict[int, int]]:
    """Bytes ``rank`` sent inside its node, and to each rank of another node."""
    node = rank // per_node
    inside = sum(b for peer, b in stats["sent_to"].items() if int(peer) // per_node == node)
    across = {int(peer): b for peer, b in stats["sent_to"].items()
              if int(peer) // per_node != node and b}
    return inside, across


def _one_flat_ring(facts: dict) -> bool:
    """Whether every rank sent only to its right neighbour in ``comm`` (a flat ring)."""
    stats = facts.get("stats") or []
    n = len(stats)
    return n > 2 and all({int(p) for p, b in st["sent_to"].items() if b} == {(r + 1) % n}
                         for r, st in enumerate(stats))


def _off_rail(facts: dict, per_node: int) -> tuple[int, list[int]] | None:
    """The first rank that sent across the network off its rail, and to whom; else None."""
    for rank, stats in enumerate(facts.get("stats") or []):
        stray = sorted(p for p in _sent(stats, rank, per_node)[1]
                       if p % per_node != rank % per_node)
        if stray:
            return rank, stray
    return None


def _hier_traffic(facts: dict, nodes: int, per_node: int, numel: int, **example: Any) -> None:
    _hier_values(facts, nodes, per_node, numel, **example)
    size = bytes_of(numel)
    want = cost.hierarchical_bytes_sent(nodes, per_node, size)
    for rank, stats in enumerate(facts["stats"]):
        node = rank // per_node
        inside, across = _sent(stats, rank, per_node)
        off_rail = sorted(p for p in across if p % per_node != rank % per_node)
        expect(not off_rail, f"rank {rank} (local rank {rank % per_node} of node {node}) sent "
                             f"across the network to rank(s) {off_rail}, which are not on its "
                             f"rail (local rank {rank % per_node} of the other nodes)")
        expect(sum(across.values()) == want["inter"],
               f"a tensor of S = {size} bytes: rank {rank} sent {sum(across.values())} bytes "
               "across the "
               f"network, expected {want['inter']:.0f} = 2(M-1)/(G M) S with M = {nodes} "
               f"nodes, G = {per_node}: its rail's ring all-reduce of the node's 1/{per_node} "
               f"chunk" + (f" (this tensor has shape {tuple(example['shape'])}: are the chunks "
                           "cut from its flat view, tensor.view(-1)?)"
                           if example.get("shape") else ""))
        expect(inside == want["intra"],
               f"a tensor of S = {size} bytes: rank {rank} sent "
               f"{inside} bytes inside its node; a ring reduce-scatter and all-gather there "
               f"send {want['intra']:.0f}")


def _hier_time(facts: dict, nodes: int, per_node: int, numel: int, **example: Any) -> None:
    _hier_values(facts, nodes, per_node, numel, **example)
    want = cost.hierarchical_allreduce_time(nodes, per_node, bytes_of(numel), INTRA_ALPHA,
                                            INTRA_BETA, INTRA_ALPHA + NIC_ALPHA, NIC_BETA)
    got = facts["makespan"]
    expect(abs(got - want) <= 1e-6 * want,
           f"{bytes_of(numel)} bytes: simulated {got * 1e6:.2f} us; "
           f"the closed form (2(G-1)(a + S/(G b)) inside, 2(M-1)(a' + S/(G M b')) across) "
           f"gives {want * 1e6:.2f} us. This check's cluster adds for free, so a right "
           "all-reduce takes exactly the closed form; more time means more steps, or more "
           "bytes on a slow link, or phases that wait for each other")


def _hier_all(facts: dict, **example: Any) -> None:
    if example["numel"] % (example["nodes"] * example["per_node"]):
        _hier_values(facts, **example)  # uneven chunks: the forms hold for whole chunks
        return
    _hier_traffic(facts, **example)
    _hier_time(facts, **example)


_HIER_MAIN = [dict(nodes=2, per_node=4, numel=64), dict(nodes=2, per_node=4, numel=8, op="mean")]
_HIER_SHAPES = [dict(nodes=2, per_node=4, numel=800), dict(nodes=3, per_node=2, numel=600),
                dict(nodes=2, per_node=8, numel=1600),
                dict(nodes=2, per_node=4, numel=800, shape=(10, 80))]  # "any shape": flat chunks
_HIER_EDGES = [dict(nodes=2, per_node=4, numel=13), dict(nodes=3, per_node=2, numel=5, op="mean"),
               dict(nodes=1, per_node=4, numel=9), dict(nodes=4, per_node=1, numel=7),
               dict(nodes=2, per_node=3, numel=2)]


def _hier_examples() -> list[dict[str, Any]]:
    """Ten clusters of 2-4 nodes of 2-4 GPUs: every other one a size that splits evenly
    (values, bytes per link and time judged), the rest any size (values)."""
    drawn = examples(10, 73, nodes=(2, 4), per_node=(2, 4), size=(1, 40), mean=(0, 1))
    return [dict(nodes=e["nodes"], per_node=e["per_node"],
                 numel=e["size"] * (e["nodes"] * e["per_node"] if i % 2 == 0 else 1),
                 op="mean" if e["mean"] else "sum", seed=i) for i, e in enumerate(drawn)]
