"""Lesson 00's demos: split then combine, and a GPU fed by loader workers."""

from __future__ import annotations

import pytest
from matplotlib.figure import Figure

from mpgpu_edu.cluster import Cluster
from mpgpu_edu.comm import launch
from mpgpu_edu.lessons import welcome as wl


def test_split_then_combine_divides_compute_and_adds_an_all_reduce() -> None:
    cluster = Cluster.uniform(4, alpha_s=1e-5, beta_Bps=1e9)
    one = launch(wl.split_then_combine, cluster.with_visible("0"), 3, 0.03, 1000)
    four = launch(wl.split_then_combine, cluster, 3, 0.03, 1000)
    assert one.trace.makespan == pytest.approx(3 * 0.03)
    assert one.bytes_sent_per_rank == [0]
    compute = four.trace.busy(0, "compute")
    assert compute == pytest.approx(3 * 0.03 / 4)
    # ring all-reduce of 4000 bytes: 2(N-1)/N of it per rank per step
    assert four.bytes_sent_per_rank == [3 * 6000] * 4
    assert compute < four.trace.makespan < one.trace.makespan
    # on a real preset the combine's additions cost time, and one device has none of them
    h100 = Cluster.preset("4xH100-nvswitch")
    alone = launch(wl.split_then_combine, h100.with_visible("0"), 2, 0.03, 1000)
    assert {e.kind for e in alone.trace.events} == {"forward", "backward"}
    assert "compute" in {e.kind for e in launch(wl.split_then_combine, h100, 2, 0.03,
                                                 1000).trace.events}


@pytest.mark.parametrize("loaders", [1, 2, 3])
def test_input_pipeline_gpu_busy_share_matches_steady_state(loaders: int) -> None:
    load, compute, steps = 0.4, 0.1, 12
    result = wl.run_input_pipeline(load, compute, loaders=loaders, steps=steps,
                                    batch_bytes=1000)
    gpu = result.trace.n_devices - 1
    assert result.trace.busy(gpu) == pytest.approx(steps * compute)
    steady = 1 - min(1.0, loaders * compute / load)
    assert wl.gpu_idle_after_first_batch(result) == pytest.approx(steady, abs=0.08)
    assert wl.gpu_idle_fraction(result) >= wl.gpu_idle_after_first_batch(result)
    kinds = {e.kind for e in result.trace.events if e.stream == "compute"}
    assert kinds == {"data", "compute"}


def test_enough_loaders_make_the_gpu_the_bottleneck() -> None:
    result = wl.run_input_pipeline(0.2, 0.1, loaders=4, steps=10, batch_bytes=10)
    assert wl.gpu_idle_after_first_batch(result) < 0.01


def test_input_pipeline_needs_a_loader_and_a_gpu() -> None:
    with pytest.raises(Exception, match="at least 2 ranks"):
        launch(wl.input_pipeline, 1, 2, 0.1, 0.1, 10)


def test_pipeline_figure_names_rows_and_states_the_idle_share() -> None:
    result = wl.run_input_pipeline(0.2, 0.1, loaders=2, steps=4, batch_bytes=10)
    fig = wl.plot_input_pipeline(result)
    assert isinstance(fig, Figure)
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert labels == ["loader 0 compute", "loader 1 compute", "GPU compute"]
    assert f"{wl.gpu_idle_fraction(result):.0%}" in fig.axes[0].get_title(loc="left")
    with_copies = wl.plot_input_pipeline(result, copies=True)
    labels = [t.get_text() for t in with_copies.axes[0].get_yticklabels()]
    assert labels == ["loader 0 compute", "loader 0 comm", "loader 1 compute", "loader 1 comm",
                      "GPU compute", "GPU comm"]


def test_epoch_seconds_is_compute_split_n_ways() -> None:
    cluster = Cluster.preset("8xH100-nvswitch")
    flops = 1e18
    times = wl.epoch_seconds(cluster, flops, [1, 2, 8])
    assert times[1] == pytest.approx(cluster.compute_seconds(flops, "bf16"))
    assert times[8] == pytest.approx(cluster.compute_seconds(flops / 8, "bf16"))
    assert times[1] / times[8] == pytest.approx(8, rel=1e-6)


def test_idle_summary_is_in_the_figure_title() -> None:
    result = wl.run_input_pipeline(0.2, 0.1, loaders=1, steps=4, batch_bytes=10)
    fig = wl.plot_input_pipeline(result, title="mine")
    title = fig.axes[0].get_title(loc="left")
    assert title.startswith("mine: ") and wl.idle_summary(result) in title
    assert f"{wl.gpu_idle_after_first_batch(result):.0%} after the first batch" in title


def test_a_faster_gpu_does_not_speed_up_an_input_bound_step() -> None:
    slow = wl.run_input_pipeline(0.4, 0.1, loaders=1, steps=6, batch_bytes=10)
    fast = wl.run_input_pipeline(0.4, 0.05, loaders=1, steps=6, batch_bytes=10)
    assert wl.step_seconds_in_steady_state(slow) == pytest.approx(0.4, rel=0.01)
    assert wl.step_seconds_in_steady_state(fast) == pytest.approx(0.4, rel=0.01)


def test_device_ids_for_maps_physical_to_logical_in_request_order() -> None:
    assert wl.device_ids_for([1, 2], [1, 2]) == [0, 1]
    assert wl.device_ids_for([3, 1, 2], [1, 3, 1]) == [1, 0, 1]
    with pytest.raises(ValueError, match="GPU 0 is not visible"):
        wl.device_ids_for([1, 2], [0])


def test_data_parallel_plan_uses_the_functions_it_is_given() -> None:
    from mpgpu_edu.cluster import parse_visible

    calls: list[str] = []

    def parse(value: str | None, n: int) -> list[int]:
        calls.append("parse")
        return parse_visible(value, n)

    def ids_for(visible: list[int], want: list[int]) -> list[int]:
        calls.append("ids")
        return wl.device_ids_for(visible, want)

    line = wl.data_parallel_plan("3,1", [1, 3], 4, parse, ids_for)
    assert calls == ["parse", "ids"]
    assert "device_ids=[1, 0]" in line and "physical GPUs [1, 3]" in line
    assert line.endswith("model on cuda:1")  # device_ids[0], DataParallel's primary device
    assert "model on" not in wl.data_parallel_plan("1,2", [1, 2], 4, parse, ids_for)
    lost = wl.data_parallel_plan("0,2,-1,1", [1], 4, parse, ids_for)
    assert "no device_ids will do" in lost


def test_prose_numbers_of_the_notebook_stay_true() -> None:
    """Lesson 00 says: GPT-2 large fits a 24 GiB card with 1 or 2 sequences of 1024 tokens
    per step but not 4; the heavy workload idles about a tenth of the run."""
    from mpgpu_edu.replica import data
    from mpgpu_edu.cluster.hardware import GPUS
    from mpgpu_edu.memory import activation_bytes, estimate_memory, spec_params

    card = GPUS["RTX4090-24GB"]
    fits = {b: estimate_memory(spec_params("gpt2-large"), "adam", "mixed", "single", 1,
                               activation_bytes("gpt2-large", b, 1024, "mixed")
                               ).fits(card.memory_bytes) for b in (1, 2, 4)}
    assert fits == {1: True, 2: True, 4: False}
    rtx = Cluster.preset("4xRTX4090-pcie")

    def one_loader(workload: data.Workload):  # noqa: ANN202 - as the notebook runs it
        return wl.run_input_pipeline(1e-3 + 0.2e-6 * workload.batch,
                                     rtx.compute_seconds(workload.step_flops), loaders=1,
                                     steps=8, batch_bytes=4 * 512 * workload.batch)

    heavy, light = data.heavy(), data.light()
    run, light_run = one_loader(heavy), one_loader(light)
    assert 0.05 <= wl.gpu_idle_after_first_batch(run) <= wl.gpu_idle_fraction(run) <= 0.15
    # "more than twice as many samples per second" than the light run
    assert (heavy.batch / wl.step_seconds_in_steady_state(run)
            > 2 * light.batch / wl.step_seconds_in_steady_state(light_run))
    # prediction 00.workers-needed: 512 ms to load, 73 ms to train; 4 workers leave the GPU
    # waiting about 40% of the time, 7 make it busy
    compute = rtx.compute_seconds(3 * 8.2e9 * 256, "bf16")
    assert compute == pytest.approx(0.073, abs=0.001)
    idle = {w: wl.gpu_idle_after_first_batch(wl.run_input_pipeline(0.512, compute, loaders=w,
                                                                    steps=24)) for w in (4, 6, 7)}
    assert 0.35 <= idle[4] <= 0.45 and idle[6] >= 0.10 > idle[7]


def test_physical_ids_as_device_ids_are_named_as_missing_logical_devices() -> None:
    from tests.mutants import failures
    from tests.mutants import lesson_00 as mutants

    failed = failures("0.2", mutants.device_ids_physical)
    assert failed, "the classic mistake must fail"
    message = next(iter(failed.values()))
    assert "does not exist in a process that sees" in message, message
    assert "cuda:0 is GPU" in message and "own numbering" in message, message


def test_ids_in_the_wrong_order_are_named_as_such() -> None:
    from tests.mutants import failures
    from tests.mutants import lesson_00 as mutants

    failed = failures("0.2", mutants.device_ids_sorted)
    assert failed, "sorted ids must fail"
    message = next(iter(failed.values()))
    assert "the right GPUs in the wrong order" in message and "device_ids[0]" in message, message
