"""``mpgpu-edu grade``: grade a class, one learner per folder, into a CSV.

    mpgpu-edu grade submissions/ --csv grades.csv
    mpgpu-edu grade submissions/ --csv grades.csv --ids 1 3.2 --timeout 30 --html grades.html

Every subfolder of SUBMISSIONS_DIR is one learner: a copy of the course folder or just their
exercises/ files. Each learner runs in their own sandbox (bubblewrap; ``--no-isolation``
grades without one, for submissions you trust) and each exercise in its own process (time
budget ``--timeout`` per exercise, ``--memory`` GiB, capped output); a submission that
crashes, hangs, exits or cheats loses only the points of what it broke, and grading goes on.
No submitted file is changed. The CSV is rewritten after every learner; a run that finds its
CSV (same exercises) resumes after the learners already in it (``--fresh``: start over).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from mpgpu_edu.cli import UsageError, number, usage_errors, writable_file

MAX_TIMEOUT_S, MAX_MEMORY_GIB = 86_400.0, 1024.0  # a day per exercise; 1 TiB
LAYOUT = ("one subfolder per learner, holding exercises/exNN_*.py (a copy of the course) or "
          "the exNN_*.py files themselves, e.g. {folder}/alice/exercises/ex01_communication.py")


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("grade", help="grade every submission in a folder into a CSV",
                            description="Grade each learner's submission in isolation.")
    parser.add_argument("submissions", metavar="SUBMISSIONS_DIR",
                        help="one subfolder per learner")
    parser.add_argument("--csv", required=True, metavar="PATH", help="write the grades here")
    parser.add_argument("--ids", nargs="*", metavar="ID",
                        help="exercise ids or lesson numbers (default: all)")
    parser.add_argument("--timeout", type=number(float, 0.0, MAX_TIMEOUT_S, above=True),
                        default=60.0, metavar="S",
                        help="seconds per exercise and learner (default 60)")
    parser.add_argument("--memory", type=number(float, 0.0, MAX_MEMORY_GIB, above=True),
                        default=4.0, metavar="GIB",
                        help="memory a check may allocate, GiB (default 4)")
    parser.add_argument("--no-isolation", action="store_true",
                        help="grade without a sandbox (only for submissions you trust: they "
                             "could then read solutions/ and write outside their folder)")
    parser.add_argument("--fresh", action="store_true",
                        help="grade every learner again, even those already in the CSV "
                             "(default: resume after them)")
    parser.add_argument("--json", action="store_true",
                        help="also print the grades as one JSON object at the end")
    parser.add_argument("--json-file", metavar="PATH",
                        help="also write the grades as one JSON object to PATH, rewritten "
                             "after every learner")
    parser.add_argument("--html", metavar="PATH", help="also write an HTML report")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from mpgpu_edu.grading import grade, registry, runner
    from mpgpu_edu.grading.grade import find_submissions

    with usage_errors(KeyError):
        ids = registry.select(args.ids)
    folder = Path(args.submissions)
    if not folder.is_dir():
        raise UsageError(f"{folder} is not a folder: give a folder with "
                         + LAYOUT.format(folder=folder))
    if args.timeout <= 0 or args.memory <= 0:
        raise UsageError("--timeout and --memory must be positive")
    found = find_submissions(folder)
    if not any(exercises is not None for _, exercises in found):
        what = (f"its {len(found)} subfolder(s) hold no exercise files" if found
                else "it is empty")
        raise UsageError(f"no learner submissions in {folder} ({what}): expected "
                         + LAYOUT.format(folder=folder))
    csv_path = writable_file(args.csv, "--csv")  # before any grading
    html_path = writable_file(args.html, "--html") if args.html else None
    json_path = writable_file(args.json_file, "--json-file") if args.json_file else None
    if not args.no_isolation:
        from mpgpu_edu.runtime.sandbox import problem

        why = problem()
        if why is not None:
            raise UsageError(f"cannot isolate the submissions: {why}; or pass --no-isolation "
                             "to grade them in plain processes (only if you trust them)")
    rows = {} if args.fresh else grade.read_rows(csv_path, ids)
    if rows is None:
        raise UsageError(f"{args.csv} holds something other than grades of these exercises: "
                         "give another --csv path, or remove the file")
    if rows:
        print(f"resuming: {len(rows)} learner(s) already graded in {args.csv}",
              file=sys.stderr, flush=True)
    limits = runner.Limits(timeout_s=args.timeout, memory_bytes=int(args.memory * 2**30))

    def show(learner: str, result: object) -> None:
        print(f"  {learner}: {result!r}", file=sys.stderr, flush=True)

    done: list[grade.Graded] = []

    def save(graded: grade.Graded) -> None:  # after every learner: nothing graded is lost
        rows[graded.learner] = grade.csv_row(graded, ids)
        grade.write_rows(csv_path, rows, ids)
        done.append(graded)
        if html_path is not None:
            grade.write_atomically(html_path, grade.html_report(done))
        if json_path is not None:
            grade.write_atomically(json_path, json.dumps(grade.to_dict(done), indent=1) + "\n")

    graded = grade.grade(folder, ids, limits, on_result=show, isolate=not args.no_isolation,
                         skip=set(rows), on_learner=save)
    grade.write_rows(csv_path, rows, ids)
    if html_path is not None:
        grade.write_atomically(html_path, grade.html_report(graded))
    if json_path is not None:
        grade.write_atomically(json_path, json.dumps(grade.to_dict(graded), indent=1) + "\n")
    if args.json:
        print(json.dumps(grade.to_dict(graded), indent=1))
    else:
        for g in graded:
            notes = f"  ({g.notes()})" if g.notes() else ""
            print(f"{g.learner}: {g.score}/{g.max_score}{notes}")
        print(f"wrote {args.csv}")
    return 0
