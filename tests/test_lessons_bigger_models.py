"""Lesson 08's programs and figures: the sharded demo sends 1.5x DDP's bytes, and prefetch
shortens the step."""

from __future__ import annotations

import importlib

import pytest

from mpgpu_edu.comm import launch
from mpgpu_edu.replica.data import make_mlp
from mpgpu_edu.lessons import bigger_models as bm


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
