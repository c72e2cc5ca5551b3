"""Checks of lesson 05: column-parallel linear, ZeRO-1 Adam, the DP x PP mesh, Megatron's MLP.

Every case has a *compute* half (runs the learner's function on the simulator, returns plain
data) and a *judge* half (rebuilds the same inputs from the case's seed and compares).
Oracles: ``torch.nn.functional.linear`` and an unsplit MLP under autograd on the whole
weights, ``torch.optim.Adam`` on the whole parameter vector with the *mean* gradient (its
moments too: Adam's update hides a gradient's scale, its moments do not),
``mpgpu_edu.hybrid.Mesh`` for the groups. Structure: FLOPs per rank from the simulator's
compute events, bytes per rank, optimizer state per rank, bytes sent in the forward and in
the backward (an all-reduce of S bytes on N ranks sends 2 (N - 1) S in all, whatever its
algorithm).

Modules: ``column`` (5.1), ``zero1`` (5.2), ``mesh`` (5.3), ``megatron`` (5.4).
"""

from __future__ import annotations

from mpgpu_edu.grading.checks import Case
from mpgpu_edu.grading.checks._support import each, examples
from mpgpu_edu.grading.checks.lesson_05.column import (_COLUMN_BIG, _COLUMN_SHAPES,
                                                       _column_compute, _column_flops,
                                                       _column_traffic, _column_values)
from mpgpu_edu.grading.checks.lesson_05.megatron import (_MLP_MAIN, _MLP_UNEVEN, _mlp_compute,
                                                         _mlp_everything, _mlp_forward,
                                                         _mlp_hidden_examples, _mlp_input_grad,
                                                         _mlp_weight_grads,
                                                         _one_all_reduce_each_way)
from mpgpu_edu.grading.checks.lesson_05.mesh import (_groups_agree, _groups_bad_compute,
                                                     _groups_bad_judge, _groups_compute,
                                                     _groups_examples)
from mpgpu_edu.grading.checks.lesson_05.zero1 import (_ZERO1_VALUES, _zero1_all, _zero1_compute,
                                                      _zero1_moments, _zero1_params,
                                                      _zero1_state, _zero1_traffic)

REFERENCES = {  # the package's own implementation, out of reach while the learner's runs
    "5.1": ["mpgpu_edu.tensor.layers:ColumnParallelLinear"],
    "5.3": ["mpgpu_edu.hybrid.mesh:Mesh", "mpgpu_edu.hybrid.mesh:make_groups"],
    "5.4": ["mpgpu_edu.tensor.layers:ParallelMLP"],
}

CASES: dict[str, list[Case]] = {
    "5.1": [
        Case("the full output on every rank, with and without a bias", 2,
             *each(_COLUMN_SHAPES, _column_compute, _column_values)),
        # FLOPs are counted inside the submission's process, where the grader cannot verify
        # them: the case tells the learner, and earns no points.
        Case("each rank computes 1/N of the FLOPs (feedback, no points: counted inside your "
             "process)", 0, *each(_COLUMN_BIG, _column_compute, _column_flops)),
        Case("traffic: an all-gather of the output", 1,
             *each(_COLUMN_BIG, _column_compute, _column_traffic)),
        Case("hidden: random shapes", 1,
             *each(examples(15, 51, n=(1, 4), batch=(1, 4), d_in=(1, 5), k=(1, 3),
                            bias=(0, 1)), _column_compute, _column_values), hidden=True),
    ],
    "5.2": [
        Case("matches torch.optim.Adam on the mean gradient", 1,
             *each(_ZERO1_VALUES, _zero1_compute, _zero1_params)),
        Case("Adam's moments are the mean gradient's, shard by shard", 2,
             *each(_ZERO1_VALUES, _zero1_compute, _zero1_moments)),
        Case("optimizer state per rank is 1/N", 1,
             *each([dict(n=4, shard=5, steps=2)], _zero1_compute, _zero1_state)),
        Case("traffic: a reduce-scatter and an all-gather", 1,
             *each([dict(n=4, shard=6, steps=2)], _zero1_compute, _zero1_traffic)),
        Case("hidden: random sizes", 1,
             *each(examples(12, 52, n=(1, 4), shard=(1, 4), steps=(1, 3)), _zero1_compute,
                   _zero1_all), hidden=True),
    ],
    "5.3": [
        Case("the docstring's example; 2 x 4, 4 x 2, 1 stage, 1 replica", 1,
             *each([dict(world_size=w, pp_size=p)
                    for w, p in [(4, 2), (8, 4), (8, 2), (3, 1), (3, 3)]],
                   _groups_compute, _groups_agree)),
        Case("pp_size must divide world_size", 1, _groups_bad_compute, _groups_bad_judge),
        Case("hidden: random meshes", 1,
             *each(_groups_examples(), _groups_compute, _groups_agree), hidden=True),
    ],
    "5.4": [
        Case("forward: the unsplit MLP's output on every rank", 3,
             *each(_MLP_MAIN, _mlp_compute, _mlp_forward)),
        Case("backward: x.grad is the unsplit MLP's input gradient on every rank", 2,
             *each(_MLP_MAIN, _mlp_compute, _mlp_input_grad)),
        Case("backward: each rank's weight gradients are its shards of the unsplit MLP's; "
             "b2's is whole", 3,
             *each(_MLP_MAIN, _mlp_compute, _mlp_weight_grads)),
        Case("traffic: one all-reduce of the output forward, one of x's gradient backward", 2,
             *each(_MLP_MAIN, _mlp_compute, _one_all_reduce_each_way)),
        Case("hidden features not a multiple of N: 7 or 3 on 4 ranks, and 4 on 3 ranks "
             "without biases", 1,
             *each(_MLP_UNEVEN, _mlp_compute, _mlp_everything)),
        Case("hidden: other sizes, world sizes 1-5 and (B, T, d) inputs", 2,
             *each(_mlp_hidden_examples(), _mlp_compute, _mlp_everything), hidden=True),
    ],
}
