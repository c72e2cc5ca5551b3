"""Lesson 09, memory for time: what each remedy for the activations costs. Recomputation and
accumulation on a simulated GPT-2 step, and the learner's recomputation measured on a real
model here.

The recomputation demos take a function with lesson 09's contract (``wrap(model, segments)``:
the learner's ``checkpointed`` once its check passes, else the package's
``mpgpu_edu.memory.recompute.checkpointed``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from matplotlib.figure import Figure
from torch import nn

from mpgpu_edu.comm.torch_threads import one_torch_thread
from mpgpu_edu.estimate.step import StepSetup, simulate_step
from mpgpu_edu.explore.live import Explorer, dropdown, slider
from mpgpu_edu.memory.models import DecoderSpec, layer_activation_bytes
from mpgpu_edu.memory.recompute import checkpointed, segment_bounds
from mpgpu_edu.viz.palette import SERIES_COLORS, SERIES_MARKERS, new_figure, style

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


def recompute_key(model: str, cluster: str, sequences: int, seq: int,
                  accumulate: Sequence[int]) -> str:
    """The key of one study in ``_recompute_stored.ROWS``."""
    return f"{model}|{cluster}|{sequences}|{seq}|{','.join(map(str, accumulate))}"


def recompute_rows(model: str = "gpt2-medium", cluster: str = "8xA100-nvlink",
                   sequences: int = 32, seq: int = 1024,
                   accumulate: Sequence[int] = (1, 2, 4, 8),
                   stored: bool = True) -> list[dict[str, Any]]:
    """``simulate step`` (data parallel, eager attention) for every recomputation and every
    split of ``sequences`` per device into ``accumulate`` micro-batches: the same tokens per
    step each time. One row per setting: step time, activations and total per device.

    With ``stored``, the notebook's study (its twelve steps take about 13 s to simulate) is
    read from ``_recompute_stored.ROWS`` when it is there; a test holds those numbers to a
    fresh simulation."""
    if stored:
        from mpgpu_edu.lessons._recompute_stored import ROWS

        key = recompute_key(model, cluster, sequences, seq, accumulate)
        if key in ROWS:
            return [dict(row) for row in ROWS[key]]
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


# ---- what a model keeps, as the sequence grows ------------------------------------------------

def activation_view(log2_seq: int = 10, model: str = "gpt2-medium",
                    layer_bytes: Callable[..., int] | None = None) -> tuple[Figure, dict]:
    """One sequence of 2**log2_seq tokens through every layer of ``model``: the bytes kept for
    backward without recomputation, with selective and with full recomputation, counted by
    ``layer_bytes`` (lesson 09's contract: the learner's ``layer_activation_bytes`` once 9.1
    passes, else ``reference_layer_bytes``)."""
    from mpgpu_edu.memory.models import get_preset

    spec, seq = get_preset(model), 2 ** log2_seq
    count = layer_bytes or reference_layer_bytes
    kept = {mode: spec.n_layers * int(count(seq, 1, spec.d_model, spec.n_heads, mode))
            for mode in RECOMPUTE}
    fig = new_figure(7.5, 2.6)
    ax = style(fig.add_subplot(), grid="x")
    names = list(kept)[::-1]
    ax.barh(names, [kept[n] / 2**30 for n in names], color=SERIES_COLORS[:3][::-1])
    for y, name in enumerate(names):
        ax.text(kept[name] / 2**30, y, f"  {kept[name] / 2**30:.2f} GiB", va="center")
    ax.set_xlim(0, max(kept.values()) / 2**30 * 1.3)
    ax.set_xlabel("GiB kept for backward: one sequence, every layer")
    whose = getattr(layer_bytes, "label", "reference activation count")
    ax.set_title(f"{spec.name}, {seq:,} tokens ({whose})", loc="left")
    return fig, {"model": model, "seq": seq, **kept}


def describe_activations(info: dict) -> str:
    from mpgpu_edu.viz.palette import format_bytes

    return (f"<b>{info['seq']:,}</b> tokens of {info['model']}: none "
            f"{format_bytes(info['none'])}, selective {format_bytes(info['selective'])}, full "
            f"{format_bytes(info['full'])} (selective / none: "
            f"{info['selective'] / info['none']:.0%})")


def activation_explorer(layer_bytes: Callable[..., int] | None = None,
                        model: str = "gpt2-medium") -> Explorer:
    """A slider for the sequence length (2**k tokens) and a model menu over
    ``activation_view``, counted by ``layer_bytes`` (the learner's once 9.1 passes)."""
    from mpgpu_edu.memory.models import PRESETS

    controls = {"log2_seq": slider("tokens: 2^k, k =", 10, 7, 15),
                "model": dropdown("model", list(PRESETS), model)}
    return Explorer(activation_view, controls, describe_activations,
                    fixed={"layer_bytes": layer_bytes})


def stored_rows_source(model: str = "gpt2-medium", cluster: str = "8xA100-nvlink",
                       sequences: int = 32, seq: int = 1024,
                       accumulate: Sequence[int] = (1, 2, 4, 8)) -> str:
    """The text of ``_recompute_stored.ROWS`` for the notebook's study, freshly simulated."""
    rows = recompute_rows(model, cluster, sequences, seq, accumulate, stored=False)
    lines = ["ROWS = {", f"    {recompute_key(model, cluster, sequences, seq, accumulate)!r}: ["]
    for row in rows:
        lines.append("        {")
        lines += [f"            {k!r}: {v!r}," for k, v in row.items()]
        lines.append("        },")
    return "\n".join(lines + ["    ],", "}"])


if __name__ == "__main__":
    import sys

    if sys.argv[1:] == ["--recompute"]:  # regenerate _recompute_stored.py's ROWS
        print(stored_rows_source())
    else:
        sys.exit("usage: python -m mpgpu_edu.lessons.memory_for_time --recompute")
