"""Lesson 07's programs: all-reduce timelines across two nodes, and the ``tp`` / ``visible``
fields of ``simulate step`` that lesson 10's placements use."""

from __future__ import annotations

import pytest

from mpgpu_edu.cluster import Cluster
from mpgpu_edu.collectives import cost
from mpgpu_edu.estimate import StepSetup, simulate_step
from mpgpu_edu.estimate.placements import SPREAD
from mpgpu_edu.lessons import many_machines as mm


def test_allreduce_runs_against_their_closed_forms() -> None:
    runs = mm.allreduce_runs("2x8xA100-ib", 2**20)
    nodes, per_node, forms = mm.link_forms("2x8xA100-ib")
    assert (nodes, per_node) == (2, 8)
    flat, hier = runs["flat ring"], runs["hierarchical"]
    assert flat["closed_form"] == cost.flat_ring_two_level_time(2, 8, 2**20, *forms)
    assert hier["closed_form"] == cost.hierarchical_allreduce_time(2, 8, 2**20, *forms)
    # The preset charges every addition as a kernel (a launch and its memory traffic): the
    # forms plus the additions' forms are the simulated times.
    preset = Cluster.preset("2x8xA100-ib")
    launch, memory = preset.launch_overhead_s, preset.memory_Bps
    assert flat["additions"] == cost.flat_ring_additions_time(2, 8, 2**20, launch, memory)
    assert hier["additions"] == cost.hierarchical_additions_time(2, 8, 2**20, launch, memory)
    for run in (flat, hier):
        assert run["seconds"] == pytest.approx(run["closed_form"] + run["additions"], rel=1e-9)
    assert cost.flat_ring_additions_time(2, 8, 2**20, launch, 0.0) == 15 * launch
    assert hier["seconds"] < flat["seconds"] / 3
    crossing = {name: {e.device for e in run["trace"].events if e.kind == "send"
                       and e.device // 8 != e.peer // 8} for name, run in runs.items()}
    assert crossing == {"flat ring": {7, 15}, "hierarchical": set(range(16))}
    fig = mm.plot_allreduce_timelines(runs)
    assert len(fig.axes) == 2 and "closed form" in fig.axes[1].get_title(loc="left")


def test_the_reveal_s_numbers_for_one_ring_per_rail_and_the_hierarchical_all_reduce() -> None:
    """The 07.flat-vs-hierarchical reveal quotes 2.44 ms (one ring per rail) and 2.34 ms
    (hierarchical) for 256 MiB on 2x8xH100-ib, and 5x over the flat ring."""
    import torch

    from mpgpu_edu.collectives.multichannel import all_reduce_multichannel, rail_rings
    from mpgpu_edu.comm import launch
    from mpgpu_edu.course import lesson_07

    why = next(p.why for p in lesson_07.PREDICTIONS if p.key == "07.flat-vs-hierarchical")
    rings = rail_rings(2, 8)
    per_rail = launch(lambda comm: all_reduce_multichannel(
        comm, torch.empty(2**26, device="meta"), rings), Cluster.preset("2x8xH100-ib"))
    runs = mm.allreduce_runs("2x8xH100-ib", 2**28)
    assert f"takes {per_rail.trace.makespan * 1e3:.2f} ms" in why
    assert f"the hierarchical {runs['hierarchical']['seconds'] * 1e3:.2f} ms" in why
    assert round(runs["flat ring"]["seconds"] / runs["hierarchical"]["seconds"]) == 5


def test_tp_groups_keep_their_all_reduces_inside_the_group() -> None:
    setup = StepSetup("gpt2-small", "2x8xH100-ib", "tensor", micro_batch=1, seq=128, tp=8)
    report, trace = simulate_step(setup)
    peers = {(e.device // 8, e.peer // 8) for e in trace.events if e.kind == "send"}
    assert peers == {(0, 0), (1, 1), (0, 1), (1, 0)}
    across = [e for e in trace.events if e.kind == "send" and e.device // 8 != e.peer // 8]
    assert {(e.device % 8, e.peer % 8) for e in across} == {(i, i) for i in range(8)}  # rails
    assert report["tokens_per_step"] == 2 * 128  # two replicas of one sequence each
    spread = StepSetup("gpt2-small", "2x8xH100-ib", "tensor", micro_batch=1, seq=128, tp=8,
                       visible=SPREAD)
    slower, _ = simulate_step(spread)
    assert slower["step_s"] > report["step_s"]


def test_tp_must_divide_and_belongs_to_tensor() -> None:
    with pytest.raises(ValueError, match="tp must divide"):
        simulate_step(StepSetup("gpt2-small", "2x8xH100-ib", "tensor", tp=3))
    with pytest.raises(ValueError, match="applies to strategy tensor"):
        simulate_step(StepSetup("gpt2-small", "2x8xH100-ib", "dp", tp=8))


def test_the_timeline_separates_messages_and_names_ranks() -> None:
    runs = mm.allreduce_runs("2x8xH100-ib", 2**20)
    fig = mm.plot_allreduce_timelines(runs)
    flat = fig.axes[0]
    assert "30 steps" in flat.get_title(loc="left") and "ranks 7 and 15" in flat.get_title(
        loc="left")
    assert [t.get_text() for t in flat.get_yticklabels()][7] == "rank 7 (node 0 GPU 7)"
    assert all(p.get_edgecolor()[:3] == (1.0, 1.0, 1.0) for p in flat.patches)
    assert any("1. reduce-scatter" in t.get_text() for t in fig.axes[1].texts)
