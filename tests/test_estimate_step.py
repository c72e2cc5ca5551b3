"""One simulated training step of a model preset (``mpgpu_edu.estimate``, ``simulate step``):
the per-layer costs against their formulas, each strategy's communication against its closed
form, its time against what its compute alone allows, and the CLI."""

from __future__ import annotations

import json

import pytest

from mpgpu_edu.cli import main
from mpgpu_edu.cluster import Cluster
from mpgpu_edu.estimate import StepSetup, simulate_step
from mpgpu_edu.estimate.costs import BF16, layer_cost, layer_ops, model_flops, output_ops
from mpgpu_edu.estimate.plan import memory_per_device, plan_step
from mpgpu_edu.memory import estimate_memory, get_preset
from mpgpu_edu.memory.models import layer_params, spec_params

SMALL = dict(model="gpt2-small", cluster="4xA100-nvlink", micro_batch=2, seq=256)


def test_layer_flops_follow_narayanan_et_al() -> None:
    """24 b s h^2 (1 + s / 6h) per layer forward for GPT's 4h MLP (SC 2021, eq. 3), and the
    logits 2 b s h V: model FLOPs are three times their sum."""
    spec, b, s = get_preset("gpt-22b"), 4, 2048
    h, v, layers = spec.d_model, spec.vocab_size, spec.n_layers
    per_layer = sum(op.flops for op in layer_ops(spec, b, s))
    assert per_layer == pytest.approx(24 * b * s * h * h * (1 + s / (6 * h)))
    assert sum(op.flops for op in output_ops(spec, b, s)) == pytest.approx(2 * b * s * h * v)
    assert model_flops(spec, b * s, s) == pytest.approx(
        72 * b * s * layers * h * h * (1 + s / (6 * h)) + 6 * b * s * h * v)
    # split t ways, the matrices' FLOPs divide by t; norms and residual adds do not shrink
    t = 8
    split = {op.name: op for op in layer_ops(spec, b, s, t)}
    whole = {op.name: op for op in layer_ops(spec, b, s)}
    assert split["MLP up"].flops == pytest.approx(whole["MLP up"].flops / t)
    assert split["norm 1"].nbytes == whole["norm 1"].nbytes


def test_each_op_is_charged_on_the_roofline() -> None:
    cluster = Cluster.preset("8xA100-nvlink")
    spec = get_preset("gpt2-small")
    cost = layer_cost(cluster, spec, 8, 1024)
    ops = layer_ops(spec, 8, 1024)
    total = sum(cluster.op_seconds(op.flops, op.nbytes, "bf16") for op in ops)
    assert sum(cost.forward) == pytest.approx(total)
    assert sum(cost.backward) == pytest.approx(
        sum(cluster.op_seconds(2 * op.flops, 2 * op.nbytes, "bf16") for op in ops))
    # a norm is memory-bound: its time is its bytes over the memory bandwidth, plus a launch
    norm = ops[0]
    assert cluster.op_seconds(0.0, norm.nbytes, "bf16") == pytest.approx(
        cluster.memory_seconds(norm.nbytes) + cluster.launch_overhead_s)
    full = layer_cost(cluster, spec, 8, 1024, recompute="full")
    assert full.recompute == cost.forward
    assert 0 < sum(layer_cost(cluster, spec, 8, 1024, recompute="selective").recompute) \
        < sum(cost.forward) / 5


def _compute_only(setup: StepSetup) -> float:
    plan, _ = plan_step(setup)
    layers = plan.layers[0][1] - plan.layers[0][0]
    per_mb = layers * (sum(plan.fwd) + sum(plan.bwd) + sum(plan.rec)) + plan.out_fwd \
        + plan.out_bwd
    return setup.accumulate * per_mb + plan.opt_s[0]


@pytest.mark.parametrize("strategy", ["dp", "zero1", "zero3"])
def test_data_parallel_steps_cost_their_compute_plus_at_most_the_exposed_tail(strategy) -> None:
    setup = StepSetup(strategy=strategy, accumulate=2, **SMALL)
    report, trace = simulate_step(setup)
    compute = _compute_only(setup)
    assert report["step_s"] >= compute * (1 - 1e-9)
    assert trace.busy(0) == pytest.approx(compute, rel=1e-6) or strategy != "dp"
    assert report["step_s"] < 1.3 * compute  # communication mostly hidden behind backward
    sent = trace.bytes_sent()[0]
    grads = BF16 * spec_params("gpt2-small")
    n = 4
    if strategy == "dp":  # one ring all-reduce of every gradient (whole buckets)
        assert sent == pytest.approx(2 * (n - 1) / n * grads, rel=1e-3)
    elif strategy == "zero1":  # reduce-scatter the gradients, all-gather the weights
        assert sent == pytest.approx((n - 1) / n * grads * 2, rel=1e-3)
    else:  # per micro-batch: weights gathered twice, gradients reduce-scattered once
        layer = BF16 * layer_params(get_preset("gpt2-small"))
        assert sent == pytest.approx(2 * 12 * 3 * (n - 1) / n * layer, rel=1e-3)


def test_tensor_parallel_sends_four_all_reduces_per_layer_and_micro_batch() -> None:
    setup = StepSetup(strategy="tensor", accumulate=2, **SMALL)
    report, trace = simulate_step(setup)
    spec, n = get_preset("gpt2-small"), 4
    act = BF16 * 2 * 256 * spec.d_model
    calls = 4 * spec.n_layers * 2
    assert trace.bytes_sent()[0] == pytest.approx(calls * 2 * (n - 1) / n * act, rel=1e-6)
    full, trace_full = simulate_step(StepSetup(strategy="tensor", recompute="full", **SMALL))
    assert trace_full.bytes_sent()[0] == pytest.approx(6 / 4 * calls / 2 * 2 * (n - 1) / n
                                                       * act, rel=1e-6)
    assert report["comm_exposed_fraction"] > 0


def test_pipeline_idles_at_least_the_1f1b_bubble() -> None:
    p, m = 4, 8
    setup = StepSetup(strategy="pipeline", accumulate=m, **SMALL)
    report, trace = simulate_step(setup)
    plan, _ = plan_step(setup)
    per_stage = [(hi - lo) * (sum(plan.fwd) + sum(plan.bwd)) for lo, hi in plan.layers]
    slowest = max(per_stage[0], per_stage[-1] + plan.out_fwd + plan.out_bwd)
    assert report["step_s"] >= (m + p - 1) * min(per_stage)  # (M + P - 1)(f + b)
    assert report["step_s"] >= m * slowest
    assert report["idle_fraction"] >= 0.9 * (p - 1) / (m + p - 1) - 0.05
    # activations and their gradients: each stage but the last sends M forward, each but the
    # first M backward, of b x s x h bf16 elements
    act = BF16 * 2 * 256 * get_preset("gpt2-small").d_model
    assert trace.bytes_sent() == [m * act, 2 * m * act, 2 * m * act, m * act]


def test_memory_per_device_is_the_memory_estimate() -> None:
    setup = StepSetup(strategy="zero3", **SMALL)
    from mpgpu_edu.memory import activation_terms

    acts = activation_terms("gpt2-small", 2, 256, "mixed", "flash", "none")
    one = acts["layers"] + acts["embedding"] + acts["output"]
    assert memory_per_device(setup, 4) == estimate_memory(
        spec_params("gpt2-small"), "adam", "mixed", "zero3", 4, one).per_device


def test_bad_setups_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown strategy"):
        plan_step(StepSetup(strategy="fsdp"))
    with pytest.raises(ValueError, match="micro_batch"):
        plan_step(StepSetup(micro_batch=0))
    with pytest.raises(ValueError, match="fewer than the 16 pipeline stages"):
        plan_step(StepSetup(model="gpt2-small", cluster="2x8xH100-ib", strategy="pipeline"))


def test_cli_simulate_step_prints_json_and_a_timeline(tmp_path, capsys) -> None:
    png = tmp_path / "step.png"
    argv = ["simulate", "step", "--model", "gpt2-small", "--cluster", "4xA100-nvlink",
            "--strategy", "dp", "--micro-batch", "2", "--seq", "256", "--json",
            "--timeline", str(png)]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert {"step_s", "tokens_per_s", "mfu", "comm_exposed_fraction", "memory_per_device",
            "fits"} <= set(report)
    assert report["tokens_per_step"] == 2 * 256 * 4
    assert 0 < report["mfu"] < 0.52  # never above the GPU's efficiency
    assert png.stat().st_size > 10_000
    assert main(argv[:-3]) == 0
    text = capsys.readouterr().out
    assert "MFU" in text and "tokens/s" in text and "per device" in text


@pytest.mark.parametrize("flag, value, says", [
    ("--model", "gpt5", "unknown 'gpt5'"), ("--strategy", "fsdp", "unknown 'fsdp'"),
    ("--micro-batch", "0", "at least 1"), ("--seq", "100000000", "at most 16777216"),
    ("--seq", "4000000", "tokens per device"),
    ("--timeline", "/no/such/folder/t.png", "does not exist"),
])
def test_cli_simulate_step_refuses_bad_input(flag, value, says, capsys) -> None:
    assert main(["simulate", "step", flag, value]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0]


@pytest.mark.parametrize("argv, says", [
    (["--tp", "2"], "--tp applies to --strategy tensor, not dp"),
    (["--strategy", "tensor", "--tp", "3"], "--tp 3 must divide the 8 devices"),
    (["--strategy", "tensor", "--tp", "0"], "at least 1"),
    (["--visible", "0,9"], "--visible 0,9"),
    (["--strategy", "tensor", "--tp", "4", "--visible", "0,1"], "--tp 4 must divide the 2"),
])
def test_cli_simulate_step_refuses_bad_tp_and_visible(argv, says, capsys) -> None:
    assert main(["simulate", "step", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0], err


def test_cli_simulate_step_places_tensor_groups_with_tp_and_visible(capsys) -> None:
    base = ["simulate", "step", "--model", "gpt2-small", "--cluster", "2x8xH100-ib",
            "--strategy", "tensor", "--tp", "8", "--micro-batch", "1", "--seq", "256", "--json"]
    spread = "0,1,2,3,8,9,10,11,4,5,6,7,12,13,14,15"
    reports = []
    for extra in ([], ["--visible", spread]):
        assert main(base + extra) == 0
        reports.append(json.loads(capsys.readouterr().out))
    inside, across = reports
    assert (inside["tp"], inside["visible"]) == (8, None)
    assert (across["tp"], across["visible"]) == (8, spread)
    # the same setup as StepSetup's fields give, and groups spread over both nodes are slower
    assert inside["step_s"] == simulate_step(StepSetup("gpt2-small", "2x8xH100-ib", "tensor",
                                                       micro_batch=1, seq=256, tp=8))[0]["step_s"]
    assert across["step_s"] > inside["step_s"]
    assert inside["tokens_per_step"] == 2 * 256  # two data-parallel replicas of one sequence
