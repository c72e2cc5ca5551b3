"""``mpgpu-edu hint ID``: the next hint of an exercise (the same level as ``mp.hint``).

    mpgpu-edu hint 3.3            # 1 the idea, then 2 the structure, then 3 near-code
    mpgpu-edu hint 3.3 --reset    # start again at the idea
"""

from __future__ import annotations

import argparse
import json

from mpgpu_edu.cli import usage_errors


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("hint", help="the next hint of an exercise (idea, structure, "
                                         "near-code)",
                            description="Reveal the next of three hints of one exercise; the "
                                        "level is kept with your progress (shared with "
                                        "mp.hint in the notebooks).")
    parser.add_argument("id", metavar="ID", help="exercise id, e.g. 3.3")
    parser.add_argument("--reset", action="store_true", help="forget the hints revealed")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from mpgpu_edu.grading.hints import hint

    with usage_errors(ValueError):
        shown = hint(args.id, reset=args.reset)
    if args.json:
        print(json.dumps({"id": shown.exercise.id, "level": shown.level,
                          "hints": shown.shown}))
    elif args.reset:
        print(f"hints of exercise {shown.exercise.id} reset: the next one is the idea")
    else:
        print(shown)
    return 0
