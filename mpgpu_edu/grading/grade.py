"""Grade a class: every learner's submission checked in isolation, one CSV row each.

``SUBMISSIONS_DIR`` holds one folder per learner: either a copy of the whole course folder
(with ``exercises/`` inside) or just the learner's ``exercises/`` files. Each learner's files
are copied into a private temporary folder, and each of their exercises runs in a child
process of that learner's own sandbox (``runtime.sandbox``: read-only file system, private
/tmp and /dev/shm, no network, the course's solutions and the other submissions hidden, a
process limit; everything it started is killed when the learner is done), with a time
budget, a memory limit and capped output (``runner``). The child only computes; this process
judges. A submission that crashes, hangs, exits, floods stdout or cheats costs only its own
points. Partial credit is per case. Symbolic links in a submission are not followed.

Results are written learner by learner (``on_learner``; the CLI rewrites the CSV atomically
after each), so a grader that is killed loses nothing already graded, and a run that finds
its CSV resumes after the learners it holds (``skip``).
"""

from __future__ import annotations

import csv
import html
import io
import os
import shutil
import tempfile
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path

from mpgpu_edu.grading.registry import EXERCISES, get
from mpgpu_edu.grading.report import ExerciseResult, Report, Scored, exercise_html, html_page
from mpgpu_edu.grading.runner import Limits, missing_file, run_many

MAX_PROCESSES = 256  # processes one learner's sandbox may hold at once


@dataclass
class Graded(Scored):
    """One learner's results."""

    learner: str
    folder: Path | None
    results: list[ExerciseResult]

    def notes(self) -> str:
        """The exercises that did not end normally, e.g. ``"1.3 timeout; 2.1 error"``."""
        return "; ".join(f"{r.id} {r.status}" for r in self.results
                         if r.status in ("error", "timeout"))


def find_submissions(directory: Path) -> list[tuple[str, Path | None]]:
    """(learner, folder with the exercise files or None) for every subfolder, by name."""
    directory = Path(directory)
    if not directory.is_dir():
        raise ValueError(f"{directory} is not a folder of submissions")
    found = []
    folders = [p for p in directory.iterdir() if p.is_dir() and not p.name.startswith(".")]
    for sub in sorted(folders):
        if sub.is_symlink() or (sub / "exercises").is_symlink():
            found.append((sub.name, None))  # a link could point at anything (solutions/)
        elif (sub / "exercises").is_dir():
            found.append((sub.name, sub / "exercises"))
        elif any(sub.glob("ex[0-9][0-9]_*.py")):
            found.append((sub.name, sub))
        else:
            found.append((sub.name, None))
    return found


def grade(directory: Path, ids: list[str] | None = None, limits: Limits = Limits(),
          on_result: Callable[[str, ExerciseResult], None] | None = None, *,
          isolate: bool = True, skip: Collection[str] = (),
          on_learner: Callable[[Graded], None] | None = None) -> list[Graded]:
    """Check exercises ``ids`` (default: all) for every submission in ``directory`` but the
    learners in ``skip``; ``isolate=False`` runs them in this machine's plain processes."""
    ids = [get(i).id for i in ids] if ids else list(EXERCISES)
    graded = []
    for learner, folder in find_submissions(directory):
        if learner in skip:
            continue
        if folder is None:
            results = [missing_file(get(i), f"{learner}/exercises/{get(i).filename}")
                       for i in ids]
        else:
            callback = (lambda r, who=learner: on_result(who, r)) if on_result else None
            results = _grade_one(learner, folder, ids, limits, callback, isolate, directory)
        graded.append(Graded(learner, folder, results))
        if on_learner is not None:
            on_learner(graded[-1])
    return graded


def _grade_one(learner: str, folder: Path, ids: list[str], limits: Limits,
               callback: Callable[[ExerciseResult], None] | None, isolate: bool,
               directory: Path) -> list[ExerciseResult]:
    private = tempfile.mkdtemp(prefix="mpgpu-learner-")
    server = None
    try:
        if isolate:
            from mpgpu_edu.runtime import LATER, PRELOAD
            from mpgpu_edu.runtime.sandbox import Sandbox

            # everything before the first fork: a learner's checks come one after another at
            # once, and a child forked before the later imports would repeat them itself
            server = Sandbox([m for m in PRELOAD if m != LATER], private, hide=[directory],
                             max_processes=limits.max_processes or MAX_PROCESSES,
                             name=f"sandbox of {learner}")
        return run_many(folder, ids, limits=limits, display_dir=f"{learner}/exercises",
                        on_result=callback, server=server, workdir=private, judge_here=True)
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(private, ignore_errors=True)


def csv_header(ids: list[str]) -> list[str]:
    return ["learner", *ids, "total", "max_total", "notes"]


def csv_row(g: Graded, ids: list[str]) -> list[str]:
    points = {r.id: r.points for r in g.results}
    return [g.learner, *(str(points.get(i, 0)) for i in ids), str(g.score), str(g.max_score),
            g.notes()]


def read_rows(path: Path, ids: list[str]) -> dict[str, list[str]] | None:
    """The rows of an earlier run's CSV at ``path`` by learner; ``{}`` if there is none;
    ``None`` if it is not a grades CSV of these exercises."""
    path = Path(path)
    if not path.exists():
        return {}
    try:
        with path.open(newline="") as handle:
            rows = list(csv.reader(handle))
    except (OSError, UnicodeDecodeError, csv.Error):
        return None
    if not rows or rows[0] != csv_header(ids):
        return None
    return {row[0]: row for row in rows[1:] if len(row) == len(rows[0])}


def write_rows(path: Path, rows: dict[str, list[str]], ids: list[str]) -> None:
    """The CSV, written atomically (``write_atomically``)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(csv_header(ids))
    for learner in sorted(rows):
        writer.writerow(rows[learner])
    write_atomically(Path(path), buffer.getvalue())


def write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to a temporary file beside ``path`` and rename it over ``path``: a
    reader (or a grader killed meanwhile) sees the old file or the new one, never half."""
    path = Path(path)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with temporary.open("w", newline="") as handle:
        handle.write(text)
    os.replace(temporary, path)


def write_csv(path: Path, graded: list[Graded], ids: list[str] | None = None) -> None:
    """One row per learner: points per exercise, total, and notes (errors, timeouts)."""
    ids = [get(i).id for i in ids] if ids else list(EXERCISES)
    write_rows(Path(path), {g.learner: csv_row(g, ids) for g in graded}, ids)


def to_dict(graded: list[Graded]) -> dict:
    return {"learners": [{"learner": g.learner, "score": g.score, "max_score": g.max_score,
                          **Report(g.results).to_dict()} for g in graded]}


def html_report(graded: list[Graded]) -> str:
    """A page: the class table, then every learner's exercises that did not pass."""
    ids = sorted({r.id for g in graded for r in g.results}, key=list(EXERCISES).index)
    head = "".join(f"<th>{i}</th>" for i in ids)
    rows = []
    for g in graded:
        points = {r.id: r for r in g.results}
        cells = "".join(f"<td title='{points[i].status}'>{points[i].points}</td>"
                        if i in points else "<td></td>" for i in ids)
        rows.append(f"<tr><td>{html.escape(g.learner)}</td>{cells}"
                    f"<td><b>{g.score}/{g.max_score}</b></td></tr>")
    body = [f"<h2>Grades</h2><table border='1' cellspacing='0' cellpadding='3'><tr><th>learner"
            f"</th>{head}<th>total</th></tr>{''.join(rows)}</table>"]
    for g in graded:
        body.append(f"<h3>{html.escape(g.learner)}: {g.score}/{g.max_score}</h3>")
        body += [exercise_html(r) for r in g.results if not r.passed]
    return html_page("".join(body), "mpgpu-edu grades")
