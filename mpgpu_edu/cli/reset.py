"""``mpgpu-edu reset ID``: put an exercise's stub back, changing only that function.

    mpgpu-edu reset 1.3

The exercise file is copied to ``.mpgpu/backups/<file>.<timestamp>.py`` first, every time,
and the command prints where: nothing the learner wrote is ever lost. A file that is gone is
restored whole, as handed out (its imports and every exercise of its lesson, as stubs).
"""

from __future__ import annotations

import argparse

from mpgpu_edu.cli import usage_errors


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("reset", help="restore an exercise's stub (after a backup)",
                            description="Restore the stub of one exercise in exercises/; the "
                                        "file is backed up to .mpgpu/backups/ first.")
    parser.add_argument("id", metavar="ID", help="exercise id, e.g. 1.3")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from mpgpu_edu.grading import registry
    from mpgpu_edu.grading.progress import CourseNotFound, find_root, reset

    with usage_errors(KeyError):
        exercise = registry.get(args.id)
    with usage_errors(CourseNotFound):
        root = find_root()
        missing = not (root / "exercises" / exercise.filename).is_file()
        file, saved = reset(root, exercise)
    if missing:
        print(f"{file.relative_to(root)} was missing: restored the whole file as handed out "
              f"(every exercise of lesson {exercise.lesson} as a stub)")
        return 0
    if saved is not None:
        print(f"backed up {file.relative_to(root)} to {saved.relative_to(root)}")
    print(f"restored the stub of exercise {exercise.id} (def {exercise.function}) in "
          f"{file.relative_to(root)}")
    return 0
