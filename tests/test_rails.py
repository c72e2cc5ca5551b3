"""Two nodes with one NIC per GPU: a flat ring uses one rail, one ring per rail uses all."""

from __future__ import annotations

import pytest
import torch

from mpgpu_edu.cluster import Cluster
from mpgpu_edu.cluster import topology as topo
from mpgpu_edu.collectives import all_reduce, cost
from mpgpu_edu.collectives.multichannel import all_reduce_multichannel, rail_rings
from mpgpu_edu.comm import launch
from mpgpu_edu.cluster.hardware import LINKS

# Published: 8x H100 ring busbw ~370 GB/s (NVIDIA/nccl-tests#212) and NDR at 46-48 GB/s per
# NIC (NVIDIA/nccl-tests#290): two such nodes with eight rails reach the ~370 GB/s class.
PUBLISHED_H100_BUSBW = 370e9
SIZE = 2**31  # 2 GiB: the large-message end of nccl-tests' sweep


def wiring_only(name: str) -> Cluster:
    cluster = Cluster.preset(name)
    cluster.efficiency, cluster.launch_overhead_s = 1.0, 0.0
    cluster.memory_Bps = 0.0
    return cluster


def _multichannel(comm, numel, rings):
    all_reduce_multichannel(comm, torch.empty(numel, device="meta"), rings)


def _flat(comm, numel):
    all_reduce(comm, torch.empty(numel, device="meta"), algo="ring")


def test_each_gpu_has_its_own_rail() -> None:
    t = topo.multi_node(2, 8, LINKS["nvlink4-nvswitch"], LINKS["ib-ndr"], nics_per_node=8)
    route = t.route(3, 11)
    assert [name for name, _ in route.shares] == ["node0.nic3.out", "node1.nic3.in"]
    assert route.resources == ()
    assert route.beta_Bps == LINKS["ib-ndr"].beta_Bps
    one_nic = topo.multi_node(2, 8, LINKS["nvlink4-nvswitch"], LINKS["ib-ndr"])
    assert [name for name, _ in one_nic.route(3, 11).shares] == ["node0.nic0.out",
                                                                "node1.nic0.in"]
    with pytest.raises(ValueError, match="nics_per_node"):
        topo.multi_node(2, 8, LINKS["nvlink3"], LINKS["ib-hdr"], nics_per_node=9)


@pytest.mark.parametrize("nodes, per_node", [(2, 8), (2, 4), (3, 4), (4, 2), (1, 8), (2, 1)])
def test_rail_rings_visit_everyone_and_cross_on_rails(nodes: int, per_node: int) -> None:
    rings = rail_rings(nodes, per_node)
    n = nodes * per_node
    assert all(sorted(ring) == list(range(n)) for ring in rings)
    hops = [(a, b) for ring in rings for a, b in zip(ring, ring[1:] + ring[:1])
            if a // per_node != b // per_node]
    outs = [a % per_node for a, _ in hops]
    if nodes == 2 and per_node > 1:
        assert all(a % per_node == b % per_node for a, b in hops)  # rail-aligned
        assert sorted(outs) == sorted(list(range(per_node)) * 2)  # every NIC, both nodes


def test_multichannel_sums_like_one_ring() -> None:
    def program(comm, rings):
        t = torch.arange(37, dtype=torch.float64) * (comm.rank + 1)
        all_reduce_multichannel(comm, t, rings)
        return t

    for nodes, per_node in [(2, 4), (3, 2)]:
        n = nodes * per_node
        got = launch(program, n, rail_rings(nodes, per_node)).results
        want = torch.arange(37, dtype=torch.float64) * sum(range(1, n + 1))
        assert all(torch.equal(t, want) for t in got)


def test_multichannel_mean_and_bad_rings() -> None:
    def program(comm):
        t = torch.full((5,), float(comm.rank))
        all_reduce_multichannel(comm, t, [[0, 1, 2], [2, 1, 0]], op="mean")
        return t

    assert all(torch.allclose(t, torch.ones(5)) for t in launch(program, 3).results)
    with pytest.raises(Exception, match="ring 1 must visit every rank"):
        launch(lambda comm: all_reduce_multichannel(comm, torch.ones(2), [[0, 1], [0, 0]]), 2)


def test_multichannel_bus_bandwidth_on_2x8_h100_is_the_published_class() -> None:
    cluster = wiring_only("2x8xH100-ib")
    seconds = launch(_multichannel, cluster, SIZE // 4, rail_rings(2, 8)).trace.makespan
    intra, nic = LINKS["nvlink4-nvswitch"], LINKS["ib-ndr"]
    assert seconds == pytest.approx(cost.rail_ring_allreduce_time(
        2, 8, SIZE, intra.alpha_s, intra.beta_Bps, nic.alpha_s, nic.beta_Bps), rel=1e-6)
    assert cost.busbw(SIZE, seconds, 16) == pytest.approx(PUBLISHED_H100_BUSBW, rel=0.15)


def test_a_flat_ring_runs_at_one_nic() -> None:
    cluster = wiring_only("2x8xH100-ib")
    seconds = launch(_flat, cluster, SIZE // 4).trace.makespan
    busbw = cost.busbw(SIZE, seconds, 16)
    assert busbw == pytest.approx(LINKS["ib-ndr"].beta_Bps, rel=0.05)


def test_every_rail_carries_traffic() -> None:
    cluster = wiring_only("2x8xA100-ib")
    trace = launch(_multichannel, cluster, 2**20, rail_rings(2, 8)).trace
    rails = {(e.device % 8, e.peer % 8) for e in trace.events
             if e.kind == "send" and e.device // 8 != e.peer // 8}
    assert {src for src, _ in rails} == set(range(8))
    assert all(src == dst for src, dst in rails)
