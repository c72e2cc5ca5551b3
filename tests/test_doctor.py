"""`mpgpu-edu doctor`: every check reports, a failure sets the exit status, bad input warns."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

from mpgpu_edu.measure import doctor
from mpgpu_edu.cli import doctor as doctor_cli

NAMES = ["python", "torch", "cuda", "CUDA_VISIBLE_DEVICES", "gloo", "nccl", "loopback port",
         "jupyterlab", "ipywidgets", "matplotlib"]


@pytest.fixture(autouse=True)
def _no_visible_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def run_json(capsys: pytest.CaptureFixture[str]) -> tuple[int, dict]:
    status = doctor_cli.run(argparse.Namespace(json=True))
    return status, json.loads(capsys.readouterr().out)


def test_every_check_reports_and_this_machine_is_ready(capsys: pytest.CaptureFixture[str]) -> None:
    status, report = run_json(capsys)
    assert [check["name"] for check in report["checks"]] == NAMES
    for check in report["checks"]:
        assert set(check) == {"name", "status", "detail", "fix"}
        assert check["status"] in ("ok", "warn", "fail")
        assert check["detail"]
        assert check["status"] == "ok" or check["fix"], check
    assert report["ok"] is True, report
    assert status == 0


def test_table_lists_every_check(capsys: pytest.CaptureFixture[str]) -> None:
    assert doctor_cli.run(argparse.Namespace(json=False)) == 0
    out = capsys.readouterr().out
    for name in NAMES:
        assert name in out
    assert "Ready: the course can run" in out


def test_a_failing_check_fails_the_run(monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    failed = doctor.Check("loopback port", "fail", "cannot open a TCP port", "allow loopback")
    monkeypatch.setattr(doctor, "check_port", lambda: failed)
    status, report = run_json(capsys)
    assert status == 1
    assert report["ok"] is False
    assert doctor.format_table([failed]).splitlines()[1].strip() == "fix: allow loopback"


def test_a_crashing_check_is_reported_not_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    def check_torch() -> doctor.Check:
        raise ImportError("libtorch_cpu.so: cannot open shared object file")

    monkeypatch.setattr(doctor, "check_torch", check_torch)
    checks = doctor.run_checks()
    (torch_check,) = [check for check in checks if check.name == "torch"]
    assert torch_check.status == "fail"
    assert "libtorch_cpu.so" in torch_check.detail
    assert not doctor.course_can_run(checks)


def test_a_different_torch_warns(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setattr(torch, "__version__", "2.0.1+cpu")
    check = doctor.check_torch()
    assert check.status == "warn"
    assert doctor.PINNED_TORCH in check.fix


@pytest.mark.parametrize("n_physical", [4, None])
@pytest.mark.parametrize("value", ["0,,1", "0,x", "0,0", "a"])
def test_malformed_visible_devices_warn_with_a_fix(monkeypatch: pytest.MonkeyPatch, value: str,
                                                   n_physical: int | None) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", value)
    monkeypatch.setattr(doctor, "_physical_gpu_count", lambda: n_physical)
    check = doctor.check_visible_devices()
    assert check.status == "warn"
    assert repr(value) in check.detail
    assert "export CUDA_VISIBLE_DEVICES=0,1" in check.fix


def test_a_missing_gpu_id_warns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    monkeypatch.setattr(doctor, "_physical_gpu_count", lambda: 2)
    assert doctor.check_visible_devices().status == "warn"


@pytest.mark.parametrize("n_physical", [4, None])
def test_well_formed_visible_devices_are_read(monkeypatch: pytest.MonkeyPatch,
                                              n_physical: int | None) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    monkeypatch.setattr(doctor, "_physical_gpu_count", lambda: n_physical)
    check = doctor.check_visible_devices()
    assert check.status == "ok"
    assert "2" in check.detail and "3" in check.detail


def test_the_doctor_reads_the_variable_as_the_simulated_cluster_does() -> None:
    from mpgpu_edu.cluster.visible import check_visible, parse_visible

    assert doctor.read_visible("1,0", 4) == ([], [1, 0])
    for value in ["0,x", "0,,1", "0,9", "1,1", "", "0,2,-1,1"]:
        warnings, physical = doctor.read_visible(value, 4)
        assert warnings and warnings == check_visible(value, 4), value
        assert physical == parse_visible(value, 4), value


def test_command_line_json_and_exit_status() -> None:
    done = subprocess.run([sys.executable, "-m", "mpgpu_edu", "doctor", "--json"],
                          capture_output=True, text=True, timeout=110)
    report = json.loads(done.stdout)
    assert done.returncode == (0 if report["ok"] else 1), done.stderr
    assert report["ok"] is True, report
