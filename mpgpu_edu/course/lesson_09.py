"""Lesson 09: memory for time: recomputation and accumulation."""

from __future__ import annotations

from mpgpu_edu.course._types import CAPSTONE, WARM_UP, Lesson, Prediction, ex

EXERCISES = (
    ex('9.1', 'layer_activation_bytes', 'What a transformer layer keeps for backward', 3,
       ("Add up what backward will need, tensor by tensor: most are s x b x h activations "
        "(34 bytes of them per token and channel in mixed precision), and the attention "
        "scores are a x s x s per sequence. Recomputation drops what it can compute again.",
        "Refuse sizes below 1 and unknown modes (ValueError). sbh = seq * batch * d_model; "
        "the scores are n_heads * seq * seq * batch, 5 bytes each. none: both terms; "
        "selective: no scores; full: only the layer's 2-byte input.",
        "sbh = seq * batch * d_model\nif recompute == 'none':\n    return 34 * sbh + 5 * "
        "n_heads * seq * seq * batch\nif recompute == 'selective':\n    return ...\nif "
        "recompute == 'full':\n    return 2 * ...\nraise ValueError(...)"),
       WARM_UP),
    ex('9.2', 'checkpointed', 'Capstone: activation recomputation, built from autograd', 8,
       ("A segment run under torch.no_grad() keeps nothing, so autograd cannot go back "
        "through it on its own: wrap each segment in a torch.autograd.Function whose forward "
        "saves only its input and whose backward runs the segment again with autograd on and "
        "back-propagates through that fresh copy.",
        "bounds and run(start, stop, x) are given. class Segment(torch.autograd."
        "Function): forward(ctx, x, start, stop, *params) saves x, runs run(start, stop, x) "
        "(autograd is already off inside a Function's forward); backward(ctx, grad_out) detaches x, requires_grad_(ctx."
        "needs_input_grad[0]), reruns the layers under enable_grad, torch.autograd.backward"
        "(out, grad_out), returns x.grad and one None per other input. Pass the segment's "
        "parameters as inputs: otherwise, when x needs no gradient (the data), no segment's "
        "output needs one, autograd calls no segment's backward, and no parameter gets a "
        "gradient.",
        "@staticmethod\ndef forward(ctx, x, start, stop, *params):\n    ctx.save_for_backward(x)\n"
        "    ctx.span = (start, stop)\n    return run(start, stop, x)  # autograd is off "
        "here\n\n@staticmethod\ndef backward(ctx, grad_out):\n    (x,) = ctx.saved_tensors\n    x = "
        "x.detach().requires_grad_(ctx.needs_input_grad[0])\n    with torch.enable_grad():\n"
        "        out = run(*ctx.span, x)\n    torch.autograd.backward(out, grad_out)\n    "
        "return (x.grad if ctx.needs_input_grad[0] else None, None, None, *[None] * "
        "(len(ctx.needs_input_grad) - 3))\n\ndef forward(x):\n    for start, stop in bounds:\n"
        "        params = [p for layer in layers[start:stop] for p in layer.parameters()]\n"
        "        x = Segment.apply(x, start, stop, *params)\n    return x"),
       CAPSTONE),
)

PREDICTIONS = (
    Prediction(
        key="09.recompute-time",
        question=("GPT-2 medium, 32 sequences of 1024 tokens per device, eager attention: "
                  "full activation recomputation shrinks the activations to under a tenth. "
                  "How much longer is a training step?"),
        choices=("no longer: recomputing is free", "about 10% longer", "about 30% longer",
                 "about twice as long"),
        answer=2,
        why=("Full recomputation runs every layer's forward a second time during backward. "
             "Forward is about a third of forward + backward (backward costs twice the "
             "FLOPs), so the step gets about a third longer; communication and the optimizer "
             "are not recomputed, so a little less than that.")),
    Prediction(
        key="09.segments-peak",
        question=("An MLP of 16 blocks (Linear and Tanh: 32 layers), recomputed in 1, 2, 4, 8 "
                  "or 16 segments of whole blocks: which keeps the lowest peak of activations, "
                  "counting the segment being recomputed in backward?"),
        choices=("1 segment: it keeps only the model's input after forward",
                 "4 segments, in between",
                 "16 segments: the smallest pieces to recompute",
                 "all the same: recomputation moves the memory, it does not save it"),
        answer=1,
        why=("After forward k segments keep k inputs; in backward the segment being recomputed "
             "keeps all of its L/k blocks' activations again (L = 16 blocks, one kept tensor "
             "each). The peak is about k + L/k blocks' worth: one segment recomputes the whole "
             "model at once, 16 keep 16 inputs. The lowest is near k = sqrt(L) = 4.")),)

LESSON = Lesson(9, 'memory for time', 'ex09_memory_for_time',
                'notebooks/09_memory_for_time.ipynb', EXERCISES, PREDICTIONS,
                drives_demos=('9.1', '9.2'))
