"""``mpgpu-edu demo``: the files it writes, and summary.json agreeing with the traces.

The tour runs once, on the two-device gloo preset (the smallest: the same code as on four
devices, in half the time); the numbers are read back from the Chrome traces and compared."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402

from mpgpu_edu.explore import tour as demo  # noqa: E402
from mpgpu_edu.cli import demo as demo_cli  # noqa: E402
from mpgpu_edu.cli import main  # noqa: E402

RUNS = ("ps", "ddp_naive", "ddp_overlapped", "gpipe", "1f1b")
PNG = b"\x89PNG\r\n\x1a\n"


def run_cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["demo", *argv])
    return rc, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def tour(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict, str, str]:
    out = tmp_path_factory.mktemp("tour") / "nested" / "dir"  # created by the command
    rc, stdout, stderr = run_cli("--out", str(out), "--cluster", "2xCPU-gloo")
    assert rc == 0, stderr
    return out, json.loads((out / "summary.json").read_text()), stdout, stderr


def chrome(path: Path) -> dict:
    return json.loads(path.read_text())


def union_length(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        total += max(0.0, stop - max(start, end))
        end = max(end, stop)
    return total


# ---- files -----------------------------------------------------------------------------------
def test_every_file_is_written(tour) -> None:
    out, summary, _, _ = tour
    assert set(summary["runs"]) == set(RUNS)
    for name in RUNS:
        assert (out / f"trace_{name}.json").exists()
        assert summary["runs"][name]["trace"] == f"trace_{name}.json"
    assert {"device_map.png", "timeline_ps.png", "timeline_ddp_naive_vs_overlapped.png",
            "timeline_gpipe_vs_1f1b.png", "memory_peak.png",
            "memory_over_time_gpipe_vs_1f1b.png", "scaling.png"} == set(summary["figures"])
    for figure in summary["figures"]:
        assert (out / figure).read_bytes()[:8] == PNG


def test_progress_goes_to_stderr_and_the_table_to_stdout(tour) -> None:
    _, summary, stdout, stderr = tour
    lines = stderr.strip().splitlines()
    assert len(lines) == len(RUNS) + 3 and all(line.startswith("demo: ") for line in lines)
    assert "2xCPU-gloo" in lines[0]
    for name in RUNS:
        assert any(row.startswith(name) for row in stdout.splitlines())
    assert summary["cluster"] == "2xCPU-gloo" and summary["world_size"] == 2


# ---- summary.json against the traces ---------------------------------------------------------
@pytest.mark.parametrize("name", RUNS)
def test_summary_agrees_with_its_trace(tour, name: str) -> None:
    out, summary, _, _ = tour
    run = summary["runs"][name]
    events = chrome(out / run["trace"])["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    makespan = max(e["ts"] + e["dur"] for e in spans) * 1e-6
    assert run["step_s"] == pytest.approx(makespan, rel=1e-9)
    for device in range(run["devices"]):
        compute = [(e["ts"] * 1e-6, (e["ts"] + e["dur"]) * 1e-6) for e in spans
                   if e["pid"] == device and e["tid"] == 0]
        idle = 1 - union_length(compute) / makespan
        assert run["idle_fraction"][device] == pytest.approx(idle, abs=1e-9)
        totals = [e["args"]["total"] for e in events if e["ph"] == "C" and e["pid"] == device]
        assert run["peak_memory"][device] == max(totals)
        assert sum(run["peak_memory_by_category"][device].values()) == max(totals)
        sent = sum(e["args"]["bytes"] for e in spans if e["pid"] == device and e["cat"] == "send")
        assert run["bytes_sent"][device] == sent


def test_pipelines_report_their_bubble_and_1f1b_holds_less(tour) -> None:
    _, summary, _, _ = tour
    gpipe, one_f_one_b = summary["runs"]["gpipe"], summary["runs"]["1f1b"]
    for run in (gpipe, one_f_one_b):
        assert run["bubble_fraction"] == pytest.approx(sum(run["idle_fraction"]) / 2)
        assert run["bubble_formula"] == pytest.approx(1 / (demo.MICROBATCHES + 1))
        assert run["bubble_fraction"] >= run["bubble_formula"] - 1e-9  # sends only add
    first = [r["peak_memory_by_category"][0]["activations"] for r in (gpipe, one_f_one_b)]
    assert first[1] < first[0]  # 1F1B frees activations as it goes
    assert "bubble_fraction" not in summary["runs"]["ddp_naive"]


def test_the_server_holds_the_optimizer_state_and_the_workers_do_not(tour) -> None:
    _, summary, _, _ = tour
    worker, server = summary["runs"]["ps"]["peak_memory_by_category"]
    assert server["optimizer"] > 0 == worker["optimizer"]
    assert worker["activations"] > 0 == server["activations"]


# ---- bad input: one line, exit status 2 ------------------------------------------------------
def test_unknown_preset(tmp_path: Path) -> None:
    rc, stdout, stderr = run_cli("--out", str(tmp_path / "x"), "--cluster", "16xTPU")
    assert rc == 2 and stdout == "" and len(stderr.strip().splitlines()) == 1
    assert "unknown cluster preset '16xTPU'" in stderr
    assert not (tmp_path / "x").exists()


def test_unwritable_out(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    rc, _, stderr = run_cli("--out", str(blocker / "sub"))
    assert rc == 2 and len(stderr.strip().splitlines()) == 1
    assert "cannot create --out" in stderr


def test_cli_default_is_the_demo_default() -> None:
    assert demo_cli.DEFAULT_CLUSTER == demo.DEFAULT_CLUSTER
