"""Prove that the lessons' demos run the learner's code, not only the checks.

    python -m tests.instrument OUT            # OUT: a copy of solutions/ whose exercise
                                              # functions log every call made outside a check
    MPGPU_EDU_IMPL=OUT MPGPU_EDU_CALL_LOG=LOG  (run the notebooks)
    python -m tests.instrument --verify LOG   # every lesson's demo exercises were called

A call is logged when it happens outside a grading child process (``_child`` marks those with
``MPGPU_EDU_GRADING_CHILD``): that is, from a notebook's demo cells, through ``mp.yours``.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

WRAPPER = '''

# ---- added by tests/instrument.py: log calls made outside the checks -----------------------
def _mpgpu_log_calls(exercise_id, target):
    import functools
    import os

    def note():
        log = os.environ.get("MPGPU_EDU_CALL_LOG")
        if log and not os.environ.get("MPGPU_EDU_GRADING_CHILD"):
            with open(log, "a") as stream:
                stream.write(exercise_id + "\\n")

    if isinstance(target, type):
        original_init = target.__init__

        @functools.wraps(original_init)
        def __init__(self, *args, **kwargs):
            note()
            original_init(self, *args, **kwargs)

        target.__init__ = __init__
        return target

    @functools.wraps(target)
    def logged(*args, **kwargs):
        note()
        return target(*args, **kwargs)

    return logged


for _mpgpu_id, _mpgpu_name in {pairs!r}:
    globals()[_mpgpu_name] = _mpgpu_log_calls(_mpgpu_id, globals()[_mpgpu_name])
'''


def instrument(out: Path) -> list[Path]:
    """Copy ``solutions/`` to ``out`` with every exercise function wrapped by the logger."""
    from mpgpu_edu.grading.registry import by_module

    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    written = []
    for source in sorted((ROOT / "solutions").glob("ex*.py")):
        pairs = [(e.id, e.function) for e in by_module(source.stem)]
        target = out / source.name
        target.write_text(source.read_text() + WRAPPER.format(pairs=pairs))
        written.append(target)
    return written


def verify(log: Path) -> list[str]:
    """The lessons' demo exercises (``drives_demos``) that were never called by a demo."""
    from mpgpu_edu.course import LESSONS

    called = set(log.read_text().split()) if log.is_file() else set()
    return [e for lesson in LESSONS.values() for e in lesson.drives_demos if e not in called]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("path", type=Path)
    parser.add_argument("--verify", action="store_true")
    args = parser.parse_args(argv)
    if args.verify:
        missing = verify(args.path)
        if missing:
            print(f"demo cells never ran the learner's code of: {', '.join(missing)} "
                  f"(log: {args.path})", file=sys.stderr)
            return 1
        print("every lesson's demos ran the learner's functions")
        return 0
    for path in instrument(args.path):
        print(f"instrumented {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
