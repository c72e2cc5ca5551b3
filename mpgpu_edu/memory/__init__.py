"""Memory: how many bytes training needs per device, and where they go.

``estimate`` answers on paper, for models too large to allocate (bytes per parameter times
parameters, split by a strategy); ``models`` counts parameters of model presets from their
shapes. Lesson 03 (data parallel replicates everything) and lessons 05-06 (ZeRO, fitting
real models) use both.
"""

from mpgpu_edu.memory.estimate import (
    OPTIMIZERS,
    PRECISIONS,
    STRATEGIES,
    MemoryEstimate,
    bytes_per_param,
    estimate_memory,
    explain,
)
from mpgpu_edu.memory.models import (
    PRESETS,
    DecoderSpec,
    activation_bytes,
    count_params,
    get_preset,
    meta_model,
    param_breakdown,
    spec_params,
)

__all__ = [
    "OPTIMIZERS", "PRECISIONS", "STRATEGIES", "MemoryEstimate", "bytes_per_param",
    "estimate_memory", "explain", "PRESETS", "DecoderSpec", "activation_bytes",
    "count_params", "get_preset", "meta_model", "param_breakdown", "spec_params",
]
