"""``mpgpu-edu check``: run the checks of some exercises and print the score.

    mpgpu-edu check                      # every exercise, in exercises/
    mpgpu-edu check 1.3 2                # exercise 1.3 and all of lesson 2
    mpgpu-edu check --impl solutions     # the instructors' solutions (CI)
    mpgpu-edu check 1.3 --json

Each exercise runs in its own process with a time limit (``--timeout``, seconds per
exercise). Exit status 0 when every exercise checked passed, 1 otherwise. Checking the
learner's ``exercises/`` records the results for ``mpgpu-edu progress``.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from mpgpu_edu.cli import UsageError, number, usage_errors, writable_file

MAX_TIMEOUT_S = 86_400.0  # a day per exercise


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("check", help="run the exercises' checks and print the score",
                            description="Run the checks of exercises (default: all).")
    parser.add_argument("ids", nargs="*", metavar="ID",
                        help="exercise ids such as 1.3, or lesson numbers (default: all)")
    parser.add_argument("--impl", default="exercises", metavar="exercises|solutions|DIR",
                        help="whose code: the learner's exercises/ (default), solutions/, "
                             "or a folder of exNN_*.py files")
    parser.add_argument("--timeout", type=number(float, 0.0, MAX_TIMEOUT_S, above=True),
                        default=60.0, metavar="S",
                        help="seconds per exercise, all its cases together (default 60)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--html", metavar="PATH", help="also write an HTML report")
    parser.add_argument("--verbose", "-v", action="store_true",
                        help="print every case of every exercise")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from mpgpu_edu.grading import registry, resolve_impl, runner
    from mpgpu_edu.grading.progress import CourseNotFound, find_root, record
    from mpgpu_edu.grading.report import Report, html_page, report_html

    with usage_errors(KeyError):
        ids = registry.select(args.ids)
    if args.timeout <= 0:
        raise UsageError(f"--timeout must be positive, got {args.timeout:g}")
    html_path = writable_file(args.html, "--html") if args.html else None  # before any check
    named = args.impl in ("exercises", "solutions")
    with usage_errors(CourseNotFound, ValueError):
        root = find_root() if named else None
        folder = resolve_impl(args.impl, root)
    if not folder.is_dir():
        raise UsageError(f"{folder} does not exist")

    def show(result: Any) -> None:  # progress while a long run goes on, one line each
        if not args.json and len(ids) > 1:
            print(f"  {result.id:5s} {result.status:15s} {result.points}/{result.max_points}",
                  file=sys.stderr, flush=True)

    shown = args.impl if named else str(folder)
    results = runner.run_many(folder, ids, limits=runner.Limits(timeout_s=args.timeout),
                              display_dir=shown, on_result=show)
    report = Report(results)
    if root is not None and args.impl == "exercises":
        from mpgpu_edu.grading.yours import remember

        shas = {r.id: remember(folder / registry.get(r.id).filename, r.id, r.passed)
                for r in results}
        record(root, results, shas)
    if html_path is not None:
        html_path.write_text(html_page(report_html(report), "mpgpu-edu check"))
    if args.json:
        print(json.dumps(report.to_dict(), indent=1))
    elif args.verbose:
        print(report.table() + "\n\n" + "\n\n".join(str(r) for r in results))
    else:
        print(report)
    return 0 if all(r.passed for r in results) else 1
