"""``mpgpu-edu devices``: the logical -> physical table, warnings, JSON, bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mpgpu_edu.cli import main

ROOT = Path(__file__).resolve().parents[1]


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert main(["devices", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_table_maps_logical_to_physical(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["devices", "--cluster", "4xRTX4090-pcie", "--visible", "2,3"]) == 0
    out = capsys.readouterr().out
    assert "cuda:0  ->  GPU 2 (NVIDIA GeForce RTX 4090" in out
    assert "cuda:1  ->  GPU 3" in out
    assert "hidden from this process: GPU 0, 1" in out
    assert "device_ids=[0, 1]" in out  # the DataParallel hint
    assert "warning" not in out


def test_json_report(capsys: pytest.CaptureFixture[str]) -> None:
    report = run_json(capsys, "--cluster", "8xA100-nvlink", "--visible", "2,3")
    assert report["logical_to_physical"] == [2, 3]
    assert report["cluster"] == "8xA100-nvlink"
    assert report["visible"] == "2,3"
    assert report["warnings"] == []
    assert report["world_size"] == 2
    assert report["devices"][1] == {"logical": 1, "device": "cuda:1", "physical": 3,
                                    "memory_bytes": 80 * 2**30}


def test_unset_visible_means_all(capsys: pytest.CaptureFixture[str]) -> None:
    report = run_json(capsys, "--cluster", "4xH100-nvswitch")
    assert report["visible"] is None
    assert report["logical_to_physical"] == [0, 1, 2, 3]


def test_malformed_value_keeps_cuda_semantics_and_warns(
        capsys: pytest.CaptureFixture[str]) -> None:
    report = run_json(capsys, "--visible", "x,1")
    assert report["logical_to_physical"] == []
    assert "entry 1 ('x')" in report["warnings"][0]
    assert main(["devices", "--visible", "1,-1,2"]) == 0
    out = capsys.readouterr().out
    assert "cuda:0  ->  GPU 1" in out and "cuda:1" not in out
    assert "warning: entry 2 ('-1') is invalid" in out


def test_empty_visible(capsys: pytest.CaptureFixture[str]) -> None:
    report = run_json(capsys, "--visible", "")
    assert report["logical_to_physical"] == []
    assert "empty" in report["warnings"][0]


def test_device_ids_check(capsys: pytest.CaptureFixture[str]) -> None:
    report = run_json(capsys, "--visible", "1,2", "--device-ids", "0,1")
    assert report["device_ids_physical"] == [1, 2]
    assert main(["devices", "--visible", "1,2", "--device-ids", "1,2"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert "write device_ids=[0, 1]" in err
    assert main(["devices", "--device-ids", "a"]) == 2
    assert "--device-ids" in capsys.readouterr().err


def test_unknown_preset_is_one_line_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["devices", "--cluster", "3xV100"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert "unknown cluster preset '3xV100'" in err and "4xRTX4090-pcie" in err


def test_runs_as_a_module() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mpgpu_edu", "devices", "--cluster", "4xRTX4090-pcie",
         "--visible", "3,1", "--json"],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["logical_to_physical"] == [3, 1]
