"""Closed forms against the simulator: exact on a uniform cluster, slower under contention."""

from __future__ import annotations

import pytest
import torch

from mpgpu_edu.cluster import Cluster
from mpgpu_edu.collectives import (ALGORITHMS, all_gather, all_reduce, broadcast,
                                   broadcast_tree, gather, reduce, reduce_scatter, reduce_tree,
                                   scatter)
from mpgpu_edu.collectives import cost
from mpgpu_edu.comm import launch

ALPHA, BETA = 1e-5, 1e9  # 10 us, 1 GB/s: latency and bandwidth terms both matter
NUMEL = 840 * 10  # 840 = lcm(1..8): every N here divides it, so ring chunks are equal
SIZE = NUMEL * 4  # fp32 bytes


def meta(numel: int = NUMEL) -> torch.Tensor:
    return torch.empty(numel, dtype=torch.float32, device="meta")


def simulated(fn, cluster, *args) -> float:
    return launch(fn, cluster, *args).trace.makespan


def uniform(n: int) -> Cluster:
    return Cluster.uniform(n, alpha_s=ALPHA, beta_Bps=BETA)


def _all_reduce(comm, algo, numel):
    all_reduce(comm, meta(numel), algo=algo)


# ---- the formulas themselves ----------------------------------------------------------

def test_closed_forms_by_hand() -> None:
    assert [cost.ceil_log2(n) for n in range(1, 10)] == [0, 1, 2, 2, 3, 3, 3, 3, 4]
    m = ALPHA + SIZE / BETA
    assert cost.naive_allreduce_time(4, SIZE, ALPHA, BETA) == pytest.approx(6 * m)
    assert cost.tree_allreduce_time(5, SIZE, ALPHA, BETA) == pytest.approx(6 * m)
    assert cost.ring_allreduce_time(4, SIZE, ALPHA, BETA) == pytest.approx(
        6 * ALPHA + 1.5 * SIZE / BETA)
    for algo in ALGORITHMS:
        assert cost.allreduce_time(algo, 1, SIZE, ALPHA, BETA) == 0.0  # one rank: nothing
    assert cost.algbw(1e9, 0.5) == 2e9
    assert cost.busbw(1e9, 0.5, 8) == pytest.approx(2e9 * 14 / 8)  # nccl-tests: 2(n-1)/n
    assert cost.busbw(1e9, 0.5, 1) == 0.0
    assert cost.ring_allreduce_bytes_sent(4, 1000) == 1500
    assert cost.naive_allreduce_root_bytes(4, 1000) == 3000
    assert cost.tree_allreduce_root_bytes(5, 1000) == 3000


def test_closed_form_errors() -> None:
    with pytest.raises(ValueError, match="naive, tree, ring"):
        cost.allreduce_time("butterfly", 4, SIZE, ALPHA, BETA)
    with pytest.raises(ValueError, match="at least 1"):
        cost.ring_allreduce_time(0, SIZE, ALPHA, BETA)
    with pytest.raises(ValueError, match="positive time"):
        cost.algbw(SIZE, 0.0)


def test_ring_beats_naive_for_large_tensors_and_tree_for_small_ones() -> None:
    n = 8
    big = {a: cost.allreduce_time(a, n, 2**30, ALPHA, BETA) for a in ALGORITHMS}
    small = {a: cost.allreduce_time(a, n, 4, ALPHA, BETA) for a in ALGORITHMS}
    assert min(big, key=big.get) == "ring"
    assert min(small, key=small.get) == "tree"


# ---- simulator == closed form on a uniform cluster ------------------------------------

@pytest.mark.parametrize("algo", list(ALGORITHMS))
@pytest.mark.parametrize("n", range(1, 9))
def test_simulated_all_reduce_equals_closed_form(algo: str, n: int) -> None:
    for numel in (NUMEL, 0):  # 0 bytes: the latency term alone
        got = simulated(_all_reduce, uniform(n), algo, numel)
        want = cost.allreduce_time(algo, n, numel * 4, ALPHA, BETA)
        assert got == pytest.approx(want, rel=1e-9, abs=0.0)


@pytest.mark.parametrize("n", [3, 5, 7])
def test_ring_with_uneven_chunks_is_within_one_element_per_step(n: int) -> None:
    numel = NUMEL + 1  # one chunk is one element longer than the others
    got = simulated(_all_reduce, uniform(n), "ring", numel)
    low = cost.ring_allreduce_time(n, numel * 4, ALPHA, BETA)
    high = cost.ring_allreduce_time(n, (numel + n) * 4, ALPHA, BETA)  # ceil(E/N) per chunk
    assert low <= got <= high


def _rooted(comm, fn, root):
    fn(comm, meta(), root=root)


def _gather(comm):
    gather(comm, meta(), root=0)


def _scatter(comm):
    chunks = [meta()] * comm.world_size if comm.rank == 0 else None
    scatter(comm, chunks, meta(), root=0)


@pytest.mark.parametrize("n", [2, 3, 5, 6, 8])
def test_simulated_rooted_collectives_equal_closed_forms(n: int) -> None:
    cluster = uniform(n)
    linear = cost.broadcast_time(n, SIZE, ALPHA, BETA)
    tree = cost.tree_broadcast_time(n, SIZE, ALPHA, BETA)
    for fn, want in [(broadcast, linear), (reduce, cost.reduce_time(n, SIZE, ALPHA, BETA)),
                     (broadcast_tree, tree),
                     (reduce_tree, cost.tree_reduce_time(n, SIZE, ALPHA, BETA))]:
        for root in (0, n - 1):
            assert simulated(_rooted, cluster, fn, root) == pytest.approx(want, rel=1e-9)
    gathered = cost.gather_time(n, SIZE, ALPHA, BETA)
    assert simulated(_gather, cluster) == pytest.approx(gathered, rel=1e-9)
    assert simulated(_scatter, cluster) == pytest.approx(gathered, rel=1e-9)


@pytest.mark.parametrize("n", [2, 3, 4, 7])
def test_simulated_ring_halves_equal_closed_forms(n: int) -> None:
    cluster = uniform(n)
    rs = simulated(lambda comm: reduce_scatter(comm, meta()), cluster)
    assert rs == pytest.approx(cost.ring_reduce_scatter_time(n, SIZE, ALPHA, BETA), rel=1e-9)
    piece = NUMEL // n  # all-gather's output is n pieces: SIZE bytes in all
    ag = simulated(lambda comm: all_gather(comm, meta(piece)), cluster)
    assert ag == pytest.approx(cost.ring_all_gather_time(n, SIZE, ALPHA, BETA), rel=1e-9)


def test_tree_depth_is_ceil_log2_for_non_powers_of_two() -> None:
    # 5, 6, 7 ranks need as many rounds as 8: the root still hears from 1, 2 and 4 in turn.
    times = [simulated(_all_reduce, uniform(n), "tree", NUMEL) for n in (5, 6, 7, 8)]
    assert times == pytest.approx([times[-1]] * 4, rel=1e-9)
    assert simulated(_all_reduce, uniform(4), "tree", NUMEL) < times[0]


# ---- contention: shared caps -------------------------------------------------------------
# The PCIe presets (host memory shared by staged copies, a shared switch uplink) are held to
# the staged_* forms in test_topology_pcie.py; the rails to rail_ring_allreduce_time in
# test_rails.py.

PCIE = "4xRTX4090-pcie"  # 4 GPUs, each on its own uplink; staged copies share host memory
BIG = 2**24  # 64 MiB of fp32: bandwidth dominates


def test_staged_forms_by_hand() -> None:
    # Four messages through a 60 GB/s cap on 24 GB/s links get 15 GB/s each; one gets 24.
    assert cost.shared_rate(24e9, 60e9, 4) == 15e9
    assert cost.shared_rate(24e9, 60e9, 1) == 24e9
    assert cost.staged_ring_allreduce_time(4, 4e9, 0.0, 24e9, 60e9) == pytest.approx(
        6 * 1e9 / 15e9)
    assert cost.staged_naive_allreduce_time(4, 4e9, 1e-5, 24e9, 60e9) == pytest.approx(
        cost.naive_allreduce_time(4, 4e9, 1e-5, 24e9))
    # A cap wider than all the links together changes nothing: the uniform form.
    assert cost.staged_ring_allreduce_time(4, 4e9, 1e-5, 24e9, 1e15) == pytest.approx(
        cost.ring_allreduce_time(4, 4e9, 1e-5, 24e9), rel=1e-12)
    with pytest.raises(ValueError, match="concurrent"):
        cost.shared_rate(1e9, 1e9, 0)


def test_rail_form_by_hand() -> None:
    # 2 nodes x 2 GPUs, S = 8 bytes: c = 8 / (2 * 4) = 1 byte per chunk, 6 steps; the network
    # (1 B at 1 B/s) is slower than one NVLink chunk (1 B at 10 B/s).
    assert cost.rail_ring_allreduce_time(2, 2, 8, 0.0, 10.0, 0.0, 1.0) == pytest.approx(6.0)
    assert cost.rail_ring_allreduce_time(2, 2, 8, 0.0, 1.0, 0.0, 10.0) == pytest.approx(6.0)


def test_ring_on_pcie_is_slower_than_its_links_alone() -> None:
    # Host memory, not the uplinks, sets the ring's pace: slower than the uniform form.
    cluster = Cluster.preset(PCIE)
    route = cluster.route(0, 1)
    got = simulated(_all_reduce, cluster, "ring", BIG)
    assert got > cost.ring_allreduce_time(4, BIG * 4, route.alpha_s, route.beta_Bps)


def test_ring_on_nvswitch_has_no_contention() -> None:
    cluster = Cluster.preset("4xA100-nvlink")
    route = cluster.route(0, 1)
    got = simulated(_all_reduce, cluster, "ring", BIG)
    add = cluster.op_seconds(0, 3 * BIG * 4 / 4)  # one chunk added per reduce-scatter step
    assert got == pytest.approx(
        cost.ring_allreduce_time(4, BIG * 4, route.alpha_s, route.beta_Bps) + 3 * add,
        rel=1e-9)
