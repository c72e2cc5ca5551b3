"""Hierarchical all-reduce: the right sums, its closed form, its bytes per link class, and
why it beats one flat ring on two nodes."""

from __future__ import annotations

import pytest
import torch

from mpgpu_edu.cluster import Cluster
from mpgpu_edu.cluster import topology as topo
from mpgpu_edu.collectives import all_reduce, cost
from mpgpu_edu.collectives.hierarchical import (all_reduce_hierarchical, node_groups,
                                                rail_groups)
from mpgpu_edu.comm import launch
from mpgpu_edu.cluster.hardware import LINKS, LinkSpec

A_NVL, B_NVL, A_NIC, B_NIC = 3e-6, 300e9, 5e-6, 40e9


def two_level(nodes: int, per_node: int) -> Cluster:
    """Nodes of NVSwitch GPUs, one NIC per GPU, and free compute: the closed forms' model."""
    wiring = topo.multi_node(nodes, per_node, LinkSpec("intra", A_NVL, B_NVL, "test"),
                             LinkSpec("nic", A_NIC, B_NIC, "test"), nics_per_node=per_node)
    return Cluster("two-level", Cluster.preset("2x8xH100-ib").gpu, wiring, efficiency=1.0,
                   launch_overhead_s=0.0, memory_Bps=0.0)


def hierarchical_meta(comm, numel: int, per_node: int) -> None:  # noqa: ANN001
    all_reduce_hierarchical(comm, torch.empty(numel, device="meta"), per_node)


def flat_meta(comm, numel: int) -> None:  # noqa: ANN001
    all_reduce(comm, torch.empty(numel, device="meta"), algo="ring")


def summed(comm, numel: int, per_node: int, op: str) -> torch.Tensor:  # noqa: ANN001
    t = torch.arange(numel, dtype=torch.float64) * (comm.rank + 1) - comm.rank
    all_reduce_hierarchical(comm, t, per_node, op=op)
    return t


def expected(n: int, numel: int, op: str) -> torch.Tensor:
    total = sum(torch.arange(numel, dtype=torch.float64) * (r + 1) - r for r in range(n))
    return total / n if op == "mean" else total


def test_groups_are_the_nodes_and_the_rails() -> None:
    assert node_groups(2, 4) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert rail_groups(2, 4) == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert rail_groups(3, 2) == [[0, 2, 4], [1, 3, 5]]
    with pytest.raises(ValueError, match="nodes and per_node"):
        rail_groups(0, 4)


@pytest.mark.parametrize("nodes, per_node", [(2, 4), (3, 2), (2, 3), (1, 4), (4, 1)])
@pytest.mark.parametrize("numel", [1, 5, 37])
def test_sums_like_one_device(nodes: int, per_node: int, numel: int) -> None:
    n = nodes * per_node
    for op in ("sum", "mean"):
        got = launch(summed, n, numel, per_node, op).results
        assert all(torch.allclose(t, expected(n, numel, op)) for t in got), (op, got)


def test_refuses_a_world_size_it_cannot_split_into_nodes() -> None:
    with pytest.raises(Exception, match="per_node must divide"):
        launch(lambda comm: all_reduce_hierarchical(comm, torch.ones(3), 4), 6)


@pytest.mark.parametrize("nodes, per_node", [(2, 8), (2, 4), (3, 4), (4, 2), (1, 4)])
@pytest.mark.parametrize("numel", [2**16, 7])
def test_simulated_time_is_the_closed_form(nodes: int, per_node: int, numel: int) -> None:
    cluster = two_level(nodes, per_node)
    seconds = launch(hierarchical_meta, cluster, numel, per_node).trace.makespan
    want = cost.hierarchical_allreduce_time(nodes, per_node, numel * 4, A_NVL, B_NVL,
                                            A_NVL + A_NIC, B_NIC)
    # Uneven chunks (numel 7) are at most one element per step slower than the form.
    assert seconds == pytest.approx(want, rel=1e-9 if numel % (nodes * per_node) == 0 else 1e-4)
    flat = launch(flat_meta, cluster, numel).trace.makespan
    want_flat = cost.flat_ring_two_level_time(nodes, per_node, numel * 4, A_NVL, B_NVL,
                                              A_NVL + A_NIC, B_NIC)
    assert flat == pytest.approx(want_flat, rel=1e-9 if numel % (nodes * per_node) == 0
                                 else 1e-4)


def test_bytes_per_link_class() -> None:
    nodes, per_node, numel = 2, 4, 800
    result = launch(hierarchical_meta, two_level(nodes, per_node), numel, per_node)
    want = cost.hierarchical_bytes_sent(nodes, per_node, numel * 4)
    for rank, stats in enumerate(result.stats):
        inside = sum(b for peer, b in stats.sent_to.items() if peer // per_node == rank // per_node)
        across = sum(b for peer, b in stats.sent_to.items() if peer // per_node != rank // per_node)
        assert (inside, across) == (want["intra"], want["inter"])
        assert {peer % per_node for peer in stats.sent_to if peer // per_node != rank // per_node
                } == {rank % per_node}  # across the network only on its own rail


@pytest.mark.parametrize("preset, intra, nic", [("2x8xH100-ib", "nvlink4-nvswitch", "ib-ndr"),
                                                ("2x8xA100-ib", "nvlink3", "ib-hdr")])
def test_beats_the_flat_ring_on_two_nodes_as_the_closed_form_predicts(preset: str, intra: str,
                                                                      nic: str) -> None:
    a, b = LINKS[intra], LINKS[nic]
    forms = (a.alpha_s, a.beta_Bps, a.alpha_s + b.alpha_s, min(a.beta_Bps, b.beta_Bps))
    wiring = Cluster.preset(preset)
    wiring.efficiency, wiring.launch_overhead_s, wiring.memory_Bps = 1.0, 0.0, 0.0
    for nbytes in (2**12, 2**26):
        hier_form = cost.hierarchical_allreduce_time(2, 8, nbytes, *forms)
        flat_form = cost.flat_ring_two_level_time(2, 8, nbytes, *forms)
        assert hier_form < flat_form / 3
        hier = launch(hierarchical_meta, wiring, nbytes // 4, 8).trace.makespan
        flat = launch(flat_meta, wiring, nbytes // 4).trace.makespan
        assert hier == pytest.approx(hier_form, rel=1e-9)
        assert flat == pytest.approx(flat_form, rel=1e-9)
        # The preset itself also charges every addition; the order stays the same.
        full = Cluster.preset(preset)
        hier_full = launch(hierarchical_meta, full, nbytes // 4, 8).trace.makespan
        flat_full = launch(flat_meta, full, nbytes // 4).trace.makespan
        assert hier_form <= hier_full and flat_form <= flat_full
        assert hier_full < flat_full / 3


def gloo_cases(comm, cases: list) -> list[torch.Tensor]:  # noqa: ANN001
    return [summed(comm, numel, per_node, op) for numel, per_node, op in cases]


@pytest.mark.gloo
def test_sums_on_real_gloo_processes() -> None:
    cases = [(9, 2, "sum"), (3, 2, "mean"), (1, 2, "sum"), (5, 1, "sum")]
    got = launch(gloo_cases, 4, cases, backend="gloo", timeout=120).results
    for rank_results in got:
        for t, (numel, _per_node, op) in zip(rank_results, cases):
            assert torch.allclose(t, expected(4, numel, op)), (numel, op, t)
