"""Lesson 08's programs and figures: the sharded demos equal one device and send 1.5x DDP's
bytes, prefetch shortens the step, recomputation and accumulation trade as the closed forms
say, the master copy keeps small updates, and the interleaved view matches (P-1)/(V M)."""

from __future__ import annotations

import importlib

import pytest
from matplotlib.figure import Figure

from mpgpu_edu.comm import launch
from mpgpu_edu.data import make_mlp
from mpgpu_edu.explore.live import Explorer
from mpgpu_edu.lessons import bigger_models as bm


def test_training_with_the_reference_equals_one_device() -> None:
    report = bm.run_training(bm.reference_wrap(), world_size=3, steps=4)
    assert report["losses"] == pytest.approx(report["reference_losses"], rel=1e-5)
    assert report["max_abs_param_diff"] < 1e-5
    assert isinstance(bm.plot_losses(report, "reference"), Figure)


def test_sharded_traffic_is_one_and_a_half_all_reduces_and_prefetch_is_faster() -> None:
    """Padding aside (none here: every layer divides by 4), 3 (N-1)/N against 2 (N-1)/N."""
    plain = bm.run_sharded_step(bm.reference_wrap(), prefetch=False)
    ahead = bm.run_sharded_step(bm.reference_wrap(), prefetch=True)
    ddp = launch(bm.allreduce_bytes, 4, make_mlp(bm.SHARDED_SIZES, seed=0)).results[0]
    assert plain.stats[0].bytes_sent == pytest.approx(1.5 * ddp, rel=1e-9)
    assert ahead.stats[0].bytes_sent == plain.stats[0].bytes_sent
    step, step_ahead = bm.step_only(plain.trace), bm.step_only(ahead.trace)
    assert step_ahead.makespan < step.makespan
    assert min(e.start for e in step.events) == 0.0
    assert step.makespan < plain.trace.makespan  # the wrapping is left out
    phases, phases_ahead = bm.phase_summary(step), bm.phase_summary(step_ahead)
    for name in ("forward_end", "backward_end", "idle_forward", "idle_backward"):
        assert phases_ahead[name] < 0.8 * phases[name], name  # forward gains, not only backward
    assert 0 < phases["idle_forward"] < phases["forward_end"]


def test_any_wrappers_step_timeline_reads_the_same() -> None:
    """The solution's wrapper names no regions: step_only still shows forward before the loss
    and backward after it, no plain compute left on the compute rows but the loss, and the
    first layer's gather at the start (only the barrier is cut)."""
    solution = importlib.import_module("solutions.ex08_bigger_models")
    for wrap in (solution.wrap_fsdp, bm.reference_wrap()):
        run = bm.run_sharded_step(wrap, prefetch=True)
        step = bm.step_only(run.trace)
        compute = [e for e in step.events if e.stream == "compute"]
        assert {e.kind for e in compute} == {"forward", "backward", "compute", "optimizer"}
        assert {e.label for e in compute if e.kind == "compute"} == {bm.LOSS}
        loss = next(e for e in compute if e.label == bm.LOSS and e.device == 0)
        mine = [e for e in compute if e.device == 0]
        assert all(e.end <= loss.start for e in mine if e.kind == "forward")
        assert all(e.start >= loss.end for e in mine if e.kind == "backward")
        first = min(step.events, key=lambda e: e.start)
        assert first.start == 0.0 and first.stream == "comm"  # layer 0's gather
        assert not any(bm._is_barrier(e) for e in step.events)
        assert step.makespan < run.trace.makespan


def test_recomputation_saves_memory_for_time_and_accumulation_splits_activations() -> None:
    rows = bm.recompute_rows("gpt2-small", "8xA100-nvlink", sequences=8, seq=512,
                             accumulate=(1, 4))
    by = {(r["recompute"], r["accumulate"]): r for r in rows}
    for k in (1, 4):
        assert (by["none", k]["activations"] > by["selective", k]["activations"]
                > by["full", k]["activations"])
        assert by["none", k]["step_s"] < by["selective", k]["step_s"] < by["full", k]["step_s"]
    for recompute in bm.RECOMPUTE:  # 4 micro-batches of 2: a quarter of the activations
        assert by[recompute, 4]["activations"] == pytest.approx(
            by[recompute, 1]["activations"] / 4, rel=0.01)
    assert isinstance(bm.plot_recompute_tradeoff(rows), Figure)


def test_the_notebooks_setting_needs_a_remedy_to_fit() -> None:
    """Cell 17's default: without recomputation or accumulation the step does not fit one
    device; selective or full recomputation, or 2 micro-batches, does."""
    rows = bm.recompute_rows(accumulate=(1, 2))
    fits = {(r["recompute"], r["accumulate"]): r["fits"] for r in rows}
    assert fits == {("none", 1): False, ("selective", 1): True, ("full", 1): True,
                    ("none", 2): True, ("selective", 2): True, ("full", 2): True}
    assert all(r["fits"] == (r["total"] <= r["capacity"]) for r in rows)


def test_a_bf16_weight_loses_small_updates_and_the_master_copy_keeps_them() -> None:
    curves = bm.master_copy_demo(steps=100, update=1e-3)
    assert curves["bf16 only"][-1] == 1.0
    assert curves["fp32"][-1] == pytest.approx(1.1, abs=1e-5)
    assert abs(curves["fp32 master, bf16 copy"][-1] - 1.1) < 0.01
    assert isinstance(bm.plot_master_copy(curves), Figure)


@pytest.mark.parametrize("stages, rounds, chunks", [(4, 2, 2), (3, 1, 3), (2, 4, 1)])
def test_interleaved_view_matches_the_closed_form(stages: int, rounds: int,
                                                  chunks: int) -> None:
    figure, info = bm.interleaved_view(stages, rounds, chunks)
    m = stages * rounds
    assert info["overhead_interleaved"] == pytest.approx((stages - 1) / (chunks * m))
    assert info["overhead_1f1b"] == pytest.approx((stages - 1) / m)
    assert info["idle_1f1b"] == pytest.approx((stages - 1) / (m + stages - 1))
    plain = next(iter(bm.schedule_traces(stages, m, chunks).values()))
    assert info["idle_1f1b"] == pytest.approx(plain.idle_fraction(0))  # the row's "idle"
    assert isinstance(figure, Figure)
    assert "(P-1)/(V M)" in bm.describe_interleaved(info)


def test_interleaved_explorer_redraws() -> None:
    explorer = bm.interleaved_explorer()
    assert isinstance(explorer, Explorer) and explorer.renders == 1
    explorer.controls["chunks"].value = 3
    assert explorer.renders == 2 and explorer.info["chunks"] == 3
