"""Write ``exercises/`` from ``solutions/``: every solved part becomes a two-line stub.

In a solution module each graded part sits inside a function body between markers::

    def ring_all_reduce(comm, tensor):
        \"\"\"...docstring: the contract...\"\"\"
        ### BEGIN SOLUTION 1.3
        ...the solution...
        ### END SOLUTION

and the generated exercise keeps everything else byte for byte, with the marked lines
replaced by these two (indented as the markers were)::

    # Exercise 1.3 (about 14 lines). mp.hint("1.3") when stuck.
    raise NotImplementedError("Exercise 1.3: ring_all_reduce (notebooks/01_communication.ipynb)")

"About k lines" counts the solution's lines that are neither blank nor comments. The id after
``BEGIN SOLUTION`` names the exercise in ``registry.EXERCISES``, which gives the function
and the notebook; a marker in the wrong function or file is an error.
"""

from __future__ import annotations

import ast
import datetime as _dt
import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from mpgpu_edu.grading.registry import EXERCISES, Exercise, by_module

BEGIN = re.compile(r"^(?P<indent>[ \t]*)### BEGIN SOLUTION (?P<id>\d+\.\d+)[ \t]*$")
END = re.compile(r"^[ \t]*### END SOLUTION[ \t]*$")


class GenerateError(ValueError):
    """A solution file whose markers do not match the registry."""


@dataclass(frozen=True)
class SolvedPart:
    """One marked solution: its exercise, the marker lines (0-based) and the indentation."""

    exercise: Exercise
    begin: int
    end: int
    indent: str
    n_lines: int


def stub_lines(exercise: Exercise, indent: str, n_lines: int) -> list[str]:
    """The two lines that replace a solution."""
    return [f"{indent}# Exercise {exercise.id} (about {n_lines} lines). "
            f'mp.hint("{exercise.id}") when stuck.',
            f'{indent}raise NotImplementedError("Exercise {exercise.id}: {exercise.function} '
            f'({exercise.notebook})")']


def find_parts(text: str, filename: str) -> list[SolvedPart]:
    """Every marked part of one solution file, checked against the registry."""
    lines = text.splitlines()
    functions = _functions_by_line(text, filename)
    parts: list[SolvedPart] = []
    open_at: tuple[int, re.Match] | None = None
    for number, line in enumerate(lines):
        begin, end = BEGIN.match(line), END.match(line)
        if begin:
            if open_at is not None:
                raise GenerateError(f"{filename}:{number + 1}: BEGIN SOLUTION inside another")
            open_at = (number, begin)
        elif end:
            if open_at is None:
                raise GenerateError(f"{filename}:{number + 1}: END SOLUTION without BEGIN")
            parts.append(_part(lines, open_at, number, functions, filename))
            open_at = None
    if open_at is not None:
        raise GenerateError(f"{filename}:{open_at[0] + 1}: BEGIN SOLUTION is never closed")
    _check_complete(parts, filename)
    return parts


def _part(lines: list[str], open_at: tuple[int, re.Match], end: int,
          functions: dict[int, str], filename: str) -> SolvedPart:
    begin, match = open_at
    exercise_id = match["id"]
    if exercise_id not in EXERCISES:
        raise GenerateError(f"{filename}:{begin + 1}: exercise {exercise_id} is not in the "
                            "registry (mpgpu_edu/grading/registry.py)")
    exercise = EXERCISES[exercise_id]
    if Path(filename).stem != exercise.module:
        raise GenerateError(f"{filename}:{begin + 1}: exercise {exercise_id} belongs in "
                            f"{exercise.filename}")
    function = functions.get(begin + 1)
    if function != exercise.function:
        raise GenerateError(f"{filename}:{begin + 1}: exercise {exercise_id} must sit in "
                            f"def {exercise.function}, found it in {function or 'no function'}")
    body = lines[begin + 1:end]
    n_lines = sum(1 for line in body if line.strip() and not line.strip().startswith("#"))
    return SolvedPart(exercise, begin, end, match["indent"], n_lines)


def _functions_by_line(text: str, filename: str) -> dict[int, str]:
    """1-based line -> name of the innermost top-level function whose body holds it."""
    tree = ast.parse(text, filename)
    owner: dict[int, str] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for line in range(node.body[0].lineno, (node.end_lineno or node.lineno) + 1):
                owner[line] = node.name
    return owner


def _check_complete(parts: list[SolvedPart], filename: str) -> None:
    found = [part.exercise.id for part in parts]
    expected = [e.id for e in by_module(Path(filename).stem)]
    duplicates = sorted({i for i in found if found.count(i) > 1})
    missing = [i for i in expected if i not in found]
    if duplicates or missing:
        raise GenerateError(f"{filename}: exercises marked twice {duplicates}, "
                            f"missing {missing}")


def generate_text(text: str, filename: str) -> str:
    """The exercise file for the solution file ``text`` (named ``filename``)."""
    lines = text.splitlines()
    out: list[str] = []
    position = 0
    for part in find_parts(text, filename):
        out += lines[position:part.begin]
        out += stub_lines(part.exercise, part.indent, part.n_lines)
        position = part.end + 1
    out += lines[position:]
    return "\n".join(out) + "\n"


def solution_files(solutions: Path) -> list[Path]:
    """The solution modules, one per lesson, in lesson order."""
    modules = sorted({e.module for e in EXERCISES.values()})
    missing = [m for m in modules if not (solutions / f"{m}.py").is_file()]
    if missing:
        raise GenerateError(f"{solutions}: missing solution files "
                            + ", ".join(f"{m}.py" for m in missing))
    return [solutions / f"{m}.py" for m in modules]


def expected_exercises(solutions: Path) -> dict[str, str]:
    """``{filename: text}`` of every exercise file the generator writes."""
    return {path.name: generate_text(path.read_text(), path.name)
            for path in solution_files(solutions)}


def outdated(solutions: Path, exercises: Path) -> list[str]:
    """Exercise files that are missing or differ from what the generator writes."""
    return [name for name, text in expected_exercises(solutions).items()
            if not (exercises / name).is_file() or (exercises / name).read_text() != text]


class Written(NamedTuple):
    """A file ``generate`` wrote, and the copy of what it held before (None: it was new)."""

    path: Path
    backup: Path | None


def backup_file(file: Path, folder: Path) -> Path:
    """Copy ``file`` to ``folder/<name>.<timestamp>.py``; returns the copy."""
    folder.mkdir(parents=True, exist_ok=True)
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S-%f")
    target = folder / f"{file.stem}.{stamp}.py"
    target.write_bytes(file.read_bytes())
    return target


def generate(solutions: Path, exercises: Path, backups: Path | None = None) -> list[Written]:
    """(Re)write every exercise file that differs; returns what was written. A file that
    exists is copied into ``backups`` first, every time (default: ``.mpgpu/backups`` next to
    ``exercises``, where ``mpgpu-edu reset`` keeps its copies): it may hold a learner's work."""
    expected = expected_exercises(solutions)  # a bad solution file stops before any write
    folder = backups if backups is not None else exercises.parent / ".mpgpu" / "backups"
    exercises.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in expected.items():
        path = exercises / name
        if not path.is_file() or path.read_text() != text:
            saved = backup_file(path, folder) if path.exists() else None
            path.write_text(text)
            written.append(Written(path, saved))
    return written


def stub_source(exercise: Exercise, solutions: Path) -> str:
    """The source of ``exercise``'s function as the generator writes it (for ``reset``)."""
    path = solutions / exercise.filename
    return function_source(generate_text(path.read_text(), path.name), exercise.function)


def function_source(text: str, name: str) -> str:
    """The lines of top-level function ``name`` in module ``text``, decorators included."""
    lines = text.splitlines()
    for node in ast.parse(text).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            return "\n".join(lines[first - 1:node.end_lineno]) + "\n"
    raise GenerateError(f"no top-level function {name} in the module")


def source_sha(file: Path, function: str) -> str:
    """SHA-256 of top-level ``function``'s source in ``file`` ("" if absent or unreadable)."""
    try:
        text = file.read_text()
        source = function_source(text, function)
    except (OSError, ValueError, SyntaxError, UnicodeDecodeError):
        return ""
    return hashlib.sha256(source.encode()).hexdigest()
