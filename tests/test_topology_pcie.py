"""PCIe wired as it is: own uplinks, host memory shared fairly, a switch uplink shared."""

from __future__ import annotations

import pytest
import torch

from mpgpu_edu.cluster import Cluster
from mpgpu_edu.cluster import topology as topo
from mpgpu_edu.collectives import all_reduce, cost
from mpgpu_edu.comm import launch
from mpgpu_edu.cluster.hardware import LINKS

UPLINK, MEMORY, UPI = LINKS["pcie4-x16"], LINKS["host-ddr4-8ch"], LINKS["upi-xeon"]
MIB = 2**20


def wiring_only(name: str) -> Cluster:
    """A preset whose compute is free, so that only its wiring takes time."""
    cluster = Cluster.preset(name)
    cluster.efficiency, cluster.launch_overhead_s = 1.0, 0.0
    cluster.memory_Bps = 0.0
    return cluster


def _all_reduce(comm, algo, numel):
    all_reduce(comm, torch.empty(numel, device="meta"), algo=algo)


def makespan(cluster, algo: str, nbytes: int) -> float:
    return launch(_all_reduce, cluster, algo, nbytes // 4).trace.makespan


def test_every_card_has_its_own_uplink_and_shares_host_memory() -> None:
    t = topo.pcie_host(4, UPLINK, MEMORY)
    route = t.route(0, 1)
    assert route.resources == ("gpu0.up", "gpu1.down")
    assert route.shares == (("host0.memory", MEMORY.beta_Bps / 2),)  # written, then read
    assert route.beta_Bps == UPLINK.beta_Bps and route.alpha_s == UPLINK.alpha_s
    assert set(t.route(2, 3).resources).isdisjoint(route.resources)
    assert t.groups() == {"bridge0": (0, 1, 2, 3)}
    # Figures can show both numbers of every wire.
    assert {(i.beta_Bps, i.peak_Bps) for i in t.links()} == {(24e9, 31.5e9)}


def test_two_sockets_cross_the_socket_link() -> None:
    t = topo.pcie_host(8, UPLINK, MEMORY, sockets=2, socket_link=UPI)
    assert t.groups() == {"bridge0": (0, 1, 2, 3), "bridge1": (4, 5, 6, 7)}
    assert t.route(4, 5).shares == (("host1.memory", MEMORY.beta_Bps / 2),)
    across = t.route(1, 6)
    assert across.resources == ("gpu1.up", "gpu6.down")
    assert across.shares == (("host0.memory", MEMORY.beta_Bps / 2),
                             ("socket0to1", UPI.beta_Bps))
    assert across.alpha_s == pytest.approx(2 * UPLINK.alpha_s)
    assert t.route(6, 1).shares[1] == ("socket1to0", UPI.beta_Bps)
    with pytest.raises(ValueError, match="socket_link"):
        topo.pcie_host(8, UPLINK, MEMORY, sockets=2)
    with pytest.raises(ValueError, match="sockets"):
        topo.pcie_host(4, UPLINK, MEMORY, sockets=5)


def test_uneven_sockets_cover_every_device() -> None:
    t = topo.pcie_host(5, UPLINK, MEMORY, sockets=2, socket_link=UPI)
    assert sorted(d for group in t.groups().values() for d in group) == [0, 1, 2, 3, 4]


def test_a_switch_uplink_is_shared_both_ways() -> None:
    t = topo.pcie_switch(8, UPLINK, MEMORY, per_switch=4)
    assert t.groups() == {"switch0": (0, 1, 2, 3), "switch1": (4, 5, 6, 7)}
    route = t.route(1, 6)
    assert route.resources == ("gpu1.up", "gpu6.down")
    assert [name for name, _ in route.shares] == ["switch0.up", "host0.memory", "switch1.down"]
    # Even between two cards under one switch the staged copy climbs to the CPU and back.
    assert [name for name, _ in t.route(0, 1).shares] == ["switch0.up", "host0.memory",
                                                          "switch0.down"]
    with pytest.raises(ValueError, match="per_switch"):
        topo.pcie_switch(4, UPLINK, MEMORY, per_switch=0)


def test_ring_on_the_workstation_matches_its_closed_form() -> None:
    # Four messages at once share host memory: each gets min(beta, C / 4).
    cluster, size = wiring_only("4xRTX4090-pcie"), 64 * MIB
    route = cluster.route(0, 1)
    shared = route.shares[0][1]
    want = cost.staged_ring_allreduce_time(4, size, route.alpha_s, route.beta_Bps, shared)
    assert makespan(cluster, "ring", size) == pytest.approx(want, rel=1e-9)
    assert shared / 4 < route.beta_Bps  # host memory, not the uplinks, sets the ring's pace


def test_naive_on_the_workstation_matches_its_closed_form() -> None:
    cluster, size = wiring_only("4xRTX4090-pcie"), 64 * MIB
    route = cluster.route(0, 1)
    want = cost.staged_naive_allreduce_time(4, size, route.alpha_s, route.beta_Bps,
                                            route.shares[0][1])
    assert makespan(cluster, "naive", size) == pytest.approx(want, rel=1e-9)


def test_ring_is_at_least_twice_as_fast_as_naive_on_4_rtx_4090() -> None:
    cluster, size = Cluster.preset("4xRTX4090-pcie"), 256 * MIB
    ring, naive = makespan(cluster, "ring", size), makespan(cluster, "naive", size)
    tree = makespan(cluster, "tree", size)
    assert naive >= 2 * ring
    assert ring < tree < naive


def test_a_shared_switch_uplink_still_shows_contention() -> None:
    # Four cards behind one x16 switch uplink: the ring's four messages divide it four ways,
    # so the ring's 2(N-1)/N S per rank gains nothing over naive's one message at a time.
    cluster, size = wiring_only("4xRTX4090-pcie-switch"), 256 * MIB
    route = cluster.route(0, 1)
    ring, naive = makespan(cluster, "ring", size), makespan(cluster, "naive", size)
    assert ring == pytest.approx(
        cost.staged_ring_allreduce_time(4, size, route.alpha_s, route.beta_Bps,
                                        route.beta_Bps), rel=1e-9)
    assert ring > 0.9 * naive
    assert ring > 3.5 * cost.ring_allreduce_time(4, size, route.alpha_s, route.beta_Bps)


def test_two_sockets_are_slower_than_one() -> None:
    one, two = wiring_only("4xRTX4090-pcie"), wiring_only("8xRTX4090-pcie")
    size = 64 * MIB
    bus_one = cost.busbw(size, makespan(one, "ring", size), 4)
    bus_two = cost.busbw(size, makespan(two, "ring", size), 8)
    assert bus_two < bus_one
    assert bus_two <= UPI.beta_Bps  # the ring crosses the socket link each step


def test_a_route_alone_moves_at_its_narrowest_cap() -> None:
    """Across the socket link a lone 1 MiB copy takes alpha + bytes / 10 GB/s, and the route
    says so (``route.seconds`` is what the simulator measures)."""
    import torch

    from mpgpu_edu.cluster import Cluster
    from mpgpu_edu.comm import launch

    cluster = Cluster.preset("8xRTX4090-pcie", visible="4,0")
    route = cluster.route(0, 1)

    def program(comm) -> None:
        buffer = torch.zeros(2**20, dtype=torch.uint8)
        if comm.rank == 0:
            comm.send(buffer, 1)
        else:
            comm.recv(buffer, 0)

    assert route.beta_Bps == min(rate for _, rate in route.shares)
    assert abs(launch(program, cluster).trace.makespan - route.seconds(2**20)) < 1e-12
