"""`mpgpu-edu memory`: JSON, text, and one-line errors for bad input."""

from __future__ import annotations

import json

import pytest

from mpgpu_edu.cli import UsageError, main
from mpgpu_edu.cli.memory import parse_count
from mpgpu_edu.cluster.hardware import GPUS
from mpgpu_edu.memory import activation_bytes, spec_params

LLAMA_7B = 6_738_415_616


def _exit_code(argv: list[str]) -> int:
    """main's return code; argparse's own errors exit through SystemExit."""
    try:
        return main(argv)
    except SystemExit as exc:
        return int(exc.code)


def _json(argv: list[str], capsys: pytest.CaptureFixture) -> dict:
    assert main(["memory", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_seed_example_json(capsys: pytest.CaptureFixture) -> None:
    base = ["--model", "llama-7b", "--optimizer", "adam", "--precision", "mixed",
            "--devices", "8", "--gpu", "RTX4090-24GB"]
    dp = _json([*base, "--strategy", "dp"], capsys)
    assert dp["per_device"] == {"parameters": 2 * LLAMA_7B, "gradients": 2 * LLAMA_7B,
                                "optimizer": 12 * LLAMA_7B, "activations": 0,
                                "comm_buffers": 0, "other": 0}
    assert dp["per_device_total"] == 16 * LLAMA_7B
    assert dp["total_all_devices"] == 8 * 16 * LLAMA_7B
    assert dp["devices"] == 8 and dp["fits"] is False
    assert dp["gpu_memory_bytes"] == GPUS["RTX4090-24GB"].memory_bytes
    assert "16 B/parameter" in dp["convention"]
    zero3 = _json([*base, "--strategy", "zero3"], capsys)
    assert zero3["per_device_total"] == 16 * (LLAMA_7B // 8)
    assert zero3["fits"] is True


def test_fits_is_null_without_a_gpu(capsys: pytest.CaptureFixture) -> None:
    out = _json(["--params", "124M"], capsys)
    assert out["fits"] is None and out["gpu"] is None
    assert out["strategy"] == "single" and out["devices"] == 1


@pytest.mark.parametrize("text, expected", [
    ("1.5e9", 1_500_000_000), ("7B", 7_000_000_000), ("124M", 124_000_000),
    ("350k", 350_000), ("1000", 1000), ("2T", 2 * 10**12),
])
def test_params_accepts_suffixes(text: str, expected: int,
                                 capsys: pytest.CaptureFixture) -> None:
    assert parse_count(text) == expected
    assert _json(["--params", text, "--optimizer", "sgd", "--precision", "fp32"],
                 capsys)["per_device_total"] == 8 * expected


def test_zero2_mixed_adam_by_hand(capsys: pytest.CaptureFixture) -> None:
    out = _json(["--params", "4000", "--strategy", "zero2", "--devices", "4"], capsys)
    assert out["per_device_total"] == 2 * 4000 + 2 * 4000 // 4 + 12 * 4000 // 4


def test_gpu_memory_size(capsys: pytest.CaptureFixture) -> None:
    out = _json(["--params", "1B", "--gpu-memory", "16GiB"], capsys)
    assert out["gpu_memory_bytes"] == 16 * 2**30 and out["fits"] is True   # 16e9 < 16 GiB


def test_batch_and_seq_add_activations(capsys: pytest.CaptureFixture) -> None:
    out = _json(["--model", "gpt2-small", "--batch", "4", "--seq", "512", "--strategy", "dp",
                 "--devices", "2"], capsys)
    assert out["per_device"]["activations"] == activation_bytes("gpt2-small", 4, 512, "mixed")
    assert out["n_params"] == spec_params("gpt2-small")


def test_activations_size(capsys: pytest.CaptureFixture) -> None:
    out = _json(["--params", "1000", "--activations", "1KiB"], capsys)
    assert out["per_device"]["activations"] == 1024


def test_text_output(capsys: pytest.CaptureFixture) -> None:
    assert main(["memory", "--model", "llama-7b", "--strategy", "dp", "--devices", "8",
                 "--gpu", "RTX4090-24GB"]) == 0
    out = capsys.readouterr().out
    assert "per device:" in out and "optimizer" in out
    assert "optimizer: 6.74e9 × 12 B" in out
    assert "does NOT fit" in out
    assert "192.00 GiB together" in out
    assert main(["memory", "--model", "llama-7b", "--strategy", "zero3", "--devices", "8",
                 "--gpu", "RTX4090-24GB"]) == 0
    assert "fits: 12.55 GiB per device" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [
    [],                                                        # neither --params nor --model
    ["--params", "7B", "--model", "llama-7b"],                 # both
    ["--params", "-3"],
    ["--params", "0"],
    ["--params", "lots"],
    ["--model", "gpt5"],
    ["--params", "1B", "--strategy", "zero4", "--devices", "2"],
    ["--params", "1B", "--optimizer", "lamb"],
    ["--params", "1B", "--precision", "fp8"],
    ["--params", "1B", "--strategy", "dp", "--devices", "0"],
    ["--params", "1B", "--strategy", "dp", "--devices", "-4"],
    ["--params", "1B", "--devices", "4"],                      # single on 4 devices
    ["--params", "1B", "--devices", "two"],
    ["--params", "1B", "--gpu", "GTX-1"],
    ["--params", "1B", "--gpu", "RTX4090-24GB", "--gpu-memory", "24GiB"],
    ["--params", "1B", "--gpu-memory", "lots"],
    ["--params", "1B", "--batch", "4", "--seq", "128"],        # activations need --model
    ["--model", "gpt2-small", "--batch", "4"],
    ["--model", "gpt2-small", "--batch", "0", "--seq", "128"],
])
def test_bad_input_is_one_line_and_exit_2(argv: list[str],
                                          capsys: pytest.CaptureFixture) -> None:
    assert _exit_code(["memory", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert len(captured.err.strip().splitlines()) == 1
    assert "Traceback" not in captured.err


def test_another_name_for_a_strategy_is_told_which_one_it_is(capsys) -> None:
    """FSDP is what the lessons call ZeRO-3: the one line says which strategy to pass."""
    assert _exit_code(["memory", "--params", "1B", "--strategy", "fsdp", "--devices", "4"]) == 2
    err = capsys.readouterr().err
    assert "unknown strategy 'fsdp' ('fsdp' is 'zero3' here)" in err, err


def test_parse_count_rejects_nonsense() -> None:
    for text in ("", "1.2.3", "7X", "-1", "nan"):
        with pytest.raises(UsageError):
            parse_count(text)
