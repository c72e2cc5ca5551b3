"""Device maps, the CUDA_VISIBLE_DEVICES figure and the mesh, checked by what they draw (gid
tags and texts), not by pixels."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
from matplotlib.colors import to_rgba  # noqa: E402

from mpgpu_edu.cluster import Cluster  # noqa: E402
from mpgpu_edu.hybrid.mesh import Mesh  # noqa: E402
from mpgpu_edu.pipeline.partition import LayerCost, partition_by_sizes  # noqa: E402
from mpgpu_edu.cluster.trace import MemoryEvent, Trace  # noqa: E402
from mpgpu_edu.viz import palette  # noqa: E402
from mpgpu_edu.viz.devicebox import link_name, short_gpu_name  # noqa: E402
from mpgpu_edu.viz.devicemap import (  # noqa: E402
    format_count, plot_device_map, plot_visible_devices,
)
from mpgpu_edu.viz.mesh import mesh_coords, plot_mesh  # noqa: E402

GIB = 2**30


def gids(fig, prefix: str) -> list[str]:
    ax = fig.axes[0]
    return sorted(g for a in (*ax.patches, *ax.lines) if (g := a.get_gid() or "")
                  .startswith(prefix))


def texts(fig, gid: str) -> list[str]:
    return [t.get_text() for t in fig.axes[0].texts if t.get_gid() == gid]


def sixteen_layers():
    """16 layers of 300,000 parameters, 4 per stage: 1.2 M parameters, 4.58 MiB per stage."""
    return partition_by_sizes([LayerCost(str(i), 300_000, 0.0) for i in range(16)], [4] * 4)


# ---- names -----------------------------------------------------------------------------------
@pytest.mark.parametrize("name, short", [("RTX4090-24GB", "RTX 4090"), ("A100-80GB", "A100"),
                                         ("H100-SXM-80GB", "H100"), ("CPU-16GB", "CPU")])
def test_short_gpu_names(name: str, short: str) -> None:
    assert short_gpu_name(name) == short


def test_link_names_and_counts() -> None:
    assert link_name("pcie4-x16") == "PCIe 4 x16"
    assert link_name("nvlink4-nvswitch") == "NVLink 4"
    assert link_name("something-new") == "something-new"
    assert [format_count(n) for n in (512, 12_300, 1_200_000, 6_738_415_616)] == [
        "512", "12.3 K", "1.2 M", "6.74 B"]


# ---- the device map --------------------------------------------------------------------------
def test_pcie_map_gives_every_gpu_its_own_uplink_to_shared_host_memory() -> None:
    fig = plot_device_map(Cluster.preset("4xRTX4090-pcie"))
    assert gids(fig, "physical:") == [f"physical:{p}" for p in range(4)]
    assert gids(fig, "logical:") == [f"logical:{i}" for i in range(4)]
    assert gids(fig, "arrow:") == [f"arrow:{p}->{p}" for p in range(4)]
    assert gids(fig, "fabric:") == ["fabric:bridge0", "fabric:memory"]
    assert texts(fig, "fabric-name") == ["CPU root complex", "host memory"]
    assert texts(fig, "link-label") == [
        "PCIe 4 x16: 24 GB/s per card, each its own uplink",
        "every copy between two cards is staged here: 76.8 GB/s shared by all"]
    assert len(gids(fig, "link")) == 5  # one uplink per GPU to the CPU, one to host memory
    assert "cuda:2 = GPU 2" in texts(fig, "logical-name")
    assert "(RTX 4090)" in texts(fig, "logical-model")


def test_two_bridges_meet_at_the_host() -> None:
    fig = plot_device_map(Cluster.preset("8xRTX4090-pcie"))
    assert gids(fig, "fabric:") == ["fabric:bridge0", "fabric:bridge1", "fabric:host"]
    assert texts(fig, "fabric-name")[-1] == (
        "between the CPUs a copy crosses the UPI socket link, 10 GB/s shared")


def test_cards_behind_one_pcie_switch_share_its_uplink() -> None:
    fig = plot_device_map(Cluster.preset("4xRTX4090-pcie-switch"))
    assert gids(fig, "fabric:") == ["fabric:cpu", "fabric:switch0"]
    assert texts(fig, "fabric-name") == ["PCIe switch", "CPU root complex"]
    assert texts(fig, "link-label") == [
        "PCIe 4 x16: 24 GB/s per card, to the switch",
        "one x16 uplink from the switch: 24 GB/s shared by 4 cards"]
    assert len(gids(fig, "link")) == 5  # a line per card to the switch, ONE from it to the CPU


def test_visible_devices_are_renumbered_and_the_others_greyed_out() -> None:
    fig = plot_device_map(Cluster.preset("8xA100-nvlink", visible="6,2"))
    assert gids(fig, "hidden:") == [f"hidden:{p}" for p in (0, 1, 3, 4, 5, 7)]
    assert gids(fig, "physical:") == ["physical:2", "physical:6"]
    assert gids(fig, "arrow:") == ["arrow:2->1", "arrow:6->0"]
    assert texts(fig, "logical-name") == ["cuda:0 = GPU 6", "cuda:1 = GPU 2"]
    assert texts(fig, "link-label") == ["NVLink 3: 205 GB/s per GPU"]
    assert "'6,2'" in texts(fig, "visible-label")[0]
    hidden = next(p for p in fig.axes[0].patches if p.get_gid() == "hidden:0")
    assert hidden.get_linestyle() == "--"


def test_nodes_are_joined_by_the_network_link() -> None:
    fig = plot_device_map(Cluster.preset("2x8xH100-ib"))
    assert gids(fig, "node:") == ["node:node0", "node:node1"]
    assert "fabric:network" in gids(fig, "fabric:")
    labels = texts(fig, "link-label")
    assert labels.count("NVLink 4: 370 GB/s per GPU") == 2
    assert "InfiniBand NDR: 47 GB/s per NIC, 8 NICs per node, one per GPU rail" in labels
    assert len(gids(fig, "logical:")) == 16


def test_stages_are_written_on_their_devices() -> None:
    cluster = Cluster.preset("8xA100-nvlink", visible="2,3,6,5")
    fig = plot_device_map(cluster, sixteen_layers().with_devices(cluster.visible))
    stage = texts(fig, "stage")
    assert stage[:2] == ["stage 0: layers 0-3", "1.2 M params, 4.58 MiB"]
    assert "stage 3: layers 12-15" in stage
    assert "a pipeline of 4 stages" in fig.axes[0].get_title(loc="left")


def test_a_stage_on_a_device_that_is_not_visible_is_an_error() -> None:
    with pytest.raises(ValueError, match="only 2 devices are visible"):
        plot_device_map(Cluster.preset("4xRTX4090-pcie", visible="0,1"), sixteen_layers())


def test_memory_bars_against_capacity_and_oom() -> None:
    held = [{"parameters": 4 * GIB, "optimizer": 8 * GIB}, {"parameters": 30 * GIB}]
    fig = plot_device_map(Cluster.preset("4xRTX4090-pcie", visible="0,1"), memory=held)
    ax = fig.axes[0]
    segments = [p for p in ax.patches if (p.get_gid() or "").startswith("memory:")]
    assert sorted(p.get_gid() for p in segments) == [
        "memory:optimizer", "memory:parameters", "memory:parameters"]
    for p in segments:
        assert p.get_facecolor() == to_rgba(palette.MEMORY_COLORS[p.get_gid()[7:]])
    assert texts(fig, "memory-label") == ["12 GiB of 24 GiB (50%)", "30 GiB of 24 GiB OOM"]
    capacity = [p for p in ax.patches if p.get_gid() == "capacity"]
    oom_bar = [p for p in segments if p.get_x() == pytest.approx(capacity[1].get_x())]
    assert [p.get_width() for p in oom_bar] == [pytest.approx(capacity[1].get_width())]


def test_memory_from_a_trace_is_its_peak() -> None:
    trace = Trace(2, memory=[MemoryEvent(0, 0.0, "activations", 2 * GIB, "", 2 * GIB),
                             MemoryEvent(0, 1.0, "activations", -2 * GIB, "", 0),
                             MemoryEvent(1, 0.0, "parameters", GIB, "", GIB)])
    fig = plot_device_map(Cluster.preset("4xRTX4090-pcie", visible="0,1"), memory=trace)
    assert texts(fig, "memory-label") == ["2 GiB of 24 GiB (8%)", "1 GiB of 24 GiB (4%)"]


def test_cpu_presets_show_processes_not_gpus() -> None:
    fig = plot_device_map(Cluster.preset("2xCPU-gloo"))
    assert texts(fig, "logical-name") == ["rank 0 = process 0", "rank 1 = process 1"]
    assert texts(fig, "physical-name") == ["process 0", "process 1"]


def test_figures_render(tmp_path) -> None:
    plot_device_map(Cluster.preset("2x8xH100-ib"), memory=[{}] * 16).savefig(tmp_path / "a.png")
    plot_visible_devices(4, "3,1", "A100-80GB").savefig(tmp_path / "b.png")
    assert (tmp_path / "a.png").stat().st_size > 0 and (tmp_path / "b.png").stat().st_size > 0


# ---- the CUDA_VISIBLE_DEVICES figure ---------------------------------------------------------
def test_visible_devices_with_warnings() -> None:
    fig = plot_visible_devices(8, "0,2,-1,1", "A100-80GB")
    assert gids(fig, "arrow:") == ["arrow:0->0", "arrow:2->1"]
    assert len(gids(fig, "hidden:")) == 6
    [warning] = texts(fig, "warnings")
    assert "negative" in warning
    assert "device_count() == 2" in fig.axes[0].get_title(loc="left")


def test_empty_value_shows_no_devices() -> None:
    fig = plot_visible_devices(4, "")
    assert gids(fig, "arrow:") == [] and len(gids(fig, "hidden:")) == 4
    assert texts(fig, "no-devices")
    assert "set but empty" in texts(fig, "warnings")[0]


def test_unset_value_shows_every_gpu_in_order_without_warnings() -> None:
    fig = plot_visible_devices(3, None)
    assert gids(fig, "arrow:") == ["arrow:0->0", "arrow:1->1", "arrow:2->2"]
    assert texts(fig, "warnings") == []


# ---- the mesh --------------------------------------------------------------------------------
def test_mesh_coords_follow_the_mesh() -> None:
    mesh = Mesh(dp=2, pp=3)
    assert mesh_coords(mesh) == {r: mesh.coords(r) for r in range(6)}

    class Plain:  # no coords(): ranks run along the pipeline first
        dp, pp = 2, 3

    assert mesh_coords(Plain()) == mesh_coords(mesh)


def test_mesh_figure_outlines_both_kinds_of_group() -> None:
    fig = plot_mesh(Mesh(dp=2, pp=3))
    assert gids(fig, "rank:") == sorted(f"rank:{r}" for r in range(6))
    assert gids(fig, "pp-group:") == ["pp-group:0", "pp-group:1"]
    assert gids(fig, "dp-group:") == ["dp-group:0", "dp-group:1", "dp-group:2"]
    names, coords = texts(fig, "rank-name"), texts(fig, "rank-coords")
    assert coords[names.index("rank 4")] == "dp 1, pp 1"
