"""``mpgpu-edu reset``, ``generate``, ``progress`` and the usage errors of ``check`` and
``grade``: fast, no check is run here."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mpgpu_edu.course import LESSONS

from mpgpu_edu.cli import main
from mpgpu_edu.grading.generate import function_source
from mpgpu_edu.grading.progress import find_root, function_span, record
from mpgpu_edu.grading.report import ExerciseResult

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture()
def course(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    shutil.copytree(ROOT / "exercises", tmp_path / "exercises")
    shutil.copytree(ROOT / "solutions", tmp_path / "solutions")
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'course'\n")
    (tmp_path / "notebooks").mkdir()
    monkeypatch.chdir(tmp_path / "notebooks")  # as a notebook runs: the root is found above
    monkeypatch.delenv("MPGPU_EDU_ROOT", raising=False)
    return tmp_path


def write_answer(course: Path) -> tuple[Path, str]:
    """The learner solved 1.3 and added a helper of their own."""
    path = course / "exercises" / "ex01_communication.py"
    text = path.read_text()
    solved = function_source((ROOT / "solutions" / path.name).read_text(), "ring_all_reduce")
    first, last = function_span(text, "ring_all_reduce")
    lines = text.splitlines(keepends=True)
    text = "".join(lines[:first]) + solved + "".join(lines[last:]) + "\n\ndef helper():\n    " \
                                                                     "return 42\n"
    path.write_text(text)
    return path, text


def test_the_root_is_found_from_a_notebook_folder(course: Path) -> None:
    assert find_root() == course


def test_reset_backs_up_then_restores_only_that_function(course: Path,
                                                         capsys: pytest.CaptureFixture) -> None:
    path, answer = write_answer(course)
    assert main(["reset", "1.3"]) == 0
    out = capsys.readouterr().out
    backups = list((course / ".mpgpu" / "backups").glob("ex01_communication.*.py"))
    assert len(backups) == 1 and backups[0].read_text() == answer
    assert str(backups[0].relative_to(course)) in out
    stub = (ROOT / "exercises" / path.name).read_text()
    assert path.read_text() == stub + "\n\ndef helper():\n    return 42\n"
    assert main(["reset", "1.3"]) == 0  # a second reset backs up again
    assert len(list((course / ".mpgpu" / "backups").glob("ex01_communication.*.py"))) == 2


def test_reset_works_on_a_file_that_does_not_parse(course: Path) -> None:
    path = course / "exercises" / "ex01_communication.py"
    original = path.read_text()
    broken = original.replace('    raise NotImplementedError("Exercise 1.3',
                              '    for (:\n    raise NotImplementedError("Exercise 1.3')
    path.write_text(broken)
    assert main(["reset", "1.3"]) == 0
    assert path.read_text() == original


def test_reset_restores_a_deleted_function(course: Path) -> None:
    path = course / "exercises" / "ex00_devices.py"
    text = path.read_text()
    first, last = function_span(text, "data_parallel_device_ids")
    lines = text.splitlines(keepends=True)
    path.write_text("".join(lines[:first] + lines[last:]))
    assert main(["reset", "0.2"]) == 0
    assert "def data_parallel_device_ids" in path.read_text()


@pytest.mark.parametrize("argv", [["reset", "9.9"], ["check", "9.9"], ["check", "12"],
                                  ["grade", "/no/such/folder", "--csv", "x.csv"],
                                  ["check", "--impl", "/no/such/folder"]])
def test_bad_input_is_one_line_and_exit_2(course: Path, argv: list[str],
                                          capsys: pytest.CaptureFixture) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "error" in err


def test_generate_check_reports_a_stale_exercise(course: Path,
                                                 capsys: pytest.CaptureFixture) -> None:
    assert main(["generate", "--check"]) == 0
    (course / "exercises" / "ex02_parameter_server.py").write_text("# edited\n")
    assert main(["generate", "--check"]) == 1
    assert "ex02_parameter_server.py" in capsys.readouterr().out
    assert main(["generate"]) == 0
    assert main(["generate", "--check"]) == 0


def test_progress_reads_the_recorded_results(course: Path,
                                             capsys: pytest.CaptureFixture) -> None:
    record(course, [ExerciseResult("1.1", "p2p", "passed", 3),
                    ExerciseResult("1.3", "ring", "failed", 10)])
    assert main(["progress"]) == 0
    out = capsys.readouterr().out
    line = next(row for row in out.splitlines() if row.startswith("01"))
    assert f"1/{len(LESSONS[1].exercises)}" in line


def test_no_course_folder_is_a_usage_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MPGPU_EDU_ROOT", raising=False)
    assert main(["progress"]) == 2
    assert "MPGPU_EDU_ROOT" in capsys.readouterr().err


def test_command_modules_and_grading_import_no_torch() -> None:
    code = ("import sys, mpgpu_edu.cli.check, mpgpu_edu.cli.grade, mpgpu_edu.cli.reset, "
            "mpgpu_edu.cli.progress, mpgpu_edu.cli.generate, mpgpu_edu.grading.runner, "
            "mpgpu_edu.grading.grade; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120).stdout
    assert out.strip() == "False"
