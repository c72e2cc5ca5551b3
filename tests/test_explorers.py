"""Explorers: the views' numbers against their closed forms, and the widgets redrawing when a
control moves (the figure and the numbers change; a bad setting shows an error instead)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402

from mpgpu_edu.cluster import Cluster  # noqa: E402
from mpgpu_edu.explore import (  # noqa: E402
    Explorer, dp_explorer, dp_view, memory_calculator, memory_view, pipeline_explorer,
    pipeline_view, ring_stepper, ring_view, visible_devices_sandbox, visible_view,
)
from mpgpu_edu.cluster.hardware import LINKS  # noqa: E402
from mpgpu_edu.memory.estimate import estimate_memory  # noqa: E402
from mpgpu_edu.memory.models import spec_params  # noqa: E402

MIB = 2**20
FREE_SENDS = Cluster.uniform(4, alpha_s=0.0, beta_Bps=1e30)


def moved(explorer: Explorer, control: str, value: object) -> tuple:
    """Move one control; returns (figure before, figure after, renders added)."""
    before, renders = explorer.figure, explorer.renders
    explorer.controls[control].value = value
    return before, explorer.figure, explorer.renders - renders


# ---- pipeline --------------------------------------------------------------------------------
@pytest.mark.parametrize("schedule, peaks", [("gpipe", [8, 8, 8, 8]), ("1f1b", [4, 3, 2, 1])])
def test_pipeline_view_matches_the_closed_forms(schedule: str, peaks: list[int]) -> None:
    _, info = pipeline_view(4, 8, schedule, FREE_SENDS, fwd_s=0.01, bwd_s=0.02,
                            activation_bytes=MIB)
    assert info["bubble_fraction"] == pytest.approx(3 / 11)
    assert info["bubble_formula"] == pytest.approx(3 / 11)
    assert info["makespan_s"] == pytest.approx((8 + 3) * 0.03)
    assert info["peak_activations"] == peaks
    assert info["peak_activation_bytes"] == [p * MIB for p in peaks]


def test_pipeline_view_memory_curve_peaks_at_the_held_microbatches() -> None:
    fig, info = pipeline_view(4, 6, "1f1b", FREE_SENDS, activation_bytes=MIB)
    memory_ax = fig.axes[1]
    labels = [line.get_label() for line in memory_ax.get_lines() if line.get_label()[0] != "_"]
    assert labels[0] == "dev 0 (peak 4 MiB)"  # 1F1B: stage 0 holds P = 4 microbatches


def test_pipeline_sends_cost_link_time_and_widen_the_bubble() -> None:
    _, info = pipeline_view(4, 8, "gpipe", "4xRTX4090-pcie", send_bytes=16 * MIB)
    link = LINKS["pcie4-x16"]  # one card's own uplink: one send alone is alpha + S / beta
    assert info["send_s"] == pytest.approx(link.alpha_s + 16 * MIB / link.beta_Bps)
    assert info["bubble_fraction"] > info["bubble_formula"]


def test_pipeline_view_rejects_more_stages_than_devices_and_notes_naive() -> None:
    with pytest.raises(ValueError, match="5 stages need 5 devices"):
        pipeline_view(5, 4, "gpipe", "4xRTX4090-pcie")
    _, info = pipeline_view(4, 8, "naive", FREE_SENDS)
    assert info["microbatches"] == 1 and "one microbatch" in info["note"]
    assert info["bubble_fraction"] == pytest.approx(3 / 4)


def test_pipeline_explorer_redraws_when_the_microbatch_slider_moves() -> None:
    explorer = pipeline_explorer()
    assert explorer.renders == 1 and explorer.info["microbatches"] == 4
    png = explorer.png()
    before, after, renders = moved(explorer, "microbatches", 8)
    assert renders == 1 and after is not before
    assert png[:4] == explorer.png()[:4] == b"\x89PNG" and explorer.png() != png
    assert explorer.info["microbatches"] == 8
    assert explorer.info["bubble_formula"] == pytest.approx(3 / 11)
    assert "bubble" in explorer.summary.value


def test_pipeline_explorer_shows_an_error_and_keeps_the_last_figure() -> None:
    explorer = pipeline_explorer(cluster="8xA100-nvlink")
    explorer.controls["stages"].value = 8
    good = explorer.figure
    explorer.controls["cluster"].value = "4xRTX4090-pcie"  # the stage slider shrinks to 4
    assert explorer.controls["stages"].max == 4 and explorer.controls["stages"].value == 4
    assert explorer.error is None and explorer.info["stages"] == 4 and explorer.figure is not good
    explorer.controls["cluster"].value = "2xCPU-gloo"
    explorer.controls["stages"].max = 8
    before = explorer.figure
    explorer.controls["stages"].value = 3
    assert "3 stages need 3 devices" in explorer.error and explorer.figure is before
    assert "cannot draw this" in explorer.summary.value


# ---- data parallel ---------------------------------------------------------------------------
def test_dp_view_overlap_helps_and_a_light_model_gets_slower() -> None:
    _, overlapped = dp_view(4, "heavy", "4xRTX4090-pcie", bucket_mb=4, overlap=True)
    _, bucketed = dp_view(4, "heavy", "4xRTX4090-pcie", bucket_mb=4, overlap=False)
    assert overlapped["step_s"] < bucketed["step_s"]
    assert overlapped["one_device_s"] == pytest.approx(bucketed["one_device_s"], rel=0.01)
    assert overlapped["efficiency"] == pytest.approx(overlapped["speedup"] / 4)
    fig, light = dp_view(4, "light", "4xRTX4090-pcie", bucket_mb=0, overlap=False)
    assert light["speedup"] < 1 and light["mode"].startswith("naive")
    assert "slower than 1 device" in fig.axes[0].get_title(loc="left")


def test_dp_explorer_follows_its_controls() -> None:
    explorer = dp_explorer(devices=2)
    _, _, renders = moved(explorer, "devices", 3)
    assert renders == 1 and explorer.info["devices"] == 3
    assert len(explorer.info["idle_fraction"]) == 3
    moved(explorer, "overlap", False)
    assert explorer.info["mode"].startswith("bucketed")


def test_dp_view_rejects_bad_settings() -> None:
    with pytest.raises(ValueError, match="has 4 devices"):
        dp_view(5, "heavy", "4xRTX4090-pcie")
    with pytest.raises(ValueError, match="unknown model"):
        dp_view(2, "enormous", "4xRTX4090-pcie")


# ---- memory ----------------------------------------------------------------------------------
def test_memory_view_uses_the_estimator_and_says_whether_it_fits() -> None:
    _, dp = memory_view("llama-7b", "adam", "mixed", "dp", 8, "RTX4090-24GB")
    expected = estimate_memory(spec_params("llama-7b"), "adam", "mixed", "dp", 8)
    assert dp["per_device"] == expected.per_device and not dp["fits"]
    assert dp["verdict"].startswith("does not fit")
    fig, zero3 = memory_view("llama-7b", "adam", "mixed", "zero3", 8, "RTX4090-24GB")
    assert zero3["fits"] and zero3["verdict"].startswith("fits")
    assert "/ 8" in zero3["explain"]
    assert [t.get_text() for t in fig.axes[0].texts if t.get_gid() == "oom"] == ["OOM"]
    _, single = memory_view(1_000_000, strategy="single", devices=8)
    assert single["devices"] == 1 and single["per_device_total"] == 16_000_000


def test_memory_calculator_redraws_on_a_strategy_change() -> None:
    explorer = memory_calculator(model="llama-7b", devices=8)
    assert not explorer.info["fits"]
    moved(explorer, "strategy", "zero3")
    assert explorer.info["fits"] and explorer.info["strategy"] == "zero3"
    with pytest.raises(ValueError, match="unknown gpu"):
        memory_view(gpu="Voodoo2")


# ---- CUDA_VISIBLE_DEVICES --------------------------------------------------------------------
def test_visible_view_and_sandbox() -> None:
    _, info = visible_view("3,1", 4)
    assert info["visible"] == [3, 1] and info["mapping"] == {"cuda:0": 3, "cuda:1": 1}
    explorer = visible_devices_sandbox()
    assert explorer.info["visible"] == [2, 3]
    moved(explorer, "value", "1,1")
    assert explorer.info["device_count"] == 0 and explorer.info["warnings"]
    moved(explorer, "unset", True)
    assert explorer.info["value"] is None and explorer.info["visible"] == [0, 1, 2, 3]
    moved(explorer, "n_physical", 6)
    assert explorer.info["device_count"] == 6


# ---- ring ------------------------------------------------------------------------------------
def test_ring_view_and_stepper() -> None:
    _, info = ring_view(4, 2)
    assert info["phase"] == "reduce-scatter" and info["total_steps"] == 6
    _, done = ring_view(4, 6)
    assert done["phase"] == "done" and done["complete"] == [4, 4, 4, 4]
    explorer = ring_stepper(4)
    _, _, renders = moved(explorer, "step", 3)
    assert renders == 1 and explorer.info["phase"] == "all-gather"
    assert explorer.info["complete"] == [1, 1, 1, 1]  # after reduce-scatter: one sum each
    explorer.controls["world_size"].value = 2  # only 2 steps now: the slider follows
    assert explorer.controls["step"].max == 2 and explorer.info["world_size"] == 2
    assert explorer.error is None
