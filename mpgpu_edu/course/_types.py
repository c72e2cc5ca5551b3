"""The shapes of the course's data: an exercise, a prediction. Plain data, no torch."""

from __future__ import annotations

from dataclasses import dataclass

# lesson number -> (exercise module, notebook), filled as each ``Lesson`` is made, so that an
# exercise names its files without importing the package above it.
LESSON_FILES: dict[int, tuple[str, str]] = {}

WARM_UP, CAPSTONE = "warm-up", "capstone"


@dataclass(frozen=True)
class Exercise:
    """One exercise: ``function`` in ``exercises/<module>.py``, worth ``points``.

    ``hints`` holds three levels, revealed one per call of ``mp.hint``: the idea, the
    structure, near-code. ``kind`` is a warm-up (one idea, a few lines) or a capstone (a
    whole mechanism, 20-60 lines); capstones hold at least half of each lesson's points.
    """

    id: str
    function: str
    title: str
    points: int
    hints: tuple[str, str, str]
    kind: str = WARM_UP

    @property
    def lesson(self) -> int:
        return int(self.id.split(".")[0])

    @property
    def hint(self) -> str:
        """Where to get a hint (shown with a failed check: the hints themselves are tiered)."""
        return f'mp.hint("{self.id}") (or: mpgpu-edu hint {self.id}) gives the next hint'

    @property
    def module(self) -> str:
        """File stem in ``exercises/`` and ``solutions/``, e.g. ``"ex01_communication"``."""
        return LESSON_FILES[self.lesson][0]

    @property
    def filename(self) -> str:
        return f"{self.module}.py"

    @property
    def notebook(self) -> str:
        return LESSON_FILES[self.lesson][1]


@dataclass(frozen=True)
class Prediction:
    """A question asked before the cell that answers it (predict, then run).

    ``answer`` is the index of the right choice; ``why`` is shown when it is revealed. The
    cell that runs the experiment passes what it measured to ``mp.reveal``, so a choice
    that the simulator no longer bears out is caught (strict runs raise).
    """

    key: str
    question: str
    choices: tuple[str, ...]
    answer: int
    why: str


@dataclass(frozen=True)
class Lesson:
    """One lesson: its number, title, exercise module, notebook, exercises, predictions,
    and the exercises whose learner code the lesson's demos run once they pass."""

    number: int
    title: str
    module: str
    notebook: str
    exercises: tuple[Exercise, ...]
    predictions: tuple[Prediction, ...] = ()
    drives_demos: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        LESSON_FILES[self.number] = (self.module, self.notebook)


def ex(id: str, function: str, title: str, points: int,  # noqa: A002 - the exercise's id
       hints: tuple[str, str, str], kind: str = WARM_UP) -> Exercise:
    return Exercise(id, function, title, points, tuple(hints), kind)  # type: ignore[arg-type]
