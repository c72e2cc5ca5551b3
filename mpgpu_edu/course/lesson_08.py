"""Lesson 08: fitting bigger models."""

from __future__ import annotations

from mpgpu_edu.course._types import CAPSTONE, Lesson, Prediction, ex

EXERCISES = (
    ex('8.1', 'shard_of', 'ZeRO-3: one rank\'s shard of a flat vector', 3,
       ("All-gather needs every rank's piece to be the same size, so make the vector's length "
        "a multiple of N first: pad it with zeros at the end.",
        "size = ceil(E / N); a zero tensor of size * N elements (the dtype and device of "
        "flat); copy flat into its start; return the slice [rank * size, (rank + 1) * size) "
        "as a new tensor.",
        "size = -(-flat.numel() // world_size)\npadded = torch.zeros(size * world_size, "
        "dtype=flat.dtype, device=flat.device)\npadded[: flat.numel()] = flat\nreturn "
        "padded[...].clone()")),
    ex('8.2', 'interleaved_bubble_overhead', 'Interleaved 1F1B: the bubble in closed form', 4,
       ("1F1B's bubble costs (P-1)/M of the compute time: P-1 forward-and-backward slots to "
        "fill and drain, against M of work. With V chunks per device every slot is V times "
        "shorter.",
        "Check the arguments first (all at least 1; M a multiple of P, else ValueError); "
        "then one division.",
        "if n_microbatches % n_stages:\n    raise ValueError(...)\nreturn (n_stages - 1) / "
        "(n_chunks * n_microbatches)")),
    ex('8.3', 'wrap_fsdp', 'Capstone: your own sharded (ZeRO-3 / FSDP) wrapper', 20,
       ("A layer's full parameters exist only while it runs. Make each layer one autograd "
        "node (a torch.autograd.Function) whose forward gathers, runs the layer without "
        "keeping its weights and returns, and whose backward gathers again, runs the layer's "
        "backward and starts the reduce-scatter of its gradient.",
        "In wrap_fsdp: the shards (shard_of of each layer's flattened parameters, as "
        "nn.Parameters). A class with a dict of started gathers (comm.run_async(all_gather, "
        "...)), a gather(i) that starts one if needed, waits, concatenates and (with "
        "prefetch) starts the next layer's; __call__ applies the Function per layer; "
        "finish() waits for the reduce-scatters and adds each into its shard's .grad. In the "
        "Function: forward under torch.no_grad() saves only x; backward gathers, runs the "
        "layer again with grad enabled on full.requires_grad_(), backward, pads full.grad "
        "and starts comm.run_async(reduce_scatter, comm, padded, 'mean').",
        "class _Layer(torch.autograd.Function):\n    @staticmethod\n    def forward(ctx, x, "
        "shard, owner, i):\n        full = owner.gather(i, +1)\n        with torch.no_grad():\n"
        "            out = functional_call(layers[i], layer_views(layers[i], full), (x,))\n"
        "        ctx.save_for_backward(x); ctx.owner, ctx.i = owner, i\n        return out\n"
        "    @staticmethod\n    def backward(ctx, grad_out):\n        full = ctx.owner.gather("
        "ctx.i, -1).requires_grad_()\n        x = ...detach().requires_grad_(ctx."
        "needs_input_grad[0])\n        with torch.enable_grad():\n            out = ...; "
        "torch.autograd.backward(out, grad_out)\n        # pad full.grad, start its "
        "reduce-scatter (mean) on the comm stream\n        return x.grad, None, None, None"),
       CAPSTONE),
)

PREDICTIONS = (
    Prediction(
        key="08.fsdp-traffic",
        question=("One training step of the same model on 4 ranks: how many bytes does each "
                  "rank send with ZeRO-3 (FSDP), compared with DDP's all-reduce?"),
        choices=("fewer than DDP: each rank only holds a quarter", "the same as DDP",
                 "about 1.5x DDP's", "about 4x DDP's"),
        answer=2,
        why=("DDP all-reduces the gradients once: a reduce-scatter and an all-gather, "
             "2 (N-1)/N of the model per rank. FSDP does an all-gather in forward, another in "
             "backward and a reduce-scatter: 3 (N-1)/N. Sharding costs half as much traffic "
             "again, and saves (N-1)/N of the state.")),
    Prediction(
        key="08.recompute-time",
        question=("GPT-2 medium, 16 sequences of 1024 tokens per device, eager attention: "
                  "full activation recomputation shrinks the activations to a few percent. "
                  "How much longer is a training step?"),
        choices=("no longer: recomputing is free", "about 10% longer", "about 30% longer",
                 "about twice as long"),
        answer=2,
        why=("Full recomputation runs every layer's forward a second time during backward. "
             "Forward is about a third of forward + backward (backward costs twice the "
             "FLOPs), so the step gets about a third longer; communication and the optimizer "
             "are not recomputed, so a little less than that.")),
    Prediction(
        key="08.interleaved",
        question=("4 stages, 8 microbatches: 1F1B loses (P-1)/M = 37.5% of the compute time "
                  "to the bubble. Interleaved 1F1B with 2 chunks per device loses:"),
        choices=("the same 37.5%", "about half: 18.75%", "about a quarter: 9.4%", "nothing"),
        answer=1,
        why=("Each device's chunk steps do half a stage's work each, so the fill and drain "
             "take half as long: (P-1)/(V M) = 3/16. The price: twice as many messages between "
             "the devices, and more microbatch-chunks held at once.")),
)

LESSON = Lesson(8, 'fitting bigger models', 'ex08_bigger_models',
                'notebooks/08_bigger_models.ipynb', EXERCISES, PREDICTIONS,
                drives_demos=('8.3',))
