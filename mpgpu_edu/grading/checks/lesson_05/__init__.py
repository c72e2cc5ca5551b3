"""Checks of lesson 05: column-parallel linear, ZeRO-1 Adam, the DP x PP mesh, Megatron's MLP.

Every case has a *compute* half (runs the learner's function on the simulator, returns plain
data) and a *judge* half (rebuilds the same inputs from the case's seed and compares).
Oracles: ``torch.nn.functional.linear`` and an unsplit MLP under autograd on the whole
weights, ``torch.optim.Adam`` on the whole parameter vector with the *mean* gradient (its
moments too: Adam's update hides a gradient's scale, its moments do not),
``mpgpu_edu.hybrid.Mesh`` for the groups. 5.4 also checks that x's gradient is right where
x reaches the loss outside the block too or goes through it twice. Structure: bytes per
rank, bytes sent in the forward and in the backward (an all-reduce of S bytes on N ranks
sends 2 (N - 1) S in all, whatever its algorithm). Seen only inside a rank's process, and
so feedback worth no points: FLOPs per rank, optimizer state per rank, and whether the
caller's inputs were left as they were (5.1's tensors, 5.2's gradient).

Modules: ``column`` (5.1), ``zero1`` (5.2), ``mesh`` (5.3), ``megatron`` (5.4).
"""

from __future__ import annotations

from mpgpu_edu.grading.checks import FEEDBACK, Case
from mpgpu_edu.grading.checks._support import each, examples
from mpgpu_edu.grading.checks.lesson_05.column import (_COLUMN_BIG, _COLUMN_KEEPS,
                                                       _COLUMN_SHAPES, _column_compute,
                                                       _column_flops, _column_keeps,
                                                       _column_traffic, _column_values)
from mpgpu_edu.grading.checks.lesson_05.megatron import (_MLP_MAIN, _MLP_REUSED, _MLP_UNEVEN,
                                                         _mlp_compute, _mlp_everything,
                                                         _mlp_forward, _mlp_hidden_examples,
                                                         _mlp_input_grad,
                                                         _mlp_reused_input_grad,
                                                         _mlp_weight_grads,
                                                         _one_all_reduce_each_way)
from mpgpu_edu.grading.checks.lesson_05.mesh import (_groups_agree, _groups_bad_compute,
                                                     _groups_bad_judge, _groups_compute,
                                                     _groups_examples)
from mpgpu_edu.grading.checks.lesson_05.zero1 import (_ZERO1_VALUES, _zero1_all, _zero1_compute,
                                                      _zero1_keeps_grad, _zero1_moments,
                                                      _zero1_params, _zero1_state,
                                                      _zero1_traffic)

# The package's own implementation of each exercise, out of reach while the learner's runs
# (5.2 has none: the package has no ZeRO-1 step of that signature). The notebook's demos take
# 5.4's from ``lessons.tensor_and_hybrid.reference_megatron_mlp``, which calls the package's
# megatron_mlp and so is blocked with it.
# Run with every rank in a process of its own in class grading (see lesson 01's checks):
# each rank holds only its own shards of the weights, or its own gradients.
RANKS_APART = ("5.1", "5.2", "5.4")

REFERENCES = {
    "5.1": ["mpgpu_edu.tensor.layers:ColumnParallelLinear",
            "mpgpu_edu.tensor.mappings:gather_from_parallel",
            "mpgpu_edu.tensor.mappings:_GatherFromParallel"],
    "5.3": ["mpgpu_edu.hybrid.mesh:Mesh", "mpgpu_edu.hybrid.mesh:Mesh.replica_ranks",
            "mpgpu_edu.hybrid.mesh:Mesh.stage_ranks", "mpgpu_edu.hybrid.mesh:make_groups",
            "mpgpu_edu.collectives.hierarchical:node_groups",
            "mpgpu_edu.collectives.hierarchical:rail_groups", "mpgpu_edu.viz.mesh:mesh_coords"],
    "5.4": ["mpgpu_edu.tensor.megatron:megatron_mlp", "mpgpu_edu.tensor.layers:ParallelMLP",
            "mpgpu_edu.tensor.mappings:copy_to_parallel",
            "mpgpu_edu.tensor.mappings:reduce_from_parallel",
            "mpgpu_edu.tensor.mappings:*"],  # its scatter and gather would do f and g too
}

CASES: dict[str, list[Case]] = {
    "5.1": [
        Case("the full output on every rank, with and without a bias", 1,
             *each(_COLUMN_SHAPES, _column_compute, _column_values)),
        Case("float64 in, float64 out", 1, *each(_COLUMN_KEEPS, _column_compute, _column_values)),
        Case("the caller's x, weight_shard and bias_shard left unchanged " + FEEDBACK, 0,
             *each(_COLUMN_KEEPS, _column_compute, _column_keeps)),
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
        Case("matches torch.optim.Adam on the mean gradient", 2,
             *each(_ZERO1_VALUES, _zero1_compute, _zero1_params)),
        Case("Adam's moments are the mean gradient's, shard by shard", 1,
             *each(_ZERO1_VALUES, _zero1_compute, _zero1_moments)),
        Case("the caller's grad is left unchanged " + FEEDBACK, 0,
             *each(_ZERO1_VALUES, _zero1_compute, _zero1_keeps_grad)),
        Case("optimizer state per rank is 1/N " + FEEDBACK, 0,
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
        Case("ValueError unless both are at least 1 and pp_size divides world_size", 1,
             _groups_bad_compute, _groups_bad_judge),
        Case("hidden: random meshes", 1,
             *each(_groups_examples(), _groups_compute, _groups_agree), hidden=True),
    ],
    "5.4": [
        Case("forward: the unsplit MLP's output on every rank", 2,
             *each(_MLP_MAIN, _mlp_compute, _mlp_forward)),
        Case("backward: x.grad is the unsplit MLP's input gradient on every rank", 2,
             *each(_MLP_MAIN, _mlp_compute, _mlp_input_grad)),
        Case("backward: each rank's weight gradients are its shards of the unsplit MLP's; "
             "b2's is whole", 2,
             *each(_MLP_MAIN, _mlp_compute, _mlp_weight_grads)),
        Case("backward: x.grad is still right when x also feeds a residual, or goes through "
             "the block twice", 2,
             *each(_MLP_REUSED, _mlp_compute, _mlp_reused_input_grad)),
        Case("traffic: one all-reduce of the output forward, one of x's gradient backward", 2,
             *each(_MLP_MAIN, _mlp_compute, _one_all_reduce_each_way)),
        Case("hidden features not a multiple of N: 7 or 3 on 4 ranks, and 4 on 3 ranks "
             "without biases", 1,
             *each(_MLP_UNEVEN, _mlp_compute, _mlp_everything)),
        Case("hidden: other sizes, world sizes 1-5 and (B, T, d) inputs", 2,
             *each(_mlp_hidden_examples(), _mlp_compute, _mlp_everything), hidden=True),
    ],
}
