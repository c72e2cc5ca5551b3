"""Memory: how many bytes training needs per device, and where they go.

``estimate`` answers on paper, for models too large to allocate (bytes per parameter times
parameters, split by a strategy); ``models`` counts parameters of model presets from their
shapes, and the activations a forward pass keeps (eager or flash attention, recomputation).
Lesson 03 (data parallel replicates everything) and lessons 05-06 (ZeRO, fitting real models)
use both.
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
    ATTENTIONS,
    PRESETS,
    RECOMPUTES,
    DecoderSpec,
    activation_bytes,
    activation_terms,
    count_params,
    get_preset,
    layer_activation_bytes,
    meta_model,
    param_breakdown,
    spec_params,
)

__all__ = [
    "OPTIMIZERS", "PRECISIONS", "STRATEGIES", "MemoryEstimate", "bytes_per_param",
    "estimate_memory", "explain", "ATTENTIONS", "PRESETS", "RECOMPUTES", "DecoderSpec",
    "activation_bytes", "activation_terms", "count_params", "get_preset",
    "layer_activation_bytes", "meta_model", "param_breakdown", "spec_params",
]
