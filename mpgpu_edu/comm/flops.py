"""Counting what the real ops of a compute region cost: FLOPs, bytes and kernels.

Like ``torch.utils.flop_counter.FlopCounterMode`` (and with its formulas), but without its
module tracker, whose global hooks would mix up ranks that run in threads side by side. FLOPs
are kept per dtype of the op's *inputs*, so that bf16 matmuls and bf16 attention are timed at
bf16 peak.

torch's formulas count only matmuls, convolutions and attention: an add, a copy or an
optimizer step has 0 FLOPs there, yet it is not free, it streams its tensors through memory.
So every op also counts its bytes (tensors read plus tensors written) and one kernel. Given
a ``roofline`` (the cluster), each op is charged the longer of its FLOP time and its memory
time; ``memory_extra_s`` keeps, summed over ops, how much longer the memory time was.

Cost of one op: ``max(flops / (peak * efficiency), bytes / memory_Bps)
+ launch_overhead_s``.
Views (``view``, ``t``, slicing), fresh allocations (``empty``) and metadata ops move no
bytes and launch nothing.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import flop_registry, sdpa_backward_flop_count, sdpa_flop_count

_SKIP = {torch.ops.prim.device.default}
_ATEN = torch.ops.aten
# torch's registry covers the CUDA attention kernels; the CPU one would count 0 FLOPs.
_EXTRA: dict[Any, Callable[..., float]] = {
    _ATEN._scaled_dot_product_flash_attention_for_cpu:
        lambda q, k, v, *_, **__: sdpa_flop_count(q.shape, k.shape, v.shape),
    _ATEN._scaled_dot_product_flash_attention_for_cpu_backward:
        lambda g, q, k, v, *_, **__: sdpa_backward_flop_count(g.shape, q.shape, k.shape,
                                                              v.shape),
}
_FREE = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "detach",
         "alias", "lift_fresh", "set_", "resize_", "_local_scalar_dense",
         "is_nonzero", "equal"}


def dtype_name(dtype: torch.dtype) -> str:
    """``"bf16"``, ``"fp16"`` or ``"fp32"`` (everything else is timed at fp32)."""
    return {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, "fp32")


def _tensors(tree: Any) -> list[torch.Tensor]:
    return [t for t in tree_leaves(tree) if isinstance(t, torch.Tensor)]


def _input_dtype(args: Any, out: Any) -> str:
    floats = [t for t in _tensors(args) if t.is_floating_point()] or _tensors(out)
    return dtype_name(floats[0].dtype) if floats else "fp32"


def op_bytes(func: Any, args: tuple, kwargs: dict, out: Any) -> int:
    """Bytes an op moves through memory: its tensor inputs read plus its tensor outputs
    written (``copy_`` does not read its destination). 0 for views and allocations."""
    name = func._overloadpacket.__name__
    if getattr(func, "is_view", False) or name in _FREE:
        return 0
    inputs = _tensors((args[1:], kwargs)) if name == "copy_" else _tensors((args, kwargs))
    return sum(t.numel() * t.element_size() for t in inputs + _tensors(out))


class FlopCount(TorchDispatchMode):
    """``with FlopCount() as fc: ...`` then ``fc.total``, ``fc.by_dtype``, ``fc.bytes``,
    ``fc.kernels`` and, given ``roofline`` (an object with ``flop_seconds(flops, dtype)`` and
    ``memory_seconds(nbytes)``, e.g. a ``Cluster``), ``fc.memory_extra_s``.

    ``active`` off: ops run uncounted. ``factories`` off: ops that read no tensor (``zeros``,
    ``randn``: making inputs) are not counted. ``skip()`` true: the op is not counted (the
    simulator's own copies of a message)."""

    def __init__(self, roofline: Any = None, skip: Callable[[], bool] | None = None) -> None:
        super().__init__()
        self.by_dtype: dict[str, float] = defaultdict(float)
        self.bytes = 0
        self.kernels = 0
        self.memory_extra_s = 0.0
        self.roofline = roofline
        self.skip = skip or (lambda: False)
        self.active = True
        self.factories = True

    @property
    def total(self) -> float:
        return float(sum(self.by_dtype.values()))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        packet = func._overloadpacket
        if not self.active:
            return func(*args, **kwargs)
        if packet not in flop_registry and packet not in _EXTRA and func not in _SKIP:
            with self:  # count the ops the decomposition runs
                decomposed = func.decompose(*args, **kwargs)
            if decomposed is not NotImplemented:
                return decomposed
        out = func(*args, **kwargs)
        if func in _SKIP or self.skip():
            return out
        if not self.factories and not _tensors((args, kwargs)):
            return out
        self._count(func, args, kwargs, out)
        return out

    def _count(self, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
        nbytes = op_bytes(func, args, kwargs, out)
        flops, dtype = 0.0, _input_dtype(args, out)
        packet = func._overloadpacket
        if packet in flop_registry:
            flops = float(flop_registry[packet](*args, **kwargs, out_val=out))
            self.by_dtype[dtype] += flops
        elif packet in _EXTRA:
            flops = float(_EXTRA[packet](*args, **kwargs))
            self.by_dtype[dtype] += flops
        elif nbytes == 0:
            return  # a view or an allocation: no kernel
        self.bytes += nbytes
        self.kernels += 1
        if self.roofline is not None:
            flop_s = self.roofline.flop_seconds(flops, dtype) if flops else 0.0
            self.memory_extra_s += max(0.0, self.roofline.memory_seconds(nbytes) - flop_s)
