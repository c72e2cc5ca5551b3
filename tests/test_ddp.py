"""DDP from scratch: every variant equals single-device training; buckets, overlap,
accumulation, uneven shards, scaling curves; the same code on gloo."""

from __future__ import annotations

import functools

import pytest
import torch

from mpgpu_edu.cluster import Cluster
from mpgpu_edu.comm import RankError, launch
from mpgpu_edu.replica.data import heavy, light, make_batches, make_mlp
from mpgpu_edu.dp.ddp import (ddp_step, ddp_step_accumulated, ddp_step_bucketed,
                              ddp_step_overlapped, make_buckets, train_ddp)
from mpgpu_edu.dp.scaling import ddp_step_time, scaling_study, speedup_and_efficiency
from mpgpu_edu.replica.reference import train_single
from strategy_fns import BUCKET_BYTES, STEP_FNS, model_fn, train_every_ddp_variant

BATCHES = make_batches(3, 10)  # 10 samples: uneven shards over 3 and 4 ranks

VARIANTS = dict(STEP_FNS, accumulated=functools.partial(ddp_step_accumulated, micro_steps=2,
                                                        bucket_bytes=BUCKET_BYTES))


def assert_matches(result: dict, reference: tuple[dict, list]) -> None:
    ref_params, ref_losses = reference
    for name, ref in ref_params.items():
        torch.testing.assert_close(result["params"][name], ref, rtol=1e-5, atol=1e-6)
    assert result["losses"] == pytest.approx(ref_losses, rel=1e-5)


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_every_variant_matches_single_device(n: int, optimizer: str) -> None:
    reference = train_single(model_fn, BATCHES, optimizer, lr=0.05)
    for name, step_fn in VARIANTS.items():
        run = launch(train_ddp, n, step_fn, model_fn, BATCHES, optimizer, 0.05)
        for result in run.results:  # every replica, not only rank 0
            assert_matches(result, reference)


def test_world_size_larger_than_the_batch_is_a_clear_error() -> None:
    batches = make_batches(1, 3)
    with pytest.raises(RankError) as info:
        launch(train_ddp, 4, ddp_step, model_fn, batches)
    assert ("batch of 3 samples cannot be split over 4 ranks: use a batch of at least 4 or "
            "fewer ranks") in str(info.value)


def test_world_size_one_sends_nothing_during_training() -> None:
    run = launch(train_ddp, 1, STEP_FNS["overlapped"], model_fn, BATCHES)
    assert run.stats[0].messages_sent == 0


def test_buckets_take_parameters_last_first_and_respect_the_cap() -> None:
    model = make_mlp([8, 16, 16, 2])
    params = list(model.parameters())  # w1 (512 B) b1 (64) w2 (1024) b2 (64) w3 (128) b3 (8)
    buckets = make_buckets(params, 600)
    assert [p for bucket in buckets for p in bucket] == params[::-1]
    assert [len(b) for b in buckets] == [3, 1, 2]  # w2 alone: it is bigger than the cap
    assert all(sum(p.numel() * 4 for p in b) <= 600 for b in buckets if len(b) > 1)


def test_naive_sends_one_all_reduce_per_parameter_bucketed_one_per_bucket() -> None:
    def messages(step_fn: object) -> int:
        return launch(train_ddp, 2, step_fn, model_fn, BATCHES[:1]).stats[0].messages_sent

    setup = messages(lambda comm, model, opt, batch: torch.zeros(()))  # broadcast, losses
    n_params = len(list(model_fn().parameters()))
    n_buckets = len(make_buckets(list(model_fn().parameters()), BUCKET_BYTES))
    # ring all-reduce on 2 ranks: 2 messages per rank
    assert messages(ddp_step) - setup == 2 * n_params
    assert messages(STEP_FNS["bucketed"]) - setup == 2 * n_buckets


# A link about as fast as the backward of the deep model below, so overlap matters.
OVERLAP_CLUSTER = Cluster.uniform(2, alpha_s=1e-6, beta_Bps=2e9, gpu="CPU-16GB")
DEEP_BATCH = make_batches(1, 256, 64, 64)[0]


def one_deep_step(comm, step_fn) -> None:  # noqa: ANN001
    """One step of a 9-layer MLP, nothing else, so the makespan is the step's."""
    model = make_mlp([64] * 9)
    step_fn(comm, model, torch.optim.SGD(model.parameters(), lr=0.1), DEEP_BATCH)


def test_overlapped_starts_communication_before_backward_ends() -> None:
    step = functools.partial(ddp_step_overlapped, bucket_bytes=20_000)
    trace = launch(one_deep_step, OVERLAP_CLUSTER, step).trace
    backward = trace.on(0, "compute", "backward")
    assert len(backward) > 1  # the region was split where buckets started
    assert trace.on(0, "comm")[0].start < backward[-1].end


def test_overlapped_is_faster_than_bucketed_on_a_deep_model() -> None:
    def makespan(step_fn: object) -> float:
        return launch(one_deep_step, OVERLAP_CLUSTER, step_fn).trace.makespan

    bucketed = makespan(functools.partial(ddp_step_bucketed, bucket_bytes=20_000))
    overlapped = makespan(functools.partial(ddp_step_overlapped, bucket_bytes=20_000))
    assert overlapped < 0.8 * bucketed


def test_accumulation_sends_the_bytes_of_one_step_not_of_each_micro_step() -> None:
    batches = make_batches(1, 16)
    one = launch(train_ddp, 2, STEP_FNS["bucketed"], model_fn, batches).stats[0].bytes_sent
    for k in (2, 4):
        step = functools.partial(ddp_step_accumulated, micro_steps=k, bucket_bytes=BUCKET_BYTES)
        run = launch(train_ddp, 2, step, model_fn, batches)
        assert run.stats[0].bytes_sent == one
        assert_matches(run.results[0], train_single(model_fn, batches))


def test_accumulation_needs_a_sample_per_micro_step() -> None:
    step = functools.partial(ddp_step_accumulated, micro_steps=4)
    with pytest.raises(RankError, match="cannot be split over 4 micro-batches"):
        launch(train_ddp, 2, step, model_fn, make_batches(1, 6))


def test_ddp_records_memory_by_category() -> None:
    run = launch(train_ddp, 2, STEP_FNS["overlapped"], model_fn, BATCHES, "adam")
    ledger = run.ledgers[0]
    param_bytes = sum(p.numel() * 4 for p in model_fn().parameters())
    peak = run.trace.peak_memory_by_category(0)
    assert peak["parameters"] == param_bytes == peak["gradients"]
    assert peak["optimizer"] == 2 * param_bytes + 4 * len(list(model_fn().parameters()))
    categories = {m.category for m in run.trace.memory}
    assert {"activations", "comm_buffers"} <= categories
    assert ledger.peak() > 4 * param_bytes


# ---- scaling --------------------------------------------------------------------------------
def test_light_model_gets_slower_with_more_devices_on_pcie() -> None:
    times = {n: ddp_step_time(light(), "8xRTX4090-pcie", n) for n in (1, 2)}
    speedup, _ = speedup_and_efficiency(times)[2]
    assert speedup < 1


def test_heavy_model_scales_on_nvswitch() -> None:
    times = {n: ddp_step_time(heavy(), "8xH100-nvswitch", n) for n in (1, 8)}
    _, efficiency = speedup_and_efficiency(times)[8]
    assert efficiency > 0.8


def test_scaling_study_is_step_times_by_label_and_world_size() -> None:
    """The shape ``mpgpu_edu.viz.scaling.plot_scaling`` takes: {label: {N: seconds}}."""
    results = scaling_study([light()], presets=["8xH100-nvswitch"], world_sizes=(1, 2))
    assert list(results) == ["light model, 8xH100-nvswitch"]
    times = results["light model, 8xH100-nvswitch"]
    assert set(times) == {1, 2} and all(t > 0 for t in times.values())


# ---- gloo ---------------------------------------------------------------------------------
@pytest.mark.gloo
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_variants_match_single_device_on_gloo(optimizer: str) -> None:
    run = launch(train_every_ddp_variant, 2, BATCHES, optimizer, 0.05, backend="gloo",
                 timeout=120)
    reference = train_single(model_fn, BATCHES, optimizer, lr=0.05)
    for per_variant in run.results:
        assert set(per_variant) == {"naive", "bucketed", "overlapped"}
        for result in per_variant.values():
            assert_matches(result, reference)
