"""The memory estimator and the model presets, against hand-derived formulas."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

from mpgpu_edu.cluster.hardware import GPUS
from mpgpu_edu.memory import (
    PRESETS,
    STRATEGIES,
    DecoderSpec,
    activation_bytes,
    bytes_per_param,
    count_params,
    estimate_memory,
    explain,
    get_preset,
    meta_model,
    param_breakdown,
    spec_params,
)
from mpgpu_edu.cluster.trace import CATEGORIES

P = 1200        # parameters: divisible by 4, so every shard is exact
N = 4           # devices
Q = P // N      # parameters in one shard

# (strategy, precision, optimizer) -> bytes of (parameters, gradients, optimizer) per device.
# fp32: 4 + 4 + {0, 4, 8}; mixed: 2 + 2 + {4, 8, 12} (fp32 master copy + state).
EXPECTED = {
    ("single", "fp32", "sgd"): (4 * P, 4 * P, 0),
    ("single", "fp32", "sgd-momentum"): (4 * P, 4 * P, 4 * P),
    ("single", "fp32", "adam"): (4 * P, 4 * P, 8 * P),
    ("single", "mixed", "sgd"): (2 * P, 2 * P, 4 * P),
    ("single", "mixed", "sgd-momentum"): (2 * P, 2 * P, 8 * P),
    ("single", "mixed", "adam"): (2 * P, 2 * P, 12 * P),
    ("dp", "fp32", "sgd"): (4 * P, 4 * P, 0),
    ("dp", "fp32", "sgd-momentum"): (4 * P, 4 * P, 4 * P),
    ("dp", "fp32", "adam"): (4 * P, 4 * P, 8 * P),
    ("dp", "mixed", "sgd"): (2 * P, 2 * P, 4 * P),
    ("dp", "mixed", "sgd-momentum"): (2 * P, 2 * P, 8 * P),
    ("dp", "mixed", "adam"): (2 * P, 2 * P, 12 * P),
    ("zero1", "fp32", "sgd"): (4 * P, 4 * P, 0),
    ("zero1", "fp32", "sgd-momentum"): (4 * P, 4 * P, 4 * Q),
    ("zero1", "fp32", "adam"): (4 * P, 4 * P, 8 * Q),
    ("zero1", "mixed", "sgd"): (2 * P, 2 * P, 4 * Q),
    ("zero1", "mixed", "sgd-momentum"): (2 * P, 2 * P, 8 * Q),
    ("zero1", "mixed", "adam"): (2 * P, 2 * P, 12 * Q),
    ("zero2", "fp32", "sgd"): (4 * P, 4 * Q, 0),
    ("zero2", "fp32", "sgd-momentum"): (4 * P, 4 * Q, 4 * Q),
    ("zero2", "fp32", "adam"): (4 * P, 4 * Q, 8 * Q),
    ("zero2", "mixed", "sgd"): (2 * P, 2 * Q, 4 * Q),
    ("zero2", "mixed", "sgd-momentum"): (2 * P, 2 * Q, 8 * Q),
    ("zero2", "mixed", "adam"): (2 * P, 2 * Q, 12 * Q),
    ("zero3", "fp32", "sgd"): (4 * Q, 4 * Q, 0),
    ("zero3", "fp32", "sgd-momentum"): (4 * Q, 4 * Q, 4 * Q),
    ("zero3", "fp32", "adam"): (4 * Q, 4 * Q, 8 * Q),
    ("zero3", "mixed", "sgd"): (2 * Q, 2 * Q, 4 * Q),
    ("zero3", "mixed", "sgd-momentum"): (2 * Q, 2 * Q, 8 * Q),
    ("zero3", "mixed", "adam"): (2 * Q, 2 * Q, 12 * Q),
    ("pipeline", "fp32", "sgd"): (4 * Q, 4 * Q, 0),
    ("pipeline", "fp32", "sgd-momentum"): (4 * Q, 4 * Q, 4 * Q),
    ("pipeline", "fp32", "adam"): (4 * Q, 4 * Q, 8 * Q),
    ("pipeline", "mixed", "sgd"): (2 * Q, 2 * Q, 4 * Q),
    ("pipeline", "mixed", "sgd-momentum"): (2 * Q, 2 * Q, 8 * Q),
    ("pipeline", "mixed", "adam"): (2 * Q, 2 * Q, 12 * Q),
    ("tensor", "fp32", "sgd"): (4 * Q, 4 * Q, 0),
    ("tensor", "fp32", "sgd-momentum"): (4 * Q, 4 * Q, 4 * Q),
    ("tensor", "fp32", "adam"): (4 * Q, 4 * Q, 8 * Q),
    ("tensor", "mixed", "sgd"): (2 * Q, 2 * Q, 4 * Q),
    ("tensor", "mixed", "sgd-momentum"): (2 * Q, 2 * Q, 8 * Q),
    ("tensor", "mixed", "adam"): (2 * Q, 2 * Q, 12 * Q),
}


@pytest.mark.parametrize("key", sorted(EXPECTED), ids=lambda k: "-".join(k))
def test_every_strategy_precision_optimizer(key: tuple[str, str, str]) -> None:
    strategy, precision, optimizer = key
    devices = 1 if strategy == "single" else N
    est = estimate_memory(P, optimizer, precision, strategy, devices, activations_bytes=77)
    params, grads, opt = EXPECTED[key]
    assert est.per_device == {"parameters": params, "gradients": grads, "optimizer": opt,
                              "activations": 77, "comm_buffers": 0, "other": 0}
    assert est.per_device_total == params + grads + opt + 77
    assert est.total_all_devices == devices * (params + grads + opt + 77)


def test_the_table_covers_every_combination() -> None:
    assert len(EXPECTED) == len(STRATEGIES) * 2 * 3


def test_categories_are_the_trace_categories() -> None:
    est = estimate_memory(10, "adam", "fp32", "dp", 2)
    assert tuple(est.per_device) == CATEGORIES


def test_adam_is_16_bytes_per_parameter_in_both_precisions() -> None:
    assert bytes_per_param("adam", "fp32") == {"parameters": 4, "gradients": 4, "optimizer": 8}
    assert bytes_per_param("adam", "mixed") == {"parameters": 2, "gradients": 2,
                                                "optimizer": 12}   # ZeRO's K = 12
    for precision in ("fp32", "mixed"):
        est = estimate_memory(1000, "adam", precision, "single", 1)
        assert est.per_device_total == 16 * 1000
        assert "16 B/parameter" in est.convention
    assert "K=12" in estimate_memory(1, "adam", "mixed", "single", 1).convention
    assert bytes_per_param("sgd", "fp32")["optimizer"] == 0
    assert bytes_per_param("sgd-momentum", "fp32")["optimizer"] == 4


def test_uneven_shards_round_up_to_the_largest() -> None:
    est = estimate_memory(10, "adam", "fp32", "zero3", 3)      # chunks of 4, 3, 3
    assert est.per_device["parameters"] == 4 * 4
    assert est.per_device["gradients"] == 4 * 4
    assert est.per_device["optimizer"] == 8 * 4


def test_seed_example_8_cards_of_24_gb_are_not_one_192_gb_card() -> None:
    gpu = GPUS["RTX4090-24GB"].memory_bytes                  # 24 GiB
    n = spec_params("llama-7b")                              # 6.74e9
    assert 16 * n < 8 * gpu                                  # 100.4 GiB < 192 GiB in all ...
    dp = estimate_memory(n, "adam", "mixed", "dp", 8)
    assert dp.per_device_total == 16 * n                     # ... but every replica needs it all
    assert not dp.fits(gpu)
    zero3 = estimate_memory(n, "adam", "mixed", "zero3", 8)
    assert zero3.per_device_total == 16 * (n // 8)           # 12.55 GiB: fits, before activations
    assert zero3.fits(gpu)
    assert not estimate_memory(n, "adam", "mixed", "zero1", 8).fits(gpu)   # 2 + 2 + 12/8 B


def test_fits_is_inclusive() -> None:
    est = estimate_memory(100, "adam", "fp32", "single", 1)
    assert est.fits(1600) and not est.fits(1599)


def test_float_counts_that_are_whole_are_accepted() -> None:
    assert estimate_memory(7e9, "sgd", "fp32", "single", 1).n_params == 7_000_000_000


@pytest.mark.parametrize("kwargs, fragment", [
    ({"optimizer": "lamb"}, "unknown optimizer"),
    ({"precision": "fp8"}, "unknown precision"),
    ({"strategy": "zero4"}, "unknown strategy"),
    ({"devices": 0}, "devices must be"),
    ({"devices": -2}, "devices must be"),
    ({"strategy": "single", "devices": 2}, "one device"),
    ({"n_params": -1}, "negative"),
    ({"n_params": 1.5}, "whole number"),
    ({"activations_bytes": -1}, "negative"),
])
def test_bad_input_raises_value_error(kwargs: dict, fragment: str) -> None:
    args = {"n_params": 100, "optimizer": "adam", "precision": "mixed", "strategy": "dp",
            "devices": 2, **kwargs}
    with pytest.raises(ValueError, match=fragment):
        estimate_memory(**args)


def test_explain_shows_the_formulas() -> None:
    text = explain(estimate_memory(1_500_000_000, "adam", "mixed", "zero1", 8))
    assert "parameters: 1.50e9 × 2 B = 2.79 GiB" in text
    assert "optimizer: 1.50e9 / 8 × 12 B = 2.10 GiB" in text
    assert "all devices: 8 × " in text


@given(st.integers(0, 10**12), st.integers(1, 64), st.sampled_from(["fp32", "mixed"]),
       st.sampled_from(["sgd", "sgd-momentum", "adam"]))
def test_more_sharding_never_needs_more_memory(n: int, devices: int, precision: str,
                                               optimizer: str) -> None:
    totals = [estimate_memory(n, optimizer, precision, s, devices).per_device_total
              for s in ("dp", "zero1", "zero2", "zero3")]
    assert totals == sorted(totals, reverse=True)
    per_param = sum(bytes_per_param(optimizer, precision).values())
    assert n * per_param <= devices * totals[-1] <= (n + devices) * per_param


# ---- model presets ------------------------------------------------------------------------

@pytest.mark.parametrize("name, expected", [
    ("gpt2-small", 124_439_808),       # the released checkpoints' counts (tied embeddings)
    ("gpt2-medium", 354_823_168),
    ("gpt2-large", 774_030_080),
    ("gpt2-xl", 1_557_611_200),
    ("llama-7b", 6_738_415_616),
    ("llama-13b", 13_015_864_320),
])
def test_preset_counts(name: str, expected: int) -> None:
    assert spec_params(name) == expected


def test_gpt2_small_by_hand() -> None:
    d, v, positions, layers = 768, 50257, 1024, 12
    per_layer = (2 * d) + (d * 3 * d + 3 * d) + (d * d + d) + (2 * d) \
        + (d * 4 * d + 4 * d) + (4 * d * d + d)
    assert param_breakdown("gpt2-small") == {"embedding": v * d + positions * d,
                                             "layers": layers * per_layer,
                                             "final_norm": 2 * d, "lm_head": 0}


def test_gpt_22b_by_hand() -> None:
    """Korthikanti et al. 2022's 22B GPT: 12 l h^2 in the layers, plus embeddings."""
    d, v, positions, layers = 6144, 51200, 2048, 48
    per_layer = 12 * d * d + 13 * d  # weights, biases (3d + d + 4d + d) and two LayerNorms (4d)
    assert spec_params("gpt-22b") == v * d + positions * d + layers * per_layer + 2 * d
    assert 22.0e9 < spec_params("gpt-22b") < 22.2e9


def test_llama_7b_by_hand() -> None:
    d, f, v, layers = 4096, 11008, 32000, 32
    per_layer = 4 * d * d + 3 * d * f + 2 * d          # attention, SwiGLU MLP, two RMSNorms
    assert spec_params("llama-7b") == v * d + layers * per_layer + d + v * d


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_meta_model_agrees_with_the_formula_and_costs_nothing(name: str) -> None:
    model = meta_model(name)
    assert all(p.is_meta for p in model.parameters())
    assert count_params(model) == spec_params(name)


def test_tied_embeddings_count_once() -> None:
    model = meta_model("gpt2-small")
    assert model["lm_head"].weight is model["tok_emb"].weight


def test_count_params_of_a_real_module() -> None:
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    assert count_params(model) == (3 * 4 + 4) + (4 * 2 + 2)


def test_count_params_of_a_small_real_decoder() -> None:
    spec = DecoderSpec("tiny", n_layers=2, d_model=8, n_heads=2, d_ff=32, vocab_size=11,
                       n_positions=5)
    real = nn.ModuleDict({"emb": nn.Embedding(11, 8), "pos": nn.Embedding(5, 8),
                          "layers": nn.ModuleList(nn.TransformerEncoderLayer(
                              8, 2, dim_feedforward=32) for _ in range(2)),
                          "norm": nn.LayerNorm(8)})
    assert count_params(real) == spec_params(spec)      # PyTorch's own layer as the oracle


def test_get_preset_rejects_unknown_names() -> None:
    with pytest.raises(ValueError, match="unknown model 'gpt5'"):
        get_preset("gpt5")


def test_activation_bytes_korthikanti_formula() -> None:
    s, b, h, a, layers = 1024, 2, 768, 12, 12          # GPT-2 small
    assert activation_bytes("gpt2-small", b, s, "mixed") == layers * (s * b * h * 34
                                                                      + 5 * a * s * s * b)
    assert activation_bytes("gpt2-small", b, s, "fp32") == layers * (s * b * h * 66
                                                                     + 9 * a * s * s * b)


def test_activation_bytes_rejects_bad_input() -> None:
    with pytest.raises(ValueError):
        activation_bytes("gpt2-small", 0, 128)
    with pytest.raises(ValueError):
        activation_bytes("gpt2-small", 1, 128, "fp8")

