"""``mpgpu-edu generate``: write exercises/ from solutions/ (instructors).

    mpgpu-edu generate             # rewrite every exercise file that differs
    mpgpu-edu generate --check     # only report; exit status 1 if a file is out of date

Each part of a solution marked ``### BEGIN SOLUTION <id>`` ... ``### END SOLUTION`` becomes
the two-line stub; everything else is copied as it is. This overwrites learners' work: run
it in the course's own repository, not in a learner's copy.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from mpgpu_edu.cli import UsageError


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("generate", help="write exercises/ from solutions/ (instructors)",
                            description="Regenerate the exercise stubs from the solutions.")
    parser.add_argument("--solutions", metavar="DIR", help="default: <course>/solutions")
    parser.add_argument("--exercises", metavar="DIR", help="default: <course>/exercises")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 if a file differs")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from mpgpu_edu.grading import generate
    from mpgpu_edu.grading.progress import CourseNotFound, find_root

    try:
        root = find_root() if not (args.solutions and args.exercises) else None
    except CourseNotFound as exc:
        raise UsageError(str(exc)) from None
    solutions = Path(args.solutions) if args.solutions else root / "solutions"
    exercises = Path(args.exercises) if args.exercises else root / "exercises"
    try:
        if args.check:
            stale = generate.outdated(solutions, exercises)
            for name in stale:
                print(f"out of date: {exercises / name}")
            if not stale:
                print(f"{exercises} is up to date")
            return 1 if stale else 0
        written = generate.generate(solutions, exercises)
    except generate.GenerateError as exc:
        raise UsageError(str(exc)) from None
    for path in written:
        print(f"wrote {path}")
    if not written:
        print(f"{exercises} is up to date")
    return 0
