"""The data-parallel explorer: one DDP step on the simulator, as devices, bucket size and
overlap change.

The step is ``mpgpu_edu.dp.ddp``'s own, run on a *meta* copy of the model and batch: tensors
with shapes and no data, so the simulator counts the FLOPs and bytes of a real step at no
cost, and a change redraws in well under a second. ``light`` and ``heavy`` are the scaling
workloads of ``mpgpu_edu.replica.data``: the same 6.3 M-parameter model, with 64 or 16384 samples a
step. Speedup is against the same step on one device; efficiency is speedup / devices.

    fig, info = dp_view(devices=4, model="light", bucket_mb=25, overlap=False)
    info["step_s"], info["efficiency"]

With ``wrap`` (a DDP wrapper: exercise 3.5's ``wrap_ddp``, or what ``mp.yours`` chose), the
overlapped steps are the wrapper's, timed from the first forward on
(``lessons.data_parallel.step_only``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from matplotlib.figure import Figure

from mpgpu_edu.cluster import Cluster
from mpgpu_edu.comm import launch
from mpgpu_edu.replica.data import Workload, heavy, light
from mpgpu_edu.dp.ddp import ddp_step, ddp_step_bucketed, ddp_step_overlapped
from mpgpu_edu.dp.scaling import one_step_on_meta
from mpgpu_edu.explore.live import Explorer, dropdown, percent, slider
from mpgpu_edu.cluster.trace import Trace
from mpgpu_edu.viz.palette import format_bytes, format_seconds
from mpgpu_edu.viz.timeline import plot_timeline

MODELS: dict[str, Callable[[], Workload]] = {"light": light, "heavy": heavy}
BUCKET_MB = (0, 1, 4, 16, 25, 64, 100)  # 0: no buckets, one all-reduce per parameter


def step_function(bucket_mb: float, overlap: bool) -> tuple[Callable, str]:
    """The DDP step for these settings and its name: naive (``bucket_mb == 0``, no overlap),
    bucketed, or overlapped (with ``bucket_mb == 0``: one bucket per parameter)."""
    if bucket_mb < 0:
        raise ValueError(f"bucket_mb must be >= 0 (0: one all-reduce per parameter), "
                         f"got {bucket_mb}")
    if bucket_mb == 0 and not overlap:
        return ddp_step, "naive: one all-reduce per parameter, after backward"
    nbytes = max(1, int(bucket_mb * 2**20))
    size = "one bucket per parameter" if bucket_mb == 0 else f"{bucket_mb:g} MiB buckets"
    if overlap:
        return (functools.partial(ddp_step_overlapped, bucket_bytes=nbytes),
                f"overlapped, {size}")
    return functools.partial(ddp_step_bucketed, bucket_bytes=nbytes), f"bucketed, {size}"


def _workload(model: str) -> Workload:
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}: choose one of {', '.join(MODELS)}")
    return MODELS[model]()


def simulate_step(devices: int, model: str, cluster: str | Cluster, bucket_mb: float,
                  overlap: bool, wrap: Any = None) -> Trace:
    """The trace of one DDP step on the first ``devices`` devices of ``cluster``; with
    ``wrap`` and ``overlap``, one step of that DDP wrapper's replica instead."""
    machine = Cluster.preset(cluster) if isinstance(cluster, str) else cluster
    if not 1 <= devices <= machine.n_physical:
        raise ValueError(f"{machine.name} has {machine.n_physical} devices: use 1.."
                         f"{machine.n_physical}, not {devices}")
    step, _ = step_function(bucket_mb, overlap)
    machine = machine.with_visible(",".join(str(d) for d in range(devices)))
    if wrap is not None and overlap:
        from mpgpu_edu.lessons.data_parallel import step_only, wrapped_step_on_meta

        nbytes = max(1, int(bucket_mb * 2**20))
        return step_only(launch(wrapped_step_on_meta, machine, _workload(model), wrap,
                                nbytes).trace)
    return launch(one_step_on_meta, machine, _workload(model), step).trace


@functools.lru_cache(maxsize=64)
def _one_device_s(model: str, cluster: str, bucket_mb: float, overlap: bool) -> float:
    return simulate_step(1, model, cluster, bucket_mb, overlap).makespan


def dp_view(devices: int = 4, model: str = "heavy", cluster: str | Cluster = "4xRTX4090-pcie",
            bucket_mb: float = 25, overlap: bool = True,
            wrap: Any = None) -> tuple[Figure, dict]:
    """The timeline of one DDP step (``model``: "light" or "heavy") on ``devices`` devices
    of ``cluster`` (a preset name or a Cluster), with ``bucket_mb`` MiB buckets (0: none) and
    the all-reduce overlapped with backward or not.

    Returns ``(figure, info)``; ``info`` holds ``step_s``, ``one_device_s``, ``speedup``,
    ``efficiency``, ``idle_fraction`` per device and ``bytes_sent`` per device. ``wrap``: a
    DDP wrapper whose overlapped step is shown (whose it is on the title's first line)."""
    trace = simulate_step(devices, model, cluster, bucket_mb, overlap, wrap)
    name = cluster if isinstance(cluster, str) else cluster.name
    one = (_one_device_s(model, cluster, bucket_mb, overlap) if isinstance(cluster, str)
           else simulate_step(1, model, cluster, bucket_mb, overlap).makespan)
    speedup = one / trace.makespan
    _, mode = step_function(bucket_mb, overlap)
    who = ""
    if wrap is not None and overlap:
        from mpgpu_edu.lessons.data_parallel import whose

        who = (whose(wrap) if hasattr(wrap, "is_yours")
               else getattr(wrap, "label", "your DDP wrapper")) + "\n"
    info = {"devices": devices, "model": model, "cluster": name, "mode": mode,
            "step_s": trace.makespan, "one_device_s": one, "speedup": speedup,
            "efficiency": speedup / devices,
            "idle_fraction": [trace.idle_fraction(d) for d in range(devices)],
            "bytes_sent": trace.bytes_sent()}
    slower = " (slower than 1 device!)" if speedup < 1 else ""
    fig = plot_timeline(trace, title=(
        f"{who}DDP, {mode}: {model} model on {devices} devices of {name}\nstep "
        f"{format_seconds(trace.makespan)}, 1 device {format_seconds(one)}: speedup "
        f"{speedup:.2f}x{slower}, efficiency {percent(speedup / devices)}"))
    return fig, info


def describe(info: dict) -> str:
    sent = format_bytes(max(info["bytes_sent"], default=0))
    return (f"<b>step</b> {format_seconds(info['step_s'])} &nbsp; <b>1 device</b> "
            f"{format_seconds(info['one_device_s'])} &nbsp; <b>speedup</b> "
            f"{info['speedup']:.2f}x &nbsp; <b>efficiency</b> {percent(info['efficiency'])} "
            f"&nbsp; <b>sent per device</b> up to {sent}")


def dp_explorer(devices: int = 4, model: str = "light", cluster: str = "4xRTX4090-pcie",
                wrap: Any = None) -> Explorer:
    """Devices, model, cluster, bucket size and overlap as controls; the step's timeline,
    its time and its scaling efficiency redraw on every change. ``wrap``: a DDP wrapper
    whose step the overlapped settings run."""
    controls = {
        "devices": slider("devices", devices, 1, Cluster.preset(cluster).n_physical),
        "model": dropdown("model", list(MODELS), model),
        "cluster": dropdown("cluster", [c for c in Cluster.presets()
                                        if Cluster.preset(c).n_physical <= 8], cluster),
        "bucket_mb": dropdown("bucket (MiB)", [("none", 0), *((f"{b}", b) for b in
                                                             BUCKET_MB[1:])], 25),
        "overlap": dropdown("overlap with backward", [("yes", True), ("no", False)], True),
    }

    def fit_devices(change: dict) -> None:
        controls["devices"].max = Cluster.preset(change["new"]).n_physical

    controls["cluster"].observe(fit_devices, names="value")
    fixed = {"wrap": wrap} if wrap is not None else None
    return Explorer(dp_view, controls, describe, fixed=fixed)
