"""``mpgpu-edu progress``: per lesson, exercises done and points, from the latest checks.

    mpgpu-edu progress
    mpgpu-edu progress --refresh        # run every check first
    mpgpu-edu progress --json
"""

from __future__ import annotations

import argparse
import json

from mpgpu_edu.cli import usage_errors


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("progress", help="exercises done and points, per lesson",
                            description="Show the learner's progress from the latest checks.")
    parser.add_argument("--refresh", action="store_true",
                        help="check every exercise in exercises/ first")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from mpgpu_edu.grading import registry, runner
    from mpgpu_edu.grading.progress import CourseNotFound, find_root, progress, record

    with usage_errors(CourseNotFound):
        root = find_root()
    if args.refresh:
        results = runner.run_many(root / "exercises", list(registry.EXERCISES),
                                  display_dir="exercises")
        record(root, results)
    state = progress(root)
    print(json.dumps(state.to_dict(), indent=1) if args.json else state)
    return 0
