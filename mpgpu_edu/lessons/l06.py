"""Lesson 06's demos: the comparison table of the four strategies, and programs that go wrong.

The table (``strategy_rows``, ``comparison_html``, ``plot_comparison``): data, pipeline,
tensor and hybrid parallelism for one model on one cluster, with memory per device from
``mpgpu_edu.memory`` and communication per device from the closed forms of
``mpgpu_edu.collectives.cost``. Every strategy processes the same global batch per step in
microbatches of the same size, with mixed-precision Adam (bf16 activations and gradients).

- data parallel: N replicas, B/N sequences each; a ring all-reduce of the bf16 gradients.
- pipeline (1F1B): N stages, M microbatches; each middle stage sends M activations forward
  and M gradients back; stage 0 holds min(N, M) microbatches of its layers' activations.
- tensor (Megatron): every layer split N ways; per microbatch and layer two all-reduces
  forward (g) and two backward (f) of the layer's activations. Activations per layer
  s*b*h*(10 + 24/t + 5*a*s/(h*t)) bytes (Korthikanti et al. 2022, table 2, no sequence
  parallelism).
- hybrid (DP x PP): ``hybrid_dp`` replicas of an N / hybrid_dp stage pipeline.

Times are closed forms on the route between devices 0 and 1 (its alpha and effective
bandwidth), as if every device sent at that speed at once; nothing overlaps with compute and
the additions inside the all-reduces are not counted. On a switched fabric (NVSwitch) the
simulator, which charges those additions, comes close; the closed form is a lower bound where
concurrent transfers share something: on the consumer PCIe presets GPU-to-GPU copies are staged through
host memory, a cap split among concurrent transfers, and on two sockets the ring crosses the
slower socket link; on ``4xRTX4090-pcie-switch`` all four cards share one switch uplink.

The programs that go wrong, all SPMD and importable (gloo workers import them by name):
``both_send_first`` (deadlocks), ``straggler`` (logs; one slow rank), ``bad_shard`` (one rank
raises), ``forgot_to_send`` (a rank waits forever). For the debugging capstones:
``smooth_ring_broken`` (a halo exchange around a ring that deadlocks on every world size) and
``straggler_steps`` (several steps, one slow rank, per-rank logs to read). Worker processes
import this module to run them, so matplotlib (seconds to import) is imported only inside the
functions that draw.
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from mpgpu_edu.cluster import Cluster
from mpgpu_edu.collectives import all_reduce
from mpgpu_edu.collectives.cost import (message_time, ring_allreduce_bytes_sent,
                                        ring_allreduce_time)
from mpgpu_edu.comm import Communicator, LaunchResult
from mpgpu_edu.comm.errors import DeadlockError, LaunchTimeoutError
from mpgpu_edu.memory import activation_bytes, estimate_memory, get_preset, spec_params

if TYPE_CHECKING:
    from matplotlib.figure import Figure

BF16 = 2
SENT_COLOR = "#505050"  # bytes on the wire: no memory category uses this grey

# What the numbers cannot say: when each strategy is the right tool (the seed's four criteria).
QUALITIES: dict[str, dict[str, str]] = {
    "data parallel": {
        "splits": "the batch: every device a full replica",
        "model size": "must fit on one device (ZeRO shards its optimizer state)",
        "data size": "more data, more replicas: scales almost linearly",
        "hardware": "any; one all-reduce per step, which can overlap the backward",
        "development cost": "low: wrap the model in DDP"},
    "pipeline parallel": {
        "splits": "the layers into stages, one per device",
        "model size": "up to N devices' memory",
        "data size": "needs many microbatches per step to hide the bubble",
        "hardware": "modest: one activation per microbatch at each cut; across machines",
        "development cost": "medium: balance the stages, pick a schedule"},
    "tensor parallel": {
        "splits": "every layer's matrices",
        "model size": "up to N devices' memory; activations inside each block split N ways, "
                      "those at its input and output (LayerNorm, dropout) replicated unless "
                      "sequence parallel",
        "data size": "any batch size",
        "hardware": "NVLink / NVSwitch: all-reduces inside every layer; one machine",
        "development cost": "high: rewrite every layer (Megatron's f and g)"},
    "hybrid DP x PP": {
        "splits": "both: replicas of a pipeline",
        "model size": "the largest: stages per replica, replicas for throughput",
        "data size": "large: replicas and microbatches",
        "hardware": "fast links inside a group, slower between groups",
        "development cost": "highest: two kinds of groups to set up and tune"},
}
COLUMNS = ("splits", "model size", "data size", "hardware", "development cost")


@dataclass(frozen=True)
class Setting:
    """One training job: a model preset, a cluster preset, the global batch per step
    (sequences of ``seq`` tokens), microbatches per step and the hybrid's replicas."""

    model: str = "llama-7b"
    cluster: str = "8xA100-nvlink"
    batch: int = 32
    seq: int = 1024
    microbatches: int = 8
    hybrid_dp: int = 2


@dataclass(frozen=True)
class Row:
    """One strategy in numbers: bytes per device by category, bytes each device sends per
    step, their time on the wire, and the pipeline bubble (idle / total)."""

    name: str
    per_device: dict[str, int]
    capacity: int
    comm_bytes: float
    comm_seconds: float
    bubble: float

    @property
    def memory(self) -> int:
        return sum(self.per_device.values())

    @property
    def fits(self) -> bool:
        return self.memory <= self.capacity


@dataclass(frozen=True)
class _Job:
    """What every row needs, worked out once from a Setting."""

    setting: Setting
    n: int             # devices
    params: int
    d_model: int
    alpha: float
    beta: float
    capacity: int

    @classmethod
    def of(cls, setting: Setting) -> _Job:
        cluster = Cluster.preset(setting.cluster)
        route = cluster.route(0, 1)
        return cls(setting, cluster.world_size, spec_params(setting.model),
                   get_preset(setting.model).d_model, route.alpha_s, route.beta_Bps,
                   cluster.capacity_bytes(0))

    def memory(self, strategy: str, devices: int, activations: int) -> dict[str, int]:
        return estimate_memory(self.params, "adam", "mixed", strategy, devices,
                               activations).per_device

    def boundary(self, sequences: int) -> int:
        """Bytes of one activation at a cut (or of a layer's output) for ``sequences``."""
        return sequences * self.setting.seq * self.d_model * BF16

    def activations(self, sequences: int) -> int:
        return activation_bytes(self.setting.model, sequences, self.setting.seq)


def _data_parallel(job: _Job) -> Row:
    grads = BF16 * job.params
    return Row("data parallel", job.memory("dp", job.n, job.activations(
        job.setting.batch // job.n)), job.capacity, ring_allreduce_bytes_sent(job.n, grads),
        ring_allreduce_time(job.n, grads, job.alpha, job.beta), 0.0)


def _pipeline(job: _Job, stages: int, sequences: int) -> tuple[int, float, float, float]:
    """1F1B with ``stages`` stages, microbatches of ``sequences``: stage 0's activations,
    bytes a middle stage sends per step, their time, and the bubble."""
    m = job.setting.microbatches
    held = min(stages, m) * job.activations(sequences) // stages
    message = job.boundary(sequences)
    return (held, 2 * m * message, 2 * m * message_time(message, job.alpha, job.beta),
            (stages - 1) / (m + stages - 1))


def _pipeline_parallel(job: _Job) -> Row:
    held, sent, seconds, bubble = _pipeline(job, job.n, job.setting.batch
                                            // job.setting.microbatches)
    return Row("pipeline parallel", job.memory("pipeline", job.n, held), job.capacity, sent,
               seconds, bubble)


def _tensor_parallel(job: _Job) -> Row:
    """Megatron without sequence parallelism: per layer, s*b*h*(10 + 24/t + 5*a*s/(h*t))
    bytes of activations; per microbatch and layer, two all-reduces forward, two backward."""
    spec, s, t = get_preset(job.setting.model), job.setting.seq, job.n
    b = job.setting.batch // job.setting.microbatches
    per_layer = s * b * spec.d_model * (10 + 24 / t) + 5 * spec.n_heads * s * s * b / t
    calls = 4 * spec.n_layers * job.setting.microbatches
    message = job.boundary(b)
    return Row("tensor parallel", job.memory("tensor", t, int(spec.n_layers * per_layer)),
               job.capacity, calls * ring_allreduce_bytes_sent(t, message),
               calls * ring_allreduce_time(t, message, job.alpha, job.beta), 0.0)


def _hybrid(job: _Job) -> Row:
    dp = job.setting.hybrid_dp
    pp = job.n // dp
    held, sent, seconds, bubble = _pipeline(job, pp, job.setting.batch // dp
                                            // job.setting.microbatches)
    stage_grads = BF16 * job.params / pp
    return Row("hybrid DP x PP", job.memory("pipeline", pp, held), job.capacity,
               sent + ring_allreduce_bytes_sent(dp, stage_grads),
               seconds + ring_allreduce_time(dp, stage_grads, job.alpha, job.beta), bubble)


def strategy_rows(setting: Setting) -> list[Row]:
    """Memory per device and communication per device per step of the four strategies
    (see the module's docstring for what each assumes)."""
    job = _Job.of(setting)
    return [_data_parallel(job), _pipeline_parallel(job), _tensor_parallel(job), _hybrid(job)]


def describe_setting(setting: Setting) -> str:
    """The job in one paragraph: what every row of the table assumes."""
    from mpgpu_edu.viz.devicebox import link_name

    cluster = Cluster.preset(setting.cluster)
    n, dp = cluster.world_size, setting.hybrid_dp
    return (f"{setting.model} ({spec_params(setting.model) / 1e9:.2f} billion parameters), "
            f"mixed-precision Adam, {setting.batch} sequences of {setting.seq} tokens per step, "
            f"on {setting.cluster}: {n} x {cluster.gpu.display_name} "
            f"({_bytes(cluster.capacity_bytes(0))} each), linked by "
            f"{link_name(cluster.topology.links()[0].spec_name)} "
            f"({cluster.route(0, 1).beta_Bps / 1e9:g} GB/s). Pipelines and tensor parallelism run "
            f"{setting.microbatches} microbatches of {setting.batch // setting.microbatches} "
            f"sequences; the hybrid is {dp} replicas x {n // dp} stages. The step's compute, "
            f"6 FLOPs per parameter per token split over {n} devices, takes "
            f"{_seconds(step_compute_seconds(setting))} per device.")


def step_compute_seconds(setting: Setting) -> float:
    """One step's training compute per device: 6 x parameters x tokens / N FLOPs in bf16 at
    the cluster's efficiency (the same for every strategy; bubbles not counted)."""
    cluster = Cluster.preset(setting.cluster)
    flops = 6 * spec_params(setting.model) * setting.batch * setting.seq
    return cluster.compute_seconds(flops / cluster.world_size, "bf16")


def _bytes(nbytes: float) -> str:
    from mpgpu_edu.viz.palette import format_bytes

    return format_bytes(nbytes)


def _seconds(seconds: float) -> str:
    from mpgpu_edu.viz.palette import format_seconds

    return format_seconds(seconds)


def _memory_cell(row: Row) -> str:
    mark = "fits" if row.fits else "does NOT fit"
    return f"{_bytes(row.memory)} ({mark} in {_bytes(row.capacity)})"


def _comm_cell(row: Row) -> str:
    text = f"{_bytes(row.comm_bytes)}, {_seconds(row.comm_seconds)} on the wire"
    return text + (f"; bubble {row.bubble:.0%}" if row.bubble else "")


def comparison_html(rows: list[Row]) -> str:
    """The table as HTML: a row per strategy, the qualities, then memory per device and
    communication per device per step (a memory that does not fit in red)."""
    from mpgpu_edu.viz.palette import WARNING_COLOR

    head = "".join(f"<th style='text-align:left'>{html.escape(c)}</th>" for c in
                   ("strategy", *COLUMNS, "memory per device", "communication per device, step"))
    body = []
    for row in rows:
        cells = [f"<b>{html.escape(row.name)}</b>"]
        cells += [html.escape(QUALITIES[row.name][c]) for c in COLUMNS]
        color = "black" if row.fits else WARNING_COLOR
        cells.append(f"<span style='color:{color}'>{html.escape(_memory_cell(row))}</span>")
        cells.append(html.escape(_comm_cell(row)))
        body.append("<tr>" + "".join(f"<td style='text-align:left;vertical-align:top'>{c}</td>"
                                     for c in cells) + "</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def comparison_text(rows: list[Row]) -> str:
    """The numbers of the table as plain text, a line per strategy."""
    return "\n".join(f"{row.name:18} memory {_memory_cell(row):32} sent {_comm_cell(row)}"
                     for row in rows)


def plot_comparison(rows: list[Row], title: str = "") -> Figure:
    """Left: memory per device by category against the capacity. Right: bytes each device
    sends per step (log scale, dark grey bars), with their time on the wire."""
    from mpgpu_edu.viz.memory import plot_memory_bars
    from mpgpu_edu.viz.palette import FONT_SIZE, new_figure, style

    fig = new_figure(12, 4.2)
    left, right = fig.subplots(1, 2, width_ratios=[1.25, 1])
    labels = [row.name.replace(" parallel", "\nparallel").replace(" DP", "\nDP") for row in rows]
    plot_memory_bars({label: row.per_device for label, row in zip(labels, rows)},
                     rows[0].capacity, ax=left, title="memory per device")
    ys = range(len(rows))
    # one colour, one meaning: the left panel's colours are memory categories, so the bytes
    # sent are a single neutral colour (the strategy is the row's label)
    right.barh(ys, [row.comm_bytes for row in rows], color=SENT_COLOR)
    right.set_xscale("log", base=2)
    for y, row in zip(ys, rows):
        right.annotate(f" {_bytes(row.comm_bytes)}, {_seconds(row.comm_seconds)}",
                       (row.comm_bytes, y), va="center", ha="left", fontsize=FONT_SIZE - 1)
    right.set_yticks(list(ys), labels)
    right.invert_yaxis()
    low = min(r.comm_bytes for r in rows) / 4
    high = max(r.comm_bytes for r in rows) * 16
    right.set_xlim(low, high)
    ticks = [2.0 ** k for k in range(0, 64, 2) if low <= 2.0 ** k <= high]
    right.set_xticks(ticks, [_bytes(t) for t in ticks])
    right.minorticks_off()
    right.set_xlabel("bytes each device sends per step (log scale)")
    right.set_title("communication per device per step,\nand its time on the wire", loc="left")
    style(right, grid="x")
    if title:
        fig.suptitle(title, x=0.01, ha="left", fontsize=FONT_SIZE + 1)
    return fig


def fewest_devices(model: str, strategy: str, gpu: str, most: int = 64) -> int | None:
    """The fewest devices of kind ``gpu`` (a key of ``hardware.GPUS``) on which ``strategy``
    holds ``model``'s parameters, gradients and mixed-precision Adam state, before
    activations; None if even ``most`` are not enough."""
    from mpgpu_edu.hardware import GPUS

    for n in range(1, most + 1):
        if estimate_memory(spec_params(model), "adam", "mixed", strategy,
                           n).fits(GPUS[gpu].memory_bytes):
            return n
    return None


def memory_table(models: list[str], devices: int, gpus: list[str],
                 strategies: tuple[str, ...] = ("single", "dp", "zero1", "zero2", "zero3")
                 ) -> str:
    """Per-device bytes of parameters, gradients and optimizer state (mixed-precision Adam,
    before activations) of each model under each strategy over ``devices`` devices (``single``
    on one), and whether that fits each GPU of ``gpus`` (keys of ``hardware.GPUS``)."""
    from mpgpu_edu.hardware import GPUS

    names = [GPUS[g].display_name.replace("NVIDIA ", "").replace("GeForce ", "") for g in gpus]
    lines = [f"{'model':12} {'strategy':9} {'per device':>11}   "
             + "   ".join(f"{name} ({_bytes(GPUS[g].memory_bytes)})" for name, g in
                          zip(names, gpus))]
    for model in models:
        params = spec_params(model)
        for strategy in strategies:
            n = 1 if strategy == "single" else devices
            held = estimate_memory(params, "adam", "mixed", strategy, n).per_device_total
            fits = [("fits" if held <= GPUS[g].memory_bytes else "-").center(len(name) + 9)
                    for name, g in zip(names, gpus)]
            label = strategy if strategy == "single" else f"{strategy} x {n}"
            lines.append(f"{model:12} {label:9} {_bytes(held):>11}   " + "   ".join(fits))
    return "\n".join(lines)


# ---- programs that go wrong ------------------------------------------------------------------

def both_send_first(comm: Communicator) -> torch.Tensor:
    """Two ranks swap a tensor, each with a blocking send first: each waits in ``send`` for
    the other to receive, so neither ever does (a deadlock)."""
    other = 1 - comm.rank
    mine, theirs = torch.full((4,), float(comm.rank)), torch.empty(4)
    comm.send(mine, other)
    comm.recv(theirs, other)
    return theirs


def plot_wait_for(error: DeadlockError | LaunchTimeoutError) -> Figure:
    """The ranks of a ``DeadlockError`` (or a launch's timeout) around an ellipse, an arrow
    from each blocked rank to the rank it waits for, labelled with what it waits in (the
    error's ``pending``). A cycle of arrows is a deadlock: nobody can move first."""
    from matplotlib.patches import FancyArrowPatch

    from mpgpu_edu.viz.palette import FONT_SIZE, OKABE_ITO, WARNING_COLOR, new_figure

    words = {"send": "send to", "recv": "recv from"}
    waits = [(p.rank, words[p.op], p.peer) for p in error.pending if p.op in words]
    finished = set(error.finished)
    ranks = sorted({r for a, _, b in waits for r in (a, b)} | finished)
    ax = new_figure(6.5, 3.8).add_subplot()
    where = {}
    for i, rank in enumerate(ranks):  # rank 0 on the left, then clockwise
        angle = math.pi - 2 * math.pi * i / max(len(ranks), 1)
        where[rank] = (1.7 * math.cos(angle), 1.0 * math.sin(angle))
    for rank, (x, y) in where.items():
        name = f"rank {rank}" + ("\n(finished)" if rank in finished else "")
        ax.text(x, y, name, ha="center", va="center", fontsize=FONT_SIZE + 1,
                bbox={"boxstyle": "round", "facecolor": "#EAF4FB",
                      "edgecolor": OKABE_ITO["blue"]})
    for a, op, b in waits:
        (x0, y0), (x1, y1) = where[a], where[b]
        bend = _outward_bend(x0, y0, x1, y1)
        ax.add_patch(FancyArrowPatch((x0, y0), (x1, y1), arrowstyle="-|>", mutation_scale=16,
                                     color=WARNING_COLOR, linewidth=1.6, shrinkA=26, shrinkB=26,
                                     connectionstyle=f"arc3,rad={bend}"))
        dx, dy = x1 - x0, y1 - y0  # the arc bulges towards (dy, -dx); its label goes further
        length = math.hypot(dx, dy) or 1.0
        sideways = 0.3 * abs(dy) / length  # a label beside a steep arrow needs more room
        out = math.copysign(abs(bend) * 0.5 + (0.28 + sideways) / length, bend)
        ax.text((x0 + x1) / 2 + out * dy, (y0 + y1) / 2 - out * dx,
                f"rank {a} is blocked in\n{op} rank {b}", ha="center", va="center",
                fontsize=FONT_SIZE - 1, color=WARNING_COLOR)
    ax.set_xlim(-2.6, 2.6)
    ax.set_ylim(-1.5, 1.5)
    ax.axis("off")
    stuck = any(b in finished for _, _, b in waits)
    ax.set_title("who waits for whom: " + ("a rank waits for one that has finished" if stuck
                                           else "a cycle, so nobody can move first"), loc="left")
    return ax.figure


def _outward_bend(x0: float, y0: float, x1: float, y1: float, size: float = 0.3) -> float:
    """The arc's bend (matplotlib's ``arc3`` rad) that bulges away from the ellipse's centre,
    so that arrows and their labels stay outside the ring of ranks; -size on a tie."""
    dx, dy = x1 - x0, y1 - y0
    mid_x, mid_y = (x0 + x1) / 2, (y0 + y1) / 2
    outward = math.hypot(mid_x + dy, mid_y - dx) > math.hypot(mid_x - dy, mid_y + dx) + 1e-9
    return size if outward else -size


def straggler(comm: Communicator, slow_rank: int, step_seconds: float = 0.02) -> float:
    """One step on every rank: compute, then an all-reduce of a small result. ``slow_rank``
    computes three times longer (a slower card, a busy data loader); everyone else waits for
    it in the all-reduce. Each rank logs what it does. Returns the all-reduced sum."""
    seconds = step_seconds * (3 if comm.rank == slow_rank else 1)
    comm.log(f"start: my step will take {seconds * 1e3:.0f} ms")
    with comm.compute("forward", "step", seconds=seconds):  # real processes sleep it out
        result = torch.tensor([float(comm.rank)], device=comm.device)
    comm.log("computed; entering the all-reduce")
    all_reduce(comm, result)
    comm.log(f"all-reduce done: sum of ranks = {result.item():g}")
    return result.item()


def bad_shard(comm: Communicator, bad_rank: int = 2) -> float:
    """Every rank multiplies its data shard (4 samples x 8 features) by the same weights,
    then all-reduces the result; ``bad_rank``'s shard has 7 features (a malformed file), so
    its matmul raises and only that rank's traceback says why."""
    features = 7 if comm.rank == bad_rank else 8
    comm.log(f"loaded my shard: 4 samples x {features} features")
    shard, weights = torch.ones(4, features), torch.ones(8, 2)
    out = (shard @ weights).sum().reshape(1)
    all_reduce(comm, out)
    return out.item()


def forgot_to_send(comm: Communicator) -> None:
    """Rank 0 waits for a tensor from rank 1; rank 1 sends only ``if comm.rank == 2`` (a typo
    for 1), so it finishes without sending and rank 0 waits forever."""
    if comm.rank == 0:
        comm.log("waiting for rank 1's tensor")
        got = torch.empty(4)
        comm.recv(got, 1)
    elif comm.rank == 2:  # the bug: meant comm.rank == 1
        comm.send(torch.ones(4), 0)
    comm.log("done")


# ---- the debugging capstones: a halo exchange that deadlocks, and a straggler -----------------

def smooth_ring_broken(comm: Communicator, block: torch.Tensor, steps: int) -> torch.Tensor:
    """Smooth a ring-shaped array, ``steps`` times, spread over the ranks: the array is every
    rank's ``block`` in rank order, and its ends touch (after the last element of rank N-1
    comes the first of rank 0). One step replaces every element by the mean of itself and its
    two neighbours, so a rank needs one element from each neighbouring rank (its *halo*).

    The bug: each rank first sends its edges with blocking sends, then receives. Every rank
    waits in its first send for its left neighbour to receive, and that neighbour waits in
    its own send: a cycle around the whole ring."""
    n, rank = comm.world_size, comm.rank
    left, right = (rank - 1) % n, (rank + 1) % n
    x = block.clone()
    for step in range(steps):
        comm.log(f"step {step}: sending my edges to ranks {left} and {right}")
        comm.send(x[:1].clone(), left)
        comm.send(x[-1:].clone(), right)
        from_left, from_right = torch.empty(1), torch.empty(1)
        comm.recv(from_left, left)
        comm.recv(from_right, right)
        comm.log(f"step {step}: got both halos")
        padded = torch.cat([from_left, x, from_right])
        x = (padded[:-2] + padded[1:-1] + padded[2:]) / 3
    return x


def smooth_ring_reference(comm: Communicator, block: torch.Tensor,
                          steps: int) -> torch.Tensor:
    """The package's halo exchange that cannot deadlock (what a demo runs until yours passes):
    both edges in flight at once, directions told apart by tag."""
    n, rank = comm.world_size, comm.rank
    left, right = (rank - 1) % n, (rank + 1) % n
    x = block.clone()
    for _ in range(steps):
        if n == 1:
            from_left, from_right = x[-1:].clone(), x[:1].clone()
        else:
            from_left, from_right = torch.empty_like(x[:1]), torch.empty_like(x[:1])
            sends = [comm.isend(x[:1].clone(), left, tag=1),
                     comm.isend(x[-1:].clone(), right, tag=2)]
            comm.recv(from_left, left, tag=2)
            comm.recv(from_right, right, tag=1)
            for work in sends:
                work.wait()
        padded = torch.cat([from_left, x, from_right])
        x = (padded[:-2] + padded[1:-1] + padded[2:]) / 3
    return x


def smooth_on_one_device(blocks: list[torch.Tensor], steps: int) -> list[torch.Tensor]:
    """The oracle: the same smoothing on the whole array at once, split back into blocks."""
    x = torch.cat(blocks).double()
    for _ in range(steps):
        x = (torch.roll(x, 1) + x + torch.roll(x, -1)) / 3
    return [part.float() for part in torch.split(x, [len(b) for b in blocks])]


def spike_blocks(world_size: int, length: int) -> list[torch.Tensor]:
    """A ring of ``world_size * length`` zeros with one spike of 1 in the middle of rank 0's
    block, cut into equal blocks: smoothing spreads the spike over the ranks."""
    blocks = [torch.zeros(length) for _ in range(world_size)]
    blocks[0][length // 2] = 1.0
    return blocks


def run_smoothing(fn: Callable[..., torch.Tensor], blocks: list[torch.Tensor],
                  steps: int) -> torch.Tensor:
    """The whole smoothed array after ``steps`` steps of ``fn`` on ``len(blocks)`` ranks."""
    from mpgpu_edu.comm import launch

    cluster = Cluster.uniform(len(blocks), alpha_s=1e-5, beta_Bps=1e9)
    result = launch(lambda comm: fn(comm, blocks[comm.rank].clone(), steps), cluster)
    return torch.cat(result.results)


def plot_smoothing(arrays: dict[int, torch.Tensor], block: int, title: str = "") -> Figure:
    """The ring array after each number of steps (one line each), with dotted lines where
    one rank's block ends and the next one's begins."""
    from mpgpu_edu.viz.palette import FONT_SIZE, new_figure, series_color, style

    ax = new_figure(9, 3.2).add_subplot()
    for i, (steps, values) in enumerate(arrays.items()):
        ax.plot(range(len(values)), values.tolist(), color=series_color(i), marker=".",
                label=f"after {steps} step{'s' if steps != 1 else ''}")
    size = len(next(iter(arrays.values())))
    for edge in range(block, size, block):
        ax.axvline(edge - 0.5, color="black", linestyle=":", linewidth=0.8)
    ax.set_xlabel(f"element of the ring (dotted: where one rank's block of {block} ends)")
    ax.set_ylabel("value")
    ax.legend(fontsize=FONT_SIZE - 1, frameon=False)
    ax.set_title(title, loc="left")
    style(ax)
    return ax.figure


def straggler_steps(comm: Communicator, slow_rank: int, steps: int = 3,
                    step_seconds: float = 0.02, slowdown: tuple[float, ...] = (3.0,),
                    grad_numel: int = 1 << 20) -> None:
    """``steps`` training steps on every rank: compute, then a ring all-reduce of
    ``grad_numel`` fp32 gradients (a meta tensor: timed, never allocated). A rank's compute
    takes ``step_seconds`` give or take 10% (ranks are never exactly alike);
    ``slow_rank``'s is ``slowdown[step % len(slowdown)]`` times longer (a slower card, a data
    loader that falls behind). Every rank logs when its compute starts and ends and when the
    all-reduce is done; rank 0 also logs the step's end."""
    grads = torch.empty(grad_numel, dtype=torch.float32, device="meta")
    for step in range(steps):
        seconds = step_seconds * (1 + 0.1 * ((3 * comm.rank + 5 * step) % 7) / 6)
        if comm.rank == slow_rank:
            seconds *= slowdown[step % len(slowdown)]
        comm.log(f"step {step}: compute start")
        with comm.compute("forward", f"step {step}", seconds=seconds):
            pass
        comm.log(f"step {step}: compute done, waiting in all-reduce")
        all_reduce(comm, grads, op="mean", algo="ring")
        comm.log(f"step {step}: all-reduce done")
        if comm.rank == 0:
            comm.log(f"step {step}: gradients averaged over {comm.world_size} ranks")


def straggler_cluster(world_size: int) -> Cluster:
    """The cluster the straggler runs on: the textbook ``Cluster.uniform``, every device its
    own port at 10 us and 1 GB/s, additions free, so the logs show the straggler alone."""
    return Cluster.uniform(world_size, alpha_s=1e-5, beta_Bps=1e9)


def run_straggler(world_size: int, slow_rank: int, steps: int = 3,
                  slowdown: tuple[float, ...] = (3.0,)) -> LaunchResult:
    """``straggler_steps`` on ``straggler_cluster(world_size)``."""
    from mpgpu_edu.comm import launch

    return launch(straggler_steps, straggler_cluster(world_size), slow_rank, steps,
                  slowdown=slowdown)


_STAMP = re.compile(r"^\[\s*([0-9.]+) ms\] step (\d+): compute (start|done)")


def phase_seconds(logs: list[list[str]]) -> list[dict[str, float]]:
    """Per rank, from its log alone: total ``compute`` (compute start to compute done) and
    total ``wait`` (compute done to all-reduce done) over every step, in seconds."""
    out = []
    for lines in logs:
        stamps: dict[tuple[int, str], float] = {}
        done_at: dict[int, float] = {}
        for line in lines:
            match = _STAMP.match(line)
            if match:
                stamps[(int(match[2]), match[3])] = float(match[1]) / 1e3
            elif "all-reduce done" in line:
                done_at[int(line.split("step ")[1].split(":")[0])] = float(
                    line[1:line.index("ms]")]) / 1e3
        steps = sorted({step for step, _ in stamps})
        compute = sum(stamps[(s, "done")] - stamps[(s, "start")] for s in steps)
        wait = sum(done_at[s] - stamps[(s, "done")] for s in steps if s in done_at)
        out.append({"compute": compute, "wait": wait})
    return out


def find_straggler_reference(logs: list[list[str]]) -> tuple[int, float]:
    """The package's answer to exercise 6.4 (what a demo runs until yours passes)."""
    import statistics

    totals = [phases["compute"] for phases in phase_seconds(logs)]
    slow = max(range(len(totals)), key=totals.__getitem__)
    return slow, totals[slow] - statistics.median(totals)


def longest_waiter(logs: list[list[str]]) -> int:
    """The rank that waited longest in the all-reduces: a victim, not the culprit."""
    waits = [phases["wait"] for phases in phase_seconds(logs)]
    return max(range(len(waits)), key=waits.__getitem__)
