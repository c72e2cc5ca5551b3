"""Counting the FLOPs of the real ops a compute region runs.

Like ``torch.utils.flop_counter.FlopCounterMode`` (and with its formulas), but without its
module tracker, whose global hooks would mix up ranks that run in threads side by side. FLOPs
are kept per dtype so that bf16 matmuls are timed at bf16 peak.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry

_SKIP = {torch.ops.prim.device.default}


def _dtype_name(out: Any) -> str:
    tensor = out[0] if isinstance(out, (tuple, list)) and out else out
    dtype = getattr(tensor, "dtype", torch.float32)
    return {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, "fp32")


class FlopCount(TorchDispatchMode):
    """``with FlopCount() as fc: ...`` then ``fc.total`` and ``fc.by_dtype``."""

    def __init__(self) -> None:
        super().__init__()
        self.by_dtype: dict[str, float] = defaultdict(float)

    @property
    def total(self) -> float:
        return float(sum(self.by_dtype.values()))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        packet = func._overloadpacket
        if packet not in flop_registry and func not in _SKIP:
            with self:  # count the ops the decomposition runs
                decomposed = func.decompose(*args, **kwargs)
            if decomposed is not NotImplemented:
                return decomposed
        out = func(*args, **kwargs)
        if packet in flop_registry:
            self.by_dtype[_dtype_name(out)] += flop_registry[packet](*args, **kwargs,
                                                                     out_val=out)
        return out
