"""Checks of lesson 09: what a transformer layer keeps for backward, the capstone (activation
recomputation built on ``torch.autograd.Function``), and interleaved 1F1B's bubble.

Every case has two halves. *compute* calls the learner's function and returns plain data: byte
counts; for the capstone, the output and gradients of a small model, the shapes of what
autograd packed for backward during the forward (``saved_tensors_hooks``), which layer outputs
were still alive after it (weak references), and how often each layer's forward ran.
*judge* rebuilds the reference in the grader: the byte counts from
``memory.models.layer_activation_bytes`` (Korthikanti et al. 2022), the gradients from plain
autograd on the same model and data, the segments from its own split, the bubble from the
simulated schedule (``pipeline.interleaved_1f1b``).

The package's activation formulas and recomputation (``memory.recompute``) and torch's
``torch.utils.checkpoint`` are out of reach while the learner's code runs (``REFERENCES``).
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from mpgpu_edu.grading.checks import Case, CheckFailure
from mpgpu_edu.grading.checks._support import (compute_examples, examples, expect, expect_close,
                                               judge_examples)

Impl = Callable[..., Any]

REFERENCES = {
    "9.1": ["mpgpu_edu.memory.models:layer_activation_bytes",
            "mpgpu_edu.memory.models:activation_bytes",
            "mpgpu_edu.memory.models:activation_terms"],
    "9.2": ["mpgpu_edu.memory.recompute:checkpointed", "torch.utils.checkpoint:checkpoint",
            "torch.utils.checkpoint:checkpoint_sequential"],
}


# ---- 9.1 a layer's activations ----------------------------------------------------------------

MODES = ("none", "selective", "full")


def _want_bytes(seq: int, batch: int, d_model: int, n_heads: int, recompute: str) -> int:
    from mpgpu_edu.memory.models import DecoderSpec, layer_activation_bytes

    spec = DecoderSpec("check", 1, d_model, n_heads, 4 * d_model, 1)
    return layer_activation_bytes(spec, batch, seq, "mixed", "eager", recompute)


def _bytes(cases: list[tuple[int, int, int, int, str]]) -> Impl:
    def compute(impl: Impl) -> list[Any]:
        return [impl(*case) for case in cases]
    return compute


def _bytes_judge(cases: list[tuple[int, int, int, int, str]]) -> Callable[[list], None]:
    def judge(got: list) -> None:
        for (s, b, h, a, mode), value in zip(cases, got):
            want = _want_bytes(s, b, h, a, mode)
            expect(isinstance(value, (int, float)) and not isinstance(value, bool),
                   f"seq={s}, batch={b}, d_model={h}, n_heads={a}, {mode!r}: returned "
                   f"{type(value).__name__}, expected a number of bytes")
            hint = ""
            if mode == "none" and value == 34 * s * b * h:
                hint = " (the attention scores, 5 a s^2 b bytes, are missing)"
            elif mode == "full" and value == 34 * s * b * h:
                hint = " (full recomputation keeps only the layer's input)"
            expect(value == want, f"seq={s}, batch={b}, d_model={h}, n_heads={a}, {mode!r}: "
                                  f"{value:,} bytes, expected {want:,}{hint}")
    return judge


BYTE_CASES = [(2048, 4, 4096, 32, m) for m in MODES] + [(512, 2, 768, 12, m) for m in MODES]
BAD_SIZES = {"recompute='some'": (1024, 1, 1024, 16, "some"), "seq=0": (0, 1, 1024, 16, "none"),
             "n_heads=0": (1024, 1, 1024, 0, "selective")}


def _bytes_refusals(impl: Impl) -> dict[str, str]:
    out = {}
    for name, args in BAD_SIZES.items():
        try:
            impl(*args)
            out[name] = "returned"
        except ValueError:
            out[name] = "ValueError"
        except NotImplementedError:
            raise
        except Exception as exc:  # noqa: BLE001 - reported as what it is
            out[name] = type(exc).__name__
    return out


def _judge_bytes_refusals(out: dict[str, str]) -> None:
    for name, what in out.items():
        expect(what == "ValueError", f"layer_activation_bytes with {name}: "
               + ("returned a number" if what == "returned" else f"raised {what}")
               + "; it should raise ValueError")


def _modes(impl: Impl) -> dict:
    return {"bytes": _bytes(BYTE_CASES)(impl), "refused": _bytes_refusals(impl)}


def _judge_modes(data: dict) -> None:
    _bytes_judge(BYTE_CASES)(data["bytes"])
    _judge_bytes_refusals(data["refused"])


BYTE_EXAMPLES = examples(8, seed=91, seq=(1, 4096), batch=(1, 16), d_model=(1, 64),
                         n_heads=(1, 16), mode=(0, 2))


def _bytes_hidden(impl: Impl) -> list[dict]:
    return compute_examples(lambda seq, batch, d_model, n_heads, mode:
                            impl(seq, batch, d_model * 64, n_heads, MODES[mode]), BYTE_EXAMPLES)


def _judge_bytes_hidden(records: list[dict]) -> None:
    def one(out: Any, seq: int, batch: int, d_model: int, n_heads: int, mode: int) -> None:
        try:
            _bytes_judge([(seq, batch, d_model * 64, n_heads, MODES[mode])])([out])
        except CheckFailure as exc:
            raise AssertionError(str(exc)) from None
    judge_examples(records, one)


# ---- 9.2 recomputation ------------------------------------------------------------------------

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
    for k, x in enumerate(_data(width, seed, batches)):
        x.requires_grad_(input_grad)
        phase["forward"] = True
        with torch.autograd.graph.saved_tensors_hooks(
                lambda t: packed.append(list(t.shape)) or t, lambda t: t):
            y = f(x)
        phase["forward"] = False
        gc.collect()
        if k == 0:
            still = [ref is not None and ref() is not None for ref in alive]
        if not (isinstance(y, torch.Tensor) and y.requires_grad):
            return {"out": y, "tracked": False}   # nothing for backward to run through
        y.pow(2).sum().backward()
        outputs.append(y.detach())
    return {"out": outputs[0], "tracked": True, "x_grad": x.grad if input_grad else None,
            "grads": [p.grad for p in model.parameters()],
            "packed": packed if batches == 1 else packed[: len(packed) // batches],
            "alive": still, "calls": calls}


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
        "segments' backward and no parameter gets a gradient (pass the segment's parameters "
        "to apply as inputs, so that the node needs a backward anyway)"))
    if input_grad:
        expect_close(data["x_grad"], want["x_grad"], "the input's gradient", rtol=1e-9,
                     atol=1e-12)
    for i, (got, grad) in enumerate(zip(data["grads"], want["grads"])):
        expect(got is not None, f"parameter {i} (layer {2 * (i // 2)}) has no gradient after "
                                "backward" + ("" if input_grad else ": with data that needs "
                                "no gradient, does autograd still call the first segment's "
                                "backward? (pass the parameters to apply)"))
        what = f"parameter {i}'s gradient" + (f" after {batches} backward passes (they add "
                                              "up)" if batches > 1 else "")
        expect_close(got, grad, what, rtol=1e-9, atol=1e-12)


def _judge_kept(data: dict, depth: int, width: int, segments: int) -> None:
    expect(data["tracked"], "f(x) does not require a gradient: autograd cannot run backward")
    from mpgpu_edu.memory.recompute import segment_bounds

    bounds = segment_bounds(depth, segments)
    want = [[5, width]] * segments
    packed = data["packed"]
    expect(len(packed) == segments,
           f"with {segments} segments of {depth} layers, forward kept {len(packed)} tensors "
           f"for backward; it should keep {segments}: each segment's input "
           "(ctx.save_for_backward), nothing from inside a segment")
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
    refused = {}
    for segments in (0, 7):
        try:
            impl(_model(6, 4, 2), segments)
            refused[segments] = "returned"
        except ValueError:
            refused[segments] = "ValueError"
        except NotImplementedError:
            raise
        except Exception as exc:  # noqa: BLE001 - reported as what it is
            refused[segments] = type(exc).__name__
    out["refused"] = refused
    return out


def _judge_accumulate(data: dict) -> None:
    _judge_values(data, 6, 4, batches=2, seed=2)
    for segments, what in data["refused"].items():
        expect(what == "ValueError", f"checkpointed(model of 6 layers, {segments}): "
               + ("returned" if what == "returned" else f"raised {what}")
               + "; it should raise ValueError (segment_bounds does)")


RECOMPUTE_EXAMPLES = examples(5, seed=92, depth=(2, 12), width=(2, 9), segments=(1, 12))


def _recompute_hidden(impl: Impl) -> list[dict]:
    def body(depth: int, width: int, segments: int) -> dict:
        return _run(impl, depth, width, min(segments, depth), seed=depth * width)
    return compute_examples(body, RECOMPUTE_EXAMPLES)


def _judge_recompute_hidden(records: list[dict]) -> None:
    def one(out: dict, depth: int, width: int, segments: int) -> None:
        try:
            _judge_values(out, depth, width, seed=depth * width)
            _judge_kept(out, depth, width, min(segments, depth))
            _judge_calls(out, depth)
        except CheckFailure as exc:
            raise AssertionError(str(exc)) from None
    judge_examples(records, one)


# ---- 9.3 the interleaved bubble ---------------------------------------------------------------

def _bubbles(cases: list[tuple[int, int, int]]) -> Impl:
    def compute(impl: Impl) -> list[float]:
        return [float(impl(p, m, v)) for p, m, v in cases]
    return compute


def _bubble_judge(cases: list[tuple[int, int, int]]) -> Callable[[list], None]:
    def judge(got: list) -> None:
        from mpgpu_edu.pipeline import bubble_overhead, interleaved_1f1b

        for (p, m, v), value in zip(cases, got):
            simulated = bubble_overhead(interleaved_1f1b(p, m, v))
            expect(abs(value - simulated) < 1e-9,
                   f"P={p}, M={m}, V={v}: {value:.6g}, but the simulated schedule's bubble is "
                   f"{simulated:.6g} of its compute time")
    return judge


REFUSED = {"M=6 on P=4": (4, 6, 2), "V=0": (4, 8, 0), "P=0": (0, 4, 1)}


def _refusals(impl: Impl) -> dict[str, str]:
    """What each size the schedule cannot run did: "ValueError", another exception's type
    name (ZeroDivisionError: it divided before checking), or "returned"."""
    out = {}
    for name, args in REFUSED.items():
        try:
            impl(*args)
            out[name] = "returned"
        except ValueError:
            out[name] = "ValueError"
        except NotImplementedError:
            raise  # the stub: not implemented, not a wrong answer
        except Exception as exc:  # noqa: BLE001 - reported as what it is, with its input
            out[name] = type(exc).__name__
    return out


def _judge_refusals(out: dict[str, str]) -> None:
    for name, what in out.items():
        args = "interleaved_bubble_overhead({}, {}, {})".format(*REFUSED[name])
        expect(what != "returned", f"{args} ({name}) returned a number: it should raise "
                                   "ValueError, the schedule cannot run these sizes")
        expect(what == "ValueError", f"{args} ({name}) raised {what}; it should raise "
                                     "ValueError, the schedule cannot run these sizes")


BUBBLE_EXAMPLES = examples(8, seed=82, p=(2, 8), rounds=(1, 6), v=(1, 4))


def _bubble_hidden(impl: Impl) -> list[dict]:
    return compute_examples(lambda p, rounds, v: float(impl(p, p * rounds, v)),
                            BUBBLE_EXAMPLES)


def _judge_bubble_hidden(records: list[dict]) -> None:
    def one(out: float, p: int, rounds: int, v: int) -> None:
        _bubble_judge([(p, p * rounds, v)])([out])
    judge_examples(records, one)


CASES: dict[str, list[Case]] = {
    "9.1": [
        Case("the docstring's example", 1, _bytes([(1024, 1, 1024, 16, "none")]),
             _bytes_judge([(1024, 1, 1024, 16, "none")])),
        Case("none, selective and full on two shapes; bad sizes and modes raise ValueError", 1,
             _modes, _judge_modes),
        Case("hidden: other shapes", 1, _bytes_hidden, _judge_bytes_hidden, hidden=True),
    ],
    "9.2": [
        Case("8 layers in 2 segments: the output and every gradient equal the model's", 2,
             _basic, lambda d: _judge_values(d, 8, 6)),
        Case("forward keeps only each segment's input", 2, _basic,
             lambda d: _judge_kept(d, 8, 6, 2)),
        Case("every layer's forward runs twice: once more in backward", 1, _basic,
             lambda d: _judge_calls(d, 8)),
        Case("data that needs no gradient: the first segment's parameters still get theirs", 1,
             _no_input_grad, lambda d: _judge_values(d, 7, 5, input_grad=False, seed=1)),
        Case("gradients accumulate over two backward passes; a bad segments raises", 1,
             _accumulate, _judge_accumulate),
        Case("hidden: other depths, widths and segments", 1, _recompute_hidden,
             _judge_recompute_hidden, hidden=True),
    ],
    "9.3": [
        Case("the docstring's example", 1, _bubbles([(4, 8, 2)]), _bubble_judge([(4, 8, 2)])),
        Case("agrees with the simulated schedule; V=1 is 1F1B", 1,
             _bubbles([(2, 4, 3), (3, 9, 2), (4, 4, 1)]),
             _bubble_judge([(2, 4, 3), (3, 9, 2), (4, 4, 1)])),
        Case("refuses sizes the schedule cannot run", 1, _refusals, _judge_refusals),
        Case("hidden: other sizes", 1, _bubble_hidden, _judge_bubble_hidden, hidden=True),
    ],
}
