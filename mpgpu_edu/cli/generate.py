"""``mpgpu-edu generate``: write exercises/ from solutions/ (instructors).

    mpgpu-edu generate             # rewrite every exercise file that differs
    mpgpu-edu generate --check     # only report; exit status 1 if a file is out of date

Each part of a solution marked ``### BEGIN SOLUTION <id>`` ... ``### END SOLUTION`` becomes
the two-line stub; everything else is copied as it is. Meant for the course's own repository,
not a learner's copy: but an exercise file it replaces may hold a learner's work, so every
one is copied to ``.mpgpu/backups/<file>.<timestamp>.py`` first, always, and the command
prints where (as ``mpgpu-edu reset`` does).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from mpgpu_edu.cli import usage_errors


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("generate", help="write exercises/ from solutions/ (instructors)",
                            description="Regenerate the exercise stubs from the solutions.")
    parser.add_argument("--solutions", metavar="DIR", help="default: <course>/solutions")
    parser.add_argument("--exercises", metavar="DIR", help="default: <course>/exercises")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 if a file differs")
    parser.add_argument("--backups", metavar="DIR",
                        help="where to copy each exercise file before replacing it "
                             "(default: .mpgpu/backups next to the exercises folder)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from mpgpu_edu.grading import generate
    from mpgpu_edu.grading.progress import CourseNotFound, find_root

    with usage_errors(CourseNotFound):
        root = find_root() if not (args.solutions and args.exercises) else None
    solutions = Path(args.solutions) if args.solutions else root / "solutions"
    exercises = Path(args.exercises) if args.exercises else root / "exercises"
    with usage_errors(generate.GenerateError):
        if args.check:
            stale = generate.outdated(solutions, exercises)
            for name in stale:
                print(f"out of date: {exercises / name}")
            if not stale:
                print(f"{exercises} is up to date")
            return 1 if stale else 0
        written = generate.generate(solutions, exercises,
                                    Path(args.backups) if args.backups else None)
    for path, saved in written:
        if saved is not None:
            print(f"backed up {path} to {saved}")
        print(f"wrote {path}")
    if not written:
        print(f"{exercises} is up to date")
    return 0
