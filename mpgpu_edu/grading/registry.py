"""The exercise registry: every exercise of the course, its file, function, points and hint.

This module is plain data (no torch), so ``mpgpu-edu progress`` and the CLI start fast. The
checks themselves live in ``mpgpu_edu.grading.checks.lesson_NN``; a test keeps each
exercise's points equal to the sum of its cases' points.

An exercise is one function in ``exercises/exNN_*.py``. Its solution sits in the same
function of ``solutions/exNN_*.py`` between ``### BEGIN SOLUTION <id>`` and
``### END SOLUTION``; ``mpgpu_edu.grading.generate`` turns that into the two-line stub.
"""

from __future__ import annotations

from dataclasses import dataclass

LESSONS: dict[int, tuple[str, str]] = {
    0: ("ex00_devices", "notebooks/00_welcome.ipynb"),
    1: ("ex01_communication", "notebooks/01_communication.ipynb"),
    2: ("ex02_parameter_server", "notebooks/02_parameter_server.ipynb"),
    3: ("ex03_data_parallel", "notebooks/03_data_parallel.ipynb"),
    4: ("ex04_pipeline", "notebooks/04_pipeline.ipynb"),
    5: ("ex05_tensor_and_hybrid", "notebooks/05_tensor_and_hybrid.ipynb"),
    6: ("ex06_choosing", "notebooks/06_choosing_and_debugging.ipynb"),
}

LESSON_TITLES: dict[int, str] = {
    0: "welcome: devices", 1: "communication", 2: "parameter server", 3: "data parallel",
    4: "pipeline", 5: "tensor and hybrid parallel", 6: "choosing and debugging",
}


@dataclass(frozen=True)
class Exercise:
    """One exercise: ``function`` in ``exercises/<module>.py``, worth ``points``."""

    id: str
    function: str
    title: str
    points: int
    hint: str

    @property
    def lesson(self) -> int:
        return int(self.id.split(".")[0])

    @property
    def module(self) -> str:
        """File stem in ``exercises/`` and ``solutions/``, e.g. ``"ex01_communication"``."""
        return LESSONS[self.lesson][0]

    @property
    def filename(self) -> str:
        return f"{self.module}.py"

    @property
    def notebook(self) -> str:
        return LESSONS[self.lesson][1]


def _ex(id: str, function: str, title: str, points: int, hint: str) -> Exercise:  # noqa: A002
    return Exercise(id, function, title, points, hint)


EXERCISES: dict[str, Exercise] = {e.id: e for e in (
    _ex("0.1", "visible_devices", "CUDA_VISIBLE_DEVICES: logical -> physical", 5,
        "read the leading digits; stop at the first bad entry."),
    _ex("0.2", "data_parallel_device_ids", "The device_ids question", 3,
        "device_ids are positions in visible: visible.index(gpu)."),
    _ex("1.1", "p2p_time", "Point-to-point cost: alpha + n / beta", 3,
        "cluster.route(src, dst) has alpha_s and beta_Bps."),
    _ex("1.2", "naive_all_reduce", "Naive all-reduce through rank 0", 5,
        "rank 0 receives and adds each tensor, then sends back."),
    _ex("1.3", "ring_all_reduce", "Ring all-reduce", 10,
        "torch.tensor_split makes the chunks; isend before recv."),
    _ex("1.4", "ring_reduce_scatter", "Ring reduce-scatter", 6,
        "step k: send chunk (r-1-k) % N, add into (r-2-k) % N."),
    _ex("1.5", "ring_all_gather", "Ring all-gather", 5,
        "step k: send slot (r-k) % N, recv slot (r-1-k) % N."),
    _ex("2.1", "ps_worker_step", "Parameter server: the worker's step", 4,
        "comm.send the gradient, then comm.recv into params."),
    _ex("2.2", "ps_server_step", "Parameter server: the server's step", 6,
        "recv into a buffer per worker, sum, sgd_update, send."),
    _ex("3.1", "average_gradients", "DDP: average the gradients", 5,
        "all_reduce(comm, p.grad, op='mean') for each parameter."),
    _ex("3.2", "make_buckets", "DDP: bucket the gradients", 5,
        "walk reversed(range(len(sizes))); close a full bucket."),
    _ex("3.3", "backward_with_overlap", "DDP: overlap communication with backward", 8,
        "p.register_post_accumulate_grad_hook + comm.run_async."),
    _ex("3.4", "adam_memory", "Memory of training with Adam", 4,
        "sum p.numel(); frozen: no gradient, no optimizer state."),
    _ex("4.1", "balanced_boundaries", "Pipeline: balanced layer partition", 5,
        "DP: best[k][j] = cheapest max for j layers in k stages."),
    _ex("4.2", "gpipe_orders", "Pipeline: the GPipe schedule", 4,
        "all F steps in microbatch order, then all B steps."),
    _ex("4.3", "one_f_one_b_orders", "Pipeline: the 1F1B schedule", 6,
        "P - 1 - p warm-up forwards, then pairs of F and B."),
    _ex("4.4", "pipeline_forward_step", "Pipeline: one forward step of the executor", 6,
        "recv_from / send_to(step, n_stages); tag=microbatch."),
    _ex("5.1", "column_parallel_linear", "Tensor parallel: column-parallel linear", 6,
        "x @ weight_shard.T + bias_shard, all_gather, torch.cat."),
    _ex("5.2", "zero1_adam_step", "ZeRO-1: sharded optimizer state", 8,
        "reduce_scatter (mean), adam_update, all_gather."),
    _ex("5.3", "hybrid_groups", "Hybrid parallel: the DP x PP mesh", 4,
        "rank = replica * pp_size + stage."),
    _ex("6.1", "choose_strategy", "Choosing a strategy that fits", 5,
        "estimate_memory(...).fits(cluster.capacity_bytes(0))."),
    _ex("6.2", "exchange_with_partner", "Debugging: a swap that cannot deadlock", 5,
        "the lower rank of a pair sends first."),
)}


def get(exercise_id: str) -> Exercise:
    """The exercise ``exercise_id`` (e.g. ``"1.3"``); ``KeyError`` with the valid ids."""
    key = str(exercise_id).strip()
    if key not in EXERCISES:
        raise KeyError(f"unknown exercise {exercise_id!r}: choose one of "
                       + ", ".join(EXERCISES))
    return EXERCISES[key]


def by_lesson(lesson: int) -> list[Exercise]:
    return [e for e in EXERCISES.values() if e.lesson == lesson]


def by_module(module: str) -> list[Exercise]:
    return [e for e in EXERCISES.values() if e.module == module]


def max_score() -> int:
    return sum(e.points for e in EXERCISES.values())


def select(words: list[str] | None) -> list[str]:
    """Exercise ids from command-line words: ``"1.3"``, a lesson ``"1"`` (all its
    exercises), or nothing (every exercise). Raises KeyError naming an unknown word."""
    if not words:
        return list(EXERCISES)
    chosen: list[str] = []
    for word in words:
        word = word.strip()
        if word in EXERCISES:
            found = [word]
        elif word.isdigit() and int(word) in LESSONS:
            found = [e.id for e in by_lesson(int(word))]
        else:
            raise KeyError(f"unknown exercise {word!r}: choose from " + ", ".join(EXERCISES)
                           + " (or a lesson number 0-6)")
        chosen += [i for i in found if i not in chosen]
    return chosen
