"""``mpgpu-edu simulate allreduce``: the report, its JSON, and one-line errors."""

from __future__ import annotations

import json

import pytest

from mpgpu_edu.cli import main
from mpgpu_edu.cluster import Cluster
from mpgpu_edu.collectives import cost


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert main(["simulate", "allreduce", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def exit_code(argv: list[str]) -> int:
    """``main``'s exit status, whether it returns it or argparse raises SystemExit."""
    try:
        return main(argv)
    except SystemExit as exc:
        return int(exc.code)


def test_text_report(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["simulate", "allreduce", "--algo", "ring", "--world-size", "4", "--bytes", "64MiB",
            "--cluster", "4xRTX4090-pcie"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith("ring all-reduce of 64.00 MiB (67108864 bytes, fp32) on 4 x ")
    for word in ("time", "algbw", "busbw", "sent", "received", "closed form",
                 "2(N-1) alpha + 2(N-1)/N S/beta", "contention"):
        assert word in out


def test_json_report_is_consistent(capsys: pytest.CaptureFixture[str]) -> None:
    r = run_json(capsys, "--algo", "ring", "--world-size", "8", "--bytes", "1GiB",
                 "--cluster", "8xA100-nvlink")
    assert {"algo": "ring", "world_size": 8, "bytes": 2**30, "cluster": "8xA100-nvlink"
            }.items() <= r.items()
    assert r["algbw"] == pytest.approx(2**30 / r["time_s"])  # bytes/s
    assert r["busbw"] == pytest.approx(r["algbw"] * 2 * 7 / 8)
    assert r["algbw_GBps"] == pytest.approx(r["algbw"] / 1e9)
    assert r["bytes_sent_per_rank"] == [2 * 7 * 2**30 // 8] * 8
    assert r["bytes_received_per_rank"] == [2 * 7 * 2**30 // 8] * 8
    # NVSwitch gives every GPU its own port: the simulation is the closed form exactly,
    # plus the N - 1 adds of a 1/N chunk (read two, write one) of the reduce-scatter.
    want = cost.ring_allreduce_time(8, 2**30, r["link_alpha_s"], r["link_beta_Bps"])
    add = Cluster.preset("8xA100-nvlink").op_seconds(0, 3 * 2**30 / 8)
    assert r["time_s"] == pytest.approx(want + 7 * add, rel=1e-9)
    assert r["closed_form_s"] == pytest.approx(want, rel=1e-12)


def test_one_gib_on_eight_ranks_runs_on_meta_tensors(capsys: pytest.CaptureFixture[str]) -> None:
    # Meta tensors: nothing is allocated or copied (how fast is benchmarks/' business).
    for algo in ("naive", "tree"):
        r = run_json(capsys, "--algo", algo, "--world-size", "8", "--bytes", "1GiB")
        assert r["bytes_received_per_rank"][0] == {"naive": 7, "tree": 3}[algo] * 2**30


def test_size_is_rounded_up_to_fp32_elements(capsys: pytest.CaptureFixture[str]) -> None:
    r = run_json(capsys, "--world-size", "2", "--bytes", "4097", "--cluster", "2xCPU-gloo")
    assert (r["bytes_requested"], r["bytes"]) == (4097, 4100)
    assert main(["simulate", "allreduce", "--world-size", "2", "--bytes", "4097"]) == 0
    assert "rounded up to 4100" in capsys.readouterr().out


def test_one_rank_takes_no_time(capsys: pytest.CaptureFixture[str]) -> None:
    r = run_json(capsys, "--world-size", "1", "--bytes", "4KiB")
    assert r["time_s"] == 0.0 and r["algbw"] is None and r["busbw"] is None
    assert r["bytes_sent_per_rank"] == [0]


def test_defaults_use_every_device_of_the_preset(capsys: pytest.CaptureFixture[str]) -> None:
    r = run_json(capsys, "--cluster", "4xRTX4090-pcie", "--bytes", "4096")
    assert r["world_size"] == 4 and r["algo"] == "ring"
    assert r["slowdown_vs_closed_form"] > 1  # one shared bridge: contention


@pytest.mark.parametrize("argv, message", [
    (["--bytes", "-4096"], "must not be negative"),
    (["--bytes", "12XB"], "unknown size unit"),
    (["--world-size", "0"], "--world-size: must be at least 1"),
    (["--world-size", "9"], "between 1 and 8"),
    (["--world-size", "5", "--cluster", "4xRTX4090-pcie"], "between 1 and 4"),
    (["--algo", "butterfly"], "naive, tree, ring"),
    (["--cluster", "16xTPU"], "unknown cluster preset '16xTPU'"),
    (["--world-size", "two"], "expected a whole number"),
])
def test_bad_input_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str], argv: list[str],
                                          message: str) -> None:
    assert exit_code(["simulate", "allreduce", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and message in captured.err


def test_simulate_needs_a_what(capsys: pytest.CaptureFixture[str]) -> None:
    assert exit_code(["simulate"]) == 2
    assert "WHAT" in capsys.readouterr().err
