"""Activation recomputation (full, per segment), as ``torch.utils.checkpoint`` does it: the
package's own, the reference of lesson 09's capstone and of its demos.

Each segment of consecutive layers is one ``torch.autograd.Function``: its forward runs the
layers with autograd off and saves only its input; its backward runs them again from that
input with autograd on and back-propagates through the fresh copy. The segment's parameters
are inputs of the node, so that autograd calls its backward even when the data needs no
gradient (the pitfall of torch's reentrant checkpoint); they get their gradients from the
inner backward, added into ``.grad`` as any backward adds them. Unlike
``torch.utils.checkpoint.checkpoint_sequential`` the last segment is recomputed too: every
layer runs forward exactly twice, which keeps the count easy to check.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn


def segment_bounds(n_layers: int, segments: int) -> list[tuple[int, int]]:
    """``segments`` runs ``[start, stop)`` of ``n_layers`` layers, as equal as they can be, the
    first ones one layer longer when it does not divide. ValueError unless 1 <= segments <=
    n_layers."""
    if not 1 <= segments <= n_layers:
        raise ValueError(f"segments must be between 1 and the {n_layers} layers, "
                         f"got {segments}")
    size, longer = divmod(n_layers, segments)
    bounds, start = [], 0
    for k in range(segments):
        stop = start + size + (1 if k < longer else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def checkpointed(model: nn.Sequential, segments: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """``f`` with ``f(x) == model(x)`` that keeps for backward only each segment's input and
    recomputes the segment in backward; gradients equal ``model``'s."""
    layers = list(model)
    bounds = segment_bounds(len(layers), segments)

    def run(start: int, stop: int, x: torch.Tensor) -> torch.Tensor:
        for layer in layers[start:stop]:
            x = layer(x)
        return x

    class Segment(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor, start: int, stop: int,
                    *params: torch.Tensor) -> torch.Tensor:
            ctx.save_for_backward(x)
            ctx.span = (start, stop)
            with torch.no_grad():
                return run(start, stop, x)

        @staticmethod
        def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[Any, ...]:
            (x,) = ctx.saved_tensors
            wants_x = ctx.needs_input_grad[0]
            x = x.detach().requires_grad_(wants_x)
            with torch.enable_grad():
                out = run(*ctx.span, x)
            torch.autograd.backward(out, grad_out)
            return (x.grad if wants_x else None, None, None,
                    *(None for _ in ctx.needs_input_grad[3:]))

    def forward(x: torch.Tensor) -> torch.Tensor:
        for start, stop in bounds:
            params = [p for layer in layers[start:stop] for p in layer.parameters()]
            x = Segment.apply(x, start, stop, *params)
        return x

    return forward
