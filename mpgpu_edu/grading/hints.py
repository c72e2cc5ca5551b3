"""Tiered hints: each call of ``mp.hint("3.3")`` (or ``mpgpu-edu hint 3.3``) reveals the next
level: 1 the idea, 2 the structure, 3 near-code. The level reached is kept with the learner's
progress (``.mpgpu/progress.json``), shared by notebook and command line;
``mp.hint("3.3", reset=True)`` starts again at the idea.
"""

from __future__ import annotations

import html
from dataclasses import dataclass

from mpgpu_edu.grading.registry import Exercise, get

LEVELS = ("the idea", "the structure", "near-code")

# Where no course folder is found (a bare install), levels are kept for this process only.
_LEVELS_HERE: dict[str, int] = {}


@dataclass(frozen=True)
class Hint:
    """The hints of one exercise revealed so far (``level`` of 3)."""

    exercise: Exercise
    level: int

    @property
    def shown(self) -> list[str]:
        return list(self.exercise.hints[:self.level])

    def __str__(self) -> str:
        e = self.exercise
        lines = [f"Exercise {e.id}, {e.title}: hint {self.level} of {len(LEVELS)}"]
        for number, (name, text) in enumerate(zip(LEVELS, self.shown), start=1):
            if "\n" in text:  # code: on lines of its own, indented as a block
                lines.append(f"  {number}. {name}:")
                lines += [f"       {line}" for line in text.splitlines()]
            else:
                lines.append(f"  {number}. {name}: {text}")
        if self.level < len(LEVELS):
            lines.append(f'  (call mp.hint("{e.id}") again for {LEVELS[self.level]})')
        return "\n".join(lines)

    def __repr__(self) -> str:
        return str(self)

    def _repr_html_(self) -> str:
        e = self.exercise
        items = "".join(
            f"<li><b>{html.escape(name)}</b>:<pre style='margin:0.2em 0'>{html.escape(text)}</pre></li>"
            if "\n" in text else
            f"<li><b>{html.escape(name)}</b>: <span style='white-space:pre-wrap'>"
            f"{html.escape(text)}</span></li>" for name, text in zip(LEVELS, self.shown))
        more = (f"<div><i>call mp.hint(\"{e.id}\") again for {LEVELS[self.level]}</i></div>"
                if self.level < len(LEVELS) else "")
        return (f"<div><b>Exercise {e.id}, {html.escape(e.title)}</b>: hint {self.level} of "
                f"{len(LEVELS)}<ol>{items}</ol>{more}</div>")


def hint(exercise_id: str, *, reset: bool = False, root: str | None = None) -> Hint:
    """Reveal the next hint of exercise ``exercise_id`` (up to the third) and return all
    revealed so far. ``reset=True`` forgets the level reached (and reveals nothing)."""
    from pathlib import Path

    from mpgpu_edu.grading.progress import CourseNotFound, find_root, read_state, update_state

    try:
        exercise = get(exercise_id)
    except KeyError as exc:
        raise ValueError(exc.args[0]) from None
    try:
        folder: Path | None = Path(root) if root is not None else find_root()
    except CourseNotFound:
        folder = None
    if folder is None:
        level = 0 if reset else min(_LEVELS_HERE.get(exercise.id, 0) + 1, len(LEVELS))
        _LEVELS_HERE[exercise.id] = level
        return Hint(exercise, level)
    if reset:
        update_state(folder, "hints", exercise.id, None)
        return Hint(exercise, 0)
    entry = read_state(folder).get("hints", {}).get(exercise.id, {})
    level = min(int(entry.get("level", 0)) + 1, len(LEVELS))
    update_state(folder, "hints", exercise.id, {"level": level})
    return Hint(exercise, level)
