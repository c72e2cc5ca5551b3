"""Activation memory as training runs today: eager or flash attention, recomputation, tensor
parallelism (Korthikanti et al. 2022), in the Python API and in ``mpgpu-edu memory``."""

from __future__ import annotations

import json

import pytest

from mpgpu_edu.cli import main
from mpgpu_edu.memory import (
    activation_bytes,
    activation_terms,
    get_preset,
    layer_activation_bytes,
)

S, B = 4096, 1                                   # LLaMA-7B at 4k tokens, one sequence
H, A, L, V = 4096, 32, 32, 32000


def _exit_code(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as exc:
        return int(exc.code)


def _json(argv: list[str], capsys: pytest.CaptureFixture) -> dict:
    assert main(["memory", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _llama(extra: list[str], capsys: pytest.CaptureFixture) -> dict:
    return _json(["--model", "llama-7b", "--batch", str(B), "--seq", str(S), *extra], capsys)


def test_default_is_eager_without_recompute() -> None:
    s, b, h, a = 1024, 2, 768, 12                # GPT-2 small: the lessons' numbers
    eager = 12 * (s * b * h * 34 + 5 * a * s * s * b)
    assert activation_bytes("gpt2-small", b, s) == eager
    assert activation_bytes("gpt2-small", b, s, "mixed", "eager", "none", 1) == eager


@pytest.mark.parametrize("attention, recompute, per_layer", [
    ("eager", "none", S * B * H * 34 + 5 * A * S * S * B),
    ("flash", "none", 34 * S * B * H),
    ("eager", "selective", 34 * S * B * H),      # the paper's selective = the attention core
    ("flash", "selective", 34 * S * B * H),
    ("eager", "full", 2 * S * B * H),
    ("flash", "full", 2 * S * B * H),
])
def test_cli_per_layer_matches_the_paper(attention: str, recompute: str, per_layer: int,
                                         capsys: pytest.CaptureFixture) -> None:
    out = _llama(["--attention", attention, "--recompute", recompute], capsys)
    terms = out["activation_terms"]
    assert terms["per_layer"] == per_layer
    assert terms["layers"] == L * per_layer
    assert out["per_device"]["activations"] == L * per_layer      # logits not added
    assert (terms["attention"], terms["recompute"]) == (attention, recompute)


def test_llama_7b_at_4k_eager_is_5_7x_flash(capsys: pytest.CaptureFixture) -> None:
    eager = _llama([], capsys)["per_device"]["activations"]
    flash = _llama(["--attention", "flash"], capsys)["per_device"]["activations"]
    # (34 + 5as/h) / 34 with a s / h = 32: (34 + 160) / 34 = 5.71
    assert eager / flash == pytest.approx(194 / 34)
    assert eager == 104_152_956_928 and flash == 18_253_611_008   # 97.0 GiB against 17.0 GiB


def test_fp32_counts_4_byte_tensors() -> None:
    s, b, h, a = 512, 2, 768, 12
    assert layer_activation_bytes("gpt2-small", b, s, "fp32", "flash") == 66 * s * b * h
    assert layer_activation_bytes("gpt2-small", b, s, "fp32", recompute="full") == 4 * s * b * h
    assert layer_activation_bytes("gpt2-small", b, s, "fp32") == s * b * h * 66 + 9 * a * s * s * b


@pytest.mark.parametrize("t", [1, 2, 4, 8])
def test_tensor_parallel_is_eq_2(t: int) -> None:
    per_rank = layer_activation_bytes("llama-7b", B, S, tensor_parallel=t)
    assert per_rank == S * B * H * 10 + (24 * S * B * H + 5 * A * S * S * B) // t
    flash = layer_activation_bytes("llama-7b", B, S, attention="flash", tensor_parallel=t)
    assert flash == S * B * H * (10 + 24 // t)


def test_cli_strategy_tensor_splits_activations(capsys: pytest.CaptureFixture) -> None:
    out = _llama(["--strategy", "tensor", "--devices", "4"], capsys)
    assert out["activation_terms"]["tensor_parallel"] == 4
    assert out["activation_terms"]["per_layer"] == S * B * H * (10 + 6) + 5 * A * S * S * B // 4


def test_logits_term_is_fp32(capsys: pytest.CaptureFixture) -> None:
    terms = activation_terms("llama-7b", B, S)
    assert terms["output"] == 4 * S * B * V + 2 * 2 * S * B * H   # logits + two 16-bit inputs
    assert terms["embedding"] == S * B * H                        # 1-byte dropout mask
    out = _llama(["--attention", "flash", "--logits"], capsys)
    assert out["per_device"]["activations"] == (L * 34 * S * B * H + terms["output"]
                                                + terms["embedding"])
    assert out["activation_terms"]["logits"] is True


def test_json_keeps_its_fields_and_adds_units(capsys: pytest.CaptureFixture) -> None:
    out = _json(["--params", "7B"], capsys)
    for key in ("n_params", "per_device", "per_device_total", "total_all_devices", "fits",
                "convention", "gpu", "gpu_memory_bytes", "model"):
        assert key in out
    assert out["activation_terms"] is None
    assert out["per_device_total_gb"] == pytest.approx(16 * 7)            # 16 B x 7e9
    assert out["per_device_total_gib"] == pytest.approx(16 * 7e9 / 2**30)


def test_text_shows_binary_and_decimal(capsys: pytest.CaptureFixture) -> None:
    assert main(["memory", "--model", "llama-7b", "--batch", "1", "--seq", "4096",
                 "--attention", "flash"]) == 0
    out = capsys.readouterr().out
    assert "12.55 GiB" in out and "13.48 GB" in out            # the 16-bit parameters
    assert "flash attention, recompute none" in out
    assert "per layer 544.00 MiB x 32 layers" in out


def test_api_rejects_unknown_settings() -> None:
    with pytest.raises(ValueError, match="unknown attention 'sdpa'"):
        activation_bytes("llama-7b", 1, 128, attention="sdpa")
    with pytest.raises(ValueError, match="unknown recompute 'some'"):
        activation_bytes("llama-7b", 1, 128, recompute="some")
    with pytest.raises(ValueError, match="tensor_parallel"):
        activation_bytes("llama-7b", 1, 128, tensor_parallel=0)
    assert get_preset("llama-7b").n_heads == A


@pytest.mark.parametrize("argv", [
    ["--model", "llama-7b", "--batch", "1", "--seq", "128", "--attention", "sdpa"],
    ["--model", "llama-7b", "--batch", "1", "--seq", "128", "--recompute", "half"],
    ["--model", "llama-7b", "--attention", "flash"],            # no --batch/--seq
    ["--params", "7B", "--recompute", "full"],
    ["--params", "7B", "--logits"],
    ["--model", "llama-7b", "--batch", "1", "--seq", "128", "--activations", "1GiB",
     "--attention", "flash"],
])
def test_bad_settings_are_one_line_and_exit_2(argv: list[str],
                                              capsys: pytest.CaptureFixture) -> None:
    assert _exit_code(["memory", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert len(captured.err.strip().splitlines()) == 1
    assert "Traceback" not in captured.err
