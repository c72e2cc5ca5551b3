"""Lessons 02 and 03's demos: the parameter server's link, staleness, the data-parallel
recipe, DataParallel's device 0, overlap, and the memory ledger against the estimate."""

from __future__ import annotations

import functools

import pytest
import torch
from matplotlib.figure import Figure

from mpgpu_edu import dp, ps
from mpgpu_edu.cluster import Cluster
from mpgpu_edu.comm import RankError, launch
from mpgpu_edu.replica.data import Workload
from mpgpu_edu.lessons import parameter_server as psl, data_parallel as dpl
from mpgpu_edu.memory import estimate_memory
from mpgpu_edu.cluster.trace import Event, Trace
from mpgpu_edu.viz.server import widen_messages

SMALL = Workload("small", (64, 128, 64), 64)  # big enough for bytes to dominate alpha


# ---- lesson 02 ---------------------------------------------------------------------------------

def test_one_torch_thread_sets_one_and_keeps_it() -> None:
    with psl.one_torch_thread():
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == 1  # raising it again left OpenMP threads spinning


def test_link_seconds_merges_overlapping_messages_and_checks_the_kind() -> None:
    trace = Trace(2, [Event(1, "comm", "recv", 0.0, 2.0), Event(1, "comm", "recv", 1.0, 3.0),
                      Event(1, "comm", "recv", 5.0, 6.0), Event(1, "comm", "send", 0.0, 9.0)])
    assert psl.link_seconds(trace, 1, "recv") == pytest.approx(4.0)
    assert psl.link_seconds(trace, 1, "send") == pytest.approx(9.0)
    with pytest.raises(ValueError, match="recv"):
        psl.link_seconds(trace, 1, "compute")


def test_server_receive_time_grows_with_the_workers() -> None:
    route = Cluster.preset("8xA100-nvlink").route(0, 1)
    nbytes = 4 * SMALL.n_params
    for n in (2, 4):
        run = psl.run_ps_step(SMALL, "8xA100-nvlink", n)
        receiving = psl.link_seconds(run.trace, n - 1, "recv")
        # The package's server posts every receive at once: the gradients cross the server's
        # NVSwitch port together, each with a fair share of it, and end together; the bytes
        # take the port's whole bandwidth, and the latency is paid once.
        assert receiving == pytest.approx(route.alpha_s + (n - 1) * nbytes / route.beta_Bps)
        assert run.bytes_received_per_rank[n - 1] == (n - 1) * nbytes


def test_sharded_servers_each_receive_a_share() -> None:
    run = psl.run_ps_step(SMALL, "8xA100-nvlink", 6, n_servers=2)
    nbytes = 4 * SMALL.n_params
    for server in ps.servers_of(6, 2):
        assert run.bytes_received_per_rank[server] == 4 * nbytes // 2
    with pytest.raises(ValueError, match="one worker"):
        psl.run_ps_step(SMALL, "8xA100-nvlink", 2, n_servers=2)


def test_sync_with_stragglers_waits_for_the_slowest_worker() -> None:
    run = psl.run_sync("8xA100-nvlink", [1e-3, 3e-3], steps=2, server_seconds=1e-4)
    assert run.trace.makespan > 2 * (3e-3 + 1e-4)
    assert run.trace.idle_fraction(0) > 0.5 > run.trace.idle_fraction(1)
    with pytest.raises(RankError, match="2 workers need 2 times"):
        launch(psl.sync_with_stragglers, 3, [1e-3], 10, 1)


def test_async_run_has_one_time_per_update_and_honours_the_bound() -> None:
    run = psl.run_async("8xA100-nvlink", 1, 12, worker_seconds=[1e-3, 1.5e-3, 2e-3])
    times = psl.update_times(run)
    assert len(times) == len(run.losses) == 12
    assert times == sorted(times) and times[-1] == pytest.approx(run.seconds)
    clock = [0, 0, 0]
    for w in run.workers:  # SSP: nobody gets more than the bound (1) ahead of the slowest
        assert clock[w] - min(clock) <= 1
        clock[w] += 1
    assert run.held > 0


def test_learners_parameter_server_drives_the_demos_and_the_slider() -> None:
    light = Workload("tiny", (64, 64, 64), 12)
    calls = []

    def worker(*args):
        calls.append("worker")
        psl.reference_worker_step(*args)

    run = psl.run_ps_program(light, "8xA100-nvlink", 4, worker, psl.reference_server_loop, 2)
    assert calls.count("worker") == 6 and run.bytes_received_per_rank[3] == 6 * 4 * light.n_params
    explorer = psl.ps_explorer(light, "8xA100-nvlink", worker, psl.reference_server_loop)
    assert explorer.info["workers"] == 3
    explorer.controls["workers"].value = 5
    assert explorer.renders == 2 and explorer.info["workers"] == 5
    sharded = psl.run_sharded_program(light, "8xA100-nvlink", 4, psl.reference_sharded_step)
    assert sharded.bytes_sent_per_rank == [2 * 3 * 4 * light.n_params // 4] * 4


def test_concurrent_receives_share_the_port_and_end_together() -> None:
    route = Cluster.preset("8xA100-nvlink").route(0, 1)
    run = psl.run_ps_step(SMALL, "8xA100-nvlink", 4)
    ins, outs = run.trace.on(3, "comm", "recv"), run.trace.on(3, "comm", "send")
    assert len(ins) == len(outs) == 3
    assert max(e.start for e in ins) < min(e.end for e in ins)  # all three at once
    # the parameters go out together: each gets a third of the port, so each takes three
    # times as long as alone, and they end together (nobody waits its turn)
    for e in outs:
        assert e.start == outs[0].start and e.end == pytest.approx(outs[0].end, abs=1e-12)
        assert e.duration == pytest.approx(route.alpha_s + 3 * e.nbytes / route.beta_Bps)


def test_worker_compute_parts_add_up_to_the_trace() -> None:
    light = Workload("tiny", (64, 256, 64), 48)
    for workers in (1, 3):
        run = psl.run_ps_program(light, "8xA100-nvlink", workers + 1,
                                 psl.reference_worker_step, psl.reference_server_loop, 1)
        parts = psl.worker_compute_parts(light, "8xA100-nvlink", workers)
        traced = sum(e.duration for e in run.trace.on(0, "compute")
                     if e.kind in ("forward", "backward"))
        assert parts["flops_s"] + parts["launch_s"] + parts["memory_s"] == pytest.approx(
            traced, rel=1e-9)
        assert parts["samples"] == -(-48 // workers) and parts["kernels"] > 0
        # the setup is elementwise work before the first forward, on every rank
        assert 0 < psl.setup_seconds(run.trace, 0) < run.trace.on(0, "compute", "forward")[
            0].start + 1e-12
        assert psl.setup_seconds(run.trace, workers) > 0
    one, three = (psl.worker_compute_parts(light, "8xA100-nvlink", w) for w in (1, 3))
    assert one["launch_s"] == three["launch_s"]  # the same kernels, whatever the batch
    assert one["flops_s"] == pytest.approx(3 * three["flops_s"], rel=1e-6)


def test_smoothed_and_mean_curves_over_seeds() -> None:
    assert psl.smoothed([1.0, 3.0, 5.0, 7.0], 2) == [1.0, 2.0, 4.0, 6.0]
    assert psl.smoothed([2.0, 4.0], 10) == [2.0, 3.0]
    with pytest.raises(ValueError):
        psl.smoothed([1.0], 0)
    runs = psl.run_async_seeds("8xA100-nvlink", 1, 6, [0, 1], worker_seconds=[1e-3, 2e-3])
    assert runs[0].losses != runs[1].losses  # other weights, other batches
    assert runs[0].losses == psl.run_async("8xA100-nvlink", 1, 6,
                                           worker_seconds=[1e-3, 2e-3]).losses  # seed 0
    times, losses = psl.mean_curve(runs)
    assert len(times) == len(losses) == 6 and times == sorted(times)
    assert losses[0] == pytest.approx((runs[0].losses[0] + runs[1].losses[0]) / 2)


def test_comm_windows_label_every_message() -> None:
    run = psl.run_ps_step(SMALL, "8xA100-nvlink", 8, n_servers=4)
    window = psl.comm_window(run.trace)
    assert min(e.start for e in window.events) == 0 and window.on(0, "compute") == []
    fig = psl.plot_comm_windows({"4 servers": (run.trace, [f"rank {r}" for r in range(8)])})
    labels = {t.get_text() for t in fig.axes[0].texts}
    # every worker sends to the 4 servers at once, and every server receives from the 4
    # workers at once: each group of thin bars carries one badge naming its peers
    assert {"\u00d74 to 4..7", "\u00d74 from 0..3"} <= labels


def test_first_step_is_the_single_step() -> None:
    light = Workload("tiny", (64, 64, 64), 12)
    args = (light, "8xA100-nvlink", 4, psl.reference_worker_step, psl.reference_server_loop)
    single = psl.run_ps_program(*args, 1).trace
    two = psl.run_ps_program(*args, 2).trace
    # the step ends with the server's last send; the workers then load the parameters
    assert psl.first_step_seconds(two) == pytest.approx(psl.first_step_seconds(single))
    assert psl.first_step_seconds(single) <= single.makespan
    assert two.makespan < 2 * single.makespan
    assert psl.role_names(4) == ["worker 0", "worker 1", "worker 2", "server"]
    assert psl.role_names(4, 2) == ["worker 0", "worker 1", "server 2", "server 3"]


def test_comm_windows_on_one_axis_label_the_workers_messages() -> None:
    runs = {n: psl.run_ps_step(SMALL, "8xA100-nvlink", n) for n in (2, 4)}
    fig = psl.plot_comm_windows({f"N = {n}": (run.trace, psl.role_names(n))
                                 for n, run in runs.items()}, share_x=True)
    assert fig.axes[0].get_xlim() == fig.axes[1].get_xlim()
    labels = {t.get_text() for t in fig.axes[1].texts}
    # the window also spans the server's averaging (its bytes over memory bandwidth), so the
    # shortest bars may be too narrow for a label: the workers' sends keep theirs, and the
    # server's three sends at once, too thin for one each, are counted by one badge
    assert "to 3" in labels
    assert any(t.startswith("\u00d73") for t in labels)
    assert "worker 0 comm" in [t.get_text() for t in fig.axes[1].get_yticklabels()]


def test_widened_messages_split_sends_from_receives_and_keep_the_makespan() -> None:
    run = psl.run_ssp("8xA100-nvlink", [1e-3, 2e-3], steps=2, staleness_bound=10**6)
    wide = widen_messages(run.trace, 2e-4)
    assert wide.makespan == pytest.approx(run.trace.makespan)
    assert all(e.duration >= 2e-4 - 1e-12 for e in wide.events if e.stream == "comm")
    assert wide.on(0, "compute") == run.trace.on(0, "compute")
    fig = psl.plot_role_timelines({"a": (run.trace, psl.role_names(3))})
    assert "server comm" in [t.get_text() for t in fig.axes[0].get_yticklabels()]


def test_loss_curves_draw_one_line_per_run_in_each_panel() -> None:
    fig = psl.plot_loss_curves({"a": [1.0, 0.5, 0.2], "b": [1.0, 0.6, 0.3]},
                               times={"a": [0.1, 0.2, 0.3], "b": [0.2, 0.4, 0.6]}, title="t")
    assert isinstance(fig, Figure) and len(fig.axes) == 2
    assert all(len(ax.get_lines()) == 2 for ax in fig.axes)
    assert fig.axes[0].get_yscale() == "log"
    single = psl.plot_loss_curves({"a": [1.0, 0.5]}, log=False)
    assert len(single.axes) == 1 and single.axes[0].get_yscale() == "linear"
    marked = psl.plot_loss_curves({"a": [1.0, 0.5], "b": [1.0, 0.5]}, dashed=["b"],
                                  marked=["b"]).axes[0].get_lines()
    assert [line.get_marker() for line in marked] == ["None", "o"]
    assert marked[1].get_linestyle() == "--" and marked[1].get_markerfacecolor() == "white"


def test_lesson_02_staleness_sweep_ranks_as_the_notebook_says() -> None:
    """Lesson 02's section 6 sweep (7 workers, learning rate 0.2, 80 updates, 6 seeds): the
    timing is the same for every seed; averaged over the seeds, bound 1 ends lowest, then
    bound 0, bound 3 and no bound."""
    workers = [1e-3 * (1 + 0.15 * w) for w in range(7)]
    final = {}
    for bound in (0, 1, 3, 10**6):
        runs = psl.run_async_seeds("8xA100-nvlink", bound, 80, range(6), worker_seconds=workers,
                                   lr=0.2, server_seconds=20e-6)
        assert len({(tuple(r.staleness), r.held, r.seconds) for r in runs}) == 1
        final[bound] = sum(sum(r.losses[-20:]) / 20 for r in runs) / len(runs)
    assert final[1] < final[0] < final[3] < final[10**6]


def test_every_rank_a_server_keeps_its_port_busy_less_than_the_ring() -> None:
    from mpgpu_edu.replica.data import light
    from mpgpu_edu.lessons import communication as cm

    workload = light()
    nbytes = 4 * workload.n_params
    everyone = psl.run_sharded_program(workload, "8xA100-nvlink", 8, psl.reference_sharded_step)
    ring = cm.run_all_reduce("ring", "8xA100-nvlink", nbytes, world_size=8)
    assert everyone.bytes_sent_per_rank == ring.bytes_sent_per_rank
    assert len(everyone.trace.on(0, "comm", "send")) == len(ring.trace.on(0, "comm", "send"))
    ours, theirs = (psl.link_seconds(run.trace, 0, "send") for run in (everyone, ring))
    assert ours < theirs  # 7 messages side by side pay the latency once per round


# ---- lesson 03 ---------------------------------------------------------------------------------

def test_recipe_leaves_identical_replicas_after_different_shards() -> None:
    run = dpl.run_recipe(3)
    seen = run.results
    assert [s["samples"] for s in seen] == [(0, 8), (8, 16), (16, 24)]
    assert len({round(s["grad_norm_local"], 6) for s in seen}) == 3
    assert len({round(s["grad_norm_mean"], 9) for s in seen}) == 1
    assert all(torch.equal(s["params"], seen[0]["params"]) for s in seen)


def test_dataparallel_keeps_the_optimizer_state_on_device_0_only() -> None:
    run = dpl.run_step(SMALL, 3, None, steps=2)
    main, other = (run.trace.peak_memory_by_category(d) for d in (0, 1))
    assert main["optimizer"] >= 2 * 4 * SMALL.n_params and other["optimizer"] == 0
    assert run.bytes_sent_per_rank[0] > 2 * run.bytes_sent_per_rank[1]
    ddp = dpl.run_step(SMALL, 3, dp.ddp_step_bucketed, steps=2)
    peaks = [ddp.trace.peak_memory_by_category(d) for d in range(3)]
    assert all(p == peaks[0] for p in peaks) and peaks[0]["optimizer"] == main["optimizer"]


def test_deep_workload_has_many_small_tensors() -> None:
    model = dpl.deep(64).model("meta")
    assert len(list(model.parameters())) == 48
    assert dpl.deep().n_params == sum(p.numel() for p in model.parameters())


def test_only_the_overlapped_step_communicates_under_backward() -> None:
    cluster = Cluster.preset("4xRTX4090-pcie")
    workload = dpl.deep(4096)
    bucketed = dpl.run_step(workload, cluster, dp.ddp_step_bucketed, optimizer="sgd")
    overlapped = dpl.run_step(workload, cluster, functools.partial(
        dp.ddp_step_overlapped, bucket_bytes=4 * 2**20), optimizer="sgd")
    assert dpl.hidden_comm_seconds(bucketed.trace, 0) == 0.0
    assert dpl.hidden_comm_seconds(overlapped.trace, 0) > 0.0
    assert overlapped.trace.makespan < bucketed.trace.makespan


def test_measured_ledger_matches_sixteen_bytes_per_parameter() -> None:
    sizes = (16, 32, 8)
    run = dpl.run_training(2, sizes, batch=16, steps=2, optimizer="adam")
    peak = run.trace.peak_memory_by_category(0)
    n = Workload("m", sizes, 16).n_params
    estimate = estimate_memory(n, "adam", "fp32", "dp", 2, peak["activations"])
    for category in ("parameters", "gradients", "activations"):
        assert peak[category] == estimate.per_device[category]
    assert peak["optimizer"] == estimate.per_device["optimizer"] + 4 * 4  # 4 step counters


def test_scaling_study_wrapper_returns_plot_ready_series() -> None:
    times = dpl.run_scaling_study([SMALL], presets=["8xH100-nvswitch"], world_sizes=[1, 2])
    assert list(times) == ["small model, 8xH100-nvswitch"]
    assert set(times["small model, 8xH100-nvswitch"]) == {1, 2}


def test_demo_wrappers_match_one_device() -> None:
    assert psl.run_demo("sim", 3, 2, "adam")["matches"]
    report = dpl.run_demo("sim", 3, 2, "sgd", variant="bucketed")
    assert report["matches"] and report["variant"] == "bucketed"


# ---- lesson 03: a DDP wrapper at work (exercise 3.5's reference) -----------------------------

def test_reference_wrapper_trains_like_one_device_on_uneven_shards() -> None:
    report = dpl.run_wrapped_demo("sim", 5, 3, "adam", wrap=dpl.wrap_ddp)
    assert report["matches"] and report["world_size"] == 5


def test_wrapped_step_overlaps_like_the_package_step_without_the_broadcast() -> None:
    workload, bucket = dpl.deep(4096), 4 * 2**20
    wrapped = dpl.run_wrapped_step(workload, "4xRTX4090-pcie", dpl.wrap_ddp, bucket)
    step = dpl.step_only(wrapped.trace)
    assert min(e.start for e in step.events) == 0.0
    assert min(e.start for e in step.events if e.kind == "forward") == 0.0
    assert step.makespan < wrapped.trace.makespan  # the broadcast is cut
    assert dpl.hidden_comm_seconds(step, 0) > 0.0
    package = dpl.run_step(workload, "4xRTX4090-pcie", functools.partial(
        dp.ddp_step_overlapped, bucket_bytes=bucket), optimizer="sgd")
    # the two differ in their copies (the package flattens each bucket and copies it back),
    # which now cost their bytes over memory bandwidth
    assert step.makespan == pytest.approx(package.trace.makespan, rel=0.15)


def test_scaling_study_runs_a_wrapper() -> None:
    times = dpl.run_scaling_study([SMALL], presets=["8xH100-nvswitch"], world_sizes=[1, 2],
                                  wrap=dpl.wrap_ddp)
    assert set(times["small model, 8xH100-nvswitch"]) == {1, 2}
    assert all(t > 0 for t in times["small model, 8xH100-nvswitch"].values())


def test_step_timelines_mark_every_end_and_titles_stay_short() -> None:
    short = Trace(1, [Event(0, "compute", "forward", 0.0, 2.0)])
    long = Trace(1, [Event(0, "compute", "forward", 0.0, 3.0)])
    fig = dpl.plot_steps({"short": short, "long": long})
    for ax, end in zip(fig.axes, (2.0, 3.0)):
        assert [line.get_xdata()[0] for line in ax.get_lines()
                if line.get_linestyle() == "--"] == [end]
    from mpgpu_edu.grading.registry import get
    from mpgpu_edu.grading.yours import Chosen

    reference = Chosen(dpl.wrap_ddp, get("3.5"), False, "DDP wrapper",
                       'not yet (mp.check("3.5") to use yours)')
    assert dpl.whose(reference) == "reference DDP wrapper (yours: not yet)"
    mine = Chosen(dpl.wrap_ddp, get("3.5"), True, "DDP wrapper", "")
    assert dpl.whose(mine) == "your DDP wrapper"
