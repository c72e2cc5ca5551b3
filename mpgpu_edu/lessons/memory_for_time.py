"""Lesson 09, memory for time: what each remedy for a model that does not fit costs.
Recomputation and accumulation on a simulated GPT-2 step, the learner's recomputation measured
on a real model here, mixed precision's master copy, and interleaved 1F1B's bubble.

The recomputation demos take a function with lesson 09's contract (``wrap(model, segments)``:
the learner's ``checkpointed`` once its check passes, else the package's
``mpgpu_edu.memory.recompute.checkpointed``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import torch
from matplotlib.figure import Figure
from torch import nn

from mpgpu_edu.cluster.trace import Trace
from mpgpu_edu.comm.torch_threads import one_torch_thread
from mpgpu_edu.estimate.step import StepSetup, simulate_step
from mpgpu_edu.explore.live import Explorer, dropdown, percent, slider
from mpgpu_edu.memory.models import DecoderSpec, layer_activation_bytes
from mpgpu_edu.memory.recompute import checkpointed, segment_bounds
from mpgpu_edu.pipeline import interleaved_1f1b, one_f_one_b
from mpgpu_edu.pipeline.timing import schedule_timeline, timed_bubble_overhead, timeline_trace
from mpgpu_edu.viz.palette import SERIES_COLORS, SERIES_MARKERS, new_figure, style
from mpgpu_edu.viz.timeline import plot_timelines_side_by_side

Wrap = Callable[[nn.Sequential, int], Callable[[torch.Tensor], torch.Tensor]]


def reference_layer_bytes(seq: int, batch: int, d_model: int, n_heads: int,
                          recompute: str = "none") -> int:
    """Exercise 9.1's function from the package's activation model
    (``memory.models.layer_activation_bytes``, mixed precision, eager attention, one device)."""
    spec = DecoderSpec("layer", 1, d_model, n_heads, 4 * d_model, 1)
    return layer_activation_bytes(spec, batch, seq, "mixed", "eager", recompute)


def reference_checkpointed() -> Wrap:
    """The package's recomputation (``memory.recompute.checkpointed``)."""
    return checkpointed


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


# ---- your recomputation, measured ------------------------------------------------------------

def _mlp(blocks: int, width: int) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(*[m for _ in range(blocks) for m in (nn.Linear(width, width), nn.Tanh())])


def _saved_bytes(run: Callable[[], torch.Tensor], skip: set[int]) -> int:
    """What autograd keeps for backward while ``run()`` runs, in bytes, once per storage,
    leaving out the storages in ``skip`` (the parameters, which are there anyway)."""
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        ptr = t.untyped_storage().data_ptr()
        if ptr not in skip:
            seen[ptr] = t.untyped_storage().nbytes()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        run()
    return sum(seen.values())


def _step_seconds(f: Callable[[torch.Tensor], torch.Tensor], model: nn.Module,
                  x: torch.Tensor) -> float:
    model.zero_grad()
    start = time.perf_counter()
    f(x).pow(2).mean().backward()
    return time.perf_counter() - start


def measure_recompute(wrap: Wrap, blocks: int = 16, width: int = 512, batch: int = 256,
                      segments: Sequence[int] = (1, 2, 4, 8, 16),
                      repeats: int = 5) -> list[dict[str, Any]]:
    """A real MLP of ``blocks`` Linear + Tanh pairs on this machine, without recomputation
    (the row with ``segments`` 0) and with ``wrap(model, k)`` for every k in ``segments``.
    Per row: the bytes kept for backward after forward (``kept``, measured with
    ``saved_tensors_hooks``); the ``peak`` while the largest segment is recomputed in
    backward (``kept`` plus what that segment's layers keep beyond its input, each layer's
    share measured once); the FLOPs of one forward + backward (``flops``, counted); and the
    fastest of ``repeats`` forward + backward passes (``seconds``), on one thread (``one_torch_thread``: the count stays at one), every setting
    in turn each round."""
    model = _mlp(blocks, width)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    x = torch.randn(batch, width)
    inner = []  # what each layer keeps when it runs with autograd on, beyond its input
    for layer in model:
        h = torch.randn(batch, width, requires_grad=True)
        inner.append(_saved_bytes(lambda layer=layer, h=h: layer(h),
                                  params | {h.untyped_storage().data_ptr()}))
    plain = _saved_bytes(lambda: model(x), params)
    runs = {0: model} | {k: wrap(model, k) for k in segments}
    kept = {0: plain} | {k: _saved_bytes(lambda f=f: f(x), params)
                         for k, f in runs.items() if k}
    seconds: dict[int, list[float]] = {k: [] for k in runs}
    with one_torch_thread():  # a busy machine then slows every setting alike
        for _ in range(repeats + 1):  # round-robin, the first round a warm-up
            for k, f in runs.items():
                seconds[k].append(_step_seconds(f, model, x))
    rows = []
    for k, f in runs.items():
        largest = (max(sum(inner[a:b]) for a, b in segment_bounds(len(model), k)) if k
                   else 0)
        rows.append({"segments": k, "kept": kept[k], "peak": kept[k] + largest,
                     "seconds": min(seconds[k][1:]), "flops": _step_flops(f, model, x)})
    return rows


def _step_flops(f: Callable[[torch.Tensor], torch.Tensor], model: nn.Module,
                x: torch.Tensor) -> int:
    """The FLOPs of one forward + backward, counted by torch's ``FlopCounterMode`` (the
    matrix products): unlike a time, the same on every machine and under any load."""
    from torch.utils.flop_counter import FlopCounterMode

    model.zero_grad()
    with FlopCounterMode(display=False) as counter:
        f(x).pow(2).mean().backward()
    return counter.get_total_flops()


def plot_recompute_measured(rows: Sequence[dict[str, Any]]) -> Figure:
    """Left: activation bytes per number of segments, kept after forward and at the peak in
    backward, against no recomputation (dashed). Right: forward + backward FLOPs (bars,
    counted) and time (dots, measured) relative to no recomputation, against the 4/3 of one
    more forward."""
    fig = new_figure(10, 3.8)
    memory, seconds = (style(ax) for ax in fig.subplots(1, 2))
    base, mine = rows[0], [r for r in rows if r["segments"]]
    xs = range(len(mine))
    for i, key, name in ((0, "kept", "kept after forward"),
                         (1, "peak", "peak in backward (+ one segment recomputed)")):
        memory.plot(xs, [r[key] / 2**20 for r in mine], color=SERIES_COLORS[i],
                    marker=SERIES_MARKERS[i], label=name)
    memory.axhline(base["kept"] / 2**20, color="black", linestyle="--", linewidth=1,
                   label="no recomputation")
    memory.set_ylim(0, base["kept"] / 2**20 * 1.35)
    memory.set_ylabel("activations (MiB)")
    memory.legend(loc="upper center", fontsize=8)
    memory.set_title("memory: the peak is lowest in between", loc="left")
    seconds.bar(xs, [r["flops"] / base["flops"] for r in mine], color=SERIES_COLORS[2],
                width=0.6, label="FLOPs, counted")
    seconds.plot(xs, [r["seconds"] / base["seconds"] for r in mine], color="black",
                 marker="o", linestyle="none", label="time, measured here (moves with load)")
    seconds.axhline(1.0, color="black", linestyle="--", linewidth=1, label="no recomputation")
    seconds.axhline(4 / 3, color=SERIES_COLORS[1], linestyle=":", linewidth=1.5,
                    label="one more forward: 4/3")
    seconds.set_ylim(0, max([1.8] + [r["seconds"] / base["seconds"] * 1.25 for r in mine]))
    seconds.legend(loc="upper left", fontsize=8, ncol=2)
    seconds.set_ylabel("relative to none")
    seconds.set_title("work: one more forward, counted and timed", loc="left")
    for ax in (memory, seconds):
        ax.set_xticks(list(xs), [str(r["segments"]) for r in mine])
        ax.set_xlabel("segments")
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
