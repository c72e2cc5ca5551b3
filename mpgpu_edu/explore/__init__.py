"""Explorers: the course's figures with controls, redrawn live in a notebook.

Each explorer is two functions: a *view* that returns ``(figure, info)`` for given settings
(plain Python, what tests and scripts call) and a widget that wraps the view in controls.

    from mpgpu_edu.explore import pipeline_explorer
    pipeline_explorer()            # in a notebook cell: sliders, timeline, bubble, memory

| widget                      | view                 | shows                                      |
|-----------------------------|----------------------|--------------------------------------------|
| ``pipeline_explorer()``     | ``pipeline_view``    | schedule timeline, bubble, activations     |
| ``dp_explorer()``           | ``dp_view``          | one DDP step's timeline, speedup           |
| ``memory_calculator()``     | ``memory_view``      | bytes per device by category; fits or not  |
| ``visible_devices_sandbox()`` | ``visible_view``   | CUDA_VISIBLE_DEVICES: physical -> cuda:i   |
| ``ring_stepper()``          | ``ring_view``        | ring all-reduce, step by step              |
| ``tp_explorer()``           | ``tp_view``          | Megatron MLP split N ways: compute vs      |
|                             |                      | all-reduce time, bytes per link            |

Nothing here trains a model: pipelines are timed from their schedule, DDP runs one step on
meta tensors (shapes without data) on the simulator, and so does the tensor-parallel MLP block.
"""

from __future__ import annotations

import importlib
from typing import Any

# name -> module; imported on first use, so that one explorer does not load every other's
# dependencies (the DDP explorer needs the simulator, the sandbox needs nothing).
_EXPORTS = {
    "Explorer": "live",
    "pipeline_explorer": "pipeline", "pipeline_view": "pipeline",
    "dp_explorer": "dp", "dp_view": "dp",
    "memory_calculator": "memory", "memory_view": "memory",
    "visible_devices_sandbox": "visible", "visible_view": "visible",
    "ring_stepper": "ring", "ring_view": "ring",
    "tp_explorer": "tensor", "tp_view": "tensor",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'mpgpu_edu.explore' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + list(_EXPORTS))
