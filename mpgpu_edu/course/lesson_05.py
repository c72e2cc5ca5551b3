"""Lesson 05: tensor and hybrid parallel."""

from __future__ import annotations

from mpgpu_edu.course._types import CAPSTONE, WARM_UP, Lesson, Prediction, ex

EXERCISES = (
    ex('5.1', 'column_parallel_linear', 'Tensor parallel: column-parallel linear', 4,
       ("Row j of W makes output feature j from the whole x, and nothing else does: each rank "
        "can compute its own k output features without talking to anyone. Only then do the "
        "ranks need each other's features.",
        "Multiply x by this rank's rows of W (and add its slice of the bias, if there is one): "
        "a (B, k) slice. All-gather the slices (every rank receives N of them, in rank "
        "order) and put them side by side, so that feature order is W's row order.",
        "local = x @ weight_shard.T   # (B, k); add the bias slice when there is one\n"
        "parts = all_gather(comm, ...)   # [rank 0's (B, k), ..., rank N-1's]\n"
        "torch.cat(parts, dim=?)   # which dim holds the features? dim 0 would stack batches"),
       WARM_UP),
    ex('5.2', 'zero1_adam_step', 'ZeRO-1: sharded optimizer state', 5,
       ("Every replica would keep the same Adam moments: let rank r keep only those of shard "
        "r. It then needs the *average* gradient of its shard only, and afterwards everyone "
        "needs everyone's updated shard.",
        "Three moves: a reduce-scatter of the gradient that averages (your shard of the mean "
        "gradient); adam_update on your shard of params with `state`; an all-gather of the "
        "updated shards back into params. torch.tensor_split(params, N)[rank] is a view, so "
        "an update to it lands in params. Leave grad itself as it is.",
        "mine = reduce_scatter(comm, grad, op=...)   # a sum makes Adam's moments N times "
        "too big\n"
        "shard = torch.tensor_split(params, comm.world_size)[comm.rank]\n"
        "adam_update(shard, mine, state, lr)\n"
        "then all_gather(comm, shard.clone()) and copy the concatenation into params"),
       WARM_UP),
    ex('5.3', 'hybrid_groups', 'Hybrid parallel: the DP x PP mesh', 3,
       ("Read the mesh as a table, row by row: a row is one replica's pipeline (its stages), "
        "a column is one stage in every replica. A rank's number is its cell's position.",
        "Refuse bad input first (both at least 1, pp_size divides world_size: else "
        "ValueError). With R = world_size // pp_size replicas, pipeline group d lists the "
        "ranks of (d, s) for every stage s; data group s lists the ranks of (d, s) for every "
        "replica d.",
        "if <pp_size or world_size below 1, or a remainder>: raise ValueError(...)\n"
        "rank(d, s) = d * pp_size + s   # replica d, stage s\n"
        "pipelines = [[rank(d, s) for s in ...] for d in ...]   # one list per replica\n"
        "data groups: one list per stage, the same cells read down a column"),
       WARM_UP),
    ex('5.4', 'megatron_mlp', "Megatron-LM's MLP block: column, GeLU, row, one all-reduce", 13,
       ("The first layer's output features (split by columns) are exactly the second "
        "layer's input features (split by rows), so each rank runs both layers on its own "
        "hidden features and gets a *partial* output: one sum over the ranks finishes it. "
        "Backward mirrors it: x reaches the loss through every rank's slice, so x's gradient "
        "is a sum over the ranks too. Put both sums where autograd will call them.",
        "Write two small torch.autograd.Function classes inside megatron_mlp (they can use "
        "comm from the enclosing function): f, identity forward and an all-reduce of the "
        "gradient backward; g, an all-reduce forward and identity backward. Then f(x), the "
        "first linear with this rank's rows, GeLU, the second linear with this rank's "
        "columns and no bias, g, and b2 added after g. All-reduce a clone, never a tensor "
        "autograd still needs. Not a hook on x: x's gradient can also come from outside the "
        "block (a residual), and that share is not summed.",
        "class CopyToParallel(torch.autograd.Function):   # f: on x, before the first linear\n"
        "    @staticmethod\n"
        "    def forward(ctx, t): ...       # identity (return a view of t)\n"
        "    @staticmethod\n"
        "    def backward(ctx, grad): ...   # all-reduce a copy of grad; return it\n"
        "class ReduceFromParallel(torch.autograd.Function): ...   # g: f's mirror image\n"
        "hidden = gelu(<first linear of CopyToParallel.apply(x): this rank's rows, b1's slice>)\n"
        "out = ReduceFromParallel.apply(<second linear of hidden: this rank's columns, no bias>)\n"
        "then b2, once"),
       CAPSTONE),
)

PREDICTIONS = (
    Prediction(
        key="05.zero1-memory",
        question=("ZeRO-1 on 4 devices, mixed-precision Adam: each device's optimizer state "
                  "(the fp32 master weights and Adam's two moments) is what fraction of what "
                  "plain data parallelism keeps on each device?"),
        choices=("all of it: every replica still needs the whole state to update",
                 "a half", "a quarter", "an eighth"),
        answer=2,
        why=("Each of the N replicas keeps the state of its own 1/N of the parameters, so on "
             "4 devices a quarter (an eighth only on 8). The bf16 parameters and gradients "
             "stay whole on every device, so the device's total shrinks by less.")),
    Prediction(
        key="05.megatron-all-reduces",
        question=("Megatron's MLP block on 4 devices: a column-parallel linear, GeLU, then a "
                  "row-parallel linear. How many all-reduces does one forward pass need?"),
        choices=("none: each rank keeps its own slice",
                 "one, after the second linear",
                 "two, one after each linear",
                 "three: gather the hidden layer, split it, sum the output"),
        answer=1,
        why=("The first layer's output slices are exactly the second layer's input slices, so "
             "the hidden layer never leaves its rank; only the second layer's partial "
             "outputs are summed (g). The backward needs one too, of x's gradient (f).")),
    Prediction(
        key="05.tp-pcie",
        question=("The same MLP block (8192 tokens x 4096 features) on 4 RTX 4090s on PCIe, "
                  "instead of 4 A100s on NVLink. Each card has its own x16 uplink, but with no "
                  "peer-to-peer every copy between cards is staged through host memory, which "
                  "the four share. What share of the step does device 0 sit idle?"),
        choices=("under 10%", "between 10% and 50%", "more than half"),
        answer=1,
        why=("The all-reduces move the same 192 MiB per device on both machines, but on the "
             "RTX 4090s every ring step is four copies staged through host memory at once, "
             "sharing it fairly: each gets less than its own uplink, and the all-reduces take "
             "more than ten times as long as on NVLink. The RTX 4090's matrix products are "
             "slower too (about half the A100's bf16 peak), which hides part of that wait, so "
             "device 0 waits about a third of the step, not most of it: most of it only when "
             "the four cards also share one switch uplink (4xRTX4090-pcie-switch). A third of "
             "every layer lost to talking is still why tensor parallelism stays inside an "
             "NVLink machine.")),
)

LESSON = Lesson(5, 'tensor and hybrid parallel', 'ex05_tensor_and_hybrid',
                'notebooks/05_tensor_and_hybrid.ipynb', EXERCISES, PREDICTIONS,
                drives_demos=('5.4',))
