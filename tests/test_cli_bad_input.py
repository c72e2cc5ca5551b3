"""Bad input to ``mpgpu-edu``: one line on stderr that names the problem and the fix, exit
status 2, no traceback, no work started, and nothing a learner wrote lost.

The first tests are the known cases, one each; ``test_every_numeric_option_refuses_bad_values``
walks the whole parser, so a numeric option added later is held to the same rule."""

from __future__ import annotations

import argparse
import importlib
import json
import multiprocessing.process
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import mpgpu_edu.grading.grade  # imported before any patching: it binds runner.run_many
import mpgpu_edu.grading.runner
from mpgpu_edu.cli import build_parser, main
from mpgpu_edu.cluster.visible import check_visible
from mpgpu_edu.comm.errors import LaunchTimeoutError
from mpgpu_edu.grading.registry import by_module

ROOT = Path(__file__).resolve().parents[1]
PARSER = build_parser()  # imports every command module now, before any patching


class Started(BaseException):
    """Raised when a command starts work it should have refused; main does not catch it."""


@pytest.fixture()
def no_work(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise Started("the command started work before refusing its input")

    monkeypatch.setattr(subprocess, "Popen", refuse)
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", refuse)
    # the module, not the function ``mpgpu_edu.comm.launch`` that its package exports
    monkeypatch.setattr(importlib.import_module("mpgpu_edu.comm.launch"), "run_sim", refuse)
    monkeypatch.setattr(mpgpu_edu.grading.runner, "run_many", refuse)
    monkeypatch.setattr("mpgpu_edu.grading.grade.run_many", refuse)
    monkeypatch.setattr("mpgpu_edu.cli.run.run_strategy", refuse)


def refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Run ``mpgpu-edu argv``; check rc 2, empty stdout and one line on stderr; return it."""
    try:
        rc = main(argv)
    except Started:
        pytest.fail(f"mpgpu-edu {' '.join(argv)}: work started before the input was refused")
    out, err = capsys.readouterr()
    assert rc == 2, f"{argv}: exit status {rc}, stderr {err!r}"
    assert out == "" and "Traceback" not in err, f"{argv}: {out!r} {err!r}"
    assert err.count("\n") == 1 and err.strip() and err.startswith("mpgpu-edu"), (argv, err)
    return err.strip()


@pytest.fixture()
def course(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    shutil.copytree(ROOT / "exercises", tmp_path / "exercises")
    shutil.copytree(ROOT / "solutions", tmp_path / "solutions")
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'course'\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MPGPU_EDU_ROOT", raising=False)
    return tmp_path


def submissions(tmp_path: Path) -> Path:
    """A class of one learner, alice, who handed in her exercises/ files."""
    folder = tmp_path / "class"
    shutil.copytree(ROOT / "exercises", folder / "alice" / "exercises")
    return folder


# ---- (a) the known cases, one test each -----------------------------------------------------

@pytest.mark.parametrize("size", ["1e30", "1e400", "2TiB"])
def test_allreduce_bytes_past_the_limit(size, capsys, no_work) -> None:
    line = refused(["simulate", "allreduce", "--bytes", size], capsys)
    assert "--bytes" in line and "limit of 1 TiB" in line and "give a smaller size" in line


@pytest.mark.parametrize("params", ["1e400", "inf", "nan", "-1", "0", "1e16"])
def test_memory_params_must_be_finite_and_positive(params, capsys, no_work) -> None:
    assert "--params" in refused(["memory", f"--params={params}"], capsys)


def test_check_html_folder_is_checked_before_any_check(capsys, no_work) -> None:
    line = refused(["check", "1.3", "--html", "/missing/dir/r.html"], capsys)
    assert "--html" in line and "'/missing/dir' does not exist" in line and "mkdir -p" in line


def test_grade_csv_folder_is_checked_before_grading(tmp_path, capsys, no_work) -> None:
    subs = submissions(tmp_path)
    line = refused(["grade", str(subs), "--csv", "/missing/dir/g.csv"], capsys)
    assert "--csv" in line and "does not exist" in line and "mkdir -p" in line
    line = refused(["grade", str(subs), "--csv", str(tmp_path / "g.csv"),
                    "--json-file", "/missing/dir/g.json"], capsys)
    assert "--json-file" in line and "does not exist" in line and "mkdir -p" in line


def test_pipeline_sizes_past_the_limit_are_refused_at_once(capsys, no_work) -> None:
    line = refused(["simulate", "pipeline", "--microbatches", "100000", "--batch-size",
                    "100000"], capsys)
    assert "--microbatches" in line and "at most 1024" in line and "lower" in line
    line = refused(["simulate", "pipeline", "--stages", "8", "--cluster", "8xA100-nvlink",
                    "--microbatches", "1024", "--batch-size", "1024"], capsys)
    assert "limit of 4096" in line and "lower --microbatches" in line
    line = refused(["simulate", "pipeline", "--batch-size", "65536", "--width", "8192"], capsys)
    assert "limit of 2^35" in line


@pytest.mark.parametrize("flag", ["--forward-ms", "--backward-ms"])
@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "-1", "1e30"])
def test_pipeline_times_must_be_finite_and_not_negative(flag, value, capsys, no_work) -> None:
    assert flag in refused(["simulate", "pipeline", f"{flag}={value}"], capsys)


@pytest.mark.parametrize("value", ["nan", "inf", "0", "-1", "1e30"])
def test_run_timeout_is_validated(value, capsys, no_work) -> None:
    assert "--timeout" in refused(["run", "ddp", f"--timeout={value}"], capsys)


def test_run_timeout_is_passed_to_the_launch(monkeypatch, capsys) -> None:
    seen = {}

    def fake(strategy, backend, world_size, steps, optimizer, **options):
        seen.update(options)
        raise LaunchTimeoutError("ranks still running after 7 s, all stopped:\n  rank 0: x")

    monkeypatch.setattr("mpgpu_edu.cli.run.run_strategy", fake)
    line = refused(["run", "ddp", "--backend", "gloo", "--steps", "20000", "--timeout", "7"],
                   capsys)
    assert seen["timeout"] == 7.0
    assert "after 7 s" in line and "--timeout 28" in line


def test_run_timeout_stops_a_real_launch_with_one_line() -> None:
    done = subprocess.run([sys.executable, "-m", "mpgpu_edu", "run", "tp", "--steps", "3000",
                           "--timeout", "0.3"], capture_output=True, text=True, timeout=300,
                          cwd=ROOT)
    assert done.returncode == 2, done.stderr  # not 134: no abort at exit either
    assert done.stderr.count("\n") == 1 and "(--timeout 0.3)" in done.stderr


@pytest.mark.parametrize("command", [["bench", "allreduce"], ["calibrate"]])
@pytest.mark.parametrize("value", ["nan", "inf", "0", "-1", "1e30"])
def test_bench_and_calibrate_timeouts_are_validated(command, value, capsys, no_work) -> None:
    assert "--timeout" in refused([*command, f"--timeout={value}"], capsys)


@pytest.mark.parametrize("command, target, fix", [
    (["bench", "allreduce"], "mpgpu_edu.measure.bench.bench_allreduce", "lower --repeats"),
    (["calibrate"], "mpgpu_edu.measure.calibrate.calibrate", "--allreduce-sizes")])
def test_bench_and_calibrate_pass_their_timeout_and_name_it_when_it_ends(
        command, target, fix, monkeypatch, capsys) -> None:
    seen = {}

    def fake(*args, **kwargs):
        seen.update(kwargs)
        raise LaunchTimeoutError("ranks still running after 7 s, all stopped:\n  rank 0: x")

    monkeypatch.setattr(target, fake)
    line = refused([*command, "--timeout", "7"], capsys)
    assert seen["timeout"] == 7.0 and seen["progress"] is True
    assert "after 7 s" in line and "--timeout 28" in line and fix in line


def test_a_bench_tells_its_progress_and_ends_at_its_timeout_with_one_line() -> None:
    """Rank 0 tells each size timed on stderr; a run past ``--timeout`` stops with one line
    (exit status 2)."""
    done = subprocess.run([sys.executable, "-m", "mpgpu_edu", "bench", "allreduce", "--quick"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    told = [line for line in done.stderr.splitlines() if line.startswith("bench allreduce:")]
    assert [line.split(" (")[0] for line in told] == ["bench allreduce: 4 B timed",
                                                      "bench allreduce: 4100 B timed"]
    assert told[-1].startswith("bench allreduce: 4100 B timed (2 of 2, ")
    done = subprocess.run([sys.executable, "-m", "mpgpu_edu", "bench", "allreduce", "--sizes",
                           "64MiB", "--repeats", "1000", "--timeout", "1"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 2, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert "(--timeout 1)" in last and "lower --repeats or --sizes" in last
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("layout", ["empty", "no submissions"])
def test_grade_without_submissions_says_the_layout(layout, tmp_path, capsys, no_work) -> None:
    folder = tmp_path / "class"
    (folder / "alice" / "notes").mkdir(parents=True) if layout != "empty" else folder.mkdir()
    line = refused(["grade", str(folder), "--csv", str(tmp_path / "g.csv")], capsys)
    assert "no learner submissions" in line and "one subfolder per learner" in line
    assert "alice/exercises/ex01_communication.py" in line
    assert not (tmp_path / "g.csv").exists()


def test_devices_reports_a_malformed_environment_value(monkeypatch, capsys) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "abc,1")
    assert main(["devices"]) == 0
    out = capsys.readouterr().out
    assert "CUDA_VISIBLE_DEVICES 'abc,1' (from the environment" in out and "unset" not in out
    assert "warning: entry 1 ('abc') is invalid (not a device index)" in out
    assert main(["devices", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["visible"] == "abc,1" and report["visible_from"] == "environment"
    assert report["warnings"] == check_visible("abc,1", 4)  # the cluster's own parser
    assert main(["devices", "--visible", "2,3", "--json"]) == 0  # --visible wins
    assert json.loads(capsys.readouterr().out)["logical_to_physical"] == [2, 3]


def test_generate_backs_up_an_edited_exercise_first(course: Path, capsys) -> None:
    path = course / "exercises" / "ex01_communication.py"
    edited = path.read_text() + "\n# my notes, not lost\n"
    path.write_text(edited)
    assert main(["generate"]) == 0
    out = capsys.readouterr().out
    (backup,) = (course / ".mpgpu" / "backups").glob("ex01_communication.*.py")
    assert backup.read_text() == edited and f"backed up {path} to {backup}" in out
    assert path.read_text() == (ROOT / "exercises" / path.name).read_text()
    assert main(["generate"]) == 0  # nothing differs: nothing written, nothing copied
    assert len(list((course / ".mpgpu" / "backups").iterdir())) == 1


def test_reset_restores_a_deleted_file_whole(course: Path, capsys) -> None:
    path = course / "exercises" / "ex01_communication.py"
    path.unlink()
    assert main(["reset", "1.3"]) == 0
    assert "restored the whole file" in capsys.readouterr().out
    text = path.read_text()
    assert text == (ROOT / "exercises" / path.name).read_text()
    assert text.count("\nimport ") + text.count("\nfrom ") > 0
    assert all(f"def {e.function}(" in text for e in by_module("ex01_communication"))
    path.write_text(text + "\n# mine\n")  # the backup of an existing file is kept as it was
    assert main(["reset", "1.3"]) == 0
    (backup,) = (course / ".mpgpu" / "backups").glob("ex01_communication.*.py")
    assert backup.read_text().endswith("# mine\n")


# ---- (b) every numeric option of every command ----------------------------------------------

# Options that take a string but read a number or a size from it, by dest.
STRING_NUMERIC = {"bytes": "size", "params": "size", "activations": "size",
                  "gpu_memory": "size", "sizes": "size", "allreduce_sizes": "size",
                  "device_ids": "ids", "id": "ids", "ids": "ids"}
# Value-taking options that are not numbers: names, choices and paths.
NOT_NUMERIC = {"algo", "algos", "attention", "backend", "cluster", "csv", "exercises", "gpu",
               "html", "impl", "model", "optimizer", "out", "precision", "recompute", "schedule",
               "solutions", "strategy", "submissions", "timeline", "variant", "visible",
               "backups", "json_file"}
# Where 0 is a legitimate value (no option takes a negative one: every count, size, time and
# id is >= 0): free compute shows the communication alone; a 0-byte ping-pong measures alpha
# alone, as a 0-byte all-reduce shows the latency term alone; no activations is the default of
# ``memory``; and an exercise or device id "0" is valid (lesson 0, cuda:0).
ZERO_OK = {("simulate", "pipeline", "forward_ms"), ("simulate", "pipeline", "backward_ms"),
           ("calibrate", "sizes"), ("memory", "activations"),
           ("simulate", "allreduce", "bytes")}  # 0 bytes: the latency term alone
HUGE = "1" + "0" * 30  # a whole number past every stated limit
BAD = {"int": ["nan", "inf", "-1", "1e30", HUGE], "float": ["nan", "inf", "-inf", "-1", "1e30"],
       "size": ["nan", "inf", "-1", "1e30", "1e400", "1KiB,nan"], "ids": ["nan", "-1", "1e30"]}
# The least each command needs besides the option under test ("SUBS", "CSV": made per test).
BASE = {("grade",): ["SUBS", "--csv", "CSV"], ("hint",): ["1.3"], ("reset",): ["1.3"],
        ("run",): ["ddp"], ("memory",): ["--params", "7B"]}
CONTEXT = {("run", "servers"): ["ps"],  # run's STRATEGY comes first: ps takes --servers
           ("memory", "batch"): ["--model", "gpt2-small", "--batch", "1", "--seq", "8"],
           ("memory", "seq"): ["--model", "gpt2-small", "--batch", "1", "--seq", "8"],
           ("memory", "params"): []}


def options(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(command path, action) for every value-taking argument, subcommands included."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from options(sub, (*path, name))
        elif action.nargs != 0 and not isinstance(action, argparse._HelpAction):
            yield path, action


def kind_of(path: tuple[str, ...], action: argparse.Action) -> str | None:
    """"int", "float", "size", "ids", or None for a non-numeric option."""
    kind = getattr(action.type, "kind", action.type)
    if kind in (int, float):
        return kind.__name__
    assert action.type is None, f"{path} {action.dest}: unknown type {action.type!r}"
    if action.dest in STRING_NUMERIC:
        return STRING_NUMERIC[action.dest]
    assert action.dest in NOT_NUMERIC, (
        f"new option {' '.join(path)} {action.option_strings or action.dest}: add it to "
        "STRING_NUMERIC (it reads a number or a size) or NOT_NUMERIC in this test")
    return None


def test_every_numeric_option_refuses_bad_values(tmp_path, capsys, no_work) -> None:
    paths = {"SUBS": str(submissions(tmp_path)), "CSV": str(tmp_path / "g.csv")}
    checked = 0
    for path, action in options(PARSER):
        kind = kind_of(path, action)
        if kind is None:
            continue
        base = [paths.get(a, a) for a in BASE.get(path[:1], [])]
        base = [*path, *CONTEXT.get((path[0], action.dest), base)]
        PARSER.parse_args(base)  # the table's minimal arguments must be valid on their own
        values = BAD[kind] + ([] if (*path, action.dest) in ZERO_OK or kind == "ids" else ["0"])
        for value in values:
            if action.option_strings:
                argv, named = [*base, f"{action.option_strings[-1]}={value}"], action.dest
            else:  # a positional (an exercise id): in place of the table's value
                argv, named = [*path, value], value
            line = refused(argv, capsys)
            assert named.replace("_", "-") in line or repr(value) in line, (argv, line)
            checked += 1
    assert checked > 150  # every command's options were reached
