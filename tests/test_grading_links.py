"""The learner's own check and progress are not fooled by accident: an ``exercises`` folder
that is a link (to ``solutions/``, say) or an exercise file that is a link counts nothing."""

from __future__ import annotations

import contextlib
import io
import shutil
from pathlib import Path

import pytest

from mpgpu_edu.cli import main
from mpgpu_edu.grading import check
from mpgpu_edu.grading.progress import progress

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def course(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    shutil.copytree(ROOT / "solutions", tmp_path / "solutions")
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'course'\n")
    monkeypatch.setenv("MPGPU_EDU_ROOT", str(tmp_path))
    return tmp_path


def test_check_refuses_an_exercises_folder_that_is_a_link(course: Path) -> None:
    (course / "exercises").symlink_to(course / "solutions")
    result = check("0.1")
    assert result.status == "error" and result.points == 0
    assert "is a link to" in result.message and "your own" in result.message
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        assert main(["check", "0.1"]) == 2
    assert "is a link to" in err.getvalue() and len(err.getvalue().strip().splitlines()) == 1


def test_a_file_that_is_a_link_is_not_checked(course: Path) -> None:
    (course / "exercises").mkdir()
    (course / "exercises" / "ex00_devices.py").symlink_to(course / "solutions" /
                                                          "ex00_devices.py")
    result = check("0.1")
    assert result.status == "error" and result.points == 0
    assert "symbolic link" in result.message


def test_progress_counts_no_linked_file(course: Path) -> None:
    (course / "exercises").mkdir()
    shutil.copyfile(course / "solutions" / "ex00_devices.py",
                    course / "exercises" / "ex00_devices.py")
    assert check("0.1").passed
    assert progress(course).entries["0.1"]["status"] == "passed"
    shutil.rmtree(course / "exercises")
    (course / "exercises").symlink_to(course / "solutions")
    entry = progress(course).entries["0.1"]
    assert entry["status"] == "a link, not your own file" and entry["points"] == 0
    assert sum(lesson.points for lesson in progress(course).lessons) == 0


def test_progress_is_not_fooled_by_stale_entries(course: Path) -> None:
    """An id the course no longer has is dropped; an entry recorded for another function
    under an id that now names a new exercise counts nothing (its source no longer matches);
    the text form is the table, not a dump of the entries."""
    from mpgpu_edu.grading.progress import update_state

    (course / "exercises").mkdir()
    shutil.copyfile(course / "solutions" / "ex08_bigger_models.py",
                    course / "exercises" / "ex08_bigger_models.py")
    update_state(course, "exercises", "8.9", {"status": "passed", "points": 20})
    update_state(course, "exercises", "8.2", {"status": "passed", "points": 4,
                                              "source_sha256": "0" * 64})
    shown = progress(course)
    assert "8.9" not in shown.entries
    assert shown.entries["8.2"]["status"] == "changed since its check"
    assert sum(lesson.points for lesson in shown.lessons) == 0
    assert repr(shown) == str(shown) and "total" in repr(shown)


def test_progress_names_an_exercise_with_every_point_but_not_done(course: Path) -> None:
    """A failed case that earns no points (5.1's FLOPs) leaves every point earned and the
    exercise not done: the table says which exercise and why."""
    from mpgpu_edu.grading.progress import update_state

    update_state(course, "exercises", "5.1", {"status": "failed", "points": 4})
    update_state(course, "exercises", "5.2", {"status": "failed", "points": 2})
    shown = str(progress(course))
    assert "5.1: every point earned but not done, a case that earns no points failed" in shown
    assert "5.2:" not in shown
