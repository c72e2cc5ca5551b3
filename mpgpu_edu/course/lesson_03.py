"""Lesson 03: data parallel."""

from __future__ import annotations

from mpgpu_edu.course._types import CAPSTONE, Lesson, Prediction, ex

EXERCISES = (
    ex('3.1', 'average_gradients', 'DDP: average the gradients', 4,
       ("Every rank holds a gradient computed on its own shard; the gradient of the whole "
        "batch is their mean. One collective per parameter does it, in place.",
        "Loop over model.parameters(); for each, one all-reduce of its .grad with the "
        "averaging op. Nothing to return.",
        "for p in model.parameters():\n    all_reduce(comm, p.grad, op=...)")),
    ex('3.2', 'make_buckets', 'DDP: bucket the gradients', 5,
       ("Backward produces the last parameter's gradient first, so the first bucket must "
        "hold the last parameters. Greedy: fill a bucket until the next size would not fit.",
        "Walk the indices from len(sizes) - 1 down to 0, keeping the current bucket and its "
        "byte count; close it (append it to the result) when the next size would overflow "
        "it, unless it is empty. Append the last bucket if it is not empty.",
        "buckets, current, filled = [], [], 0\nfor i in reversed(range(len(sizes))):\n"
        "    # would sizes[i] take a non-empty current over bucket_bytes? close current\n"
        "    ...\n    # then i joins current\n    ...\n# after the loop: current, unless "
        "empty")),
    ex('3.3', 'backward_with_overlap', 'DDP: overlap communication with backward', 5,
       ("Do not wait for backward to end: a hook fires when a parameter's gradient is "
        "complete, and the all-reduce can start from there on the communication stream, "
        "while backward computes the earlier layers.",
        "Register a post-accumulate-grad hook on every parameter that *starts* an "
        "asynchronous all-reduce and keeps its handle; run backward; remove the hooks; "
        "wait for every handle.",
        "works = []\ndef hook(param):\n    works.append(...)  # param.grad's all-reduce "
        "(mean), started on the comm stream\nhandles = [p.register_post_accumulate_grad_hook("
        "hook) for p in ...]\n# backward; remove every handle even if it raises; then wait "
        "for every work")),
    ex('3.4', 'adam_memory', 'Memory of training with Adam', 4,
       ("Count parameters, not bytes of data: numel() works on the meta device. Every "
        "parameter keeps its weights; only the trainable ones have a gradient and Adam state.",
        "Pick (weight bytes, state bytes) from the precision, raising for an unknown one; "
        "sum numel over all parameters and over those with requires_grad; multiply.",
        "weight, state = (4, 8) if precision == 'fp32' else (2, 12)\ntrainable = "
        "sum(p.numel() for p in model.parameters() if p.requires_grad)")),
    ex('3.5', 'wrap_ddp', 'Capstone: your own DDP wrapper', 20,
       ("DDP is three things: the same start everywhere (broadcast rank 0's parameters "
        "once), buckets in reverse parameter order (your make_buckets), and a gradient hook "
        "that launches a bucket's averaging all-reduce, asynchronously, the moment the "
        "bucket's last gradient is in. finish() waits and copies the averages back.",
        "In wrap_ddp: flatten the parameters, broadcast, copy back; build the buckets from "
        "the parameters' byte sizes. Define a class with __call__ (the module's forward), a "
        "hook that counts the missing gradients of the parameter's bucket and, at zero, "
        "concatenates the bucket's grads and starts comm.run_async(all_reduce, ...), and "
        "finish(): wait for each started job, copy the flat result into each p.grad, reset "
        "the counters. Register the hook on every parameter in __init__ and keep it.",
        "buckets = [[params[j] for j in b] for b in make_buckets(sizes, cap)]  # indices -> "
        "parameters\n"
        "# buckets start in order 0, 1, 2, ... (the contract): backward fills the reverse-"
        "order buckets in that order\n"
        "def _on_grad_ready(self, param):\n    i = self.bucket_of[id(param)]\n"
        "    self.missing[i] -= 1\n    if self.missing[i] == 0:\n"
        "        flat = torch.cat([p.grad.reshape(-1) for p in buckets[i]])\n"
        "        self.started.append((i, flat, "
        "comm.run_async(all_reduce, comm, flat, 'mean')))\n# finish(): work.wait(); copy "
        "flat.split([p.numel() ...]) into each p.grad; self.started.clear(); reset missing"),
       CAPSTONE),
)

PREDICTIONS = (
    Prediction(
        key="03.memory-per-gpu",
        question=("DDP with Adam on 4 devices instead of 1, same model: how much memory does "
                  "each device need for parameters, gradients and optimizer state?"),
        choices=("a quarter of one device's", "half of one device's",
                 "the same as one device's", "more than one device's"),
        answer=2,
        why=("Every device keeps a whole replica: all the parameters, all the gradients and "
             "all of Adam's moments, exactly as one device would (and DDP adds the scratch "
             "space of its all-reduce). Only the activations shrink with the batch shard. "
             "Splitting the batch saves compute, never state: ZeRO (lesson 05) splits it.")),
    Prediction(
        key="03.light-on-8",
        question=("The light model (6.3 M parameters, batch 512) on 8 RTX 4090s joined by "
                  "PCIe, with your DDP wrapper (25 MiB buckets, torch's default): how does "
                  "one step compare with one card?"),
        choices=("about 8x faster", "about 2-4x faster", "about as fast",
                 "slower than one card"),
        answer=3,
        why=("Each card computes 1/8 of a small batch, but every step still averages all "
             "24 MiB of gradients over PCIe, staged through shared host memory and across "
             "the link between the box's two CPUs: the all-reduce takes far longer "
             "than the backward it could hide behind. More cards, slower steps.")),
)

LESSON = Lesson(3, 'data parallel', 'ex03_data_parallel', 'notebooks/03_data_parallel.ipynb',
                EXERCISES, PREDICTIONS, drives_demos=('3.5',))
