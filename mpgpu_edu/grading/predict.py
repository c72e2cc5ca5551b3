"""Predict, then run: a question asked before the cell that answers it.

    mp.predict("01.ring-vs-naive")          # shows the question and its choices
    ...the cell that runs the experiment...
    mp.reveal("01.ring-vs-naive", measured=choice_the_run_bears_out)

In JupyterLab the choices are buttons, and the learner's choice is recorded in
``.mpgpu/progress.json``; in a headless run ``predict`` prints the question and goes on.
``predict(key, choice=1)`` records a choice without buttons. ``reveal`` compares the recorded
choice with the answer and says why; ``measured`` (the index or text of the choice the run
bears out) guards the lesson's answer: when the run disagrees, ``reveal`` says so, and in a
strict run (``MPGPU_EDU_STRICT=1``, as CI runs the notebooks) it raises.
"""

from __future__ import annotations

import datetime as _dt
import os
import string
from typing import Any

from mpgpu_edu.course import Prediction, prediction

_CHOICES_HERE: dict[str, int] = {}  # where no course folder is found: this process only


def predict(key: str, *, choice: int | str | None = None) -> None:
    """Ask prediction ``key``; with ``choice`` (index or text), record that answer."""
    item = _get(key)
    if choice is not None:
        _record(item, _index(item, choice))
    print(_question_text(item))
    if choice is None:
        _show_buttons(item)
    else:
        print(f"recorded: ({string.ascii_lowercase[_index(item, choice)]})")


def reveal(key: str, measured: int | str | None = None) -> None:
    """Show the answer of prediction ``key`` beside the learner's recorded choice."""
    item = _get(key)
    letters = string.ascii_lowercase
    lines = []
    chosen = _recorded(item)
    if chosen is None:
        lines.append("You did not choose (a headless run, or no click).")
    else:
        verdict = "right" if chosen == item.answer else "not quite"
        lines.append(f"You predicted ({letters[chosen]}) {item.choices[chosen]}: {verdict}.")
    lines.append(f"Answer: ({letters[item.answer]}) {item.choices[item.answer]}. {item.why}")
    if measured is not None:
        seen = _index(item, measured)
        if seen != item.answer:
            message = (f"prediction {key}: this run bears out ({letters[seen]}) "
                       f"{item.choices[seen]}, but the lesson's answer is "
                       f"({letters[item.answer]}); the lesson needs updating")
            if os.environ.get("MPGPU_EDU_STRICT", "") not in ("", "0", "false", "no"):
                raise AssertionError(message)
            lines.append("Note: " + message)
    print("\n".join(lines))


def _get(key: str) -> Prediction:
    try:
        return prediction(key)
    except KeyError as exc:
        raise ValueError(exc.args[0]) from None


def _index(item: Prediction, choice: int | str) -> int:
    if isinstance(choice, bool) or not isinstance(choice, (int, str)):
        raise ValueError(f"choice must be an index or one of {list(item.choices)}")
    if isinstance(choice, str):
        if choice in item.choices:
            return item.choices.index(choice)
        letter = choice.strip().lower()
        if len(letter) == 1 and letter in string.ascii_lowercase[:len(item.choices)]:
            return string.ascii_lowercase.index(letter)
        raise ValueError(f"{choice!r} is not a choice of {item.key}: {list(item.choices)}")
    if not 0 <= choice < len(item.choices):
        raise ValueError(f"choice {choice} of {item.key}: choose 0..{len(item.choices) - 1}")
    return choice


def _question_text(item: Prediction) -> str:
    letters = string.ascii_lowercase
    lines = [f"Predict: {item.question}"]
    lines += [f"  ({letters[i]}) {text}" for i, text in enumerate(item.choices)]
    return "\n".join(lines)


def _root() -> Any:
    from mpgpu_edu.grading.progress import CourseNotFound, find_root

    try:
        return find_root()
    except CourseNotFound:
        return None


def _record(item: Prediction, index: int) -> None:
    from mpgpu_edu.grading.progress import update_state

    root = _root()
    if root is None:
        _CHOICES_HERE[item.key] = index
        return
    update_state(root, "predictions", item.key, {
        "choice": index, "at": _dt.datetime.now().isoformat(timespec="seconds")})


def _recorded(item: Prediction) -> int | None:
    from mpgpu_edu.grading.progress import read_state

    root = _root()
    if root is None:
        return _CHOICES_HERE.get(item.key)
    entry = read_state(root).get("predictions", {}).get(item.key)
    if not isinstance(entry, dict) or not isinstance(entry.get("choice"), int):
        return None
    choice = entry["choice"]
    return choice if 0 <= choice < len(item.choices) else None


def _show_buttons(item: Prediction) -> None:
    """Buttons in a notebook front end; nothing where ipywidgets or a display is missing."""
    try:
        import ipywidgets as widgets
        from IPython import get_ipython
        from IPython.display import display
    except ImportError:
        return
    if get_ipython() is None:
        return
    letters = string.ascii_lowercase
    buttons = widgets.ToggleButtons(
        options=[(f"({letters[i]})", i) for i in range(len(item.choices))], value=None,
        description="Your guess:", tooltips=list(item.choices))
    status = widgets.Label("")

    def chosen(change: dict) -> None:
        if change.get("new") is not None:
            _record(item, int(change["new"]))
            status.value = f"recorded ({letters[change['new']]}); now run the next cell"

    buttons.observe(chosen, names="value")
    box = widgets.VBox([buttons, status])
    box.add_class("mpgpu-predict")
    display(box)
