"""Where each strategy's demo lives: ``mpgpu-edu run STRATEGY`` and notebooks find it here.

A demo is ``run_demo(backend, world_size, steps, optimizer, **options) -> dict``: it trains
the course's small model with the strategy and compares it with single-device training. The
report has at least ``strategy, backend, world_size, steps, losses, reference_losses,
final_loss, reference_final_loss, max_abs_param_diff``.

Modules are imported only when asked for, so one strategy that is missing (or slow to
import) does not stop the others.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

RUNNERS: dict[str, str] = {
    "ps": "mpgpu_edu.ps:run_demo",
    "ddp": "mpgpu_edu.dp:run_demo",
    "pipeline": "mpgpu_edu.pipeline.runner:run_demo",
    "tp": "mpgpu_edu.tensor.runner:run_demo",
    "hybrid": "mpgpu_edu.hybrid.runner:run_demo",
}


class StrategyNotAvailable(ValueError):
    """The strategy is known, but its module (or its ``run_demo``) does not exist yet."""


def get_runner(strategy: str) -> Callable[..., dict]:
    """The ``run_demo`` of ``strategy`` (a key of ``RUNNERS``), imported now."""
    if strategy not in RUNNERS:
        raise ValueError(f"unknown strategy {strategy!r}: choose one of {', '.join(RUNNERS)}")
    module_name, attr = RUNNERS[strategy].split(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        # Only the module itself (or its package) missing means "not there yet"; a missing
        # dependency inside an existing module is a real error and propagates.
        if exc.name is None or not module_name.startswith(exc.name):
            raise
        raise StrategyNotAvailable(f"strategy {strategy!r} is not available yet") from None
    runner = getattr(module, attr, None)
    if runner is None:
        raise StrategyNotAvailable(f"strategy {strategy!r} is not available yet")
    return runner


def run_strategy(strategy: str, backend: str, world_size: int, steps: int, optimizer: str,
                 **options: Any) -> dict:
    """Run the demo of ``strategy``; see the module's docstring for the report."""
    return get_runner(strategy)(backend, world_size, steps, optimizer, **options)
