"""Lesson 09's programs and figures: recomputation and accumulation trade as the closed forms
say, and the measured recomputation keeps one input per segment and peaks lowest in between."""

from __future__ import annotations

import pytest
import torch
from matplotlib.figure import Figure

from mpgpu_edu.lessons import memory_for_time as mt
from mpgpu_edu.memory.recompute import checkpointed, segment_bounds


def test_the_reference_layer_bytes_is_korthikanti_eq_1() -> None:
    s, b, h, a = 1024, 2, 768, 12
    assert mt.reference_layer_bytes(s, b, h, a) == s * b * h * 34 + 5 * a * s * s * b
    assert mt.reference_layer_bytes(s, b, h, a, "selective") == 34 * s * b * h
    assert mt.reference_layer_bytes(s, b, h, a, "full") == 2 * s * b * h


@pytest.mark.parametrize("segments", [1, 2, 3, 7])
@pytest.mark.parametrize("input_grad", [True, False])
def test_checkpointed_equals_plain_autograd(segments: int, input_grad: bool) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(6, 6) if i % 2 == 0 else torch.nn.Tanh()
                                  for i in range(7)]).double()
    x = torch.randn(4, 6, dtype=torch.float64, requires_grad=input_grad)
    model(x).pow(2).sum().backward()
    want = [p.grad.clone() for p in model.parameters()]
    want_x = x.grad.clone() if input_grad else None
    model.zero_grad()
    x.grad = None
    checkpointed(model, segments)(x).pow(2).sum().backward()
    for got, grad in zip(model.parameters(), want):
        assert torch.allclose(got.grad, grad, rtol=1e-12, atol=1e-14)
    if input_grad:
        assert torch.allclose(x.grad, want_x, rtol=1e-12, atol=1e-14)


def test_segment_bounds_split_evenly_and_refuse_bad_counts() -> None:
    assert segment_bounds(5, 2) == [(0, 3), (3, 5)]
    assert segment_bounds(7, 7) == [(k, k + 1) for k in range(7)]
    for bad in (0, 8):
        with pytest.raises(ValueError, match="segments"):
            segment_bounds(7, bad)


def test_measured_recomputation_keeps_one_input_per_segment() -> None:
    """Every kept tensor is one batch x width input; the plain model keeps its input and every
    Tanh output; the peak is lowest in between."""
    blocks, width, batch = 8, 32, 16
    rows = mt.measure_recompute(mt.reference_checkpointed(), blocks=blocks, width=width,
                                batch=batch, segments=(1, 2, 4, 8), repeats=1)
    one = 4 * batch * width
    assert rows[0]["segments"] == 0 and rows[0]["kept"] == (blocks + 1) * one
    for r in rows[1:]:
        assert r["kept"] == r["segments"] * one
        assert r["seconds"] > 0
        # one more forward of every Linear: L products more than the plain 3L - 1 (the first
        # Linear's input needs no gradient, so its backward has one product, not two)
        assert r["flops"] / rows[0]["flops"] == pytest.approx((4 * blocks - 1) / (3 * blocks - 1))
    peaks = {r["segments"]: r["peak"] for r in rows}
    assert peaks[1] == rows[0]["kept"]              # one segment: everything, once more
    assert min(peaks.values()) < peaks[1] and min(peaks.values()) < peaks[8]
    assert isinstance(mt.plot_recompute_measured(rows), Figure)


def test_recomputation_saves_memory_for_time_and_accumulation_splits_activations() -> None:
    rows = mt.recompute_rows("gpt2-small", "8xA100-nvlink", sequences=8, seq=512,
                             accumulate=(1, 4))
    by = {(r["recompute"], r["accumulate"]): r for r in rows}
    for k in (1, 4):
        assert (by["none", k]["activations"] > by["selective", k]["activations"]
                > by["full", k]["activations"])
        assert by["none", k]["step_s"] < by["selective", k]["step_s"] < by["full", k]["step_s"]
    for recompute in mt.RECOMPUTE:  # 4 micro-batches of 2: a quarter of the activations
        assert by[recompute, 4]["activations"] == pytest.approx(
            by[recompute, 1]["activations"] / 4, rel=0.01)
    assert isinstance(mt.plot_recompute_tradeoff(rows), Figure)


@pytest.mark.slow
def test_the_stored_study_is_a_fresh_simulation_and_needs_a_remedy_to_fit() -> None:
    """The notebook reads its twelve steps from ``_recompute_stored``: they must be what
    ``simulate step`` gives today. And the notebook's setting: without recomputation or
    accumulation the step does not fit one device; selective or full recomputation, or 2
    micro-batches, does."""
    from mpgpu_edu.lessons._recompute_stored import ROWS

    assert list(ROWS) == [mt.recompute_key("gpt2-medium", "8xA100-nvlink", 32, 1024,
                                           (1, 2, 4, 8))]
    stored, fresh = mt.recompute_rows(), mt.recompute_rows(stored=False)
    assert len(stored) == len(fresh) == 12
    for s, f in zip(stored, fresh):
        assert set(s) == set(f)
        for name, value in f.items():
            assert s[name] == (pytest.approx(value, rel=1e-9) if isinstance(value, float)
                               else value), name
    fits = {(r["recompute"], r["accumulate"]): r["fits"] for r in stored
            if r["accumulate"] <= 2}
    assert fits == {("none", 1): False, ("selective", 1): True, ("full", 1): True,
                    ("none", 2): True, ("selective", 2): True, ("full", 2): True}
    assert all(r["fits"] == (r["total"] <= r["capacity"]) for r in stored)


def test_the_activation_explorer_counts_every_layer_with_the_function_it_is_given() -> None:
    from mpgpu_edu.explore.live import Explorer
    from mpgpu_edu.memory.models import get_preset

    spec = get_preset("gpt2-medium")
    figure, info = mt.activation_view(11, "gpt2-medium")
    assert isinstance(figure, Figure) and info["seq"] == 2048
    for mode in mt.RECOMPUTE:
        assert info[mode] == spec.n_layers * mt.reference_layer_bytes(
            2048, 1, spec.d_model, spec.n_heads, mode)
    assert info["none"] > info["selective"] > info["full"]
    calls = []
    explorer = mt.activation_explorer(lambda *a: calls.append(a) or 1)
    assert isinstance(explorer, Explorer) and explorer.info["none"] == spec.n_layers
    explorer.controls["log2_seq"].value = 12
    assert explorer.renders == 2 and calls[-1][0] == 4096
