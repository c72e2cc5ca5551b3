"""The two-node device map: every GPU's local and global rank, hidden GPUs, rails."""

from __future__ import annotations

import pytest

from mpgpu_edu.viz.nodes import global_rank, node_shape, plot_node_map
from mpgpu_edu.cluster import Cluster


def texts(fig, gid: str) -> list[str]:  # noqa: ANN001
    return [t.get_text() for ax in fig.axes for t in ax.texts if t.get_gid() == gid]


def test_shape_of_the_presets() -> None:
    assert node_shape(Cluster.preset("2x8xH100-ib")) == (2, 8)
    assert node_shape(Cluster.preset("8xA100-nvlink")) == (1, 8)
    assert [global_rank(1, j, 8) for j in range(3)] == [8, 9, 10]


def test_every_visible_gpu_shows_its_ranks() -> None:
    fig = plot_node_map("2x8xA100-ib", 2, ["0,1", "2,3"])
    assert texts(fig, "rank-label") == ["cuda:0", "local rank 0", "rank 0",
                                        "cuda:1", "local rank 1", "rank 1",
                                        "cuda:0", "local rank 0", "rank 2",
                                        "cuda:1", "local rank 1", "rank 3"]
    assert len(texts(fig, "hidden-label")) == 12
    titles = texts(fig, "node-title:1")
    assert titles == ["node 1: host 1, torchrun --node-rank 1 --nproc-per-node 2, "
                      "CUDA_VISIBLE_DEVICES=2,3"]
    rails = [line for line in fig.axes[0].lines if str(line.get_gid()).startswith("rail:")]
    assert len(rails) == 8
    assert "world size 4" in texts(fig, "formula")[0]


def test_default_is_every_gpu_of_both_nodes() -> None:
    fig = plot_node_map()
    ranks = [t for t in texts(fig, "rank-label") if t.startswith("rank")]
    assert ranks == [f"rank {r}" for r in range(16)]
    assert "47 GB/s per NIC" in texts(fig, "network-label")[0]


def test_bad_input_names_the_problem() -> None:
    with pytest.raises(ValueError, match="one node|1 node"):
        plot_node_map("8xA100-nvlink")
    with pytest.raises(ValueError, match="one per node"):
        plot_node_map("2x8xH100-ib", visible=["0,1"])
    with pytest.raises(ValueError, match="nproc_per_node=3"):
        plot_node_map("2x8xH100-ib", 3, ["0,1", "0,1,2"])


def test_the_fabric_has_a_switch_per_rail_and_a_spine() -> None:
    fig = plot_node_map()
    patches = {str(p.get_gid()) for p in fig.axes[0].patches}
    assert {f"rail-switch:{g}" for g in range(8)} <= patches and "spine" in patches
    # the label says what the simulator does with a hop between rails
    assert "non-blocking" in texts(fig, "network-label")[0]
    route_on, route_off = (Cluster.preset("2x8xH100-ib").route(7, s) for s in (15, 8))
    assert (route_on.alpha_s, route_on.beta_Bps) == (route_off.alpha_s, route_off.beta_Bps)


def test_local_ranks_on_different_gpus_are_flagged_as_not_one_rail() -> None:
    fig = plot_node_map("2x8xH100-ib", 2, ["0,1", "2,3"])
    (warning,) = texts(fig, "rail-mismatch")
    assert "local rank 0: NIC 0 on node 0, NIC 2 on node 1" in warning
    assert "local rank 1: NIC 1 on node 0, NIC 3 on node 1" in warning
    flagged = [t for t in texts(fig, "nic-label") if "local rank" in t]
    assert flagged == ["NIC 0\nlocal rank 0", "NIC 1\nlocal rank 1",
                       "NIC 2\nlocal rank 0", "NIC 3\nlocal rank 1"]
    for same in (None, ["0,1", "0,1"], ["2,3", "2,3"]):
        fig = plot_node_map("2x8xH100-ib", None if same is None else 2, same)
        assert texts(fig, "rail-mismatch") == []
        assert not [t for t in texts(fig, "nic-label") if "local rank" in t]
