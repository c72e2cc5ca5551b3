"""benchmarks/gpu_check.py: its ``--dry-run`` (CPU, tiny sizes) writes the whole section.

Numbers are not checked (they are the machine's); that every field is there is."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_check.py"


@pytest.fixture(scope="module")
def gpu_check() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def section(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """(the whole results file, the section) after one dry run into a file that already
    holds another benchmark's section."""
    path = tmp_path_factory.mktemp("gpu_check") / "RESULTS.md"
    path.write_text("# Benchmark results\n\n<!-- other -->\nkept\n<!-- other -->\n")
    done = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--results", str(path)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    text = path.read_text()
    parts = text.split("<!-- gpu_check -->")
    assert len(parts) == 3, "the section must sit between exactly two markers"
    return text, parts[1]


def test_every_field_has_a_row(gpu_check: ModuleType, section: tuple[str, str]) -> None:
    rows = dict(re.findall(r"^\| ([\w.]+) \| (.*) \|$", section[1], re.M))
    for field in gpu_check.FIELDS:
        if field != "multi_gpu":
            assert rows.get(field, "") != "", f"no row for {field}"
    assert rows["device"] == "cpu" and rows["torch"]
    assert int(rows["parameters"]) == 32 * 64 + 64 + 64 * 64 + 64 + 64 * 32 + 32
    for field in ("memory_estimate_bytes", "memory_ledger_bytes", "step_flops_fp32",
                  "simulated_step_s_fp32", "measured_step_s_fp32", "add_GBps", "adam_GBps"):
        assert float(rows[field]) > 0, field


def test_multi_rank_part_runs_on_gloo(section: tuple[str, str]) -> None:
    rows = dict(re.findall(r"^\| ([\w.]+) \| (.*) \|$", section[1], re.M))
    assert rows["multi_gpu.backend"] == "gloo"
    for part in ("allreduce", "ddp", "pipeline"):
        assert "error" not in rows[f"multi_gpu.{part}"], rows[f"multi_gpu.{part}"]
        assert "measured_s" in rows[f"multi_gpu.{part}"]
        assert "simulated_s" in rows[f"multi_gpu.{part}"]
    assert "exact True" in rows["multi_gpu.allreduce"]


def test_other_sections_are_kept(section: tuple[str, str]) -> None:
    assert "<!-- other -->\nkept\n<!-- other -->" in section[0]
    assert "Command: `python benchmarks/gpu_check.py --dry-run --results" in section[1]


def test_profile_by_device_name(gpu_check: ModuleType) -> None:
    assert gpu_check.pick_profile("NVIDIA H200")[:2] == ("H100-SXM-80GB", "8xH100-nvswitch")
    assert gpu_check.pick_profile("NVIDIA A100-SXM4-80GB")[0] == "A100-80GB"
    assert gpu_check.pick_profile("NVIDIA GeForce RTX 4090")[0] == "RTX4090-24GB"
    assert gpu_check.pick_profile("Tesla T4") == (*gpu_check.DEFAULT_PROFILE, False)
    assert gpu_check.spec_bandwidth("NVIDIA H200") == 4.8e12
    assert gpu_check.spec_bandwidth("Tesla T4") is None


def test_needs_results_or_dry_run(gpu_check: ModuleType) -> None:
    with pytest.raises(SystemExit) as exc:
        gpu_check.main([])
    assert exc.value.code == 2
