"""Topologies (routes and the resources they hold) and the Cluster built on them."""

from __future__ import annotations

import pytest

from mpgpu_edu.cluster import Cluster, MemoryLedger, Route
from mpgpu_edu.cluster import topology as topo
from mpgpu_edu.cluster.hardware import GPUS, LINKS

PRESETS = ["4xRTX4090-pcie", "4xRTX4090-pcie-switch", "8xRTX4090-pcie", "4xA100-nvlink",
           "8xA100-nvlink", "4xH100-nvswitch", "8xH100-nvswitch", "2x8xA100-ib", "2x8xH100-ib",
           "2xCPU-gloo", "4xCPU-gloo"]


# --- topology ------------------------------------------------------------------------------

def test_uniform_routes_use_own_ports() -> None:
    t = topo.uniform(3, alpha_s=1e-5, beta_Bps=1e9)
    assert t.n_devices == 3
    assert t.route(0, 2) == Route(1e-5, 1e9, ("gpu0.out", "gpu2.in"))
    assert len(t.links()) == 3  # every pair
    assert t.route(0, 1).seconds(10**9) == pytest.approx(1e-5 + 1.0)


def test_nvswitch_ring_shares_no_port() -> None:
    link = LINKS["nvlink4-nvswitch"]
    t = topo.nvswitch(8, link)
    ring = [t.route(i, (i + 1) % 8) for i in range(8)]
    ports = [name for route in ring for name, _ in route.shares]
    assert len(ports) == len(set(ports))
    assert t.route(2, 5).shares == (("gpu2.out", link.beta_Bps), ("gpu5.in", link.beta_Bps))
    assert all(route.beta_Bps == link.beta_Bps and route.alpha_s == link.alpha_s
               for route in ring)
    assert t.groups() == {"nvswitch0": tuple(range(8))}
    assert {info.b for info in t.links()} == {"nvswitch0"}


def test_pcie_cards_share_host_memory_only() -> None:
    # Each card has its own uplink (ports); staged copies meet in host memory (a shared cap).
    t = topo.pcie_host(4, LINKS["pcie4-x16"], LINKS["host-ddr4-8ch"])
    assert t.route(0, 1).resources == ("gpu0.up", "gpu1.down")
    assert t.route(2, 3).shares == t.route(0, 1).shares
    assert {info.shared_resource for info in t.links()} == {"host0.memory"}


def test_multi_node_routes() -> None:
    intra, inter = LINKS["nvlink4-nvswitch"], LINKS["ib-ndr"]
    t = topo.multi_node(2, 4, intra, inter, nics_per_node=4)
    assert t.n_devices == 8
    assert t.groups() == {"node0": (0, 1, 2, 3), "node1": (4, 5, 6, 7)}
    inside = t.route(1, 2)
    assert inside.shares == (("gpu1.out", intra.beta_Bps), ("gpu2.in", intra.beta_Bps))
    between = t.route(1, 6)
    assert [name for name, _ in between.shares] == ["node0.nic1.out", "node1.nic2.in"]
    assert between.alpha_s == pytest.approx(intra.alpha_s + inter.alpha_s)
    assert between.beta_Bps == min(intra.beta_Bps, inter.beta_Bps)
    back = t.route(6, 1)
    assert [name for name, _ in back.shares] == ["node1.nic2.out", "node0.nic1.in"]
    assert {info.shared_resource for info in t.links()} == (
        {None} | {f"node{k}.nic{j}" for k in range(2) for j in range(4)})


def test_route_errors() -> None:
    t = topo.uniform(2, 1e-5, 1e9)
    with pytest.raises(ValueError, match="itself"):
        t.route(1, 1)
    with pytest.raises(ValueError, match="device 2 does not exist"):
        t.route(0, 2)
    with pytest.raises(ValueError, match="beta_Bps"):
        topo.uniform(2, 1e-5, 0)
    with pytest.raises(ValueError, match="alpha_s"):
        topo.uniform(2, -1, 1e9)
    with pytest.raises(ValueError, match="at least 1 device"):
        topo.uniform(0, 1e-5, 1e9)
    with pytest.raises(ValueError, match="per_node"):
        topo.multi_node(2, 0, LINKS["nvlink3"], LINKS["ib-hdr"])


# --- cluster -------------------------------------------------------------------------------

def test_presets_list() -> None:
    assert Cluster.presets() == PRESETS


@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_is_consistent(name: str) -> None:
    cluster = Cluster.preset(name)
    n = int(name.split("x")[0]) * (8 if name.startswith("2x8x") else 1)
    assert cluster.name == name
    assert cluster.n_physical == cluster.world_size == n
    assert cluster.logical_to_physical == list(range(n))
    assert cluster.gpu.source and cluster.gpu.memory_bytes > 0
    assert all(v > 0 for v in cluster.gpu.peak_flops.values())
    assert cluster.efficiency == cluster.gpu.efficiency and 0 < cluster.efficiency < 1
    assert cluster.launch_overhead_s > 0 and cluster.memory_Bps > 0
    assert cluster.gpu.compute_source
    for info in cluster.topology.links():
        assert info.beta_Bps > 0
    for src in range(n):
        for dst in range(n):
            if src != dst:
                route = cluster.route(src, dst)
                assert route.alpha_s > 0 and route.beta_Bps > 0
                assert route.resources or route.shares
    assert name in cluster.describe()


def test_unknown_preset_names_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="4xRTX4090-pcie.*2x8xH100-ib"):
        Cluster.preset("3xV100")


def test_visible_devices_map_logical_to_physical() -> None:
    cluster = Cluster.preset("8xA100-nvlink", visible="2,3")
    assert cluster.world_size == 2
    assert cluster.n_physical == 8
    assert cluster.visible == [2, 3]
    assert cluster.physical(0) == 2 and cluster.physical(1) == 3
    assert [name for name, _ in cluster.route(0, 1).shares] == ["gpu2.out", "gpu3.in"]
    with pytest.raises(ValueError, match="world_size is 2"):
        cluster.physical(2)
    assert cluster.visible_warnings() == []


def test_visible_follows_cuda_rules_and_warns() -> None:
    cluster = Cluster.preset("4xRTX4090-pcie", visible="3,1,-1,0")
    assert cluster.logical_to_physical == [3, 1]
    assert "entry 3 ('-1')" in cluster.visible_warnings()[0]


def test_zero_visible_devices() -> None:
    cluster = Cluster.preset("4xRTX4090-pcie", visible="")
    assert cluster.world_size == 0
    assert cluster.new_ledgers() == []
    with pytest.raises(ValueError, match="no devices are visible"):
        cluster.physical(0)


def test_with_visible_keeps_the_machine() -> None:
    full = Cluster.preset("8xRTX4090-pcie")
    part = full.with_visible("5,4")
    assert part.topology is full.topology and part.gpu is full.gpu
    assert part.logical_to_physical == [5, 4]
    assert full.world_size == 8
    assert part.with_visible(None).world_size == 8


class _FakeTorchDtype:
    """Prints like ``torch.bfloat16`` (importing torch here would make this file slow)."""

    def __str__(self) -> str:
        return "torch.bfloat16"


def test_compute_seconds() -> None:
    cluster = Cluster.preset("4xH100-nvswitch")
    peak = GPUS["H100-SXM-80GB"].peak_flops["bf16"]
    expected = 1e12 / (peak * cluster.gpu.efficiency) + cluster.launch_overhead_s
    assert cluster.compute_seconds(1e12, "bf16") == pytest.approx(expected)
    assert cluster.compute_seconds(1e12, _FakeTorchDtype()) == pytest.approx(expected)
    assert cluster.compute_seconds(0) == cluster.launch_overhead_s
    with pytest.raises(ValueError, match="fp32, bf16, fp16"):
        cluster.compute_seconds(1.0, "int8")
    with pytest.raises(ValueError, match="flops"):
        cluster.compute_seconds(-1.0)


def test_uniform_cluster_matches_closed_forms() -> None:
    cluster = Cluster.uniform(4, alpha_s=1e-5, beta_Bps=1e9)
    assert cluster.world_size == 4
    assert cluster.efficiency == 1.0 and cluster.launch_overhead_s == 0.0
    assert cluster.gpu is GPUS["H100-SXM-80GB"]
    assert cluster.route(3, 0) == Route(1e-5, 1e9, ("gpu3.out", "gpu0.in"))
    fp32 = GPUS["H100-SXM-80GB"].peak_flops["fp32"]
    assert cluster.compute_seconds(fp32) == pytest.approx(1.0)
    small = Cluster.uniform(2, 1e-5, 1e9, gpu="RTX4090-24GB", efficiency=0.25)
    assert small.gpu.name == "RTX4090-24GB" and small.efficiency == 0.25
    with pytest.raises(ValueError, match="unknown gpu"):
        Cluster.uniform(2, 1e-5, 1e9, gpu="V100")
    with pytest.raises(ValueError, match="efficiency"):
        Cluster.uniform(2, 1e-5, 1e9, efficiency=0.0)


def test_ledgers_one_per_visible_device() -> None:
    cluster = Cluster.preset("4xRTX4090-pcie", visible="2,3")
    ledgers = cluster.new_ledgers()
    assert [ledger.device for ledger in ledgers] == [0, 1]
    assert all(isinstance(ledger, MemoryLedger) for ledger in ledgers)
    assert ledgers[1].capacity_bytes == cluster.capacity_bytes(1) == 24 * 2**30
    assert "physical GPU 3" in ledgers[1].name
    assert cluster.new_ledgers()[0] is not ledgers[0]  # fresh every call


def test_describe_mentions_the_mapping() -> None:
    text = Cluster.preset("2x8xH100-ib", visible="8,0").describe()
    assert "cuda:0 -> GPU 8" in text and "cuda:1 -> GPU 0" in text
    assert "ib-ndr" in text and "node1" in text
