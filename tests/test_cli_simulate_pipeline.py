"""``mpgpu-edu simulate pipeline``: the report, its JSON, and one-line errors."""

from __future__ import annotations

import json

import pytest

from mpgpu_edu.cli import main


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert main(["simulate", "pipeline", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def exit_code(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as exc:
        return int(exc.code)


def test_json_report(capsys: pytest.CaptureFixture[str]) -> None:
    r = run_json(capsys, "--schedule", "gpipe", "--stages", "4", "--microbatches", "8",
                 "--cluster", "8xH100-nvswitch")
    assert (r["schedule"], r["stages"], r["microbatches"], r["cluster"]) == (
        "gpipe", 4, 8, "8xH100-nvswitch")
    assert r["bubble_fraction_formula"] == pytest.approx(3 / 11)
    # Sends cost a few microseconds against 2 ms stages, and the copies between the stages'
    # regions count as compute: close to the formula.
    formula = r["bubble_fraction_formula"]
    assert formula - 0.01 < r["bubble_fraction"] < formula + 0.01
    assert len(r["idle_fraction_per_device"]) == 4
    assert r["makespan_s"] == pytest.approx(11 * 2 * 3e-3, rel=0.01)  # (M+P-1)(f+b)
    assert r["peak_activations"] == [8, 8, 8, 8]


def test_1f1b_holds_fewer_microbatches(capsys: pytest.CaptureFixture[str]) -> None:
    r = run_json(capsys, "--schedule", "1f1b", "--stages", "4", "--microbatches", "8")
    assert r["peak_activations"] == [4, 3, 2, 1]
    gp = run_json(capsys, "--schedule", "gpipe", "--stages", "4", "--microbatches", "8")
    assert r["makespan_s"] == pytest.approx(gp["makespan_s"], rel=1e-3)  # sends differ
    assert sum(r["peak_activation_bytes"]) < sum(gp["peak_activation_bytes"])


def test_naive_idles_all_but_one_device(capsys: pytest.CaptureFixture[str]) -> None:
    r = run_json(capsys, "--schedule", "naive", "--stages", "4")
    assert r["microbatches"] == 1
    assert r["bubble_fraction"] == pytest.approx(0.75, abs=0.01)
    assert r["peak_activations"] == [1, 1, 1, 1]


def test_unequal_stages_make_a_bigger_bubble(capsys: pytest.CaptureFixture[str]) -> None:
    r = run_json(capsys, "--stages", "3", "--microbatches", "4")  # 8 layers: 3, 3, 2
    assert sorted(r["layers_per_stage"]) == [2, 3, 3]
    assert r["bubble_fraction"] > r["bubble_fraction_formula"] + 0.02


def test_pcie_is_slower_than_nvswitch(capsys: pytest.CaptureFixture[str]) -> None:
    args = ("--stages", "8", "--microbatches", "8", "--width", "512", "--batch-size", "128")
    pcie = run_json(capsys, *args, "--cluster", "8xRTX4090-pcie")
    nvswitch = run_json(capsys, *args, "--cluster", "8xH100-nvswitch")
    assert pcie["makespan_s"] > nvswitch["makespan_s"]
    assert pcie["bytes_sent_per_device"] == nvswitch["bytes_sent_per_device"]


def test_text_report_shows_the_grid(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "pipeline", "--stages", "2", "--microbatches", "2"]) == 0
    out = capsys.readouterr().out
    assert "dev 0 | F0 F1 .  .  B0 B1 |" in out
    for word in ("makespan", "bubble", "(P-1)/(M+P-1)", "device 1: idle"):
        assert word in out


@pytest.mark.parametrize("argv, message", [
    (["--schedule", "zigzag"], "unknown schedule 'zigzag'"),
    (["--stages", "9"], "--stages 9 is more than the model's 8 layers"),
    (["--stages", "2", "--layers", "1"], "more than the model's 1 layers"),
    (["--stages", "0"], "--stages: must be at least 1"),
    (["--microbatches", "0"], "--microbatches: must be at least 1"),
    (["--stages", "5", "--cluster", "4xRTX4090-pcie"], "4xRTX4090-pcie has 4"),
    (["--schedule", "naive", "--microbatches", "3"], "one microbatch"),
    (["--cluster", "16xTPU"], "unknown cluster preset"),
    (["--microbatches", "100"], "raise --batch-size"),
])
def test_bad_input_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str], argv, message):
    assert exit_code(["simulate", "pipeline", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert len(err.strip().splitlines()) == 1


def test_interleaved_bubble_is_the_closed_form(capsys: pytest.CaptureFixture[str]) -> None:
    """4 stages x 2 chunks x 8 microbatches: the bubble is (P-1)/(V M) of the compute, half
    of 1F1B's (P-1)/M; sends cost microseconds against 1 ms chunks, so within 1 point."""
    args = ("--stages", "4", "--microbatches", "8", "--cluster", "8xH100-nvswitch")
    r = run_json(capsys, "--schedule", "interleaved", "--chunks", "2", *args)
    assert (r["schedule"], r["chunks"], r["layers_per_stage"]) == ("interleaved", 2, [1] * 8)
    assert r["bubble_overhead_formula"] == pytest.approx(3 / 16)
    assert r["bubble_overhead_grid"] == pytest.approx(3 / 16)
    assert abs(r["bubble_overhead"] - 3 / 16) < 0.01
    assert r["bubble_fraction_formula"] == pytest.approx(3 / 19)
    plain = run_json(capsys, "--schedule", "1f1b", *args)
    assert plain["chunks"] == 1 and plain["bubble_overhead_formula"] == pytest.approx(3 / 8)
    assert abs(plain["bubble_overhead"] - 3 / 8) < 0.01
    assert r["makespan_s"] < plain["makespan_s"]
    # the price: P V - 1 = 7 boundaries carry messages instead of P - 1 = 3
    assert 3 * sum(r["bytes_sent_per_device"]) == 7 * sum(plain["bytes_sent_per_device"])


def test_interleaved_text_names_chunks(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "pipeline", "--schedule", "interleaved", "--stages", "2"]) == 0
    out = capsys.readouterr().out
    assert "2 stages x 2 chunks x 4 microbatches" in out and "F0.1" in out
    assert "(P-1)/(V M) = 12.5%" in out


@pytest.mark.parametrize("argv, words", [
    (["--schedule", "interleaved", "--stages", "4", "--microbatches", "6"], "not a multiple"),
    (["--chunks", "3"], "needs --schedule interleaved"),
    (["--schedule", "interleaved", "--stages", "4", "--chunks", "3"], "virtual stages"),
    (["--schedule", "interleaved", "--chunks", "0"], "--chunks"),
])
def test_interleaved_bad_input_is_one_line(argv, words, capsys) -> None:
    assert exit_code(["simulate", "pipeline", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and words in err
