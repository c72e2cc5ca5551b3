"""Lesson 10: planning a large run: what fits, where each parallelism goes, and the pipeline's
bubble (interleaved 1F1B)."""

from __future__ import annotations

from mpgpu_edu.course._types import CAPSTONE, WARM_UP, Lesson, Prediction, ex

EXERCISES = (
    ex('10.1', 'interleaved_bubble_overhead', 'Interleaved 1F1B: the bubble in closed form', 4,
       ("1F1B's bubble costs (P-1)/M of the compute time: P-1 forward-and-backward slots to "
        "fill and drain, against M of work. With V chunks per device every slot is V times "
        "shorter.",
        "Check the arguments first (all at least 1; M a multiple of P, else ValueError); "
        "then one division.",
        "if min(n_stages, n_microbatches, n_chunks) < 1 or n_microbatches % n_stages:\n"
        "    raise ValueError(...)\nreturn (n_stages - 1) / "
        "(n_chunks * n_microbatches)"),
       WARM_UP),
    ex('10.2', 'interleaved_orders', 'Capstone: the interleaved 1F1B schedule, device by device',
       8,
       ("Two lists per device, as in 4.3's 1F1B: the order of its forwards and the order of its "
        "backwards, each a list of M x V Steps. Write one helper that gives the k-th of them "
        "(k = 0 .. M V - 1), then zip them after the warm-up.",
        "The k-th forward of device p: round, within = divmod(k, P * V); chunk = within // P; "
        "microbatch = round * P + within % P. The k-th backward is the same with chunk "
        "V - 1 - chunk. Warm-up w = min(2(P-1-p) + (V-1)P, M V), or min(P-1-p, M V) when "
        "V = 1; then forwards[:w], then forward w+i and backward i in turn, then the last w "
        "backwards.",
        "def nth(k, op):\n    round_, within = divmod(k, P * V)\n    chunk = within // P\n"
        "    if op == 'B':\n        chunk = V - 1 - chunk\n    return Step(p, round_ * P + "
        "within % P, op, chunk)\n\nforwards = [nth(k, 'F') for k in range(M * V)]\nbackwards "
        "= [nth(k, 'B') for k in range(M * V)]\nsteady = [s for pair in zip(forwards[w:], "
        "backwards) for s in pair]\norders.append(forwards[:w] + steady + backwards[M * V - "
        "w:])"),
       CAPSTONE),
)

PREDICTIONS = (
    Prediction(
        key="10.tp-across-nodes",
        question=("LLaMA-7B on 2 nodes x 8 H100, tensor parallelism over 8 GPUs and two "
                  "data-parallel replicas. Each TP group either stays inside a node, or takes "
                  "4 GPUs from each node. How much longer is the step of the split groups?"),
        choices=("within 20%: the same bytes move either way",
                 "between 1.2x and 4x longer",
                 "more than 4x longer"),
        answer=1,
        why=("Tensor parallelism all-reduces the activations 4 times per layer and "
             "micro-batch, on the critical path: split over two nodes, each all-reduce's "
             "ring crosses the network at 47 GB/s instead of NVLink's 370 GB/s. Compute "
             "still takes the same time, so the step grows by about 2-2.5x, not 8x. Data "
             "parallelism's one gradient all-reduce per step is what should cross.")),
    Prediction(
        key="10.interleaved",
        question=("4 stages, 8 microbatches: 1F1B loses (P-1)/M = 37.5% of the compute time "
                  "to the bubble. Interleaved 1F1B with 2 chunks per device loses:"),
        choices=("the same 37.5%", "about half: 18.75%", "about a quarter: 9.4%", "nothing"),
        answer=1,
        why=("Each device's chunk steps do half a stage's work each, so the fill and drain "
             "take half as long: half the bubble (exercise 10.1 asks for the formula). The "
             "price: more messages between the devices (P V - 1 hops per microbatch instead "
             "of P - 1: 7 instead of 3 here), and more microbatch-chunks held at once.")),)

LESSON = Lesson(10, 'planning a large run', 'ex10_planning', 'notebooks/10_planning.ipynb',
                EXERCISES, PREDICTIONS, drives_demos=('10.2',))
