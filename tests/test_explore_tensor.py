"""The tensor-parallel explorer: its numbers against the closed forms of Megatron's block (one
all-reduce each way, compute 1/N), NVLink against PCIe, the function it is given actually
running the block, and the widget redrawing when a control moves."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402

from mpgpu_edu.cluster import Cluster  # noqa: E402
from mpgpu_edu.explore import tp_explorer, tp_view  # noqa: E402
from mpgpu_edu.tensor import megatron_mlp  # noqa: E402

FREE_LINKS = Cluster.uniform(8, alpha_s=0.0, beta_Bps=1e30)
SMALL = {"d_model": 256, "tokens": 512}  # the closed forms hold at any size; small is quick


class Counting:
    """exercise 5.4's signature, delegating to the reference, counting calls, with a label."""

    label = "your Megatron MLP"

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return megatron_mlp(*args, **kwargs)


@pytest.mark.parametrize("devices", [2, 4, 8])
def test_tp_view_one_all_reduce_each_way_and_ring_bytes(devices: int) -> None:
    _, info = tp_view(devices, "8xA100-nvlink", **SMALL)
    output = SMALL["tokens"] * SMALL["d_model"] * 2
    assert info["output_bytes"] == output
    assert info["all_reduces"] == (pytest.approx(1.0), pytest.approx(1.0))
    # two all-reduces of the output: 2 (N - 1) x output bytes each, over all devices
    assert sum(info["bytes_sent"]) == 2 * 2 * (devices - 1) * output
    assert sum(info["bytes_per_link"].values()) == sum(info["bytes_sent"])
    assert {src for src, _ in info["bytes_per_link"]} == set(range(devices))


def test_tp_view_with_free_links_scales_perfectly() -> None:
    _, one = tp_view(1, FREE_LINKS, **SMALL)
    _, four = tp_view(4, FREE_LINKS, **SMALL)
    assert one["all_reduce_s"] == 0 and one["bytes_per_link"] == {}
    assert four["compute_s"] == pytest.approx(one["compute_s"] / 4, rel=1e-6)
    assert four["all_reduce_s"] == pytest.approx(0, abs=1e-3 * four["step_s"])
    assert four["speedup"] == pytest.approx(4, rel=1e-3)
    assert four["scaling"][4]["step_s"] == pytest.approx(four["step_s"])


def test_tp_view_pcie_waits_more_and_more_as_devices_grow() -> None:
    shares = {n: tp_view(n, "8xRTX4090-pcie")[1]["comm_share"] for n in (2, 4, 8)}
    assert shares[2] < shares[4] < shares[8]
    _, nvlink = tp_view(8, "8xA100-nvlink")
    assert nvlink["comm_share"] < 0.25 < shares[8]
    assert nvlink["speedup"] > 5  # NVLink: tensor parallelism pays


def test_tp_view_runs_the_function_it_is_given_and_names_it() -> None:
    mlp = Counting()
    fig, info = tp_view(4, "8xA100-nvlink", mlp=mlp, **SMALL)
    # ranks x runs: the timeline's (4 devices) and the lower panel's (1, 2, 4, 8: 4 reused)
    assert mlp.calls == 4 + 1 + 2 + 8
    assert info["who"] == "your Megatron MLP"
    assert fig.axes[0].get_title(loc="left").startswith("your Megatron MLP")


def test_tp_view_rejects_more_devices_than_the_cluster_has() -> None:
    with pytest.raises(ValueError, match="4xRTX4090-pcie has 4 devices"):
        tp_view(5, "4xRTX4090-pcie")


def test_tp_explorer_redraws_when_the_device_slider_moves() -> None:
    mlp = Counting()
    explorer = tp_explorer(mlp, devices=2, d_model=1024)
    assert explorer.renders == 1 and explorer.info["devices"] == 2
    png = explorer.png()
    before = explorer.figure
    explorer.controls["devices"].value = 4
    assert explorer.renders == 2 and explorer.figure is not before
    assert explorer.info["devices"] == 4 and explorer.png() != png
    assert explorer.info["who"] == "your Megatron MLP" and mlp.calls > 0
    assert "waiting on all-reduces" in explorer.summary.value
    assert "dev 3 -&gt; dev 0" in explorer.summary.value or "dev 3 -> dev 0" in \
        explorer.summary.value


def test_tp_explorer_follows_the_cluster_and_shows_errors() -> None:
    explorer = tp_explorer(devices=8, d_model=1024)
    explorer.controls["cluster"].value = "4xRTX4090-pcie"  # the slider shrinks to 4
    assert explorer.controls["devices"].max == 4 and explorer.info["devices"] == 4
    assert explorer.error is None and explorer.info["cluster"] == "4xRTX4090-pcie"
    good = explorer.figure
    explorer.controls["devices"].max = 8
    explorer.controls["devices"].value = 6
    assert "has 4 devices" in explorer.error and explorer.figure is good
    assert "cannot draw this" in explorer.summary.value


def test_tp_explorer_offers_the_switch_and_it_waits_longer_than_own_uplinks() -> None:
    explorer = tp_explorer(devices=4, d_model=1024)
    assert "4xRTX4090-pcie-switch" in explorer.controls["cluster"].options
    _, own = tp_view(4, "4xRTX4090-pcie")
    _, switch = tp_view(4, "4xRTX4090-pcie-switch")
    _, nvlink = tp_view(4, "4xA100-nvlink")
    # staged through host memory the all-reduces already wait far longer than on NVLink;
    # behind one shared switch uplink longer still
    assert nvlink["all_reduce_s"] * 5 < own["all_reduce_s"] < switch["all_reduce_s"]
