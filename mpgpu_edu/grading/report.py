"""Results of checks, as plain text (terminals, ``print``) and HTML (JupyterLab).

An exercise's status is one of ``STATUSES``: ``passed`` (every case passed),
``not_implemented`` (every case met the stub's NotImplementedError), ``failed`` (a case's
check did not hold), ``error`` (the code raised, or its process died) or ``timeout``.
Points are per case: a failed exercise keeps the points of the cases it passed.
"""

from __future__ import annotations

import html
import re
from dataclasses import asdict, dataclass, field

STATUSES = ("passed", "failed", "not_implemented", "error", "timeout")
_STUB = re.compile(r"Exercise (\d+\.\d+): ")
_WORD = {"passed": "PASS", "failed": "FAIL", "not_implemented": "TODO", "error": "ERROR",
         "timeout": "TIMEOUT"}
_ICON = {"passed": "✅", "failed": "❌", "not_implemented": "✏️", "error": "💥",
         "timeout": "⏱️"}
_COLOUR = {"passed": "#009E73", "failed": "#D55E00", "not_implemented": "#777777",
           "error": "#CC79A7", "timeout": "#E69F00"}


@dataclass
class CaseResult:
    """One case: its verdict, the points it earned, and what the learner should read."""

    name: str
    max_points: int
    status: str
    message: str = ""
    hidden: bool = False
    output: str = ""
    seconds: float = 0.0
    text: str = ""

    @property
    def points(self) -> int:
        return self.max_points if self.status == "passed" else 0


def exercise_status(cases: list[CaseResult]) -> str:
    """Every case passed: passed; every case not implemented: not_implemented; otherwise the
    worst of timeout, error, failed among the rest."""
    statuses = {case.status for case in cases}
    if not cases:
        return "error"
    if statuses == {"passed"}:
        return "passed"
    if statuses == {"not_implemented"}:
        return "not_implemented"
    for status in ("timeout", "error", "failed", "not_implemented"):
        if status in statuses:
            return "failed" if status == "not_implemented" else status
    return "failed"


@dataclass
class ExerciseResult:
    """The outcome of one exercise's checks. ``str()`` is a plain-text report; in JupyterLab
    the result shows as HTML (``_repr_html_``), with a timeline figure where one helps."""

    id: str
    title: str
    status: str
    max_points: int
    cases: list[CaseResult] = field(default_factory=list)
    hint: str = ""
    file: str = ""
    function: str = ""
    notebook: str = ""
    message: str = ""
    figure_png: str = ""
    ran_in: str = "a separate process"
    seconds: float = 0.0

    @property
    def points(self) -> int:
        return sum(case.points for case in self.cases)

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    @property
    def waits_on(self) -> list[str]:
        """The other exercises whose stubs this one's cases stopped at (8.2 calls 8.1's
        ``shard_of``): a learner who wrote this one sees why it still reads not implemented."""
        found: list[str] = []
        for case in self.cases:
            match = _STUB.match(case.message or "") if case.status == "not_implemented" else None
            if match and match.group(1) != self.id and match.group(1) not in found:
                found.append(match.group(1))
        return found

    @property
    def verdict(self) -> str:
        """The status in words; with every point earned but a case failed, that the failed
        case earns no points (shown only: a fact the grader cannot re-derive) and is still
        wrong, so the exercise is not done."""
        words = self.status.replace("_", " ")
        if self.waits_on:
            words += ": it calls " + " and ".join(f"exercise {i}" for i in self.waits_on)
            words += ", still a stub"
        unscored = [c for c in self.cases if c.max_points == 0 and c.status != "passed"]
        if self.status != "passed" and unscored and self.points == self.max_points:
            words += ": every point earned, but a case that earns no points failed"
        return words

    def to_dict(self, figure: bool = False) -> dict:
        data = asdict(self)
        data["points"] = self.points
        data["cases"] = [dict(asdict(c), points=c.points) for c in self.cases]
        if not figure:
            data.pop("figure_png")
        return data

    def __str__(self) -> str:
        lines = [f"{_WORD[self.status]:7s} Exercise {self.id} {self.title}: "
                 f"{self.points}/{self.max_points} points ({self.verdict})"]
        if self.message:
            lines += ["  " + line for line in self.message.splitlines()]
        lines += [f"  {line}" for line in self._waiting_lines()]
        for case in self.cases:
            lines.append(f"  {_WORD[case.status]:7s} {case.name} "
                         f"({case.points}/{case.max_points})")
            if case.status not in ("passed", "not_implemented") and case.message:
                lines += ["          " + line for line in case.message.splitlines()]
            if case.text and case.status != "passed":
                lines += ["          " + line for line in case.text.splitlines()]
            if case.output and case.status != "passed":
                lines += ["          | " + line for line in case.output.splitlines()[-20:]]
        if not self.passed and self.hint:
            lines.append(f"  Hint: {self.hint}")
        if not self.passed and self.file:
            lines.append(f"  Your code: {self.file}, def {self.function}; "
                         f"lesson: {self.notebook}")
        if self.ran_in != "a separate process":
            lines.append(f"  Checked in {self.ran_in}.")
        return "\n".join(lines)

    def _waiting_lines(self) -> list[str]:
        return [f"Your code calls exercise {i}'s function, still a stub (NotImplementedError): "
                f"solve {i} first, then check this one again." for i in self.waits_on]

    def __repr__(self) -> str:
        return (f"<ExerciseResult {self.id} {self.status} {self.points}/{self.max_points} "
                f"points>")

    def _repr_html_(self) -> str:
        return exercise_html(self)


def _esc(text: str) -> str:
    return html.escape(text, quote=True)


def exercise_html(result: ExerciseResult) -> str:
    """One exercise as an HTML card: verdict, per-case table, hint, figure."""
    colour = _COLOUR[result.status]
    parts = [f'<div style="border-left:4px solid {colour};padding:4px 10px;margin:4px 0;'
             'font-family:sans-serif;font-size:13px">',
             f"<div><b>{_ICON[result.status]} Exercise {_esc(result.id)}: "
             f"{_esc(result.title)}</b> &mdash; {result.points}/{result.max_points} points "
             f'<span style="color:{colour}">({_esc(result.verdict)})</span></div>']
    if result.message:
        parts.append(f'<pre style="white-space:pre-wrap;margin:4px 0">'
                     f"{_esc(result.message)}</pre>")
    for line in result._waiting_lines():
        parts.append(f"<div>{_esc(line)}</div>")
    parts.append('<table style="border-collapse:collapse;margin:4px 0">')
    for case in result.cases:
        detail = ""
        if case.status != "passed" and case.status != "not_implemented" and case.message:
            detail = (f'<pre style="white-space:pre-wrap;margin:2px 0;color:#444">'
                      f"{_esc(case.message)}</pre>")
        if case.text and case.status != "passed":
            detail += f'<pre style="margin:2px 0">{_esc(case.text)}</pre>'
        if case.output and case.status != "passed":
            detail += (f'<details><summary>printed output</summary><pre>{_esc(case.output)}'
                       "</pre></details>")
        parts.append(f'<tr><td style="vertical-align:top;padding:1px 6px">'
                     f"{_ICON[case.status]}</td><td style='text-align:left;padding:1px 6px'>"
                     f"{_esc(case.name)} <span style='color:#777'>({case.points}/"
                     f"{case.max_points})</span>{detail}</td></tr>")
    parts.append("</table>")
    if not result.passed and result.hint:
        parts.append(f"<div><b>Hint:</b> {_esc(result.hint)}</div>")
    if not result.passed and result.file:
        parts.append(f'<div style="color:#777">Your code: <code>{_esc(result.file)}</code>, '
                     f"<code>def {_esc(result.function)}</code> &middot; "
                     f"{_esc(result.notebook)}</div>")
    if result.figure_png:
        parts.append(f'<img style="max-width:100%;margin-top:6px" alt="timeline" '
                     f'src="data:image/png;base64,{result.figure_png}"/>')
    parts.append(f'<div style="color:#999;font-size:11px">checked in {_esc(result.ran_in)}, '
                 f"{result.seconds:.1f} s</div></div>")
    return "".join(parts)


class Scored:
    """Points added up: ``score`` out of ``max_score``, over the parts that ``_parts`` names
    (``results``: a report's or a learner's; a learner's progress adds up its lessons)."""

    _parts = "results"

    @property
    def score(self) -> int:
        return sum(part.points for part in getattr(self, self._parts))

    @property
    def max_score(self) -> int:
        return sum(part.max_points for part in getattr(self, self._parts))


@dataclass
class Report(Scored):
    """Several exercises' results: a table with a total score."""

    results: list[ExerciseResult]

    def to_dict(self) -> dict:
        return {"exercises": [r.to_dict() for r in self.results], "score": self.score,
                "max_score": self.max_score}

    def table(self) -> str:
        width = max([len(r.title) for r in self.results] + [5])
        lines = [f"{'id':4s}  {'exercise':{width}s}  {'status':15s}  points"]
        for r in self.results:
            lines.append(f"{r.id:4s}  {r.title:{width}s}  {r.status:15s}  "
                         f"{r.points:>3d}/{r.max_points}")
        lines.append(f"{'':4s}  {'total':{width}s}  {'':15s}  {self.score:>3d}/{self.max_score}")
        return "\n".join(lines)

    def __str__(self) -> str:
        details = [str(r) for r in self.results if not r.passed]
        return "\n\n".join([self.table(), *details])

    def _repr_html_(self) -> str:
        return report_html(self)


def report_html(report: Report, title: str = "mpgpu-edu checks") -> str:
    """A summary table, then every exercise's card."""
    rows = "".join(
        f"<tr><td>{_esc(r.id)}</td><td style='text-align:left'>{_esc(r.title)}</td>"
        f"<td>{_ICON[r.status]} {r.status.replace('_', ' ')}</td>"
        f"<td>{r.points}/{r.max_points}</td></tr>" for r in report.results)
    return (f"<div style='font-family:sans-serif'><h3>{_esc(title)}: {report.score}/"
            f"{report.max_score} points</h3><table><tr><th>id</th><th>exercise</th>"
            f"<th>status</th><th>points</th></tr>{rows}</table>"
            + "".join(exercise_html(r) for r in report.results) + "</div>")


def html_page(body: str, title: str) -> str:
    """A standalone HTML page around ``body``."""
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{_esc(title)}</title>"
            f"</head><body>{body}</body></html>\n")
