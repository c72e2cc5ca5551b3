"""Lesson 09 exercises: memory for time.

Every remedy for a model that does not fit trades one resource for another: recomputation
keeps fewer activations and runs forwards again. 9.1 counts what a transformer layer keeps for
backward, 9.2 builds recomputation itself (what ``torch.utils.checkpoint`` does).
``segment_bounds`` just below is solved for you: 9.2 uses it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn


# ---- worked example (solved, not graded) ---------------------------------------------------

def segment_bounds(n_layers: int, segments: int) -> list[tuple[int, int]]:
    """Split ``n_layers`` consecutive layers into ``segments`` runs ``[start, stop)`` as equal
    as they can be, the first ones one layer longer when it does not divide.

    >>> segment_bounds(5, 2)
    [(0, 3), (3, 5)]
    """
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


# ---- exercises -----------------------------------------------------------------------------

def layer_activation_bytes(seq: int, batch: int, d_model: int, n_heads: int,
                           recompute: str = "none") -> int:
    """Bytes one GPT transformer layer keeps for backward on one device, in mixed precision
    (2-byte activations, 1-byte dropout masks) with eager attention, as Korthikanti et al.
    (2022) count them, with s = ``seq``, b = ``batch``, h = ``d_model``, a = ``n_heads``:

    - ``"none"``: s b h (34 + 5 a s / h): 34 s b h for the layer's inputs, projections, MLP
      and masks, and 5 a s^2 b for the attention scores (softmax output, its dropout mask and
      the dropout's output: 2 + 1 + 2 bytes per score);
    - ``"selective"``: recompute the attention core in backward, so the scores are not kept:
      34 s b h;
    - ``"full"``: keep only the layer's input, 2 s b h, and run its forward again in backward.

    Return an ``int`` (bytes are whole: write the scores as 5 a s s b, not s b h 5 a s / h).
    Raise ``ValueError`` for any size below 1 or another ``recompute``.

    >>> layer_activation_bytes(1024, 1, 1024, 16)
    119537664
    """
    ### BEGIN SOLUTION 9.1
    if min(seq, batch, d_model, n_heads) < 1:
        raise ValueError("seq, batch, d_model and n_heads must each be at least 1")
    sbh = seq * batch * d_model
    if recompute == "none":
        return 34 * sbh + 5 * n_heads * seq * seq * batch
    if recompute == "selective":
        return 34 * sbh
    if recompute == "full":
        return 2 * sbh
    raise ValueError(f"unknown recompute {recompute!r}: choose none, selective or full")
    ### END SOLUTION


def checkpointed(model: nn.Sequential, segments: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """Activation recomputation (full, per segment): return a function ``f`` with
    ``f(x) == model(x)`` whose forward keeps for backward only each segment's input.

    - ``model``'s layers (its children, in order) are split with ``segment_bounds`` and
      ``run(start, stop, x)`` runs one span of them: both solved below.
    - Forward: run every segment with autograd off (a ``Function``'s forward runs so), so
      that nothing inside it is kept; keep the segment's input, and only that, for its backward
      (``ctx.save_for_backward``). The result must still take part in autograd: make each
      segment one node of the graph with a ``torch.autograd.Function`` of your own (write
      it inside this function or beside it).
    - Backward, segment by segment from the last: run the segment's forward again from its
      kept input with autograd on (``torch.enable_grad()``, the input detached, and made to
      require a gradient when forward's did: ``ctx.needs_input_grad[0]``), back-propagate the incoming gradient through it
      (``torch.autograd.backward``), and hand back the input's gradient. The parameters'
      gradients are added into their ``.grad`` by that inner backward, as any backward
      does: two backward passes before an optimizer step leave the sum.
    - Think about the data: ``x`` usually needs no gradient. Autograd calls a node's backward
      only when one of its inputs needs a gradient; what then makes it call any segment's
      backward, so that the parameters get theirs?
    - Every layer's forward runs exactly twice per forward-and-backward: once in forward,
      once in its segment's backward. The layers are stateless (no dropout, no batch norm):
      running one twice gives the same result.

    The gradients equal ``model(x)``'s: of every parameter, and of ``x`` when it requires one.
    """
    bounds = segment_bounds(len(model), segments)  # [(start, stop), ...], one per segment
    layers = list(model)

    def run(start: int, stop: int, x: torch.Tensor) -> torch.Tensor:
        """Layers ``start`` to ``stop - 1`` on ``x``, recorded by autograd or not as the
        caller's mode says."""
        for layer in layers[start:stop]:
            x = layer(x)
        return x

    # Yours: a torch.autograd.Function for one segment, and the function to return.
    ### BEGIN SOLUTION 9.2
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
            x = x.detach().requires_grad_(ctx.needs_input_grad[0])
            with torch.enable_grad():
                out = run(*ctx.span, x)
            torch.autograd.backward(out, grad_out)
            return (x.grad if ctx.needs_input_grad[0] else None, None, None,
                    *(None for _ in ctx.needs_input_grad[3:]))

    def forward(x: torch.Tensor) -> torch.Tensor:
        for start, stop in bounds:
            params = [p for layer in layers[start:stop] for p in layer.parameters()]
            x = Segment.apply(x, start, stop, *params)
        return x

    return forward
    ### END SOLUTION

