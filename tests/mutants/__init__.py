"""Plausible wrong answers, one module per lesson: every exercise has at least one, and its
check must reject every one (``tests/test_mutants.py``).

Each module defines ``MUTANTS: dict[str, list[str]]``, exercise id -> names of module-level
functions (or classes) in the same module, each a wrong variant of the exercise's function
with the same signature. A mutant's docstring names the mistake it makes.
"""


def failures(exercise_id: str, fn: object, only: str = "") -> dict[str, str]:
    """Every case of ``exercise_id`` (or only those whose name starts with ``only``) that
    rejects ``fn`` (both halves, in this process): its name and message."""
    from mpgpu_edu.grading.checks import cases_for

    failed = {}
    for case in cases_for(exercise_id):
        if not case.name.startswith(only):
            continue
        try:
            case.run(fn)
        except Exception as exc:  # noqa: BLE001 - a failure is what is asserted on
            failed[case.name] = f"{type(exc).__name__}: {exc}"
    return failed
