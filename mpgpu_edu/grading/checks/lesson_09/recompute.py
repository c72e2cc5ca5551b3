"""Exercise 9.2, activation recomputation: both halves. *compute* runs the learner's
``checkpointed`` on a fresh model and returns its output, gradients, what forward packed for
backward, which layer outputs outlived forward and how often each layer ran; *judge* compares
with plain autograd on the same model and data, and with its own split into segments.

Scored: the output and the gradients (``_judge_values``). Seen only inside the learner's
process, and so feedback worth no points: what forward packed and kept alive
(``_judge_kept``), how often each layer's forward ran (``_judge_calls``), and whether the
caller's x was left as it was (``_judge_input_kept``)."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from mpgpu_edu.grading.checks import CheckFailure
from mpgpu_edu.grading.checks._support import (compute_examples, examples, expect, expect_close,
                                               judge_examples)
from mpgpu_edu.grading.checks._support import refusal

Impl = Callable[..., Any]


def _model(depth: int, width: int, seed: int) -> nn.Sequential:
    """``depth`` layers, Linear and Tanh in turn (ending on a Linear when depth is odd)."""
    torch.manual_seed(seed)
    layers: list[nn.Module] = [nn.Linear(width, width) if i % 2 == 0 else nn.Tanh()
                               for i in range(depth)]
    return nn.Sequential(*layers).double()


def _data(width: int, seed: int, batches: int = 1) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed + 1000)
    return [torch.randn(5, width, generator=generator, dtype=torch.float64)
            for _ in range(batches)]


def _run(impl: Impl, depth: int, width: int, segments: int, seed: int = 0,
         input_grad: bool = True, batches: int = 1) -> dict:
    """The learner's recomputation on a fresh model: output, gradients (after ``batches``
    backward passes), what forward packed, which layer outputs survived it, forward calls."""
    model = _model(depth, width, seed)
    calls, alive, phase = [0] * depth, [None] * depth, {"forward": True}

    def hook(i: int) -> Callable:
        def record(_module: nn.Module, _inputs: Any, output: torch.Tensor) -> None:
            calls[i] += 1
            if phase["forward"]:
                alive[i] = weakref.ref(output)
        return record

    for i, layer in enumerate(model):
        layer.register_forward_hook(hook(i))
    f = impl(model, segments)
    packed: list[list[int]] = []
    outputs, still = [], []
    changed = False
    for k, x in enumerate(_data(width, seed, batches)):
        x.requires_grad_(input_grad)
        phase["forward"] = True
        with torch.autograd.graph.saved_tensors_hooks(
                lambda t: packed.append(list(t.shape)) or t, lambda t: t):
            y = f(x)
        phase["forward"] = False
        changed = changed or x.requires_grad != input_grad
        gc.collect()
        if k == 0:
            still = [ref is not None and ref() is not None for ref in alive]
        if not (isinstance(y, torch.Tensor) and y.requires_grad):
            return {"out": y, "tracked": False, "changed_input": changed}
        try:
            y.pow(2).sum().backward()
        except RuntimeError as exc:
            raise _explained(exc) from None
        outputs.append(y.detach())
    return {"out": outputs[0], "tracked": True, "changed_input": changed,
            "x_grad": x.grad if input_grad else None,
            "grads": [p.grad for p in model.parameters()],
            "packed": packed if batches == 1 else packed[: len(packed) // batches],
            "alive": still, "calls": calls}


# torch's words for two mistakes inside a segment's backward, and what each means there.
_KNOWN_ERRORS = (
    ("backward through the graph a second time",
     "a graph was back-propagated after it was freed. Either the segment's recomputation ran "
     "back into the graph before it (the kept input still carries it): detach the kept input "
     "before running the segment again; or the recomputed graph was back-propagated twice "
     "(autograd.grad, then autograd.backward on the same output): one "
     "torch.autograd.backward(out, grad_out) fills the parameters' .grad and the input's "
     "together"),
    ("does not require grad and does not have a grad_fn",
     "the recomputed output has no graph: a Function's backward runs with autograd off, so "
     "recompute the segment under torch.enable_grad()"),
)


def _explained(exc: RuntimeError) -> Exception:
    """``exc`` from ``loss.backward()``, with what it means for a recomputing segment when
    torch's message is one of ``_KNOWN_ERRORS``."""
    text = str(exc)
    for words, meaning in _KNOWN_ERRORS:
        if words in text:
            return CheckFailure(f"backward failed (torch: {words!r}): {meaning}")
    return exc


def _reference(depth: int, width: int, seed: int = 0, batches: int = 1) -> dict:
    model = _model(depth, width, seed)
    xs = _data(width, seed, batches)
    for x in xs:
        x.requires_grad_(True)
        model(x).pow(2).sum().backward()
    return {"out": model(xs[0]).detach(), "x_grad": xs[-1].grad,
            "grads": [p.grad for p in model.parameters()]}


def _judge_values(data: dict, depth: int, width: int, input_grad: bool = True,
                  batches: int = 1, seed: int = 0) -> None:
    want = _reference(depth, width, seed, batches)
    expect_close(data["out"], want["out"], "f(x)", rtol=1e-9, atol=1e-12)
    expect(data["tracked"], "f(x) does not require a gradient" + (
        "" if input_grad else " when the data needs none: autograd never calls your "
        "segments' backward and no parameter gets a gradient. What makes autograd call a "
        "node's backward when none of its inputs so far needs a gradient? (The second "
        "hint says.)"))
    if input_grad:
        expect_close(data["x_grad"], want["x_grad"], "the input's gradient", rtol=1e-9,
                     atol=1e-12)
    for i, (got, grad) in enumerate(zip(data["grads"], want["grads"])):
        expect(got is not None, f"parameter {i} (layer {2 * (i // 2)}) has no gradient after "
                                "backward" + ("" if input_grad else ": with data that needs "
                                "no gradient, either autograd never calls the first segment's "
                                "backward (nothing given to apply needs a gradient: pass the "
                                "parameters to apply too), or the recomputation in backward "
                                "ran with autograd off (a Function's backward does, unless it "
                                "runs the segment under torch.enable_grad())"))
        what = f"parameter {i}'s gradient" + (f" after {batches} backward passes (they add "
                                              "up)" if batches > 1 else "")
        expect_close(got, grad, what, rtol=1e-9, atol=1e-12)


def _judge_input_kept(data: dict, input_grad: bool = True) -> None:
    """Feedback: the caller's x.requires_grad after the call, seen only inside the learner's
    process."""
    expect(not data["changed_input"],
           "f(x) changed the caller's x: its requires_grad was "
           f"{input_grad} before the call and {not input_grad} after it (x.requires_grad_() "
           "changes the caller's tensor, and makes autograd compute a gradient nobody asked "
           "for): leave x as it is"
           + ("" if input_grad else "; what else makes autograd call the first segment's "
              "backward? (The second hint says.)"))


def _judge_kept(data: dict, depth: int, width: int, segments: int) -> None:
    expect(data["tracked"], "f(x) does not require a gradient: autograd cannot run backward")
    from mpgpu_edu.memory.recompute import segment_bounds

    bounds = segment_bounds(depth, segments)
    want = [[5, width]] * segments
    packed = data["packed"]
    expect(len(packed) == segments,
           f"with {segments} segment{'s' if segments > 1 else ''} of {depth} layers, forward "
           f"kept {len(packed)} tensors for backward; it should keep {segments}: each "
           "segment's input, saved with ctx.save_for_backward (not as an attribute of ctx), "
           "and nothing from inside a segment")
    expect(packed == want, f"forward kept tensors of shapes {packed}; expected each "
                           f"segment's input, {want}")
    ends = {stop - 1 for _, stop in bounds}
    kept = [i for i, live in enumerate(data["alive"]) if live and i not in ends]
    expect(not kept, f"after forward, the outputs of layers {kept} were still alive: only "
                     f"each segment's output may outlive it (segments {bounds})")


def _judge_calls(data: dict, depth: int) -> None:
    expect(data["tracked"], "f(x) does not require a gradient: autograd cannot run backward")
    calls = data["calls"]
    expect(all(c == 2 for c in calls),
           f"forward calls per layer over one forward and backward: {calls}; each layer runs "
           "twice, once in forward and once when its segment is recomputed in backward")


def _basic(impl: Impl) -> dict:
    return _run(impl, 8, 6, 2)


def _no_input_grad(impl: Impl) -> dict:
    return _run(impl, 7, 5, 3, seed=1, input_grad=False)


def _accumulate(impl: Impl) -> dict:
    out = _run(impl, 6, 4, 3, seed=2, batches=2)
    refused = {segments: refusal(lambda segments=segments: impl(_model(6, 4, 2), segments))
               for segments in (0, 7)}
    out["refused"] = refused
    return out


def _input_kept_runs(impl: Impl) -> dict:
    """*compute* of the feedback case on the caller's x: data that needs a gradient (8
    layers in 2 segments), data that needs none (7 layers in 3), two batches (6 in 3)."""
    return {"needs_grad": _basic(impl), "no_grad": _no_input_grad(impl),
            "two_batches": _run(impl, 6, 4, 3, seed=2, batches=2)}


def _judge_input_kept_runs(data: dict) -> None:
    _judge_input_kept(data["needs_grad"])
    _judge_input_kept(data["no_grad"], input_grad=False)
    _judge_input_kept(data["two_batches"])


def _judge_accumulate(data: dict) -> None:
    _judge_values(data, 6, 4, batches=2, seed=2)
    for segments, what in data["refused"].items():
        expect(what == "ValueError", f"checkpointed(model of 6 layers, {segments}): "
               + ("returned" if what == "returned" else f"raised {what}")
               + "; it should raise ValueError (segment_bounds does)")


# Drawn shapes (segments at most the depth), and two whose layers do not split evenly.
RECOMPUTE_EXAMPLES = [dict(e, segments=min(e["segments"], e["depth"]))
                      for e in examples(5, seed=92, depth=(2, 12), width=(2, 9),
                                        segments=(1, 12))] + [
    dict(depth=11, width=3, segments=4), dict(depth=5, width=4, segments=2)]


def _recompute_hidden(impl: Impl) -> list[dict]:
    def body(depth: int, width: int, segments: int) -> dict:
        return _run(impl, depth, width, segments, seed=depth * width)
    return compute_examples(body, RECOMPUTE_EXAMPLES)


def _judge_recompute_hidden(records: list[dict]) -> None:
    """Scored: the output and the gradients of every example."""
    def one(out: dict, depth: int, width: int, segments: int) -> None:
        try:
            _judge_values(out, depth, width, seed=depth * width)
        except CheckFailure as exc:
            raise AssertionError(str(exc)) from None
    judge_examples(records, one)


def _judge_recompute_hidden_inside(records: list[dict]) -> None:
    """Feedback: on the hidden examples, what forward kept, how often each layer ran, and
    the caller's x left as it was (each seen only inside the learner's process)."""
    def one(out: dict, depth: int, width: int, segments: int) -> None:
        try:
            _judge_kept(out, depth, width, segments)
            _judge_calls(out, depth)
            _judge_input_kept(out)
        except CheckFailure as exc:
            raise AssertionError(str(exc)) from None
    judge_examples(records, one)
