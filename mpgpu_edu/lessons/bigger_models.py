"""Lesson 08, fitting bigger models: sharded training (ZeRO-3 / FSDP), recomputation and
accumulation, mixed precision's master copy, and interleaved 1F1B.

The sharded demos take a wrapper with lesson 08's contract (``wrap(comm, module, prefetch)``:
the learner's ``wrap_fsdp`` once its check passes, else the package's
``mpgpu_edu.dp.fsdp.wrap_fsdp``) and run it on the simulator. Memory over time comes from the
package's wrapper, which records what it holds in each rank's ledger.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import torch
from matplotlib.figure import Figure
from torch import nn

from mpgpu_edu.cluster import Cluster
from mpgpu_edu.collectives import all_gather, all_reduce
from mpgpu_edu.comm import Communicator, LaunchResult, launch
from mpgpu_edu.comm.base import RESERVED_TAG
from mpgpu_edu.data import loss_fn, make_batches, make_mlp, shard
from mpgpu_edu.dp import fsdp
from mpgpu_edu.estimate.step import StepSetup, simulate_step
from mpgpu_edu.explore.live import Explorer, dropdown, percent, slider
from mpgpu_edu.pipeline import interleaved_1f1b, one_f_one_b
from mpgpu_edu.pipeline.timing import schedule_timeline, timed_bubble_overhead, timeline_trace
from mpgpu_edu.reference import make_optimizer, train_single
from mpgpu_edu.trace import Event, Trace
from mpgpu_edu.viz.palette import SERIES_COLORS, SERIES_MARKERS, new_figure, style
from mpgpu_edu.viz.timeline import plot_timelines_side_by_side

Wrap = Callable[[Communicator, nn.Sequential, bool], Any]

SHARDED_SIZES = (256, 512, 512, 512, 256)  # 4 Linear layers, 0.9 M parameters
SHARDED_BATCH = 256
SHARDED_CLUSTER = "8xA100-nvlink"


def reference_wrap() -> Wrap:
    """The package's sharded wrapper (``dp.fsdp.wrap_fsdp``), for ``mp.yours``."""
    return fsdp.wrap_fsdp


# ---- one sharded step, and training ---------------------------------------------------------

def sharded_step(comm: Communicator, wrap: Wrap, model: nn.Sequential,
                 batch: tuple[torch.Tensor, torch.Tensor], prefetch: bool) -> float:
    """SPMD: wrap ``model``, then one step on this rank's shard of ``batch`` (forward, backward,
    ``finish``, SGD). The wrapping is setup (untimed); a barrier starts the step; the loss is a
    region of its own (``"compute"``, ``"loss"``), which ``step_only`` uses to tell forward
    from backward in any wrapper's timeline."""
    with comm.compute("setup", "wrap the model", seconds=0):  # once, not part of the step
        replica = wrap(comm, model, prefetch)
        optimizer = torch.optim.SGD(list(replica.parameters()), lr=0.01)
        (x, y), part = shard(batch, comm.rank, comm.world_size)
    comm.barrier()  # every rank has its shards: the step starts here
    out = replica(x)
    with comm.compute("compute", LOSS):
        loss = loss_fn(out, y) * part * comm.world_size
    loss.backward()
    replica.finish()
    with comm.compute("optimizer", "step"):
        optimizer.step()
    return loss.item()


def run_sharded_step(wrap: Wrap, prefetch: bool, world_size: int = 4,
                     cluster: str = SHARDED_CLUSTER) -> LaunchResult:
    """One step of the demo MLP on the first ``world_size`` devices of ``cluster``."""
    machine = Cluster.preset(cluster, visible=",".join(map(str, range(world_size))))
    model = make_mlp(SHARDED_SIZES, seed=0)
    batch = make_batches(1, SHARDED_BATCH, SHARDED_SIZES[0], SHARDED_SIZES[-1], seed=1)[0]
    return launch(sharded_step, machine, wrap, model, batch, prefetch)


def step_only(trace: Trace) -> Trace:
    """The trace of ``sharded_step`` from the end of its barrier on (the wrapping and the
    barrier left out; the first layer's gather kept), with its phases named: on the compute
    rows, work outside a named region (a wrapper that names none, a ReLU, the padding of a
    gradient) becomes ``"forward"`` before the loss and ``"backward"`` after it, so every
    wrapper's timeline reads the same."""
    start = _barrier_end(trace)
    events = [replace(_phase_named(e, trace), start=max(e.start, start) - start,
                      end=e.end - start)
              for e in trace.events if e.end > start and not _is_barrier(e)]
    memory = [replace(m, time=max(m.time, start) - start) for m in trace.memory]
    return Trace(trace.n_devices, events, memory, trace.source, dict(trace.meta))


LOSS = "loss"


def _is_barrier(event: Event) -> bool:
    """The barrier's messages are the only ones with reserved tags (``comm.barrier``)."""
    words = event.label.split()
    return (len(words) == 2 and words[0] == "tag" and words[1].isdigit()
            and int(words[1]) >= RESERVED_TAG)


def _barrier_end(trace: Trace) -> float:
    return max((e.end for e in trace.events if _is_barrier(e)), default=0.0)


def _phase_named(event: Event, trace: Trace) -> Event:
    if event.stream != "compute" or event.kind != "compute" or event.label == LOSS:
        return event
    loss = [e for e in trace.on(event.device, "compute") if e.label == LOSS]
    if not loss:
        return event
    return replace(event, kind="forward" if event.end <= loss[0].start else "backward")


def phase_summary(step: Trace, device: int = 0) -> dict[str, float]:
    """Of a ``step_only`` trace, on ``device``: when forward and backward end (seconds from
    the step's start) and how long its compute row idles in each (forward: up to the loss;
    backward: from the loss to backward's end)."""
    compute = sorted(step.on(device, "compute"), key=lambda e: e.start)
    loss = next(e for e in compute if e.label == LOSS)
    forward_end = max(e.end for e in compute if e.kind == "forward")
    backward_end = max(e.end for e in compute if e.kind == "backward")

    def busy(lo: float, hi: float) -> float:
        return sum(max(0.0, min(e.end, hi) - max(e.start, lo)) for e in compute)
    return {"forward_end": forward_end, "backward_end": backward_end,
            "idle_forward": loss.start - busy(0.0, loss.start),
            "idle_backward": (backward_end - loss.end) - busy(loss.end, backward_end)}


def allreduce_bytes(comm: Communicator, model: nn.Sequential) -> int:
    """SPMD: what DDP sends per step for ``model``: one ring all-reduce of every parameter,
    flattened. Returns the bytes this rank sent."""
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    before = comm.stats.bytes_sent
    all_reduce(comm, flat, "mean")
    return comm.stats.bytes_sent - before


def train_wrapped(comm: Communicator, wrap: Wrap, model: nn.Sequential,
                  batches: Sequence[tuple[torch.Tensor, torch.Tensor]], optimizer: str,
                  prefetch: bool) -> dict[str, Any]:
    """SPMD: train with ``wrap`` one step per batch. Returns this rank's share of each step's
    loss and, gathered from the shards at the end, every layer's full flat parameters."""
    replica = wrap(comm, copy.deepcopy(model), prefetch)
    shards = list(replica.parameters())
    opt = make_optimizer(optimizer, shards, lr=0.05)
    losses = []
    for batch in batches:
        (x, y), part = shard(batch, comm.rank, comm.world_size)
        loss = loss_fn(replica(x), y)
        (loss * part * comm.world_size).backward()
        replica.finish()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item() * part)
    flats = [torch.cat(all_gather(comm, s.detach())) for s in shards]
    return {"losses": losses, "flats": flats}


def run_training(wrap: Wrap, world_size: int = 3, steps: int = 10, optimizer: str = "adam",
                 prefetch: bool = True) -> dict[str, Any]:
    """Train the demo MLP (8 -> 32 -> 32 -> 2) with ``wrap`` on ``world_size`` simulated ranks
    and on one device, the same batches of 20: losses and the largest parameter gap."""
    sizes = (8, 32, 32, 2)
    batches = make_batches(steps, 20, sizes[0], sizes[-1], seed=3)
    model = make_mlp(sizes, seed=0)
    run = launch(train_wrapped, world_size, wrap, model, batches, optimizer, prefetch)
    ref_params, ref_losses = train_single(lambda: make_mlp(sizes, seed=0), batches, optimizer,
                                          0.05)
    reference = make_mlp(sizes, seed=0)
    reference.load_state_dict(ref_params)
    layers = [layer for layer in reference if any(True for _ in layer.parameters())]
    gap = 0.0
    for layer, flat in zip(layers, run.results[0]["flats"]):
        want = torch.cat([p.detach().reshape(-1) for p in layer.parameters()])
        gap = max(gap, (flat[: want.numel()] - want).abs().max().item())
    losses = [sum(step) for step in zip(*(r["losses"] for r in run.results))]
    return {"losses": losses, "reference_losses": ref_losses, "max_abs_param_diff": gap}


def plot_losses(report: dict[str, Any], label: str) -> Figure:
    """The sharded run's loss per step over one device's."""
    fig = new_figure(8, 3.2)
    ax = style(fig.add_subplot())
    ax.plot(report["reference_losses"], color="#9CC7E6", linewidth=4, label="one device")
    ax.plot(report["losses"], color="#0072B2", linestyle="--", marker="o", label=label)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.legend()
    ax.set_title(f"{label}: largest parameter gap to one device "
                 f"{report['max_abs_param_diff']:.0e}", loc="left")
    return fig


# ---- recomputation and accumulation ---------------------------------------------------------

RECOMPUTE = ("none", "selective", "full")


def recompute_rows(model: str = "gpt2-medium", cluster: str = "8xA100-nvlink",
                   sequences: int = 32, seq: int = 1024,
                   accumulate: Sequence[int] = (1, 2, 4, 8)) -> list[dict[str, Any]]:
    """``simulate step`` (data parallel, eager attention) for every recomputation and every
    split of ``sequences`` per device into ``accumulate`` micro-batches: the same tokens per
    step each time. One row per setting: step time, activations and total per device."""
    rows = []
    for recompute in RECOMPUTE:
        for k in accumulate:
            report, _ = simulate_step(StepSetup(model, cluster, "dp", sequences // k, seq, k,
                                                "eager", recompute))
            rows.append({"recompute": recompute, "accumulate": k, "step_s": report["step_s"],
                         "activations": report["memory_per_device"]["activations"],
                         "total": report["memory_total"], "capacity": report["capacity"],
                         "fits": report["memory_total"] <= report["capacity"]})
    return rows


def plot_recompute_tradeoff(rows: Sequence[dict[str, Any]]) -> Figure:
    """Memory per device against step time: one line per recomputation, one point per number
    of accumulated micro-batches (labelled; "does not fit" above the capacity), the device's
    capacity dashed."""
    fig = new_figure(9, 4.8)
    ax = style(fig.add_subplot())
    base = next(r["step_s"] for r in rows if r["recompute"] == "none" and r["accumulate"] == 1)
    for i, recompute in enumerate(RECOMPUTE):
        mine = [r for r in rows if r["recompute"] == recompute]
        xs = [r["step_s"] / base for r in mine]
        ys = [r["total"] / 2**30 for r in mine]
        ax.plot(xs, ys, color=SERIES_COLORS[i], marker=SERIES_MARKERS[i],
                label=f"recompute {recompute}")
        for x, y, r in zip(xs, ys, mine):
            text = f"x{r['accumulate']}" + ("" if r["fits"] else ": does not fit")
            ax.annotate(text, (x, y), textcoords="offset points",
                        xytext=(6, 4), fontsize=8)
    capacity = rows[0]["capacity"] / 2**30
    ax.axhline(capacity, color="black", linestyle="--", linewidth=1)
    ax.text(1.0, capacity, f" one device's memory, {capacity:.0f} GiB", va="bottom", fontsize=8)
    ax.set_xlabel("step time, relative to no recomputation and no accumulation")
    ax.set_ylabel("memory per device (GiB)")
    ax.set_ylim(0, max([capacity] + [r["total"] / 2**30 for r in rows]) * 1.12)
    ax.legend(loc="upper right")
    ax.set_title("memory saved against time paid (x k: k accumulated micro-batches, same "
                 "tokens per step)", loc="left")
    return fig


# ---- mixed precision: why a master copy -------------------------------------------------------

def master_copy_demo(steps: int = 200, update: float = 1e-3) -> dict[str, list[float]]:
    """A weight of 1.0 receives ``steps`` updates of ``+update``: kept in bf16 only, in an
    fp32 master copy (rounded to bf16 for use, as mixed precision does), and in fp32."""
    bf16 = torch.tensor(1.0, dtype=torch.bfloat16)
    master = torch.tensor(1.0)
    out: dict[str, list[float]] = {"bf16 only": [], "fp32 master, bf16 copy": [], "fp32": []}
    for _ in range(steps):
        bf16 = bf16 + torch.tensor(update, dtype=torch.bfloat16)
        master = master + update
        out["bf16 only"].append(bf16.item())
        out["fp32 master, bf16 copy"].append(master.to(torch.bfloat16).item())
        out["fp32"].append(master.item())
    return out


def plot_master_copy(curves: dict[str, list[float]]) -> Figure:
    fig = new_figure(8, 3.4)
    ax = style(fig.add_subplot())
    for i, (name, values) in enumerate(curves.items()):
        ax.plot(range(1, len(values) + 1), values, color=SERIES_COLORS[i], label=name,
                linestyle="-" if i < 2 else ":")
    ax.set_xlabel("optimizer steps of +0.001")
    ax.set_ylabel("weight")
    ax.legend()
    ax.set_title("a bf16 weight cannot grow by 0.001: bf16 keeps 8 significant bits",
                 loc="left")
    return fig


# ---- interleaved 1F1B -----------------------------------------------------------------------

def schedule_traces(n_stages: int, n_microbatches: int, n_chunks: int, forward_s: float = 1e-3,
                    backward_s: float = 2e-3) -> dict[str, Trace]:
    """1F1B and interleaved 1F1B as timelines, free sends, equal stages: a chunk step takes
    1/V of a stage's forward or backward."""
    plain = one_f_one_b(n_stages, n_microbatches)
    inter = interleaved_1f1b(n_stages, n_microbatches, n_chunks)
    v = n_chunks
    out = {}
    for name, schedule, f, b in (("1F1B", plain, forward_s, backward_s),
                                 (f"interleaved, {v} chunks", inter, forward_s / v,
                                  backward_s / v)):
        overhead = timed_bubble_overhead(schedule, f, b)
        label = f"{name}: idle = {overhead:.2%} of compute time (right: of the makespan)"
        out[label] = _shade_odd_chunks(timeline_trace(schedule_timeline(schedule, f, b),
                                                      n_stages), schedule)
    return out


def _shade_odd_chunks(trace: Trace, schedule: Any) -> Trace:
    """Steps of odd model chunks as the kinds "forward, odd chunk" and "backward, odd chunk"
    (a lighter shade), so that a microbatch's passes through the chunks can be told apart."""
    if schedule.n_chunks == 1:
        return trace
    odd = {(s.stage, s.token) for row in schedule.grid for s in row if s and s.chunk % 2}
    events = [replace(e, kind=f"{e.kind}, odd chunk") if (e.device, e.label) in odd else e
              for e in trace.events]
    return Trace(trace.n_devices, events, trace.memory, trace.source, dict(trace.meta))


def interleaved_view(stages: int = 4, rounds: int = 2, chunks: int = 2) -> tuple[Figure, dict]:
    """The explorer's view: 1F1B against interleaved 1F1B for P stages, M = rounds x P
    microbatches and V chunks; ``info`` has both overheads (idle time over compute time),
    the closed form, and both idle shares of the makespan (``idle_1f1b``,
    ``idle_interleaved``)."""
    m = rounds * stages
    traces = schedule_traces(stages, m, chunks)
    plain = timed_bubble_overhead(one_f_one_b(stages, m), 1.0, 2.0)
    inter = timed_bubble_overhead(interleaved_1f1b(stages, m, chunks), 1 / chunks, 2 / chunks)
    info = {"stages": stages, "microbatches": m, "chunks": chunks, "overhead_1f1b": plain,
            "overhead_interleaved": inter, "formula": (stages - 1) / (chunks * m),
            # the same idle time against the makespan (busy + idle), as each row's end says
            "idle_1f1b": plain / (1 + plain), "idle_interleaved": inter / (1 + inter)}
    return plot_timelines_side_by_side(traces, streams=("compute",)), info


def describe_interleaved(info: dict) -> str:
    return (f"<b>P</b> {info['stages']}, <b>M</b> {info['microbatches']}, <b>V</b> "
            f"{info['chunks']}: bubble 1F1B {percent(info['overhead_1f1b'])}, interleaved "
            f"{percent(info['overhead_interleaved'])} of compute (formula (P-1)/(V M) = "
            f"{percent(info['formula'])})")


def interleaved_explorer() -> Explorer:
    """Sliders for stages, microbatch rounds and chunks; both timelines redraw."""
    controls = {"stages": slider("stages P", 4, 2, 6),
                "rounds": slider("microbatches M / P", 2, 1, 4),
                "chunks": dropdown("chunks V", [1, 2, 3, 4], 2)}
    return Explorer(interleaved_view, controls, describe_interleaved)
