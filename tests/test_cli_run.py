"""``mpgpu-edu run``: train a strategy, compare with one device; bad input is one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mpgpu_edu.cli import runners
from mpgpu_edu.cli import main

REQUIRED = {"strategy", "backend", "world_size", "steps", "losses", "reference_losses",
            "final_loss", "reference_final_loss", "max_abs_param_diff"}


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert main(["run", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize(("strategy", "world_size"), [("ddp", 3), ("ps", 3)])
def test_json_report_matches_the_reference(capsys: pytest.CaptureFixture[str], strategy: str,
                                           world_size: int) -> None:
    report = run_json(capsys, strategy, "--world-size", str(world_size), "--steps", "3",
                      "--optimizer", "adam")
    assert REQUIRED <= set(report)
    assert (report["strategy"], report["backend"], report["world_size"], report["steps"]) == (
        strategy, "sim", world_size, 3)
    assert report["max_abs_param_diff"] < 1e-5
    assert report["losses"] == pytest.approx(report["reference_losses"], rel=1e-5)


def test_text_summary(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "ddp", "--world-size", "2", "--steps", "2", "--variant", "naive"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("ddp (naive) on sim, world size 2, 2 steps, sgd")
    assert "reference:" in out and "max |parameter - reference|" in out
    assert "verdict: matches single-device training" in out


@pytest.mark.parametrize(("argv", "message"), [
    (["ddp", "--world-size", "25"], "batch of 24 samples cannot be split over 25 ranks"),
    (["ddp", "--world-size", "0"], "--world-size: must be at least 1"),
    (["ps", "--world-size", "1"], "needs at least 2 ranks"),
    (["gossip"], "unknown strategy 'gossip'"),
    (["ddp", "--backend", "mpi"], "unknown backend 'mpi'"),
    (["ddp", "--optimizer", "lion"], "unknown optimizer 'lion'"),
    (["ddp", "--variant", "fancy"], "unknown DDP variant 'fancy'"),
    (["ps", "--variant", "naive"], "--variant is an option of 'ddp' only"),
])
def test_bad_input_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str], argv: list[str],
                                          message: str) -> None:
    assert main(["run", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_a_strategy_whose_module_is_missing_is_not_available_yet(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(runners.RUNNERS, "tp", "mpgpu_edu.no_such_package.runner:run_demo")
    assert main(["run", "tp"]) == 2
    assert capsys.readouterr().err.strip() == (
        "mpgpu-edu run: error: strategy 'tp' is not available yet")


def test_a_missing_dependency_inside_a_strategy_is_not_hidden(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "strategy_with_missing_dep.py").write_text("import no_such_dependency_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(runners.RUNNERS, "tp", "strategy_with_missing_dep:run_demo")
    with pytest.raises(ModuleNotFoundError, match="no_such_dependency_xyz"):
        runners.get_runner("tp")


def test_runners_are_imported_lazily() -> None:
    assert set(runners.RUNNERS) == {"ps", "ddp", "pipeline", "tp", "hybrid"}
    assert runners.get_runner("ddp").__module__ == "mpgpu_edu.dp"


@pytest.mark.gloo
def test_ddp_on_gloo(capsys: pytest.CaptureFixture[str]) -> None:
    report = run_json(capsys, "ddp", "--backend", "gloo", "--world-size", "2", "--steps", "2")
    assert report["backend"] == "gloo"
    assert report["max_abs_param_diff"] < 1e-5
