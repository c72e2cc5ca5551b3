"""Plausible wrong answers, one module per lesson: every exercise has at least one, and its
check must reject every one (``tests/test_mutants.py``).

Each module defines ``MUTANTS: dict[str, list[str]]``, exercise id -> names of module-level
functions (or classes) in the same module, each a wrong variant of the exercise's function
with the same signature. A mutant's docstring names the mistake it makes.
"""
