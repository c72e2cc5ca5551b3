"""The pipeline explorer: stages, microbatches and schedule in; timeline, bubble and activation
memory out, without training anything.

The timeline comes from the schedule alone (``schedule_timeline``): every device runs its
steps in the schedule's order as soon as its inputs have arrived, a forward taking ``fwd_s``,
a backward ``bwd_s`` and a message between stages the cluster's time for ``send_bytes``.
A microbatch's activations are held from the start of its forward to the end of its backward:
GPipe's stage 0 holds all M at once, 1F1B's at most P.

    fig, info = pipeline_view(stages=4, microbatches=8, schedule="1f1b")
    info["bubble_fraction"], info["peak_activations"]     # 0.27..., [4, 3, 2, 1]
"""

from __future__ import annotations

from matplotlib.figure import Figure

from mpgpu_edu.cluster import Cluster
from mpgpu_edu.explore.live import Explorer, dropdown, percent, slider
from mpgpu_edu.pipeline.measures import peak_activations
from mpgpu_edu.pipeline.schedules import gpipe, naive, one_f_one_b
from mpgpu_edu.pipeline.steps import Schedule
from mpgpu_edu.pipeline.timing import TimedStep, schedule_timeline, timeline_trace
from mpgpu_edu.cluster.trace import MemoryEvent, Trace
from mpgpu_edu.viz.memory import plot_memory_over_time
from mpgpu_edu.viz.palette import format_bytes, format_seconds, new_figure
from mpgpu_edu.viz.timeline import plot_timeline

SCHEDULES = ("naive", "gpipe", "1f1b")
ACTIVATION_BYTES = 256 * 2**20  # what one stage keeps for one microbatch's backward
SEND_BYTES = 16 * 2**20         # what one stage sends the next for one microbatch

ClusterLike = str | Cluster


def make_schedule(name: str, stages: int, microbatches: int) -> Schedule:
    """``"naive"`` (the whole batch as one microbatch), ``"gpipe"`` or ``"1f1b"``."""
    if name == "naive":
        return naive(stages)
    if name == "gpipe":
        return gpipe(stages, microbatches)
    if name == "1f1b":
        return one_f_one_b(stages, microbatches)
    raise ValueError(f"unknown schedule {name!r}: choose one of {', '.join(SCHEDULES)}")


def _cluster(cluster: ClusterLike) -> Cluster:
    return Cluster.preset(cluster) if isinstance(cluster, str) else cluster


def with_activations(timeline: list[TimedStep], n_devices: int, nbytes: int) -> Trace:
    """The timeline as a Trace whose memory records each microbatch's activations, allocated
    when its forward starts and freed when its backward ends."""
    trace = timeline_trace(timeline, n_devices)
    # A backward that ends as the next forward starts frees and allocates at the same moment:
    # one net change, so the memory line shows no blip there.
    net: dict[tuple[int, float], int] = {}
    for t in timeline:
        key = (t.device, t.start) if t.step.op == "F" else (t.device, t.end)
        net[key] = net.get(key, 0) + (nbytes if t.step.op == "F" else -nbytes)
    held = [0] * n_devices
    for (device, time), delta in sorted(net.items(), key=lambda item: item[0][::-1]):
        if delta:
            held[device] += delta
            trace.memory.append(MemoryEvent(device, time, "activations", delta,
                                            "microbatch activations", held[device]))
    return trace


def pipeline_view(stages: int = 4, microbatches: int = 4, schedule: str = "gpipe",
                  cluster: ClusterLike = "4xRTX4090-pcie", fwd_s: float = 0.01,
                  bwd_s: float = 0.02, *, activation_bytes: int = ACTIVATION_BYTES,
                  send_bytes: int = SEND_BYTES) -> tuple[Figure, dict]:
    """The timeline of one step of ``schedule`` on the first ``stages`` devices of ``cluster``
    (a preset name or a Cluster), above each device's activation memory over the step.

    Returns ``(figure, info)``; ``info`` holds ``makespan_s``, ``bubble_fraction`` (idle time
    over stages x makespan, measured on this timeline), ``bubble_formula`` ((P-1)/(M+P-1),
    the value with free sends), ``idle_fraction`` per device, ``peak_activations`` (microbatches
    held at once, per stage), ``peak_activation_bytes`` and ``send_s``."""
    machine = _cluster(cluster)
    if not 1 <= stages <= machine.world_size:
        raise ValueError(f"{stages} stages need {stages} devices; {machine.name} has "
                         f"{machine.world_size}: use 1..{machine.world_size} stages")
    plan = make_schedule(schedule, stages, microbatches)
    m = plan.n_microbatches
    send_s = machine.route(0, 1).seconds(send_bytes) if stages > 1 else 0.0
    timeline = schedule_timeline(plan, fwd_s, bwd_s, send_s)
    trace = with_activations(timeline, stages, activation_bytes)
    busy = sum(t.end - t.start for t in timeline)
    bubble = 1 - busy / (stages * trace.makespan)
    peaks = peak_activations(plan)
    info = {"schedule": schedule, "stages": stages, "microbatches": m,
            "cluster": machine.name, "makespan_s": trace.makespan, "bubble_fraction": bubble,
            "bubble_formula": (stages - 1) / (m + stages - 1), "send_s": send_s,
            "idle_fraction": [trace.idle_fraction(d) for d in range(stages)],
            "peak_activations": peaks,
            "peak_activation_bytes": [p * activation_bytes for p in peaks],
            "note": ("naive runs the whole batch as one microbatch"
                     if schedule == "naive" and microbatches != 1 else "")}
    return _figure(trace, info), info


def _figure(trace: Trace, info: dict) -> Figure:
    p, m = info["stages"], info["microbatches"]
    fig = new_figure(10, 0.55 * p + 4.6)
    top, bottom = fig.subplots(2, 1, height_ratios=[0.55 * p + 1.2, 2.6], sharex=True)
    plot_timeline(trace, ax=top, streams=("compute",), title=(
        f"{info['schedule']}: {p} stages x {m} microbatches on {info['cluster']}, step "
        f"{format_seconds(info['makespan_s'])}\nbubble {percent(info['bubble_fraction'])} of "
        f"each device's time ((P-1)/(M+P-1) = {percent(info['bubble_formula'])} if sends "
        f"took no time)"))
    top.set_xlabel("")
    plot_memory_over_time(trace, ax=bottom, stacked=False)
    bottom.set_title(f"activations held per stage: peak {info['peak_activations']} "
                     f"microbatches = {format_bytes(max(info['peak_activation_bytes']))} "
                     "on the fullest stage", loc="left")
    return fig


def describe(info: dict) -> str:
    peaks = ", ".join(f"stage {s}: {n}" for s, n in enumerate(info["peak_activations"]))
    note = f" ({info['note']})" if info["note"] else ""
    return (f"<b>step</b> {format_seconds(info['makespan_s'])} &nbsp; <b>bubble</b> "
            f"{percent(info['bubble_fraction'])} (formula {percent(info['bubble_formula'])}) "
            f"&nbsp; <b>send</b> {format_seconds(info['send_s'])} &nbsp; "
            f"<b>microbatches held at peak</b> {peaks}{note}")


def pipeline_explorer(stages: int = 4, microbatches: int = 4, schedule: str = "gpipe",
                      cluster: str = "4xRTX4090-pcie") -> Explorer:
    """Sliders for stages and microbatches, menus for the schedule, the cluster and the
    forward and backward times; the timeline and activation memory redraw on every change."""
    controls = {
        "stages": slider("stages", stages, 1, 8),
        "microbatches": slider("microbatches", microbatches, 1, 16),
        "schedule": dropdown("schedule", SCHEDULES, schedule),
        "cluster": dropdown("cluster", Cluster.presets(), cluster),
        "fwd_s": dropdown("forward", [("5 ms", 0.005), ("10 ms", 0.01), ("20 ms", 0.02)], 0.01),
        "bwd_s": dropdown("backward", [("10 ms", 0.01), ("20 ms", 0.02), ("40 ms", 0.04)],
                          0.02),
    }

    def fit_stages(change: dict) -> None:  # no more stages than the cluster has devices
        controls["stages"].max = Cluster.preset(change["new"]).world_size

    controls["cluster"].observe(fit_stages, names="value")
    fit_stages({"new": cluster})
    return Explorer(pipeline_view, controls, describe)
