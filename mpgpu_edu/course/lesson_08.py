"""Lesson 08: fitting bigger models: sharded parameters (ZeRO-3 / FSDP)."""

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
    ex('8.2', 'wrap_fsdp', 'Capstone: your own sharded (ZeRO-3 / FSDP) wrapper', 18,
       ("A layer's full parameters exist only inside forward_layer and backward_layer: gather "
        "at the start of each and let the vector go at the end (ShardedLayerFn already keeps "
        "nothing but the layer's input). The gradient leaves as a reduce-scatter started on "
        "the comm stream; finish() waits for those and adds each into its shard's .grad.",
        "gather(i, step): self.start_gather(i) (it does nothing if the gather was prefetched), "
        "wait for self.pending.pop(i), concatenate the list, cut it to sizes[i]; with "
        "prefetch, self.start_gather(self.next_layer(i, step)) before returning. "
        "forward_layer: run_layer on gather(i, +1). backward_layer: gather(i, -1) first (so a "
        "prefetched gather is queued before this layer's reduce-scatter), layer_backward, pad "
        "the flat gradient to shards[i].numel() * comm.world_size elements, start its "
        "reduce-scatter with 'mean', append (i, work) to self.reducing, return the input's "
        "gradient. finish: wait for each, add into shards[i].grad (None at first), clear.",
        "def gather(self, i, step):\n    self.start_gather(i)\n    full = torch.cat(self."
        "pending.pop(i).wait())[: sizes[i]]\n    if prefetch:\n        self.start_gather("
        "self.next_layer(i, step))\n    return full\n\ndef "
        "backward_layer(self, i, x, grad_out, needs_input_grad):\n    grad_x, grad_full = "
        "layer_backward(layers[i], self.gather(i, -1), x, grad_out, needs_input_grad)\n    "
        "padded = torch.zeros(shards[i].numel() * comm.world_size, dtype=grad_full.dtype)\n"
        "    padded[: sizes[i]] "
        "= grad_full\n    self.reducing.append((i, comm.run_async(reduce_scatter, comm, "
        "padded, 'mean')))\n    return grad_x"),
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
        key="08.prefetch-memory",
        question=("The same step, with prefetch: at its peak, how many layers' full (gathered) "
                  "parameters does a rank hold at once?"),
        choices=("none: prefetch only moves the gathers earlier", "one, as without prefetch",
                 "two: the layer that runs and the next", "all of them"),
        answer=2,
        why=("Prefetch starts the next layer's gather while this layer computes, so both "
             "gathered vectors exist together: twice the gathered memory of no prefetch, for "
             "the time it hides. FSDP2 bounds this the same way (one layer ahead by default).")),
)

LESSON = Lesson(8, 'fitting bigger models', 'ex08_bigger_models',
                'notebooks/08_bigger_models.ipynb', EXERCISES, PREDICTIONS,
                drives_demos=('8.2',))
