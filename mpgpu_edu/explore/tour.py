"""The headless tour: every strategy of the course on one simulated cluster, as files.

``run_tour(out, preset)`` runs one training step of each strategy on the first four devices of
a preset (default ``4xRTX4090-pcie``: four consumer GPUs, each on its own PCIe 4 x16 link
to the CPU, with no peer-to-peer, so every GPU-to-GPU copy is staged through host memory,
whose bandwidth concurrent copies share: slow enough that communication costs show) and
writes, into ``out``:

- ``summary.json``: per run, the step time, each device's idle share, the bubble (pipelines),
  and each device's peak memory, in total and by category;
- ``trace_<run>.json``: the run's timeline in Chrome's trace format (open it in Perfetto,
  https://ui.perfetto.dev);
- PNG figures: the device map, a timeline and the peak memory of every run, DDP naive against
  overlapped, GPipe against 1F1B (timelines and memory over time), and DDP's scaling.

The runs are the package's own code: ``ps_step`` (one server, the other ranks workers),
``ddp_step`` and ``ddp_step_overlapped`` (4 MiB buckets), on the ``heavy`` workload of
``mpgpu_edu.replica.data`` built from *meta* tensors (shapes without data: the simulator counts the
FLOPs and bytes of the real 6.3 M-parameter step without spending them); and
``pipeline_train_step`` under GPipe and 1F1B, on a real MLP of 8 Linear layers split into one
stage per device, each forward taking 4 ms and each backward 8 ms so the schedules' shapes
show. Every run uses Adam, its two moments already allocated as in any step after the first.
"""

from __future__ import annotations

import copy
import functools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from mpgpu_edu.cluster import Cluster
from mpgpu_edu.comm import Communicator, launch
from mpgpu_edu.replica.data import Workload, heavy, make_mlp
from mpgpu_edu.dp.ddp import ddp_step, ddp_step_overlapped
from mpgpu_edu.dp.scaling import scaling_study
from mpgpu_edu.memory.measure import track_gradients, track_optimizer_state, track_parameters
from mpgpu_edu.pipeline.executor import pipeline_train_step
from mpgpu_edu.pipeline.partition import Placement, partition_balanced, split_module
from mpgpu_edu.pipeline.schedules import gpipe, one_f_one_b
from mpgpu_edu.pipeline.steps import Schedule
from mpgpu_edu.ps.sync import ps_step
from mpgpu_edu.cluster.trace import Trace

if TYPE_CHECKING:
    from matplotlib.figure import Figure

DEFAULT_CLUSTER = "4xRTX4090-pcie"
DEVICES = 4
BUCKET_BYTES = 4 * 2**20
MICROBATCHES = 8
STAGE_SECONDS = (0.004, 0.008)  # forward, backward of one microbatch on one stage

Progress = Callable[[str], None]
LABELS = {"ps": "parameter server", "ddp_naive": "DDP, naive", "ddp_overlapped":
          "DDP, overlapped", "gpipe": "pipeline, GPipe", "1f1b": "pipeline, 1F1B"}


@dataclass
class Run:
    """One simulated training step: its name (file names), a title, and its trace."""

    name: str
    title: str
    trace: Trace
    schedule: Schedule | None = None


# ---- the SPMD programs: one training step each, with its memory recorded -------------------

def _adam(comm: Communicator, module: torch.nn.Module) -> torch.optim.Optimizer:
    """Adam with its state already there, as in every step after the first (Adam creates its
    moments in its first ``step``): one step on zero gradients, which moves no parameter and,
    outside any compute region, takes no simulated time. Records parameters, gradients and
    the optimizer state in ``comm.memory``."""
    optimizer = torch.optim.Adam(module.parameters(), lr=1e-3)
    for p in module.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    track_parameters(comm, module)
    track_gradients(comm, module)
    track_optimizer_state(comm, optimizer)
    return optimizer


def _meta_step(comm: Communicator, workload: Workload, step: Callable, server: bool) -> None:
    """One step of ``step`` on a meta copy of ``workload``; with ``server`` the last rank is a
    parameter server, the only one with an optimizer."""
    model = workload.model(device="meta")
    if server and comm.rank != comm.world_size - 1:
        track_parameters(comm, model)
        track_gradients(comm, model)
        optimizer = None
    else:
        optimizer = _adam(comm, model)
    step(comm, model, optimizer, workload.make_batch(device="meta"))


def _pipeline_step(comm: Communicator, model: torch.nn.Sequential, placement: Placement,
                   schedule: Schedule, batch: tuple[torch.Tensor, torch.Tensor]) -> None:
    stages = split_module(copy.deepcopy(model), placement)
    optimizer = _adam(comm, stages[comm.rank])
    pipeline_train_step(comm, stages, schedule, *batch, optimizer, stage_seconds=STAGE_SECONDS)


# ---- the tour ----------------------------------------------------------------------------------

def demo_cluster(preset: str) -> Cluster:
    """The first four devices of ``preset`` (all of them if it has fewer, at least two)."""
    machine = Cluster.preset(preset)
    n = min(DEVICES, machine.n_physical)
    if n < 2:
        raise ValueError(f"the demo needs a preset with at least 2 devices; {preset} has "
                         f"{machine.n_physical}")
    return machine.with_visible(",".join(str(d) for d in range(n)))


def interconnect(cluster: Cluster) -> str:
    """How the cluster's devices are linked, in one phrase: its links at their effective
    bandwidth, and what a copy from device 0 to device 1 shares with other copies."""
    from mpgpu_edu.viz.devicebox import link_name

    links = sorted({(info.spec_name, info.beta_Bps) for info in cluster.topology.links()})
    text = "links: " + ", ".join(f"{link_name(name)} {beta / 1e9:g} GB/s" for name, beta in links)
    shared = [name for name, _ in cluster.route(0, 1).shares]
    if any(name.startswith("switch") for name in shared):
        text += "; every card behind one shared switch uplink"
    elif any(name.endswith(".memory") for name in shared):
        text += ("; each card its own link to the CPU, GPU-to-GPU copies staged through host "
                 "memory, which concurrent copies share")
    return text


def pipeline_setup(n_stages: int) -> tuple[torch.nn.Sequential, Placement, tuple]:
    """The model, its placement (balanced by parameters) and one batch of the pipeline runs."""
    # 8 Linear layers (256 wide) with a ReLU between each two; a batch large enough that
    # activations, not parameters, fill a stage's memory.
    model = make_mlp([256] * 9)
    generator = torch.Generator().manual_seed(0)
    batch = (torch.randn(4096, 256, generator=generator),
             torch.randn(4096, 256, generator=generator))
    return model, partition_balanced(model, n_stages), batch


def strategy_runs(cluster: Cluster, progress: Progress) -> tuple[list[Run], Placement]:
    """Run the five steps on ``cluster``; returns them and the pipeline's placement."""
    n, work = cluster.world_size, heavy()
    overlapped = functools.partial(ddp_step_overlapped, bucket_bytes=BUCKET_BYTES)
    model, placement, batch = pipeline_setup(n)
    schedules = {"gpipe": gpipe(n, MICROBATCHES), "1f1b": one_f_one_b(n, MICROBATCHES)}
    programs = {  # name: (title, SPMD function, its arguments)
        "ps": (f"parameter server: rank {n - 1} serves, ranks 0..{n - 2} compute", _meta_step,
               (work, ps_step, True)),
        "ddp_naive": ("DDP, naive: one all-reduce per parameter, after backward", _meta_step,
                      (work, ddp_step, False)),
        "ddp_overlapped": ("DDP, overlapped: 4 MiB buckets all-reduced during backward",
                           _meta_step, (work, overlapped, False)),
        **{name: (f"{LABELS[name]}: {n} stages x {MICROBATCHES} microbatches", _pipeline_step,
                  (model, placement, schedule, batch)) for name, schedule in schedules.items()},
    }
    runs = []
    for name, (title, program, args) in programs.items():
        started = time.perf_counter()
        runs.append(Run(name, title, launch(program, cluster, *args).trace, schedules.get(name)))
        progress(f"{title} ... {time.perf_counter() - started:.1f} s")
    return runs, placement


def scaling_results(cluster: Cluster) -> dict[str, dict[int, float]]:
    """DDP (overlapped) step time on 1..N devices of ``cluster``, light and heavy workload:
    ``{label: {N: seconds}}`` for ``plot_scaling`` (``mpgpu_edu.dp.scaling``)."""
    step = functools.partial(ddp_step_overlapped, bucket_bytes=BUCKET_BYTES)
    return scaling_study(presets=(cluster.name,), step_fn=step,
                         world_sizes=range(1, cluster.world_size + 1))


# ---- what the runs show ------------------------------------------------------------------------

def summarize(run: Run) -> dict:
    """The numbers of ``summary.json`` for one run, all read from its trace."""
    trace, n = run.trace, run.trace.n_devices
    idle = [trace.idle_fraction(d) for d in range(n)]
    entry = {"title": run.title, "devices": n, "steps": 1, "step_s": trace.makespan,
             "idle_fraction": idle, "bytes_sent": trace.bytes_sent(),
             "peak_memory": [trace.peak_memory(d) for d in range(n)],
             "peak_memory_by_category": [trace.peak_memory_by_category(d) for d in range(n)],
             "trace": f"trace_{run.name}.json"}
    if run.schedule is not None:
        p, m = run.schedule.n_stages, run.schedule.n_microbatches
        entry |= {"schedule": run.schedule.name, "microbatches": m,
                  "bubble_fraction": sum(idle) / n, "bubble_formula": (p - 1) / (m + p - 1)}
    return entry


def write_figures(out: Path, cluster: Cluster, runs: list[Run], placement: Placement,
                  scaling: dict[str, dict[int, float]]) -> list[str]:
    """Every PNG of the tour; returns their file names."""
    from mpgpu_edu.viz.devicemap import plot_device_map
    from mpgpu_edu.viz.memory import plot_memory_compare
    from mpgpu_edu.viz.scaling import plot_scaling
    from mpgpu_edu.viz.timeline import plot_timeline, plot_timelines_side_by_side

    by_name = {run.name: run for run in runs}
    pipelines = {LABELS[name]: by_name[name].trace for name in ("gpipe", "1f1b")}
    figures = {
        "device_map": plot_device_map(cluster, placement, memory=by_name["gpipe"].trace,
                                      title=f"{cluster.name}: the pipeline's stages and "
                                            "their peak memory under GPipe"),
        "timeline_ps": plot_timeline(by_name["ps"].trace, title=by_name["ps"].title),
        "timeline_ddp_naive_vs_overlapped": plot_timelines_side_by_side(
            {by_name["ddp_naive"].title: by_name["ddp_naive"].trace,
             by_name["ddp_overlapped"].title: by_name["ddp_overlapped"].trace}),
        # A stage's messages take microseconds here: the compute rows tell the story.
        "timeline_gpipe_vs_1f1b": plot_timelines_side_by_side(pipelines, streams=("compute",)),
        "memory_peak": memory_figure(cluster, runs),
        "memory_over_time_gpipe_vs_1f1b": plot_memory_compare(pipelines, device=0),
        "scaling": plot_scaling(scaling, title=f"DDP (overlapped) on {cluster.name}: speedup "
                                               "as devices are added"),
    }
    for name, figure in figures.items():
        figure.savefig(out / f"{name}.png")
    return [f"{name}.png" for name in figures]


def memory_figure(cluster: Cluster, runs: list[Run]) -> Figure:
    """Each run's peak memory per device, by category, one panel per run. No capacity line:
    these small models would be slivers under a 24 GiB one."""
    from matplotlib.patches import Patch

    from mpgpu_edu.viz.memory import plot_memory_bars
    from mpgpu_edu.viz.palette import format_bytes, new_figure

    fig = new_figure(4.2 * len(runs), 4.2)
    axes = fig.subplots(1, len(runs), squeeze=False)[0]
    handles: dict[str, Patch] = {}
    for ax, run in zip(axes, runs):
        peaks = [run.trace.peak_memory_by_category(d) for d in range(run.trace.n_devices)]
        plot_memory_bars(peaks, None, title=LABELS[run.name], ax=ax)
        legend = ax.get_legend()
        handles |= {h.get_label(): h for h in legend.legend_handles}
        legend.remove()
    fig.legend(handles=list(handles.values()), loc="outside lower center", ncol=len(handles),
               frameon=False)
    fig.suptitle(f"peak memory per device, by category (each {cluster.gpu.display_name} "
                 f"holds {format_bytes(cluster.gpu.memory_bytes)})", x=0.01, ha="left")
    return fig


def run_tour(out: str | Path, preset: str = DEFAULT_CLUSTER,
             progress: Progress = lambda line: None) -> dict:
    """Run the tour on ``preset`` and write its files into ``out`` (created if missing);
    ``progress`` gets one line per stage. Returns the summary (also ``summary.json``)."""
    started = time.perf_counter()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    cluster = demo_cluster(preset)
    progress(f"cluster {cluster.name}: devices {cluster.visible} of {cluster.n_physical}, "
             f"{cluster.gpu.display_name}; {interconnect(cluster)}")
    runs, placement = strategy_runs(cluster, progress)
    for run in runs:
        run.trace.save_chrome(out / f"trace_{run.name}.json")
    scaling = scaling_results(cluster)
    progress(f"DDP scaling on 1..{cluster.world_size} devices, light and heavy workload")
    figures = write_figures(out, cluster, runs, placement, scaling)
    progress(f"{len(figures)} figures written to {out}")
    summary = {"cluster": cluster.name, "gpu": cluster.gpu.display_name,
               "visible": cluster.visible, "world_size": cluster.world_size,
               "runs": {run.name: summarize(run) for run in runs},
               "scaling_step_s": scaling, "figures": figures,
               "elapsed_s": time.perf_counter() - started}
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def table(summary: dict) -> str:
    """The summary as a short table: one line per run."""
    from mpgpu_edu.viz.palette import format_bytes, format_seconds

    lines = [f"{'run':<16}{'step':>10}  {'idle per device':<24}{'bubble':>7}  peak memory "
             "(fullest device)"]
    for name, run in summary["runs"].items():
        idle = " ".join(f"{x:.0%}" for x in run["idle_fraction"])
        bubble = f"{run['bubble_fraction']:.0%}" if "bubble_fraction" in run else "-"
        lines.append(f"{name:<16}{format_seconds(run['step_s']):>10}  {idle:<24}{bubble:>7}  "
                     f"{format_bytes(max(run['peak_memory']))}")
    return "\n".join(lines)
