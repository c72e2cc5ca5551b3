"""Grade a class: every learner's submission checked in isolation, one CSV row each.

``SUBMISSIONS_DIR`` holds one folder per learner: either a copy of the whole course folder
(with ``exercises/`` inside) or just the learner's ``exercises/`` files. Each exercise of each
learner runs in its own child process with a time budget, a memory limit and capped output
(``runner``), so a submission that crashes, hangs, exits or floods stdout costs only its own
points. Partial credit is per case. Submissions are copied before they are imported, so
grading changes no file.
"""

from __future__ import annotations

import csv
import html
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from mpgpu_edu.grading.registry import EXERCISES, get
from mpgpu_edu.grading.report import ExerciseResult, Report, exercise_html, html_page
from mpgpu_edu.grading.runner import Limits, missing_file, run_many


@dataclass
class Graded:
    """One learner's results."""

    learner: str
    folder: Path | None
    results: list[ExerciseResult]

    @property
    def score(self) -> int:
        return sum(r.points for r in self.results)

    @property
    def max_score(self) -> int:
        return sum(r.max_points for r in self.results)

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
        if (sub / "exercises").is_dir():
            found.append((sub.name, sub / "exercises"))
        elif any(sub.glob("ex[0-9][0-9]_*.py")):
            found.append((sub.name, sub))
        else:
            found.append((sub.name, None))
    return found


def grade(directory: Path, ids: list[str] | None = None, limits: Limits = Limits(),
          on_result: Callable[[str, ExerciseResult], None] | None = None) -> list[Graded]:
    """Check exercises ``ids`` (default: all) for every submission in ``directory``."""
    ids = [get(i).id for i in ids] if ids else list(EXERCISES)
    graded = []
    for learner, folder in find_submissions(directory):
        if folder is None:
            results = [missing_file(get(i), f"{learner}/exercises/{get(i).filename}")
                       for i in ids]
        else:
            callback = (lambda r, who=learner: on_result(who, r)) if on_result else None
            results = run_many(folder, ids, limits=limits, display_dir=f"{learner}/exercises",
                               on_result=callback)
        graded.append(Graded(learner, folder, results))
    return graded


def write_csv(path: Path, graded: list[Graded], ids: list[str] | None = None) -> None:
    """One row per learner: points per exercise, total, and notes (errors, timeouts)."""
    ids = [get(i).id for i in ids] if ids else list(EXERCISES)
    with Path(path).open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["learner", *ids, "total", "max_total", "notes"])
        for g in graded:
            points = {r.id: r.points for r in g.results}
            writer.writerow([g.learner, *(points.get(i, 0) for i in ids), g.score, g.max_score,
                             g.notes()])


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
