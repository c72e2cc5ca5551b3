"""The isolated runner end to end: every solution passes, every stub is reported as not
implemented, hostile submissions are graded within their timeouts, and no learner file
changes. One run per implementation, shared by the tests (module-scoped fixtures)."""

from __future__ import annotations

import contextlib
import csv
import hashlib
import io
import json
import shutil
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

import mpgpu_edu
from mpgpu_edu.cli import main
from mpgpu_edu.grading import ExerciseFailed, check
from mpgpu_edu.grading.progress import function_span
from mpgpu_edu.course import LESSONS
from mpgpu_edu.grading.registry import EXERCISES

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def digest(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` with the hash of its bytes."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def run_cli(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = main(list(argv))
    return code, out.getvalue()


@pytest.fixture(scope="module")
def course(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A learner's course folder: exercises/ and solutions/ copied from the repository."""
    root = tmp_path_factory.mktemp("course")
    shutil.copytree(ROOT / "exercises", root / "exercises")
    shutil.copytree(ROOT / "solutions", root / "solutions")
    (root / "pyproject.toml").write_text("[project]\nname = 'course'\n")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MPGPU_EDU_ROOT", str(root))
        yield root


@pytest.fixture(scope="module")
def checked(course: Path) -> dict:
    """``check --json`` of the solutions and of the stubs, with the files' hashes around."""
    before = digest(course)
    solutions = run_cli("check", "--impl", "solutions", "--json")
    stubs = run_cli("check", "--json")
    return {"before": before, "after": digest(course), "solutions": solutions,
            "stubs": stubs}


def test_every_solution_passes(checked: dict) -> None:
    code, out = checked["solutions"]
    report = json.loads(out)
    assert code == 0
    assert [e["id"] for e in report["exercises"]] == list(EXERCISES)
    failed = {e["id"]: e for e in report["exercises"] if e["status"] != "passed"}
    assert not failed, json.dumps(failed, indent=1)
    assert report["score"] == report["max_score"] == sum(e.points for e in EXERCISES.values())
    assert {"id", "status", "points", "max_points"} <= set(report["exercises"][0])


def test_every_stub_is_not_implemented_and_nothing_errs(checked: dict) -> None:
    code, out = checked["stubs"]
    report = json.loads(out)
    assert code == 1 and report["score"] == 0
    for exercise in report["exercises"]:
        assert exercise["status"] == "not_implemented", exercise
        assert {c["status"] for c in exercise["cases"]} == {"not_implemented"}, exercise


def test_checking_changes_no_file(checked: dict, course: Path) -> None:
    changed = {k for k in checked["before"].keys() | checked["after"].keys()
               if checked["before"].get(k) != checked["after"].get(k)}
    assert changed == {".mpgpu/progress.json"}  # the only file written: the learner's progress
    assert not list((course / "exercises").rglob("__pycache__"))


def test_progress_counts_what_was_checked(checked: dict) -> None:
    code, out = run_cli("progress", "--json")
    state = json.loads(out)
    assert code == 0 and state["points"] == 0
    assert state["exercises"]["1.3"]["status"] == "not_implemented"
    assert [lesson["total"] for lesson in state["lessons"]] == [
        len(lesson.exercises) for lesson in LESSONS.values()]


# ---- hostile submissions --------------------------------------------------------------------

def replaced(text: str, name: str, source: str) -> str:
    first, last = function_span(text, name)
    lines = text.splitlines(keepends=True)
    return "".join(lines[:first]) + textwrap.dedent(source).lstrip("\n") + "".join(lines[last:])


BUCKETS = """
    buckets, current, filled = [], [], 0
    for index in reversed(range(len(sizes))):
        if current and filled + sizes[index] > bucket_bytes:
            buckets.append(current)
            current, filled = [], 0
        current.append(index)
        filled += sizes[index]
    return buckets + ([current] if current else [])
"""
HOSTILE = {  # learner: (file, function, new source)
    "crash": ("ex01_communication", "ring_all_reduce",
              "def ring_all_reduce(comm, tensor):\n    import ctypes\n    ctypes.string_at(0)\n"),
    "hang": ("ex01_communication", "ring_all_reduce",
             "def ring_all_reduce(comm, tensor):\n    while True:\n        pass\n"),
    "exit": ("ex03_data_parallel", "make_buckets",
             "def make_buckets(sizes, bucket_bytes):\n    import sys\n    sys.exit(3)\n"),
    "os_exit": ("ex03_data_parallel", "make_buckets",
                "def make_buckets(sizes, bucket_bytes):\n    import os\n    os._exit(3)\n"),
    "flood": ("ex03_data_parallel", "make_buckets",
              "def make_buckets(sizes, bucket_bytes):\n    for _ in range(3000):\n"
              "        print('spam ' * 400)\n" + textwrap.indent(textwrap.dedent(BUCKETS), "    ")),
    "memory": ("ex03_data_parallel", "make_buckets",
               "def make_buckets(sizes, bucket_bytes):\n    hog = bytearray(3 * 2**30)\n"
               "    return [[0]]\n"),
    "mutate": ("ex03_data_parallel", "make_buckets",
               "def make_buckets(sizes, bucket_bytes):\n    sizes.reverse()\n"
               "    sizes.reverse()\n    sizes.append(0)\n    sizes.pop()\n    sizes.sort()\n"
               "    return [list(range(len(sizes)))[::-1]]\n"),
    "deaf": ("ex03_data_parallel", "make_buckets",
             "def make_buckets(sizes, bucket_bytes):\n    import signal\n"
             "    signal.signal(signal.SIGALRM, signal.SIG_IGN)\n    while True:\n        pass\n"),
}
IDS = ["1.3", "3.2"]


STUCK = {"hang": "1.3", "deaf": "3.2"}  # graded on that exercise alone, with a short budget
# Learners whose only change is make_buckets are graded on 3.2 alone: 1.3 runs first and
# never touches that file, so their 1.3 would be the good learner's, graded again.
ONLY_32 = {learner for learner, (module, _, _) in HOSTILE.items()
           if module == "ex03_data_parallel" and learner not in STUCK}


def grade_folder(folder: Path, timeout: str, ids: list[str]) -> dict[str, dict]:
    out_csv = folder.parent / f"{folder.name}.csv"
    code, _ = run_cli("grade", str(folder), "--csv", str(out_csv), "--ids", *ids,
                      "--timeout", timeout, "--memory", "1")
    assert code == 0
    with out_csv.open() as handle:
        return {row["learner"]: row for row in csv.DictReader(handle)}


@pytest.fixture(scope="module")
def graded(tmp_path_factory: pytest.TempPathFactory) -> dict:
    calm = tmp_path_factory.mktemp("submissions")
    only_32 = tmp_path_factory.mktemp("buckets_only")
    stuck = {i: tmp_path_factory.mktemp(f"stuck{i}") for i in STUCK.values()}
    shutil.copytree(ROOT / "solutions", calm / "good" / "exercises")  # a whole-repo layout
    shutil.copytree(ROOT / "exercises", calm / "stubs")
    for learner, (module, function, source) in HOSTILE.items():
        folder = (stuck[STUCK[learner]] if learner in STUCK
                  else only_32 if learner in ONLY_32 else calm) / learner
        shutil.copytree(ROOT / "solutions", folder)
        path = folder / f"{module}.py"
        path.write_text(replaced(path.read_text(), function, source))
    shutil.copytree(ROOT / "solutions", calm / "syntax")
    (calm / "syntax" / "ex01_communication.py").write_text("def ring_all_reduce(:\n")
    (calm / "nothing").mkdir()
    folders = [calm, only_32, *stuck.values()]
    before = [digest(folder) for folder in folders]
    rows = grade_folder(calm, "60", IDS) | grade_folder(only_32, "60", ["3.2"])
    for exercise_id, folder in stuck.items():
        rows |= grade_folder(folder, "4", [exercise_id])
    return {"rows": rows, "before": before, "after": [digest(folder) for folder in folders]}


@pytest.mark.parametrize("learner, ring, buckets, note", [
    ("good", 10, 5, ""), ("stubs", 0, 0, ""), ("crash", 0, 5, "1.3 error"),
    ("exit", None, 0, "3.2 error"), ("os_exit", None, 0, "3.2 error"), ("flood", None, 5, ""),
    ("memory", None, 0, "3.2 error"), ("mutate", None, 0, ""), ("syntax", 0, 5, "1.3 error"),
    ("nothing", 0, 0, "1.3 error; 3.2 error"),
    ("hang", 0, None, "1.3 timeout"), ("deaf", None, 0, "3.2 timeout"),
])
def test_grade_marks_each_submission_and_goes_on(graded: dict, learner: str,
                                                ring: int | None, buckets: int | None,
                                                note: str) -> None:
    row = graded["rows"][learner]
    assert row["notes"] == note
    got = {i: int(row[i]) for i in IDS if i in row}
    want = {i: p for i, p in (("1.3", ring), ("3.2", buckets)) if p is not None}
    assert got == want
    assert int(row["total"]) == sum(want.values())
    assert int(row["max_total"]) == sum(EXERCISES[i].points for i in want)


def test_grade_writes_one_row_per_learner_and_changes_no_file(graded: dict) -> None:
    assert len(graded["rows"]) == len(HOSTILE) + 4
    assert graded["before"] == graded["after"]


# ---- check() for notebooks --------------------------------------------------------------------

NOTEBOOK_CELL = '''
import torch
def ring(comm, tensor):
    n = comm.world_size
    chunks = list(torch.tensor_split(tensor.view(-1), n))
    buffer = torch.empty_like(chunks[0])
    for k in range(n - 1):
        incoming = chunks[(comm.rank - 1 - k) % n]
        work = comm.isend(chunks[(comm.rank - k) % n], (comm.rank + 1) % n)
        comm.recv(buffer[: incoming.numel()], (comm.rank - 1) % n)
        work.wait()
        incoming.add_(buffer[: incoming.numel()])
    for k in range(n - 1):
        work = comm.isend(chunks[(comm.rank + 1 - k) % n], (comm.rank + 1) % n)
        comm.recv(chunks[(comm.rank - k) % n], (comm.rank - 1) % n)
        work.wait()

def stuck(sizes, bucket_bytes):
    # Hangs well past the check's timeout, then ends: a thread of this kernel cannot be
    # killed, and one spinning forever would hold the GIL for every later test. Sleeping in
    # small steps keeps it from slowing the rest of the session while it runs.
    import time
    end = time.monotonic() + 20
    while time.monotonic() < end:
        time.sleep(0.01)
'''


def notebook_functions() -> dict:
    namespace = {"__name__": "__main__"}
    exec(compile(NOTEBOOK_CELL, "<notebook cell>", "exec"), namespace)  # noqa: S102
    return namespace


def test_a_notebook_function_is_checked_in_the_kernel() -> None:
    result = mpgpu_edu.check("1.3", notebook_functions()["ring"])
    assert result.passed, str(result)
    assert "this kernel" in result.ran_in
    assert "✅" in result._repr_html_() and "PASS" in str(result)


def test_a_hanging_notebook_function_times_out() -> None:
    """...and the package's functions the check blocked work again in the kernel while the
    hanging case goes on (a lesson's demo after it would otherwise be refused)."""
    from mpgpu_edu.lessons import communication as cm

    result = check("3.2", notebook_functions()["stuck"], timeout=1.5)
    assert result.status == "timeout"
    assert "background of this kernel" in result.cases[0].message
    assert cm.binary_tree_all_reduce.__code__.co_filename != "<blocked>"


def test_a_function_from_a_file_is_checked_in_a_separate_process() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("solved", ROOT / "solutions" /
                                                  "ex03_data_parallel.py")
    solved = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(solved)
    result = check("3.2", solved.make_buckets, figures=False)
    assert result.passed and result.ran_in == "a separate process"
    assert result.file.endswith("solutions/ex03_data_parallel.py")


def test_check_shows_a_timeline_figure(course: Path) -> None:
    result = check("1.3", impl="solutions")
    assert result.passed and result.figure_png
    assert '<img style="max-width:100%' in result._repr_html_()


def test_check_never_raises_unless_strict(course: Path) -> None:
    unknown = check("9.9")
    assert unknown.status == "error" and "unknown exercise" in unknown.message
    with pytest.raises(ValueError):
        check("9.9", strict=True)
    with pytest.raises(ExerciseFailed):
        check("0.2", strict=True)
    assert check("0.2", impl=course / "solutions", strict=True).passed
