"""The tensor-parallel explorer: Megatron's MLP block split over 1 to 8 devices, on the
simulator, as the number of devices, the cluster and the model width change.

The block is lesson 05's ``lessons.tensor_and_hybrid.megatron_pass``: ``Linear(d, 4d)``, GELU,
``Linear(4d, d)`` in bf16 on ``tokens`` rows, forward and backward, run by a function with
exercise 5.4's signature (the learner's ``megatron_mlp`` once ``mp.yours`` hands it over,
else the package's) on meta tensors: the simulator times its FLOPs and bytes without
computing them, so a change redraws in well under a second.

Each device computes 1/N of the block, then waits for two all-reduces of a (tokens, d)
activation: the output's (g, after the forward) and x's gradient (f, after the backward).
The compute shrinks as 1/N; the all-reduces do not (each device sends 2 (N - 1)/N of the
activation per all-reduce), so the share of the step spent waiting grows with N, and far
faster on PCIe than on NVLink.

    fig, info = tp_view(devices=4, cluster="8xA100-nvlink", d_model=4096)
    info["compute_s"], info["all_reduce_s"], info["bytes_per_link"]
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from matplotlib.figure import Figure

from mpgpu_edu.cluster import Cluster
from mpgpu_edu.comm import LaunchResult, launch
from mpgpu_edu.explore.live import Explorer, dropdown, percent, slider
from mpgpu_edu.viz.palette import (IDLE_COLOR, IDLE_EDGE, IDLE_HATCH, color, format_bytes,
                                   format_seconds, new_figure, style)
from mpgpu_edu.viz.timeline import plot_timeline

D_MODELS = (1024, 2048, 4096, 8192)  # the block's width d; its hidden layer is 4d
TOKENS = 8 * 1024                    # rows of the batch (sequences x their length)
SCALING = (1, 2, 4, 8)               # the device counts the lower panel compares
BF16 = 2

ClusterLike = str | Cluster
_RUNS: dict[tuple, tuple[Any, LaunchResult]] = {}  # (id(mlp), preset, tokens, d, N) -> run


def _reference() -> Callable[..., Any]:
    from mpgpu_edu.tensor import megatron_mlp

    return megatron_mlp


def _machine(cluster: ClusterLike) -> Cluster:
    return Cluster.preset(cluster) if isinstance(cluster, str) else cluster


def simulate_block(devices: int, cluster: ClusterLike, d_model: int = 4096,
                   tokens: int = TOKENS, mlp: Callable[..., Any] | None = None) -> LaunchResult:
    """One forward and backward of the block on the first ``devices`` devices of ``cluster``
    (a preset name or a Cluster), run by ``mlp`` (default: the package's ``megatron_mlp``).
    Runs on a preset are remembered, so moving one control does not redo the others."""
    from mpgpu_edu.lessons.tensor_and_hybrid import megatron_pass

    machine = _machine(cluster)
    if not 1 <= devices <= machine.n_physical:
        raise ValueError(f"{machine.name} has {machine.n_physical} devices: use 1.."
                         f"{machine.n_physical}, not {devices}")
    if d_model < 1 or tokens < 1:
        raise ValueError(f"d_model and tokens must be >= 1, got {d_model} and {tokens}")
    mlp = mlp if mlp is not None else _reference()
    key = (id(mlp), cluster, tokens, d_model, devices) if isinstance(cluster, str) else None
    if key in _RUNS and _RUNS[key][0] is mlp:
        return _RUNS[key][1]
    visible = machine.with_visible(",".join(str(d) for d in range(devices)))
    result = launch(megatron_pass, visible, mlp, tokens, d_model)
    if key is not None:
        if len(_RUNS) > 256:
            _RUNS.clear()
        _RUNS[key] = (mlp, result)
    return result


def split_times(result: LaunchResult) -> dict[str, float]:
    """The critical device's forward, backward and waiting time (the step less its compute:
    the time it waits for the all-reduces to finish)."""
    trace = result.trace
    worst = max(range(trace.n_devices), key=trace.idle)
    forward = sum(e.duration for e in trace.on(worst, "compute", "forward"))
    backward = sum(e.duration for e in trace.on(worst, "compute", "backward"))
    return {"forward_s": forward, "backward_s": backward,
            "all_reduce_s": max(trace.makespan - trace.busy(worst), 0.0),
            "step_s": trace.makespan}


def link_table(result: LaunchResult) -> dict[tuple[int, int], int]:
    """Bytes sent over each link used, {(source, destination): bytes}."""
    return {link: nbytes for link, nbytes in sorted(result.bytes_per_link().items()) if nbytes}


def tp_view(devices: int = 4, cluster: ClusterLike = "8xA100-nvlink", d_model: int = 4096,
            tokens: int = TOKENS, mlp: Callable[..., Any] | None = None
            ) -> tuple[Figure, dict]:
    """The timeline of one forward and backward of the Megatron MLP block (width ``d_model``,
    hidden 4 x ``d_model``, ``tokens`` rows, bf16) split over ``devices`` devices of
    ``cluster``, above the same block's compute and all-reduce time on 1, 2, 4 and 8 devices.

    Returns ``(figure, info)``; ``info`` holds ``step_s``, ``compute_s`` (forward + backward
    of the device that waits longest), ``all_reduce_s`` (its waiting time), ``comm_share``,
    ``one_device_s``, ``speedup``, ``all_reduces`` (forward, backward: how many all-reduces
    of the output the bytes add up to), ``bytes_sent`` per device, ``bytes_per_link``
    ({(src, dst): bytes}) and ``scaling`` (per device count: compute_s, all_reduce_s).
    ``mlp``: a function with exercise 5.4's signature (its ``label``, if any, in the title)."""
    from mpgpu_edu.lessons.tensor_and_hybrid import all_reduces

    machine = _machine(cluster)
    name = machine.name
    result = simulate_block(devices, cluster, d_model, tokens, mlp)
    times = split_times(result)
    output_bytes = tokens * d_model * BF16
    counts = tuple(all_reduces([r[k] for r in result.results], output_bytes)
                   for k in ("forward_bytes", "backward_bytes"))
    scaling = {}
    for n in sorted({*(n for n in SCALING if n <= machine.n_physical), devices}):
        t = split_times(simulate_block(n, cluster, d_model, tokens, mlp))
        scaling[n] = {"compute_s": t["forward_s"] + t["backward_s"],
                      "forward_s": t["forward_s"], "backward_s": t["backward_s"],
                      "all_reduce_s": t["all_reduce_s"], "step_s": t["step_s"]}
    one = scaling[1]["step_s"]
    compute = times["forward_s"] + times["backward_s"]
    who = getattr(mlp, "label", None) or ("package's Megatron MLP" if mlp is None
                                          else "Megatron MLP")
    info = {"devices": devices, "cluster": name, "d_model": d_model, "hidden": 4 * d_model,
            "tokens": tokens, "who": who, "step_s": times["step_s"], "compute_s": compute,
            "forward_s": times["forward_s"], "backward_s": times["backward_s"],
            "all_reduce_s": times["all_reduce_s"],
            "comm_share": times["all_reduce_s"] / times["step_s"] if times["step_s"] else 0.0,
            "one_device_s": one, "speedup": one / times["step_s"],
            "all_reduces": counts, "output_bytes": output_bytes,
            "bytes_sent": result.bytes_sent_per_rank, "bytes_per_link": link_table(result),
            "scaling": scaling}
    return _figure(result, info), info


def _figure(result: LaunchResult, info: dict) -> Figure:
    n = info["devices"]
    rows = 2 * n
    fig = new_figure(10, 0.34 * rows + 5.6)
    top, bottom = fig.subplots(2, 1, height_ratios=[0.34 * rows + 1.6, 2.6])
    slower = " (slower than 1 device!)" if info["speedup"] < 1 else ""
    plot_timeline(result.trace, ax=top, title=(
        f"{info['who']}\nd = {info['d_model']}, hidden {info['hidden']}, {info['tokens']} "
        f"tokens, on {n} of {info['cluster']}: speedup {info['speedup']:.2f}x{slower}\n"
        f"step {format_seconds(info['step_s'])} = compute {format_seconds(info['compute_s'])}"
        + (f" + waiting on the all-reduces {format_seconds(info['all_reduce_s'])} "
           f"({percent(info['comm_share'])})" if n > 1 else " (one device: no all-reduce)")))
    scaling = info["scaling"]
    labels = [f"{k} device{'s' if k > 1 else ''}" for k in scaling]
    y = list(range(len(scaling)))
    forward = [s["forward_s"] for s in scaling.values()]
    backward = [s["backward_s"] for s in scaling.values()]
    wait = [s["all_reduce_s"] for s in scaling.values()]
    bottom.barh(y, forward, color=color("forward"), label="forward")
    bottom.barh(y, backward, left=forward, color=color("backward"), label="backward")
    bottom.barh(y, wait, left=[f + b for f, b in zip(forward, backward)], color=IDLE_COLOR,
                edgecolor=IDLE_EDGE, hatch=IDLE_HATCH, linewidth=0,
                label="waiting on the all-reduces")
    longest = max(s["step_s"] for s in scaling.values())
    for row, (k, s) in zip(y, scaling.items()):
        share = s["all_reduce_s"] / s["step_s"] if s["step_s"] else 0.0
        bottom.annotate(f"{format_seconds(s['step_s'])}, {percent(share)} waiting",
                        xy=(s["step_s"], row), xytext=(4, 0), textcoords="offset points",
                        va="center", fontsize=9,
                        fontweight="bold" if k == n else "normal")
    bottom.set_yticks(y, [f"{lab} (above)" if k == n else lab
                          for k, lab in zip(scaling, labels)])
    for tick, k in zip(bottom.get_yticklabels(), scaling):
        tick.set_fontweight("bold" if k == n else "normal")
    bottom.set_ylim(len(y) - 0.5, -0.5)
    bottom.set_xlim(0, longest * 1.35)
    bottom.xaxis.set_major_formatter(lambda x, _pos: format_seconds(x) if x else "0")
    bottom.set_xlabel("time of one forward and backward")
    style(bottom, grid="x")
    bottom.tick_params(axis="y", length=0)
    bottom.set_title(f"the same block on {info['cluster']}, by number of devices",
                     loc="left", pad=20, fontsize=10)
    bottom.legend(loc="lower left", bbox_to_anchor=(0, 1.0), ncol=3, fontsize=9,
                  frameon=False, borderaxespad=0.2)
    return fig


def describe(info: dict) -> str:
    forward, backward = info["all_reduces"]
    links = info["bytes_per_link"]
    if links:
        rows = [f"dev {s} -> dev {d}: {format_bytes(b)}" for (s, d), b in links.items()]
        link_text = "<br>".join(rows)
    else:
        link_text = "none: one device sends nothing"
    return (f"<b>step</b> {format_seconds(info['step_s'])} &nbsp; <b>compute</b> "
            f"{format_seconds(info['compute_s'])} &nbsp; <b>waiting on all-reduces</b> "
            f"{format_seconds(info['all_reduce_s'])} ({percent(info['comm_share'])}) &nbsp; "
            f"<b>1 device</b> {format_seconds(info['one_device_s'])} &nbsp; <b>speedup</b> "
            f"{info['speedup']:.2f}x<br><b>all-reduces of the "
            f"{format_bytes(info['output_bytes'])} output</b>: {forward:g} forward, "
            f"{backward:g} backward &nbsp; <b>bytes per link</b>:<br>"
            f"<span style='font-family:monospace'>{link_text}</span>")


def tp_explorer(mlp: Callable[..., Any] | None = None, devices: int = 4,
                cluster: str = "8xA100-nvlink", d_model: int = 4096) -> Explorer:
    """Tensor-parallel devices, cluster and model width as controls; the block's timeline,
    its compute and all-reduce time and the bytes on each link redraw on every change.
    ``mlp``: the function that runs the block (``mp.yours("5.4", ...)``; default the
    package's ``megatron_mlp``)."""
    presets = [c for c in Cluster.presets() if Cluster.preset(c).n_physical <= 8]
    controls = {
        "devices": slider("tensor-parallel devices", devices, 1,
                          Cluster.preset(cluster).n_physical),
        "cluster": dropdown("cluster", presets, cluster),
        "d_model": dropdown("width d (hidden 4d)", list(D_MODELS), d_model),
    }

    def fit_devices(change: dict) -> None:
        controls["devices"].max = Cluster.preset(change["new"]).n_physical

    controls["cluster"].observe(fit_devices, names="value")
    fixed = {"mlp": mlp} if mlp is not None else None
    return Explorer(tp_view, controls, describe, fixed=fixed)
