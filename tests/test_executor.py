"""The pipeline executor: any schedule, the same result as one device, and the timeline and
memory the textbook predicts."""

from __future__ import annotations

import functools

import pipeline_fns
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from mpgpu_edu.cluster import Cluster
from mpgpu_edu.comm import RankError, launch
from mpgpu_edu.replica.data import make_batches, make_mlp
from mpgpu_edu.pipeline import (ScheduleError, Step, from_order, gpipe, naive, one_f_one_b,
                                partition_by_sizes, split_module, steps_of)
from mpgpu_edu.pipeline.executor import message_tag, pipeline_train_step, run_schedule
from mpgpu_edu.pipeline.microbatches import split_batch, stage_inputs_like
from mpgpu_edu.pipeline.runner import (make_schedule, max_abs_diff, optimizer_factory, run_demo,
                                       train_pipeline)
from mpgpu_edu.replica.reference import train_single

SIZES = (8, 32, 32, 32, 32, 2)  # 9 layers: Linear, ReLU, ..., Linear
FREE_SENDS = 1e30  # bytes/s: a message costs ~0 s


def model_fn():
    return make_mlp(SIZES, seed=0)


def batches(steps: int = 2, n: int = 16):
    return make_batches(steps, n, SIZES[0], SIZES[-1], seed=3)


def reference(data, optimizer: str = "sgd", lr: float = 0.05):
    return train_single(model_fn, data, optimizer, lr)


def assert_matches(result, data, optimizer: str = "sgd") -> None:
    """fp32, rel 1e-5. Adam divides by sqrt(v): a gradient that is ~0 on both sides but
    summed in another order moves its parameter by a few 1e-6, hence Adam's atol."""
    ref_params, ref_losses = reference(data, optimizer)
    state = {k: v for r in result.results for k, v in r["state"].items()}
    atol = 1e-5 if optimizer == "adam" else 1e-6
    for name, expected in ref_params.items():
        torch.testing.assert_close(state[name], expected, rtol=1e-5, atol=atol)
    assert result.results[-1]["losses"] == pytest.approx(ref_losses, rel=1e-5)


# ---- equal to single-device training ------------------------------------------------------

CASES = [  # schedule, P, M, layers per stage (None: balanced by parameters)
    ("naive", 2, 1, None),
    ("gpipe", 2, 1, None),
    ("gpipe", 3, 4, None),
    ("1f1b", 3, 5, [1, 5, 3]),     # unequal stages, unequal microbatches (16 = 4+3+3+3+3)
    ("gpipe", 4, 3, [3, 1, 1, 4]),
    ("1f1b", 4, 8, None),
    ("naive", 4, 1, [2, 2, 4, 1]),
]


@pytest.mark.parametrize("name, n_stages, n_mb, sizes", CASES)
def test_pipeline_training_equals_single_device(name, n_stages, n_mb, sizes):
    data = batches()
    placement = partition_by_sizes(model_fn(), sizes) if sizes else None
    result = launch(train_pipeline, n_stages, model_fn(), data,
                    make_schedule(name, n_stages, n_mb), placement)
    assert_matches(result, data)
    assert [r["losses"] is None for r in result.results] == [True] * (n_stages - 1) + [False]


def test_adam_equals_single_device():
    data = batches(3)
    result = launch(train_pipeline, 3, model_fn(), data, one_f_one_b(3, 4), None,
                    optimizer_factory("adam"))
    assert_matches(result, data, "adam")


def test_ranks_may_share_one_model_object_on_the_simulator():
    """Threads share the model's layers; each rank touches only its own stage's."""
    data, model = batches(1), model_fn()
    stages = split_module(model, partition_by_sizes(model, [3, 3, 3]))

    def step(comm):
        optimizer = torch.optim.SGD(stages[comm.rank].parameters(), lr=0.05)
        return pipeline_train_step(comm, stages, gpipe(3, 4), *data[0], optimizer)

    losses = launch(step, 3).results
    assert losses[:2] == [None, None]
    assert losses[2] == pytest.approx(reference(data)[1][0], rel=1e-6)
    assert max_abs_diff({k: v for k, v in model.state_dict().items()}, reference(data)[0]) < 1e-6


# ---- one interpreter, any valid schedule ------------------------------------------------------

def test_a_hand_made_schedule_runs_too():
    """GPipe with each device's backwards in reverse order: not a builder, still valid."""
    orders = [[*(Step(p, m, "F") for m in range(4)), *(Step(p, m, "B") for m in (3, 2, 1, 0))]
              for p in range(3)]
    data = batches(1)
    assert_matches(launch(train_pipeline, 3, model_fn(), data, from_order("mine", orders, 4)),
                   data)


@st.composite
def random_orders(draw):
    """Per device, a random order of its steps in which each microbatch's F precedes its B."""
    n_stages, n_mb = draw(st.integers(2, 3)), draw(st.integers(1, 4))
    orders = []
    for p in range(n_stages):
        f_order = draw(st.permutations(range(n_mb)))
        b_order = draw(st.permutations(range(n_mb)))
        keys = draw(st.lists(st.booleans(), min_size=2 * n_mb, max_size=2 * n_mb))
        forwards = [Step(p, m, "F") for m in f_order]
        backwards = [Step(p, m, "B") for m in b_order]
        order, done = [], set()
        while forwards or backwards:
            can_b = bool(backwards) and backwards[0].microbatch in done
            if can_b and (not forwards or keys[len(order)]):
                order.append(backwards.pop(0))
            else:
                done.add(forwards[0].microbatch)
                order.append(forwards.pop(0))
        orders.append(order)
    return n_stages, n_mb, orders


@settings(max_examples=10, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(random_orders())
def test_any_valid_schedule_runs_without_deadlock(case):
    n_stages, n_mb, orders = case
    try:
        schedule = from_order("random", orders, n_mb)
    except ScheduleError:
        assume(False)  # the orders wait on each other forever: not a schedule
    data = batches(1)
    assert_matches(launch(train_pipeline, n_stages, model_fn(), data, schedule), data)


def test_message_tags_name_microbatch_and_direction():
    tags = {message_tag(Step(1, m, op)) for m in range(8) for op in "FB"}
    assert len(tags) == 16


# ---- the timeline: bubbles and links --------------------------------------------------------

def schedule_step(comm, schedule, seconds):
    model = make_mlp([8] * (comm.world_size + 1), seed=0)
    stages = split_module(model, partition_by_sizes(model, [2] * (comm.world_size - 1) + [1]))
    x = torch.ones(16, 8)
    optimizer = torch.optim.SGD(stages[comm.rank].parameters(), lr=0.1)
    pipeline_train_step(comm, stages, schedule, x, x, optimizer, stage_seconds=seconds)


def bubble(trace, n: int) -> float:
    return sum(trace.idle(d) for d in range(n)) / (n * trace.makespan)


@pytest.mark.parametrize("builder", [gpipe, one_f_one_b])
@pytest.mark.parametrize("n_stages, n_mb", [(2, 1), (2, 4), (3, 8), (4, 4)])
def test_simulated_bubble_is_the_textbook_formula(builder, n_stages, n_mb):
    cluster = Cluster.uniform(n_stages, alpha_s=0.0, beta_Bps=FREE_SENDS)
    trace = launch(schedule_step, cluster, builder(n_stages, n_mb), (1.0, 2.0)).trace
    assert bubble(trace, n_stages) == pytest.approx((n_stages - 1) / (n_mb + n_stages - 1),
                                                    rel=1e-9)
    assert trace.makespan == pytest.approx((n_mb + n_stages - 1) * 3.0, rel=1e-9)
    first = [e.label for e in trace.on(0, "compute") if e.kind in ("forward", "backward")]
    assert first == [step.token for step in steps_of(builder(n_stages, n_mb), 0)]


def test_naive_pipeline_leaves_all_but_one_device_idle():
    trace = launch(schedule_step, Cluster.uniform(4, 0.0, FREE_SENDS), naive(4), (1.0, 2.0)).trace
    assert [trace.idle_fraction(d) for d in range(4)] == pytest.approx([0.75] * 4)


def wide_step(comm, schedule):
    model = make_mlp([512] * 5, seed=0)
    stages = split_module(model, partition_by_sizes(model, [2, 2, 2, 1]))
    x = torch.ones(64, 512)
    run_schedule(comm, schedule, stages[comm.rank], split_batch(x, 4), split_batch(x, 4),
                 torch.nn.functional.mse_loss,
                 recv_like=stage_inputs_like(stages[:comm.rank], split_batch(x, 4)),
                 stage_seconds=(1e-4, 2e-4))


def test_activations_cross_pcie_slower_than_nvswitch():
    result = launch(wide_step, Cluster.preset("4xRTX4090-pcie"), gpipe(4, 4))
    nvswitch = result.retime(Cluster.preset("4xH100-nvswitch"))
    assert result.trace.makespan > nvswitch.makespan
    sends = [e for e in result.trace.events if e.kind == "send"]
    assert len(sends) == 2 * 3 * 4  # per boundary and microbatch: an activation and a grad
    assert {e.nbytes for e in sends} == {16 * 512 * 4}


# ---- memory: GPipe holds M microbatches, 1F1B at most P --------------------------------------

def activation_peaks(trace, n: int) -> list[int]:
    return [max(trace.memory_timeline(d)[1]["activations"]) for d in range(n)]


def one_microbatch_bytes(trace, device: int) -> int:
    return next(m.delta for m in trace.memory if m.device == device
                and m.category == "activations")


@pytest.mark.parametrize("n_stages, n_mb", [(3, 6), (4, 8)])
def test_gpipe_holds_every_microbatch_1f1b_at_most_p(n_stages, n_mb):
    data = batches(1, n=n_mb * 2)
    gp = launch(train_pipeline, n_stages, model_fn(), data, gpipe(n_stages, n_mb)).trace
    fb = launch(train_pipeline, n_stages, model_fn(), data, one_f_one_b(n_stages, n_mb)).trace
    unit = one_microbatch_bytes(gp, 0)
    assert activation_peaks(gp, n_stages)[0] == n_mb * unit
    assert activation_peaks(fb, n_stages)[0] == min(n_stages, n_mb) * unit
    for p in range(n_stages):
        unit_p = one_microbatch_bytes(fb, p)
        assert activation_peaks(fb, n_stages)[p] == min(n_stages - p, n_mb) * unit_p
    assert gp.peak_memory(0) > fb.peak_memory(0)
    times, series = fb.memory_timeline(0)
    assert series["parameters"][-1] > 0 and series["activations"][-1] == 0


# ---- bad input ----------------------------------------------------------------------------------

def test_schedule_must_have_one_stage_per_rank():
    with pytest.raises(RankError, match="3 stages but the communicator has 2 ranks"):
        launch(train_pipeline, 2, model_fn(), batches(1), gpipe(3, 2))


def test_more_microbatches_than_samples_is_refused():
    with pytest.raises(ValueError, match="cannot split a batch of 4 samples into 5"):
        split_batch(torch.zeros(4, 2), 5)


def test_missing_microbatches_is_refused():
    def prog(comm):
        run_schedule(comm, gpipe(1, 2), torch.nn.Linear(2, 2), [torch.zeros(1, 2)],
                     [torch.zeros(1, 2)] * 2, torch.nn.functional.mse_loss)

    with pytest.raises(RankError, match="stage 0 needs 2 microbatches"):
        launch(prog, 1)


@pytest.mark.parametrize("args, message", [
    (("zigzag", 2, 2), "unknown schedule 'zigzag'"),
    (("naive", 2, 3), "naive schedule runs the whole batch as one microbatch"),
])
def test_make_schedule_errors(args, message):
    with pytest.raises(ValueError, match=message):
        make_schedule(*args)


# ---- the runner and gloo --------------------------------------------------------------------

def test_run_demo_reports_the_comparison():
    report = run_demo("sim", 3, 2, "sgd", schedule="1f1b", microbatches=4)
    for key in ("strategy", "backend", "world_size", "steps", "losses", "reference_losses",
                "final_loss", "reference_final_loss", "max_abs_param_diff"):
        assert key in report
    assert report["strategy"] == "pipeline" and len(report["losses"]) == 2
    assert report["final_loss"] == pytest.approx(report["reference_final_loss"], rel=1e-5)
    assert report["max_abs_param_diff"] < 1e-5


@pytest.mark.parametrize("kwargs, message", [
    ({"world_size": 10}, "cannot split a 9-layer model into 10 stages"),
    ({"steps": 0}, "steps must be at least 1"),
    ({"microbatches": 17}, "microbatches must be between 1 and the batch size 16"),
    ({"optimizer": "lion"}, "unknown optimizer 'lion'"),
])
def test_run_demo_bad_input(kwargs, message):
    args = {"backend": "sim", "world_size": 2, "steps": 1, "optimizer": "sgd", **kwargs}
    with pytest.raises(ValueError, match=message):
        run_demo(**args)


@pytest.mark.gloo
def test_gloo_pipeline_equals_single_device():
    data = batches(2)
    schedules = [gpipe(2, 4), one_f_one_b(2, 3), naive(2)]
    result = launch(pipeline_fns.train_schedules, 2, model_fn(), data, schedules,
                    backend="gloo", timeout=60)
    for i in range(len(schedules)):
        per_schedule = functools.reduce(lambda a, b: a | b,
                                        [r[i]["state"] for r in result.results])
        ref_params, ref_losses = reference(data)
        for name, expected in ref_params.items():
            torch.testing.assert_close(per_schedule[name], expected, rtol=1e-5, atol=1e-6)
        assert result.results[1][i]["losses"] == pytest.approx(ref_losses, rel=1e-5)


# ---- interleaved 1F1B: chunks on every rank, same result ----------------------------------

@pytest.mark.parametrize("n_stages, n_mb, n_chunks", [(2, 4, 2), (3, 3, 3), (2, 2, 4)])
def test_interleaved_equals_single_device(n_stages, n_mb, n_chunks):
    """V chunks per rank (9 layers cut into P V virtual stages), messages wrapping from the
    last rank back to the first: the same parameters and losses as one device."""
    from mpgpu_edu.pipeline import interleaved_1f1b

    data = batches(steps=2, n=12)
    schedule = interleaved_1f1b(n_stages, n_mb, n_chunks)
    result = launch(train_pipeline, n_stages, model_fn(), data, schedule)
    assert_matches(result, data)


def test_interleaved_messages_carry_chunked_tags():
    """Chunk 0's tags are lesson 04's (2m, 2m+1); chunk c's are offset so that microbatch m's
    activation into chunk 1 never matches chunk 0's."""
    assert message_tag(Step(1, 3, "F")) == 6 and message_tag(Step(1, 3, "B")) == 7
    assert message_tag(Step(0, 3, "F", 1)) not in {message_tag(Step(0, m, op))
                                                   for m in range(64) for op in "FB"}
