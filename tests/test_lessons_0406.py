"""Lessons 04-06's demos: pipelines on the clock, split layers, the comparison table, and the
programs that go wrong on purpose."""

from __future__ import annotations

import pytest
import torch
from matplotlib.figure import Figure
from torch import nn

from mpgpu_edu.cluster import Cluster
from mpgpu_edu.collectives.cost import ring_allreduce_bytes_sent
from mpgpu_edu.comm import DeadlockError, LaunchTimeoutError, RankError, launch
from mpgpu_edu.replica.data import loss_fn, make_batches, make_mlp
from mpgpu_edu.estimate import choosing
from mpgpu_edu.hybrid import Mesh, train_hybrid
from mpgpu_edu.lessons import pipeline as pl, tensor_and_hybrid as th, choosing_and_debugging as cd
from mpgpu_edu.memory import spec_params
from mpgpu_edu.pipeline import (gpipe, naive, one_f_one_b, partition_balanced, partition_by_list,
                                partition_by_sizes)
from mpgpu_edu.tensor import megatron_mlp
from mpgpu_edu.viz.stages import plot_bubble

# ---- lesson 04 --------------------------------------------------------------------------------


def test_seed_model_splits_as_the_seed_says() -> None:
    placement = partition_by_list(pl.seed_model(30, width=4), [10, 20])
    assert [(s.layers[0], s.layers[-1]) for s in placement.stages] == [
        ("1", "10"), ("11", "20"), ("21", "30")]


def test_balancing_the_uneven_model_beats_equal_layer_counts() -> None:
    model = pl.uneven_model()
    by_count = max(s.n_params for s in partition_by_sizes(model, [3, 3, 3, 3]).stages)
    balanced = max(s.n_params for s in partition_balanced(model, 4).stages)
    assert balanced < 0.6 * by_count
    fig = pl.plot_stage_costs({"count": partition_by_sizes(model, [3, 3, 3, 3]),
                                "balanced": partition_balanced(model, 4)})
    assert isinstance(fig, Figure) and len(fig.axes) == 2


def test_naive_step_keeps_one_device_busy_at_a_time() -> None:
    result = pl.run_step(naive(4))
    forward, backward = pl.BATCH_SECONDS
    # plus a few copies and launches outside the stages' regions (activations handed on)
    assert result.trace.makespan == pytest.approx(4 * (forward + backward), rel=3e-3)
    for device in range(4):
        assert result.trace.idle_fraction(device) == pytest.approx(0.75, abs=1e-3)
    lines = pl.describe_messages(result).splitlines()
    assert sum("activations" in line for line in lines) == 3
    assert sum("gradient" in line for line in lines) == 3
    fig = pl.plot_flow(result.trace)
    arrows = [p for p in fig.axes[0].texts if str(p.get_gid()).startswith("message:")]
    assert len(arrows) == 6


def test_gpipe_and_1f1b_same_time_less_memory() -> None:
    gp, ofob = pl.run_step(gpipe(4, 8)), pl.run_step(one_f_one_b(4, 8))
    assert gp.trace.makespan == pytest.approx(ofob.trace.makespan, rel=1e-3)  # sends differ
    assert ofob.trace.peak_memory(0) < gp.trace.peak_memory(0)
    assert gp.trace.makespan < pl.run_step(naive(4)).trace.makespan


@pytest.mark.parametrize("stages", [2, 4, 5])
def test_bubble_rows_measure_both_formulas(stages: int) -> None:
    for row in pl.bubble_rows(stages, [1, 3, 8]):
        assert row["idle_share"] == pytest.approx(row["idle_formula"])
        assert row["overhead"] == pytest.approx(row["overhead_formula"])
    assert len(plot_bubble(stages, pl.bubble_rows(stages, (1, 2, 4, 8, 16, 32, 64))).axes[0].get_lines()) == 4


def test_timed_trace_pays_the_link() -> None:
    nbytes = 64 * 2**20
    pcie, pcie_s = pl.timed_trace(one_f_one_b(4, 8), "4xRTX4090-pcie", 0.002, 0.004, nbytes)
    nvlink, nvlink_s = pl.timed_trace(one_f_one_b(4, 8), "4xA100-nvlink", 0.002, 0.004, nbytes)
    assert pcie_s == pytest.approx(Cluster.preset("4xRTX4090-pcie").route(0, 1).seconds(nbytes))
    assert nvlink_s < pcie_s
    assert 8 * 0.006 < nvlink.makespan < pcie.makespan


def _solution_executor():  # noqa: ANN202 - the solution's execute_schedule
    import importlib.util
    from pathlib import Path

    file = Path(__file__).resolve().parents[1] / "solutions" / "ex04_pipeline.py"
    spec = importlib.util.spec_from_file_location("solution_ex04_for_demo", file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.execute_schedule


@pytest.mark.parametrize("executor", ["reference", "solution"])
def test_an_executor_of_exercise_4_5_drives_the_memory_demo(executor: str) -> None:
    run = pl.reference_executor if executor == "reference" else _solution_executor()
    gp = pl.run_executor_step(run, gpipe(4, 8))
    ofob = pl.run_executor_step(run, one_f_one_b(4, 8))
    assert [pl.microbatches_held(gp.trace, d) for d in range(4)] == [8, 8, 8, 8]
    assert [pl.microbatches_held(ofob.trace, d) for d in range(4)] == [4, 3, 2, 1]
    assert gp.trace.makespan == pytest.approx(ofob.trace.makespan, rel=0.01)
    assert ofob.trace.peak_memory(0) < gp.trace.peak_memory(0)
    assert gp.results[-1] == pytest.approx(pl.run_step(gpipe(4, 8)).results[-1]["losses"][0])
    runs = {"GPipe": gp, "1F1B": ofob}
    for fig in (pl.plot_memory_runs(runs, "your pipeline executor"),
                pl.plot_timeline_runs(runs, "your pipeline executor")):
        assert "your pipeline executor" in fig._suptitle.get_text()


def test_tracked_stage_frees_a_microbatch_when_the_executor_lets_go_of_it() -> None:
    def program(comm):  # noqa: ANN001, ANN202
        stage = pl.TrackedStage(nn.Sequential(nn.Linear(4, 4), nn.Tanh()), comm)
        y0, y1 = stage(torch.randn(3, 4)), stage(torch.randn(3, 4))
        y0.sum().backward()
        comm.memory.alloc("other", 1)  # a marker: backward done, y0 still held
        del y0
        return stage.calls

    result = launch(program, 1)
    assert result.results == [2]
    records = [(m.category, m.delta) for m in result.trace.memory
               if m.category in ("activations", "other")]
    (_, first), _, marker, (category, freed) = records[:4]
    assert marker == ("other", 1) and category == "activations" and freed == -first and first > 0


def test_the_memory_demo_shows_what_the_executor_keeps_alive() -> None:
    from tests.mutants.lesson_04 import executor_never_frees

    ofob = pl.run_executor_step(executor_never_frees, one_f_one_b(4, 8))
    assert [pl.microbatches_held(ofob.trace, d) for d in range(4)] == [8, 8, 8, 8]


def test_the_warm_up_references_match_the_package() -> None:
    from mpgpu_edu.pipeline import LayerCost, from_order, render

    costs = [3, 1, 1, 1, 2]
    assert pl.reference_boundaries(costs, 2) == [2]
    layers = [LayerCost(str(i), c, 0) for i, c in enumerate(costs)]
    assert partition_by_list(layers, pl.reference_boundaries(costs, 3)) == \
        partition_balanced(layers, 3)
    assert render(from_order("gpipe", pl.reference_gpipe_orders(3, 5))) == \
        render(gpipe(3, 5))
    assert render(from_order("1f1b", pl.reference_one_f_one_b_orders(4, 6))) == \
        render(one_f_one_b(4, 6))


def test_the_link_figure_labels_every_panel_in_time() -> None:
    traces = {name: pl.timed_trace(one_f_one_b(4, 4), name, 0.002, 0.004, 64 * 2**20)[0]
              for name in ("4xRTX4090-pcie", "4xA100-nvlink")}
    fig = pl.plot_link_timelines(traces)
    fig.canvas.draw()
    for ax in fig.axes:
        assert ax.get_xlabel() and any(t.get_text() for t in ax.get_xticklabels())
    labels = [t.get_text() for t in fig.axes[0].texts if t.get_gid() == "bar-label"]
    assert "F0" in labels and "F3" in labels


# ---- lesson 05 --------------------------------------------------------------------------------


@pytest.mark.parametrize("world_size", [4, 3])
def test_split_conv_equals_the_unsplit_layer(world_size: int) -> None:
    torch.manual_seed(0)
    conv = nn.Conv2d(5, 64, 3, padding=1)
    images = torch.randn(2, 5, 8, 8)
    result = launch(th.split_conv, world_size, conv, images)
    expected = conv(images).detach()
    firsts = [r["channels"][0] for r in result.results]
    assert firsts[0] == 0 and result.results[-1]["channels"][1] == 63
    for r in result.results:
        torch.testing.assert_close(r["output"], expected)
    assert sum(r["filters"][0] for r in result.results) == 64


def test_split_figures_draw() -> None:
    assert isinstance(th.plot_channel_split(64, 64, 4), Figure)
    assert len(th.plot_linear_split(4).axes) == 2


def test_megatron_mlp_sends_a_third_of_the_naive_split() -> None:
    megatron = launch(th.mlp_pass, "4xA100-nvlink", 64, 32, False)
    naive_split = launch(th.mlp_pass, "4xA100-nvlink", 64, 32, True)
    one_all_reduce = ring_allreduce_bytes_sent(4, 64 * 32 * 2)  # bf16 activations
    assert megatron.bytes_sent_per_rank == [2 * one_all_reduce] * 4
    assert naive_split.bytes_sent_per_rank == [6 * one_all_reduce] * 4


@pytest.mark.parametrize("world_size", [4, 3])
def test_megatron_pass_runs_one_all_reduce_each_way(world_size: int) -> None:
    result = launch(th.megatron_pass, world_size, megatron_mlp, 64, 32)
    activation = 64 * 32 * 2  # bf16
    assert th.all_reduces([r["forward_bytes"] for r in result.results], activation) == 1
    assert th.all_reduces([r["backward_bytes"] for r in result.results], activation) == 1
    assert {e.kind for e in result.trace.events} >= {"forward", "backward", "send"}
    lines = th.link_lines(result).splitlines()
    assert len(lines) == world_size and lines[0].startswith("dev 0 -> dev 1:")


def test_traffic_by_group_splits_every_byte() -> None:
    mesh = Mesh(2, 2)
    result = launch(train_hybrid, 4, mesh, make_mlp([4, 8, 8, 2]), make_batches(1, 8, 4, 2),
                    gpipe(2, 2), None, None, loss_fn)
    traffic = th.traffic_by_group(result, mesh)
    assert traffic["pipeline"] > 0 and traffic["data"] > 0
    assert sum(traffic.values()) == sum(result.bytes_sent_per_rank)


def test_zero_sends_what_an_all_reduce_sends() -> None:
    plain = launch(th.sharded_update_traffic, 4, 1024, False)
    zero = launch(th.sharded_update_traffic, 4, 1024, True)
    assert zero.bytes_sent_per_rank == plain.bytes_sent_per_rank == [2 * 3 * 1024] * 4


# ---- lesson 06 --------------------------------------------------------------------------------


def test_strategy_rows_follow_the_closed_forms() -> None:
    setting = cd.Setting(model="gpt2-small", cluster="8xA100-nvlink", batch=16, microbatches=4)
    rows = {row.name: row for row in cd.strategy_rows(setting)}
    assert set(rows) == set(choosing.QUALITIES)
    params = spec_params("gpt2-small")
    assert rows["data parallel"].comm_bytes == pytest.approx(
        ring_allreduce_bytes_sent(8, 2 * params))
    assert rows["pipeline parallel"].bubble == pytest.approx(7 / 11)
    assert rows["hybrid DP x PP"].bubble == pytest.approx(3 / 7)
    assert rows["tensor parallel"].memory < rows["data parallel"].memory
    assert rows["pipeline parallel"].comm_bytes < rows["data parallel"].comm_bytes
    assert choosing.step_compute_seconds(setting) > 0


def test_comparison_table_and_figure() -> None:
    rows = cd.strategy_rows(cd.Setting())
    page = cd.comparison_html(rows)
    assert page.count("<tr>") == 5 and "does NOT fit" in page
    assert len(cd.comparison_text(rows).splitlines()) == 4
    assert "llama-7b" in cd.describe_setting(cd.Setting())
    assert isinstance(cd.plot_comparison(rows), Figure)


def test_memory_table_has_a_line_per_model_and_strategy() -> None:
    text = cd.memory_table(["gpt2-small", "llama-7b"], 8, ["RTX4090-24GB"])
    assert len(text.splitlines()) == 1 + 2 * 5
    assert "zero3 x 8" in text


def test_both_send_first_deadlocks_and_the_picture_shows_a_cycle() -> None:
    with pytest.raises(DeadlockError) as caught:
        launch(cd.both_send_first, 2)
    fig = cd.plot_wait_for(caught.value)
    assert "cycle" in fig.axes[0].get_title(loc="left")
    assert len(fig.axes[0].patches) == 2


def test_straggler_makes_everyone_wait_and_logs_it() -> None:
    result = launch(cd.straggler, 3, 2, 0.01)
    assert result.results == [3.0] * 3
    assert all(len(lines) == 3 for lines in result.logs)
    assert result.trace.idle_fraction(0) == pytest.approx(2 / 3, abs=0.01)


@pytest.mark.parametrize("world_size", [2, 3, 5])
def test_smooth_ring_broken_deadlocks_and_the_reference_matches_one_device(
        world_size: int) -> None:
    with pytest.raises(DeadlockError):
        launch(cd.smooth_ring_broken, world_size, torch.arange(3.0), 1)
    blocks = [torch.arange(float(k + 1)) for k in range(world_size)]
    got = cd.run_smoothing(cd.smooth_ring_reference, blocks, 3)
    assert torch.allclose(got, torch.cat(cd.smooth_on_one_device(blocks, 3)), atol=1e-6)
    assert cd.run_smoothing(cd.smooth_ring_reference, [torch.arange(4.0)], 2).shape == (4,)


def test_the_wait_for_picture_of_a_ring_has_an_arrow_per_rank() -> None:
    with pytest.raises(DeadlockError) as caught:
        launch(cd.smooth_ring_broken, 5, torch.arange(3.0), 1)
    fig = cd.plot_wait_for(caught.value)
    assert len(fig.axes[0].patches) == 5 and "cycle" in fig.axes[0].get_title(loc="left")


def test_straggler_steps_logs_name_the_slow_rank_not_the_longest_waiter() -> None:
    result = cd.run_straggler(5, slow_rank=1, steps=3)
    phases = cd.phase_seconds(result.logs)
    assert max(range(5), key=lambda r: phases[r]["compute"]) == 1
    assert cd.longest_waiter(result.logs) != 1
    rank, seconds = cd.find_straggler_reference(result.logs)
    assert rank == 1 and seconds == pytest.approx(3 * 2 * 0.02, rel=0.1)
    assert result.trace.busy(0, "comm") > 0.01 * result.trace.makespan  # comm rows visible


def test_fewest_devices_for_llama_7b_on_rtx_4090s() -> None:
    assert cd.fewest_devices("llama-7b", "zero3", "RTX4090-24GB") == 5
    assert cd.fewest_devices("llama-7b", "dp", "RTX4090-24GB", most=16) is None


def test_bad_shard_names_its_rank() -> None:
    with pytest.raises(RankError) as caught:
        launch(cd.bad_shard, 4, 2)
    assert caught.value.rank == 2 and "bad_shard" in caught.value.rank_traceback
    # it ends at the learner's line, not in torch's dispatch machinery under the FLOP counter
    lines = caught.value.rank_traceback.splitlines()
    assert "_dynamo" not in caught.value.rank_traceback and "launch.py" not in lines[1]
    assert "frame(s) inside torch and the simulator's FLOP counter not shown" in lines[-2]
    assert lines[-1].startswith("RuntimeError: mat1 and mat2 shapes cannot be multiplied")


def test_forgot_to_send_is_a_deadlock_on_the_simulator() -> None:
    with pytest.raises(DeadlockError, match="rank 1: finished") as caught:
        launch(cd.forgot_to_send, 2)
    assert "finished" in cd.plot_wait_for(caught.value).axes[0].get_title(loc="left")


@pytest.mark.gloo
def test_forgot_to_send_hangs_on_gloo_until_the_timeout() -> None:
    launch(cd.straggler, 2, 1, 0.001, backend="gloo")  # start the workers outside the timeout
    with pytest.raises(LaunchTimeoutError, match="recv from rank 1"):
        launch(cd.forgot_to_send, 2, backend="gloo", timeout=3)
