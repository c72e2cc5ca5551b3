"""exercises/ is exactly what the generator writes from solutions/, stubs keep the solutions'
signatures and docstrings, and the registry agrees with the files and the checks."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from mpgpu_edu.grading import generate
from mpgpu_edu.grading.checks import cases_for
from mpgpu_edu.grading.registry import EXERCISES, LESSONS, select

ROOT = Path(__file__).resolve().parents[1]
SOLUTIONS, EXERCISE_DIR = ROOT / "solutions", ROOT / "exercises"
NOTEBOOKS = {"00_welcome", "01_communication", "02_parameter_server", "03_data_parallel",
             "04_pipeline", "05_tensor_and_hybrid", "06_choosing_and_debugging",
             "07_many_machines", "08_bigger_models", "09_memory_for_time", "10_planning"}


def functions(path: Path) -> dict[str, ast.FunctionDef]:
    tree = ast.parse(path.read_text())
    return {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}


def test_exercises_are_what_the_generator_writes() -> None:
    assert generate.outdated(SOLUTIONS, EXERCISE_DIR) == [], \
        "exercises/ is out of date: run `mpgpu-edu generate`"
    assert sorted(p.name for p in EXERCISE_DIR.glob("*.py")) == sorted(
        p.name for p in SOLUTIONS.glob("ex*.py"))


@pytest.mark.parametrize("module", sorted({e.module for e in EXERCISES.values()}))
def test_stubs_keep_signatures_and_docstrings(module: str) -> None:
    solved, stubs = functions(SOLUTIONS / f"{module}.py"), functions(EXERCISE_DIR / f"{module}.py")
    assert list(solved) == list(stubs)
    for name, node in solved.items():
        stub = stubs[name]
        assert ast.dump(node.args) == ast.dump(stub.args), name
        assert ast.dump(node.returns) == ast.dump(stub.returns) if node.returns else True
        assert ast.get_docstring(node) == ast.get_docstring(stub), name
        assert ast.get_docstring(node), f"{module}.{name} has no docstring"


@pytest.mark.parametrize("exercise", list(EXERCISES.values()), ids=list(EXERCISES))
def test_each_stub_is_exactly_the_two_lines(exercise) -> None:  # noqa: ANN001
    text = (EXERCISE_DIR / exercise.filename).read_text()
    lines = generate.function_source(text, exercise.function).splitlines()
    # the stub ends the function, or (8.2) stands where a solved class's methods go
    at = [k for k, line in enumerate(lines) if line.strip().startswith("# Exercise ")]
    assert len(at) == 1, f"{exercise.id}: one stub per exercise, found {len(at)}"
    comment, raise_line = lines[at[0]].strip(), lines[at[0] + 1].strip()
    assert comment.startswith(f"# Exercise {exercise.id} (about ")
    assert comment.endswith(f'lines). mp.hint("{exercise.id}") when stuck.')
    assert raise_line == (f'raise NotImplementedError("Exercise {exercise.id}: '
                          f'{exercise.function} ({exercise.notebook})")')
    assert len(lines[at[0]]) <= 100
    solution = generate.function_source((SOLUTIONS / exercise.filename).read_text(),
                                        exercise.function)
    assert "### BEGIN SOLUTION" in solution and "### BEGIN" not in text


def test_a_worked_example_sits_above_the_stubs() -> None:
    for module in {e.module for e in EXERCISES.values()}:
        graded = {e.function for e in EXERCISES.values() if e.module == module}
        names = list(functions(SOLUTIONS / f"{module}.py"))
        assert names[0] not in graded, f"{module}: the first function is the worked example"
        assert "raise NotImplementedError" not in generate.function_source(
            (EXERCISE_DIR / f"{module}.py").read_text(), names[0])


def test_registry_covers_every_lesson_with_enough_exercises() -> None:
    assert len(EXERCISES) >= 18
    assert {e.lesson for e in EXERCISES.values()} == set(LESSONS)
    assert {Path(e.notebook).stem for e in EXERCISES.values()} == NOTEBOOKS
    for exercise in EXERCISES.values():
        points = sum(case.points for case in cases_for(exercise.id))
        assert points == exercise.points, f"{exercise.id}: cases give {points} points"
        assert any(case.hidden for case in cases_for(exercise.id)) or exercise.id in (
            "1.1", "3.3", "3.4", "4.4")


def test_select_reads_ids_and_lessons() -> None:
    assert select(["1.3", "2"]) == ["1.3"] + [e.id for e in EXERCISES.values() if e.lesson == 2]
    assert select(None) == list(EXERCISES)
    with pytest.raises(KeyError, match="unknown exercise '9.9'"):
        select(["9.9"])


def test_stub_line_counts_are_the_solution_lines() -> None:
    for path in sorted(SOLUTIONS.glob("ex*.py")):
        lines = path.read_text().splitlines()
        for part in generate.find_parts(path.read_text(), path.name):
            body = [line.strip() for line in lines[part.begin + 1:part.end]]
            counted = [line for line in body if line and not line.startswith("#")]
            assert part.n_lines == len(counted) > 0, (path.name, part.exercise.id)


BAD_MARKERS = {
    "unknown id": "def ps_worker_step():\n    ### BEGIN SOLUTION 9.9\n    pass\n"
                  "    ### END SOLUTION\n",
    "wrong function": "def other():\n    ### BEGIN SOLUTION 2.1\n    pass\n    ### END SOLUTION\n",
    "never closed": "def ps_worker_step():\n    ### BEGIN SOLUTION 2.1\n    pass\n",
    "missing exercise": "def ps_worker_step():\n    ### BEGIN SOLUTION 2.1\n    pass\n"
                        "    ### END SOLUTION\n",
}


@pytest.mark.parametrize("case", list(BAD_MARKERS))
def test_bad_markers_are_reported(case: str) -> None:
    with pytest.raises(generate.GenerateError):
        generate.generate_text(BAD_MARKERS[case], "ex02_parameter_server.py")


def test_generate_writes_only_what_differs(tmp_path: Path) -> None:
    out = tmp_path / "exercises"
    assert len(generate.generate(SOLUTIONS, out)) == len(list(SOLUTIONS.glob("ex*.py")))
    assert generate.generate(SOLUTIONS, out) == []
    (out / "ex00_devices.py").write_text("# edited\n")
    assert generate.outdated(SOLUTIONS, out) == ["ex00_devices.py"]


@pytest.mark.parametrize("module", sorted({e.module for e in EXERCISES.values()}))
def test_the_docstring_examples_hold_for_the_solutions(module: str) -> None:
    import doctest
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"solved_{module}", SOLUTIONS / f"{module}.py")
    solved = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(solved)
    assert doctest.testmod(solved).failed == 0
