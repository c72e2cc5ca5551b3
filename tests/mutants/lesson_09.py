"""Plausible wrong answers for lesson 09 (see tests/mutants/__init__.py)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint_sequential

from mpgpu_edu.memory.recompute import segment_bounds  # the exercise file's solved split


# ---- 9.1 ----------------------------------------------------------------------------------


def _sizes(seq: int, batch: int, d_model: int, n_heads: int, recompute: str) -> int:
    if min(seq, batch, d_model, n_heads) < 1 or recompute not in ("none", "selective", "full"):
        raise ValueError("bad sizes")
    return seq * batch * d_model


def bytes_without_scores(seq: int, batch: int, d_model: int, n_heads: int,
                         recompute: str = "none") -> int:
    """Forgets the attention scores: 34 sbh even without recomputation."""
    sbh = _sizes(seq, batch, d_model, n_heads, recompute)
    return 2 * sbh if recompute == "full" else 34 * sbh


def bytes_as_float(seq: int, batch: int, d_model: int, n_heads: int,
                   recompute: str = "none") -> float:
    """The right bytes as a float, s b h (34 + 5 a s / h), where bytes are a whole number."""
    sbh = _sizes(seq, batch, d_model, n_heads, recompute)
    if recompute == "full":
        return 2.0 * sbh
    return sbh * (34 + (5 * n_heads * seq / d_model if recompute == "none" else 0.0))


def bytes_full_keeps_everything_else(seq: int, batch: int, d_model: int, n_heads: int,
                                     recompute: str = "none") -> int:
    """Treats full recomputation like selective: drops the scores, keeps the 34 sbh."""
    sbh = _sizes(seq, batch, d_model, n_heads, recompute)
    return 34 * sbh + (5 * n_heads * seq * seq * batch if recompute == "none" else 0)


def bytes_scores_per_head_dim(seq: int, batch: int, d_model: int, n_heads: int,
                              recompute: str = "none") -> int:
    """Writes the score term as 5 a s / h without the sbh in front: 5 a s b bytes."""
    sbh = _sizes(seq, batch, d_model, n_heads, recompute)
    if recompute == "full":
        return 2 * sbh
    return 34 * sbh + (5 * n_heads * seq * batch if recompute == "none" else 0)


def bytes_never_refuses(seq: int, batch: int, d_model: int, n_heads: int,
                        recompute: str = "none") -> int:
    """The right sums, but an unknown mode counts as none and sizes are not checked."""
    sbh = seq * batch * d_model
    if recompute == "full":
        return 2 * sbh
    if recompute == "selective":
        return 34 * sbh
    return 34 * sbh + 5 * n_heads * seq * seq * batch


def _float_formula(seq: int, batch: int, d_model: int, n_heads: int, recompute: str,
                   to_int: Any) -> int:
    """``to_int`` of s b h (34 + 5 a s / h) computed in floats."""
    sbh = _sizes(seq, batch, d_model, n_heads, recompute)
    if recompute == "full":
        return 2 * sbh
    return to_int(sbh * (34 + (5 * n_heads * seq / d_model if recompute == "none" else 0)))


def bytes_float_cut_to_int(seq: int, batch: int, d_model: int, n_heads: int,
                           recompute: str = "none") -> int:
    """int() of the float formula s b h (34 + 5 a s / h): 3404.999... becomes 3404."""
    return _float_formula(seq, batch, d_model, n_heads, recompute, int)


def bytes_float_rounded(seq: int, batch: int, d_model: int, n_heads: int,
                        recompute: str = "none") -> int:
    """round() of the float formula: right until the count outgrows a float's precision."""
    return _float_formula(seq, batch, d_model, n_heads, recompute, round)


def bytes_scores_six_bytes(seq: int, batch: int, d_model: int, n_heads: int,
                           recompute: str = "none") -> int:
    """Counts 6 bytes per attention score (2 + 2 + 2: the dropout mask as 2 bytes)."""
    sbh = _sizes(seq, batch, d_model, n_heads, recompute)
    scores = n_heads * seq * seq * batch
    return {"none": 34 * sbh + 6 * scores, "selective": 34 * sbh, "full": 2 * sbh}[recompute]


def bytes_refuses_only_zero(seq: int, batch: int, d_model: int, n_heads: int,
                            recompute: str = "none") -> int:
    """Refuses a size of 0 but counts negative sizes as if they were real."""
    if 0 in (seq, batch, d_model, n_heads) or recompute not in ("none", "selective", "full"):
        raise ValueError("bad sizes")
    sbh = seq * batch * d_model
    if recompute == "full":
        return 2 * sbh
    return 34 * sbh + (5 * n_heads * seq * seq * batch if recompute == "none" else 0)


# ---- 9.2 ----------------------------------------------------------------------------------

def _segment_fn(layers: list[nn.Module], *, params: bool = True, keep: bool = False,
                overwrite: bool = False, detach: bool = True, grad_mode: bool = True,
                twice: bool = False) -> Any:
    class Segment(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor, start: int, stop: int, *ps: torch.Tensor) -> Any:
            ctx.save_for_backward(x)
            ctx.span = (start, stop)
            outs = []
            with torch.no_grad():
                for layer in layers[start:stop]:
                    x = layer(x)
                    outs.append(x)
            if keep:
                ctx.outs = outs
            return x

        @staticmethod
        def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[Any, ...]:
            (x,) = ctx.saved_tensors
            start, stop = ctx.span
            x = (x.detach() if detach else x).requires_grad_(ctx.needs_input_grad[0])
            with torch.enable_grad() if grad_mode else torch.no_grad():
                out = x
                for layer in layers[start:stop]:
                    out = layer(out)
            mine = [p for layer in layers[start:stop] for p in layer.parameters()]
            if overwrite:
                inputs = ([x] if ctx.needs_input_grad[0] else []) + mine
                grads = torch.autograd.grad(out, inputs, grad_out)
                for p, g in zip(mine, grads[len(inputs) - len(mine):]):
                    p.grad = g
                grad_x = grads[0] if ctx.needs_input_grad[0] else None
            else:
                if twice:  # the input's gradient first, then the parameters' from the same graph
                    torch.autograd.grad(out, [x], grad_out)
                torch.autograd.backward(out, grad_out)
                grad_x = x.grad if ctx.needs_input_grad[0] else None
            return (grad_x, None, None, *(None for _ in ctx.needs_input_grad[3:]))

    def apply(x: torch.Tensor, start: int, stop: int) -> torch.Tensor:
        mine = [p for layer in layers[start:stop] for p in layer.parameters()] if params else []
        return Segment.apply(x, start, stop, *mine)
    return apply


def _checkpointed(model: nn.Sequential, bounds: list[tuple[int, int]], **options: bool) -> Any:
    segment = _segment_fn(list(model), **options)

    def forward(x: torch.Tensor) -> torch.Tensor:
        for start, stop in bounds:
            x = segment(x, start, stop)
        return x
    return forward


def recompute_without_detach(model: nn.Sequential, segments: int) -> Any:
    """Runs the segment again from the kept input itself, not a detached copy."""
    return _checkpointed(model, segment_bounds(len(model), segments), detach=False)


def recompute_backward_twice(model: nn.Sequential, segments: int) -> Any:
    """Takes the input's gradient with autograd.grad, then back-propagates the same
    recomputed graph again for the parameters' (no retain_graph)."""
    return _checkpointed(model, segment_bounds(len(model), segments), twice=True)


def recompute_without_grad_mode(model: nn.Sequential, segments: int) -> Any:
    """Runs the segment again with autograd off, as a Function's backward starts."""
    return _checkpointed(model, segment_bounds(len(model), segments), grad_mode=False)


def recompute_nothing(model: nn.Sequential, segments: int) -> Any:
    """Returns the model itself: right numbers, every activation kept, nothing recomputed."""
    segment_bounds(len(model), segments)
    return model


def recompute_one_segment(model: nn.Sequential, segments: int) -> Any:
    """Checkpoints the whole model as one segment, whatever ``segments`` says."""
    segment_bounds(len(model), segments)
    return _checkpointed(model, [(0, len(model))])


def recompute_without_parameters(model: nn.Sequential, segments: int) -> Any:
    """Passes only x to apply: with data that needs no gradient, the first segment's backward
    never runs and its parameters get no gradient."""
    return _checkpointed(model, segment_bounds(len(model), segments), params=False)


def recompute_keeps_outputs(model: nn.Sequential, segments: int) -> Any:
    """Stores the segment's inner outputs on ctx "to save time": they stay alive."""
    return _checkpointed(model, segment_bounds(len(model), segments), keep=True)


def recompute_overwrites_grad(model: nn.Sequential, segments: int) -> Any:
    """Sets p.grad from torch.autograd.grad: a second backward pass replaces the first."""
    return _checkpointed(model, segment_bounds(len(model), segments), overwrite=True)


def recompute_from_the_start(model: nn.Sequential, segments: int) -> Any:
    """Keeps the model's input instead of each segment's, and in each segment's backward
    runs every layer before it again: right gradients, far more forwards."""
    bounds = segment_bounds(len(model), segments)
    layers = list(model)

    class FromStart(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor, x0: torch.Tensor, start: int, stop: int,
                    *ps: torch.Tensor) -> Any:
            ctx.save_for_backward(x0)
            ctx.span = (start, stop)
            for layer in layers[start:stop]:
                x = layer(x)
            return x

        @staticmethod
        def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[Any, ...]:
            (x0,) = ctx.saved_tensors
            start, stop = ctx.span
            with torch.no_grad():
                for layer in layers[:start]:
                    x0 = layer(x0)
            x = x0.detach().requires_grad_(True)
            with torch.enable_grad():
                out = x
                for layer in layers[start:stop]:
                    out = layer(out)
            torch.autograd.backward(out, grad_out)
            return (x.grad, None, None, None, *(None for _ in ctx.needs_input_grad[4:]))

    def forward(x: torch.Tensor) -> torch.Tensor:
        x0 = x.detach()
        for start, stop in bounds:
            mine = [p for layer in layers[start:stop] for p in layer.parameters()]
            x = FromStart.apply(x, x0, start, stop, *mine)
        return x
    return forward


def recompute_marks_the_input(model: nn.Sequential, segments: int) -> Any:
    """Gets past data that needs no gradient by switching on the caller's x.requires_grad
    (and passes no parameters): right numbers, but the caller's tensor is changed."""
    inner = _checkpointed(model, segment_bounds(len(model), segments), params=False)

    def forward(x: torch.Tensor) -> torch.Tensor:
        x.requires_grad_(True)
        return inner(x)
    return forward


def recompute_drops_leftover_layers(model: nn.Sequential, segments: int) -> Any:
    """Cuts len(model) // segments layers per segment: the last layers of an uneven split
    never run."""
    segment_bounds(len(model), segments)
    size = len(model) // segments
    return _checkpointed(model, [(k * size, (k + 1) * size) for k in range(segments)])


def recompute_with_torch(model: nn.Sequential, segments: int) -> Any:
    """torch's checkpoint_sequential: it runs the last segment without recomputation, and it
    is not the learner's to call here."""
    segment_bounds(len(model), segments)
    return lambda x: checkpoint_sequential(model, segments, x, use_reentrant=False)


MUTANTS: dict[str, list[str]] = {
    "9.1": ["bytes_without_scores", "bytes_as_float", "bytes_full_keeps_everything_else",
            "bytes_scores_per_head_dim", "bytes_never_refuses", "bytes_float_cut_to_int",
            "bytes_float_rounded", "bytes_refuses_only_zero", "bytes_scores_six_bytes"],
    "9.2": ["recompute_nothing", "recompute_one_segment", "recompute_without_parameters",
            "recompute_keeps_outputs", "recompute_overwrites_grad", "recompute_from_the_start",
            "recompute_with_torch", "recompute_marks_the_input",
            "recompute_drops_leftover_layers", "recompute_backward_twice"],
}
