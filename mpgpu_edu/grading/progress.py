"""The learner's course folder, progress and resets.

The course folder (the "root") holds ``exercises/`` next to ``mpgpu_edu/`` or a
``pyproject.toml``; it is found by walking up from the current directory (a notebook runs in
``notebooks/``), or named by the environment variable ``MPGPU_EDU_ROOT``. Course state lives
in ``<root>/.mpgpu/``: ``progress.json`` (the latest result of every exercise checked) and
``backups/`` (a copy of an exercise file taken before every reset).
"""

from __future__ import annotations

import ast
import datetime as _dt
import html
import json
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from mpgpu_edu.grading.generate import (backup_file, function_source, generate_text,
                                        source_sha, stub_source)
from mpgpu_edu.grading.registry import EXERCISES, LESSON_TITLES, LESSONS, Exercise
from mpgpu_edu.grading.report import ExerciseResult, Scored

ROOT_ENV = "MPGPU_EDU_ROOT"
STATE_DIR = ".mpgpu"
IMPL_ENV = "MPGPU_EDU_IMPL"  # the exercises folder a whole run checks (else exercises/)


class CourseNotFound(FileNotFoundError):
    """No course folder (one with ``exercises/``) around the current directory."""


def find_root(start: Path | str | None = None) -> Path:
    """The course folder: ``$MPGPU_EDU_ROOT``, else the nearest folder at or above ``start``
    (default: the current directory) holding ``exercises/`` and ``mpgpu_edu/`` or
    ``pyproject.toml``."""
    if os.environ.get(ROOT_ENV):
        root = Path(os.environ[ROOT_ENV]).expanduser().resolve()
        if not (root / "exercises").is_dir():
            raise CourseNotFound(f"{ROOT_ENV}={root} has no exercises/ folder")
        return root
    here = Path(start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / "exercises").is_dir() and ((folder / "mpgpu_edu").is_dir()
                                                or (folder / "pyproject.toml").is_file()):
            return folder
    raise CourseNotFound(f"no course folder (with exercises/) at or above {here}: run from "
                         f"inside the course, or set {ROOT_ENV}")


# ---- progress -------------------------------------------------------------------------------

def progress_path(root: Path) -> Path:
    return root / STATE_DIR / "progress.json"


def read_state(root: Path) -> dict:
    """The whole of ``progress.json``: ``exercises`` (latest results), ``hints`` (the level
    revealed per exercise), ``predictions`` (the learner's choices). Empty when absent."""
    try:
        data = json.loads(progress_path(root).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def update_state(root: Path, section: str, key: str, value: dict | None) -> None:
    """Set (or with ``None`` remove) one entry of one section of ``progress.json``,
    atomically (a crash leaves the old file or the new one, never half of one)."""
    state = read_state(root)
    entries = state.get(section) if isinstance(state.get(section), dict) else {}
    if value is None:
        entries.pop(key, None)
    else:
        entries[key] = value
    state[section] = entries
    path = progress_path(root)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(f".{os.getpid()}.tmp")
    temporary.write_text(json.dumps(state, indent=1, sort_keys=True))
    temporary.replace(path)


def load(root: Path) -> dict[str, dict]:
    """``{exercise id: {"status", "points", "max_points", "checked_at", "source_sha256"}}``
    (empty if never checked)."""
    entries = read_state(root).get("exercises", {})
    return entries if isinstance(entries, dict) else {}


def record(root: Path, results: list[ExerciseResult],
           shas: dict[str, str] | None = None) -> None:
    """Remember the latest result of each exercise checked, with the SHA-256 of the
    function's source as it was checked (``shas``; by default hashed from ``exercises/``
    now), so a later edit makes the record stale for ``mp.yours``."""
    now = _dt.datetime.now().isoformat(timespec="seconds")
    for r in results:
        sha = (shas or {}).get(r.id)
        if sha is None:
            exercise = EXERCISES[r.id]
            sha = source_sha(root / "exercises" / exercise.filename, exercise.function)
        update_state(root, "exercises", r.id, {
            "status": r.status, "points": r.points, "max_points": r.max_points,
            "checked_at": now, "source_sha256": sha})


@dataclass
class LessonProgress:
    lesson: int
    title: str
    done: int
    total: int
    points: int
    max_points: int


@dataclass
class Progress(Scored):
    """Per lesson: exercises passed out of all, and points. Shows as a table."""

    lessons: list[LessonProgress]
    entries: dict[str, dict]
    note: str = ""  # said under the table: e.g. checks of another folder are not counted

    _parts = "lessons"
    points, max_points = Scored.score, Scored.max_score  # the names progress reports use

    def to_dict(self) -> dict:
        return {"lessons": [vars(lesson) for lesson in self.lessons],
                "exercises": {i: self.entries.get(i, {"status": "unchecked", "points": 0,
                                                      "max_points": e.points})
                              for i, e in EXERCISES.items()},
                "points": self.points, "max_points": self.max_points}

    def __str__(self) -> str:
        lines = [f"{'lesson':6s}  {'':28s}  {'done':>6s}  {'points':>7s}"]
        for item in self.lessons:
            lines.append(f"{item.lesson:02d}      {item.title:28s}  "
                         f"{item.done:>2d}/{item.total:<3d}  {item.points:>3d}/{item.max_points}")
        lines.append(f"{'':6s}  {'total':28s}  {'':6s}  {self.points:>3d}/{self.max_points}")
        return "\n".join(lines + ([self.note] if self.note else []))

    def __repr__(self) -> str:  # the table, also where only text is shown
        return str(self)

    def _repr_html_(self) -> str:
        rows = "".join(f"<tr><td>{p.lesson:02d}</td><td style='text-align:left'>"
                       f"{html.escape(p.title)}</td><td>{p.done}/{p.total}</td>"
                       f"<td>{p.points}/{p.max_points}</td></tr>" for p in self.lessons)
        return (f"<table><tr><th>lesson</th><th></th><th>done</th><th>points</th></tr>{rows}"
                f"<tr><td></td><td><b>total</b></td><td></td><td><b>{self.points}/"
                f"{self.max_points}</b></td></tr></table>"
                + (f"<p>{html.escape(self.note)}</p>" if self.note else ""))


def progress(root: Path | str | None = None) -> Progress:
    """The learner's progress from the latest checks (``mpgpu_edu.check`` records them)."""
    folder = Path(root) if root is not None else find_root()
    entries = {i: e for i, e in load(folder).items() if i in EXERCISES}  # not a removed id
    for exercise_id, entry in entries.items():  # edited since its check: no longer counts
        exercise = EXERCISES.get(exercise_id)
        if exercise is None or not isinstance(entry, dict) or not entry.get("source_sha256"):
            continue
        path = folder / "exercises" / exercise.filename
        if path.parent.is_symlink() or path.is_symlink():  # not the learner's own file
            entries[exercise_id] = dict(entry, status="a link, not your own file", points=0)
            continue
        now = source_sha(path, exercise.function)
        if now != entry["source_sha256"] and entry.get("status") == "passed":
            entries[exercise_id] = dict(entry, status="changed since its check", points=0)
    lessons = []
    for lesson in LESSONS:
        exercises = [e for e in EXERCISES.values() if e.lesson == lesson]
        done = [e for e in exercises if entries.get(e.id, {}).get("status") == "passed"]
        points = sum(min(int(entries.get(e.id, {}).get("points", 0)), e.points)
                     for e in exercises)
        lessons.append(LessonProgress(lesson, LESSON_TITLES[lesson], len(done), len(exercises),
                                      points, sum(e.points for e in exercises)))
    impl = os.environ.get(IMPL_ENV, "")
    elsewhere = impl not in ("", "exercises") and (
        Path(impl).resolve() != (folder / "exercises").resolve())
    notes = [f"(checks of {IMPL_ENV}={impl} are not counted here: this table counts the "
             "course's exercises/ folder)"] if elsewhere else []
    notes += [f"{i}: every point earned but not done, a case that earns no points failed "
              f"(mp.check(\"{i}\") shows which)"
              for i, e in sorted(entries.items()) if isinstance(e, dict)
              and e.get("status") not in ("passed", None) and EXERCISES[i].points > 0
              and int(e.get("points", 0) or 0) >= EXERCISES[i].points]
    return Progress(lessons, entries, "\n".join(notes))


# ---- reset ------------------------------------------------------------------------------------

def backup(root: Path, file: Path) -> Path:
    """Copy ``file`` to ``.mpgpu/backups/<name>.<timestamp>.py``; returns the copy."""
    return backup_file(file, root / STATE_DIR / "backups")


def original_stub(root: Path, exercise: Exercise) -> str:
    """The stub of ``exercise`` as first handed out: generated from ``solutions/``, or taken
    from the committed ``exercises/`` file when the solutions are not there."""
    solutions = root / "solutions"
    if (solutions / exercise.filename).is_file():
        return stub_source(exercise, solutions)
    try:
        stub = function_source(original_module(root, exercise), exercise.function)
    except (ValueError, SyntaxError):
        stub = ""
    if f"Exercise {exercise.id}:" not in stub:
        raise CourseNotFound(f"cannot find the original stub of exercise {exercise.id}: "
                             "solutions/ is missing and git has no stub to restore")
    return stub


def original_module(root: Path, exercise: Exercise) -> str:
    """The whole exercise file of ``exercise`` as first handed out (imports, every exercise
    of its lesson as a stub): generated from ``solutions/``, else the committed file."""
    solution = root / "solutions" / exercise.filename
    if solution.is_file():
        return generate_text(solution.read_text(), solution.name)
    try:
        return subprocess.run(["git", "show", f"HEAD:exercises/{exercise.filename}"], cwd=root,
                              capture_output=True, text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def reset(root: Path, exercise: Exercise) -> tuple[Path, Path | None]:
    """Put the stub of ``exercise`` back into ``exercises/<module>.py``, changing only that
    function. The file is backed up first, always. A file that is gone is restored whole, as
    handed out: imports and every exercise of its lesson. Returns (file, backup or None when
    there was no file)."""
    stub = original_stub(root, exercise)
    file = root / "exercises" / exercise.filename
    if not file.is_file():
        module = original_module(root, exercise)
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_text(module if stub in module else stub)
        return file, None
    saved = backup(root, file)
    text = file.read_text()
    span = function_span(text, exercise.function)
    lines = text.splitlines(keepends=True)
    if span is None:
        new = text.rstrip("\n") + "\n\n\n" + stub
    else:
        first, last = span
        new = "".join(lines[:first]) + stub + "".join(lines[last:])
    file.write_text(new)
    return file, saved


_DEF = r"^(async\s+)?def\s+{name}\s*\("


def function_span(text: str, name: str) -> tuple[int, int] | None:
    """0-based [first, last) lines of top-level function ``name`` (decorators included), or
    None. Works on files that do not parse, by indentation."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return _span_by_indentation(text.splitlines(), name)
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            return first - 1, node.end_lineno or node.lineno
    return None


def _span_by_indentation(lines: list[str], name: str) -> tuple[int, int] | None:
    pattern = re.compile(_DEF.format(name=re.escape(name)))
    start = next((i for i, line in enumerate(lines) if pattern.match(line)), None)
    if start is None:
        return None
    first = start
    while first > 0 and lines[first - 1].startswith("@"):
        first -= 1
    end = start + 1
    top_level = re.compile(r"^(?:@|def\s|async\s+def\s|class\s|[A-Za-z_])")
    while end < len(lines) and not top_level.match(lines[end]):
        end += 1
    while end > start + 1 and not lines[end - 1].strip():
        end -= 1  # keep the blank lines between functions
    return first, end


def resolve_impl(impl: str | Path | None, root: Path | None) -> Path:
    """``None`` or ``"exercises"``: the learner's folder; ``"solutions"``; or a folder."""
    if impl is None or str(impl) in ("exercises", "solutions"):
        assert root is not None
        folder = root / (str(impl) if impl is not None else "exercises")
        if folder.name == "exercises" and folder.is_symlink():
            raise ValueError(f"{folder} is a link to {folder.resolve()}, not your own folder: "
                             "checks and progress count only your own files; replace the "
                             "link with a folder (`mpgpu-edu generate` writes fresh stubs)")
        return folder
    folder = Path(impl).expanduser().resolve()
    if not folder.is_dir():
        raise ValueError(f"--impl {impl}: no such folder")
    return folder
