"""Checks of lesson 09: what a transformer layer keeps for backward, and the capstone (activation
recomputation built on ``torch.autograd.Function``).

Every case has two halves. *compute* calls the learner's function and returns plain data: byte
counts; for the capstone, the output and gradients of a small model, the shapes of what
autograd packed for backward during the forward (``saved_tensors_hooks``), which layer outputs
were still alive after it (weak references), and how often each layer's forward ran.
*judge* rebuilds the reference in the grader: the byte counts from
``memory.models.layer_activation_bytes`` (Korthikanti et al. 2022), the gradients from plain
autograd on the same model and data, and the segments from its own split. The capstone's
output and gradients earn its points; what its forward packed and kept alive, how often each
layer ran and whether the caller's x was left as it was are seen only inside the learner's
process: feedback cases, worth no points (``checks.FEEDBACK``).

The package's activation formulas and recomputation (``memory.recompute``) and torch's
``torch.utils.checkpoint`` are out of reach while the learner's code runs (``REFERENCES``).

Modules: ``activations`` (9.1), ``recompute`` (9.2)."""

from __future__ import annotations

from mpgpu_edu.grading.checks import FEEDBACK, Case
from mpgpu_edu.grading.checks.lesson_09.activations import (_bytes, _bytes_hidden, _bytes_judge,
                                                            _judge_bytes_hidden, _judge_modes,
                                                            _modes)
from mpgpu_edu.grading.checks.lesson_09.recompute import (_accumulate, _basic, _input_kept_runs,
                                                          _judge_accumulate, _judge_calls,
                                                          _judge_input_kept_runs, _judge_kept,
                                                          _judge_recompute_hidden,
                                                          _judge_recompute_hidden_inside,
                                                          _judge_values, _no_input_grad,
                                                          _recompute_hidden)

REFERENCES = {
    "9.1": ["mpgpu_edu.memory.models:layer_activation_bytes",
            "mpgpu_edu.memory.models:activation_bytes",
            "mpgpu_edu.memory.models:activation_terms",
            "mpgpu_edu.estimate.choosing:_tensor_parallel",
            "mpgpu_edu.estimate.choosing:_Job"],
    "9.2": ["mpgpu_edu.memory.recompute:checkpointed", "torch.utils.checkpoint:checkpoint",
            "torch.utils.checkpoint:checkpoint_sequential",
            "torch.utils.checkpoint:CheckpointFunction"],
}


CASES: dict[str, list[Case]] = {
    "9.1": [
        Case("the docstring's example", 1, _bytes([(1024, 1, 1024, 16, "none")]),
             _bytes_judge([(1024, 1, 1024, 16, "none")])),
        Case("none, selective and full on two shapes, exact to the byte (a million-token "
             "context too); bad sizes and modes raise ValueError", 1, _modes, _judge_modes),
        Case("hidden: other shapes", 1, _bytes_hidden, _judge_bytes_hidden, hidden=True),
    ],
    "9.2": [
        Case("8 layers in 2 segments: the output and every gradient equal the model's", 4,
             _basic, lambda d: _judge_values(d, 8, 6)),
        Case("forward keeps only each segment's input " + FEEDBACK, 0, _basic,
             lambda d: _judge_kept(d, 8, 6, 2)),
        Case("every layer's forward runs twice: once more in backward " + FEEDBACK, 0, _basic,
             lambda d: _judge_calls(d, 8)),
        Case("data that needs no gradient: every parameter still gets its gradient", 1,
             _no_input_grad, lambda d: _judge_values(d, 7, 5, input_grad=False, seed=1)),
        Case("gradients accumulate over two backward passes; bad segment counts raise", 1,
             _accumulate, _judge_accumulate),
        Case("hidden: other depths, widths and segments", 2, _recompute_hidden,
             _judge_recompute_hidden, hidden=True),
        Case("the caller's x left as it was: its requires_grad unchanged " + FEEDBACK, 0,
             _input_kept_runs, _judge_input_kept_runs),
        Case("hidden: other depths, widths and segments: only each segment's input kept, "
             "every layer run twice, x left as it was " + FEEDBACK, 0, _recompute_hidden,
             _judge_recompute_hidden_inside, hidden=True),
    ],
}
