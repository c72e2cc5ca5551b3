"""The learner's tools around the exercises: tiered hints, predictions, ``mp.yours`` (the
learner's code drives the demos only while it passes as it is now), plain data between a
check's halves, and the instrumented solutions that prove the demos run the learner's code."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import mpgpu_edu as mp
from mpgpu_edu.course import LESSONS
from mpgpu_edu.grading.checks._plain import UNPLAIN, plain, type_name
from mpgpu_edu.grading.registry import EXERCISES

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def course(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A learner's course folder: exercises (stubs) and solutions, state in .mpgpu/."""
    for folder in ("exercises", "solutions"):
        shutil.copytree(ROOT / folder, tmp_path / folder)
    (tmp_path / "pyproject.toml").write_text("")
    monkeypatch.setenv("MPGPU_EDU_ROOT", str(tmp_path))
    monkeypatch.delenv("MPGPU_EDU_IMPL", raising=False)
    monkeypatch.delenv("MPGPU_EDU_STRICT", raising=False)
    return tmp_path


# ---- hints ----------------------------------------------------------------------------------

def test_hint_reveals_one_level_per_call_and_keeps_it(course: Path) -> None:
    first, second, third, again = (mp.hint("1.3") for _ in range(4))
    assert (first.level, second.level, third.level, again.level) == (1, 2, 3, 3)
    hints = EXERCISES["1.3"].hints
    assert first.shown == [hints[0]] and third.shown == list(hints)
    assert "hint 1 of 3" in str(first) and hints[0] in str(first)
    assert json.loads((course / ".mpgpu" / "progress.json").read_text())["hints"]["1.3"] == {
        "level": 3}
    assert mp.hint("1.3", reset=True).level == 0
    assert mp.hint("1.3").level == 1


def test_hint_level_is_shared_with_the_command_line(course: Path) -> None:
    mp.hint("2.1")
    out = subprocess.run([sys.executable, "-m", "mpgpu_edu", "hint", "2.1", "--json"],
                         capture_output=True, text=True, check=True).stdout
    assert json.loads(out)["level"] == 2
    bad = subprocess.run([sys.executable, "-m", "mpgpu_edu", "hint", "9.9"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "unknown exercise '9.9'" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1


# ---- predictions ------------------------------------------------------------------------------

def _any_prediction():
    for lesson in LESSONS.values():
        if lesson.predictions:
            return lesson.predictions[0]
    pytest.fail("no lesson has a prediction")


def test_predict_records_and_reveal_compares(course: Path, capsys) -> None:
    item = _any_prediction()
    wrong = (item.answer + 1) % len(item.choices)
    mp.predict(item.key)
    assert item.question in capsys.readouterr().out
    mp.reveal(item.key)
    assert "did not choose" in capsys.readouterr().out
    mp.predict(item.key, choice=wrong)
    mp.reveal(item.key)
    out = capsys.readouterr().out
    assert "not quite" in out and item.why in out
    mp.predict(item.key, choice=item.answer)
    mp.reveal(item.key, measured=item.answer)
    assert ": right." in capsys.readouterr().out


def test_reveal_catches_a_stale_answer_in_strict_runs(course: Path, monkeypatch) -> None:
    item = _any_prediction()
    other = (item.answer + 1) % len(item.choices)
    mp.reveal(item.key, measured=other)  # not strict: a note, no error
    monkeypatch.setenv("MPGPU_EDU_STRICT", "1")
    with pytest.raises(AssertionError, match="needs updating"):
        mp.reveal(item.key, measured=other)
    with pytest.raises(ValueError, match="not a choice"):
        mp.predict(item.key, choice="no such choice")


# ---- the learner's code drives the demos ----------------------------------------------------

def _solve(course: Path, exercise_id: str) -> None:
    from mpgpu_edu.grading.generate import function_source
    from mpgpu_edu.grading.progress import function_span

    exercise = EXERCISES[exercise_id]
    solved = function_source((course / "solutions" / exercise.filename).read_text(),
                             exercise.function)
    file = course / "exercises" / exercise.filename
    lines = file.read_text().splitlines(keepends=True)
    first, last = function_span(file.read_text(), exercise.function)
    file.write_text("".join(lines[:first]) + solved + "".join(lines[last:]))


def test_yours_uses_the_learners_code_only_while_it_passes_as_it_is(course: Path) -> None:
    from mpgpu_edu.collectives import all_reduce_ring

    stub = mp.yours("1.3", reference=all_reduce_ring, what="ring")
    assert not stub.is_yours and stub.fn is all_reduce_ring
    assert stub.label == "reference ring (yours: not yet)"
    assert stub.note.startswith('reference ring; yours: not yet (mp.check("1.3")')
    _solve(course, "1.3")
    assert not mp.yours("1.3", reference=all_reduce_ring).is_yours  # not checked yet
    assert mp.check("1.3").passed
    mine = mp.yours("1.3", reference=all_reduce_ring, what="ring")
    assert mine.is_yours and mine.label == "your ring" and mine.fn is not all_reduce_ring
    result = mp.launch(lambda comm: mine(comm, torch.ones(5) * (comm.rank + 1)) or None, 3)
    assert result.trace.makespan > 0
    file = course / "exercises" / EXERCISES["1.3"].filename
    file.write_text(file.read_text().replace("def ring_all_reduce(", "def ring_all_reduce(  ",
                                             1))
    edited = mp.yours("1.3", reference=all_reduce_ring, what="ring")
    assert not edited.is_yours  # edited since its check, and it says so
    assert edited.label == "reference ring (yours: changed since it passed)"
    assert mp.progress().entries["1.3"]["status"] == "changed since its check"
    file.write_text(file.read_text().replace("def ring_all_reduce(  ", "def ring_all_reduce(",
                                             1).replace("incoming.add_(", "incoming.sub_(", 1))
    assert not mp.check("1.3").passed  # a variant tried after passing
    assert mp.yours("1.3", reference=all_reduce_ring, what="ring").note.startswith(
        "reference ring; yours: its last check did not pass")


# ---- plain data between a check's halves ----------------------------------------------------

def test_plain_strips_what_could_lie() -> None:
    class Agreeable(list):
        def __eq__(self, other: object) -> bool:
            return True

    class Liar(torch.Tensor):
        pass

    class Count(int):
        def __eq__(self, other: object) -> bool:
            return True

    data = plain({"a": Agreeable([1, 2]), "t": torch.zeros(2).as_subclass(Liar),
                  "n": Count(3), "x": (1.5, None, "s"), "o": object()})
    assert type(data["a"]) is list and data["a"] != [9]
    assert type(data["t"]) is torch.Tensor
    assert type(data["n"]) is int and data["n"] != 4
    assert data["x"] == [1.5, None, "s"]
    assert data["o"] == {UNPLAIN: "object"} and type_name(data["o"]) == "object"


def test_every_case_has_two_halves() -> None:
    from mpgpu_edu.grading.checks import cases_for

    for exercise_id in EXERCISES:
        for case in cases_for(exercise_id):
            assert callable(case.compute) and callable(case.judge), (exercise_id, case.name)


# ---- the instrumented solutions --------------------------------------------------------------

def test_instrumented_solutions_log_calls_outside_the_checks(tmp_path: Path,
                                                             monkeypatch) -> None:
    sys.path.insert(0, str(ROOT))
    from tests.instrument import instrument, verify

    out = tmp_path / "solved"
    instrument(out)
    log = tmp_path / "calls.log"
    monkeypatch.setenv("MPGPU_EDU_CALL_LOG", str(log))
    monkeypatch.setenv("MPGPU_EDU_IMPL", str(out))
    assert mp.check("1.3").passed  # in a grading child: not logged
    assert not log.exists() or "1.3" not in log.read_text().split()
    ring = mp.yours("1.3", reference=lambda comm, t: None)
    assert ring.is_yours
    mp.launch(lambda comm: ring(comm, torch.ones(3)) or None, 2)
    assert "1.3" in log.read_text().split()
    assert "1.3" not in verify(log)


def test_the_checker_can_be_warmed_up_in_the_background(course: Path) -> None:
    """A notebook's first ``mp.progress()`` starts the checker's fork server in a thread;
    a check that follows uses it (and one that comes sooner waits for it)."""
    from mpgpu_edu.grading import runner
    from mpgpu_edu.runtime import local_server

    runner.warm_up()
    assert mp.check("0.2", impl="solutions").passed
    assert local_server().running() and local_server().server_pid


def test_a_failed_case_that_earns_no_points_is_named_in_the_verdict() -> None:
    """Every point earned but a 0-point case failed: the exercise is not done, and its line
    says why instead of reading '4/4 points (failed)'."""
    from mpgpu_edu.grading.report import CaseResult, ExerciseResult, exercise_status

    cases = [CaseResult("values", 4, "passed"),
             CaseResult("FLOPs per rank", 0, "failed", message="3x the FLOPs")]
    result = ExerciseResult("5.1", "column-parallel", exercise_status(cases), 4, cases)
    assert result.points == 4 and result.status == "failed"
    assert "(failed: every point earned, but a case that earns no points failed)" in str(result)
    assert "a case that earns no points failed" in result._repr_html_()
    honest = ExerciseResult("5.1", "column-parallel", "failed", 4,
                            [CaseResult("values", 4, "failed")])
    assert "(failed)" in str(honest) and "earns no points" not in str(honest)


def test_an_exercise_stopped_by_another_exercises_stub_says_which() -> None:
    """8.2 written but 8.1 still a stub: every case meets 8.1's NotImplementedError. The
    result says that 8.1 is what is missing, not only 'not implemented'."""
    from mpgpu_edu.grading.report import CaseResult, ExerciseResult, exercise_status

    stub_81 = "Exercise 8.1: shard_of (notebooks/08_bigger_models.ipynb)"
    cases = [CaseResult("3 ranks", 4, "not_implemented", message=stub_81),
             CaseResult("timeline", 3, "not_implemented", message=stub_81)]
    result = ExerciseResult("8.2", "sharded wrapper", exercise_status(cases), 7, cases)
    assert result.status == "not_implemented" and result.waits_on == ["8.1"]
    assert "it calls exercise 8.1, still a stub" in str(result)
    assert "solve 8.1 first" in str(result) and "solve 8.1 first" in result._repr_html_()
    own = ExerciseResult("8.2", "sharded wrapper", "not_implemented", 7, [CaseResult(
        "3 ranks", 7, "not_implemented", message="Exercise 8.2: wrap_fsdp (notebooks/...)")])
    assert own.waits_on == [] and "solve" not in str(own)
