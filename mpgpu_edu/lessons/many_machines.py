"""Lesson 07 (many machines): the programs and figures the notebook calls.

- ``two_node_torchrun``: two ``torchrun`` launchers on this machine, one per "node", as on
  two real hosts (``--nnodes 2 --node-rank 0|1 --master-addr ... --master-port ...``); every
  rank reports its node, local rank, global rank and the result of one all-reduce on gloo.
- ``allreduce_runs`` / ``plot_allreduce_timelines``: one all-reduce across 2 x 8 GPUs, a
  flat ring against the hierarchical all-reduce, on the simulator, each against its closed
  form (additions free, and with ``cost``'s additions: a kernel launch and memory traffic);
  ``nccl_rails_seconds``: NCCL's ring on every rail, for comparison.
- ``placement_rows`` / ``plot_placements``: where each kind of parallelism goes on a 2-node
  mesh, by simulated step time (``mpgpu_edu.estimate.step``); the notebook's four are stored
  in ``_placements_stored``.

Run as ``python -m mpgpu_edu.lessons.many_machines`` it is the worker that each rank of the
torchrun demo runs (it reads torchrun's environment variables); with ``--placements`` it
prints ``_placements_stored.ROWS`` freshly simulated.
"""

from __future__ import annotations

import functools
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

REPORT_PREFIX = "MPGPU_RANK_REPORT "


# ---- a real two-"node" torchrun on localhost --------------------------------------------------

@dataclass(frozen=True)
class RankReport:
    """What one torchrun worker saw: its node (``GROUP_RANK``), its local and global rank,
    the world size, its ``CUDA_VISIBLE_DEVICES`` and the all-reduce of ``rank + 1``."""

    node: int
    local_rank: int
    rank: int
    world_size: int
    local_world_size: int
    visible: str
    all_reduce: float
    pid: int


@dataclass(frozen=True)
class TorchrunResult:
    """The reports of every rank (sorted by global rank) and each launcher's command."""

    reports: list[RankReport]
    commands: list[list[str]]
    seconds: float


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def torchrun_command(node_rank: int, nnodes: int, nproc_per_node: int, port: int) -> list[str]:
    """The launcher of one node: ``torchrun --nnodes N --node-rank K --nproc-per-node P
    --master-addr 127.0.0.1 --master-port PORT -m mpgpu_edu.lessons.many_machines``."""
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nnodes),
            "--node-rank", str(node_rank), "--nproc-per-node", str(nproc_per_node),
            "--master-addr", "127.0.0.1", "--master-port", str(port),
            "-m", "mpgpu_edu.lessons.many_machines"]


def two_node_torchrun(nproc_per_node: int = 2, nnodes: int = 2, timeout: float = 90.0,
                      visible: tuple[str, ...] | None = None) -> TorchrunResult:
    """Start ``nnodes`` torchrun launchers on this machine, each as if on its own host, and
    collect every rank's report. ``visible[k]`` is node k's ``CUDA_VISIBLE_DEVICES`` (by
    default ``0,...,P-1`` on every node: each host numbers its own GPUs from 0). Every
    launcher runs in its own process group, killed on the way out (timeout or not); a
    launcher that fails or a missing report raises ``RuntimeError`` with its output."""
    if nproc_per_node < 1 or nnodes < 1:
        raise ValueError(f"nproc_per_node and nnodes must be >= 1, got {nproc_per_node} and "
                         f"{nnodes}")
    visible = visible or tuple(",".join(map(str, range(nproc_per_node)))
                               for _ in range(nnodes))
    port, start = free_port(), time.monotonic()
    commands = [torchrun_command(k, nnodes, nproc_per_node, port) for k in range(nnodes)]
    procs: list[subprocess.Popen] = []
    try:
        for k, command in enumerate(commands):
            env = dict(os.environ, CUDA_VISIBLE_DEVICES=visible[k], PYTHONUNBUFFERED="1",
                       OMP_NUM_THREADS="1")
            procs.append(subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, text=True,
                                          start_new_session=True))
        outputs = []
        for proc in procs:
            left = max(1.0, timeout - (time.monotonic() - start))
            try:
                outputs.append(proc.communicate(timeout=left)[0])
            except subprocess.TimeoutExpired:
                raise RuntimeError(f"torchrun did not finish within {timeout:g} s (a "
                                   "launcher waiting for the other node?); both were "
                                   "stopped") from None
    finally:
        for proc in procs:
            _kill_group(proc)
    for k, (proc, out) in enumerate(zip(procs, outputs)):
        if proc.returncode != 0:
            raise RuntimeError(f"node {k}'s torchrun exited with status {proc.returncode}:\n"
                               + out[-3000:])
    reports = read_reports(outputs)
    if len(reports) != nnodes * nproc_per_node:
        raise RuntimeError(f"expected {nnodes * nproc_per_node} rank reports, got "
                           f"{len(reports)}:\n" + "\n".join(o[-1500:] for o in outputs))
    return TorchrunResult(sorted(reports, key=lambda r: r.rank), commands,
                          time.monotonic() - start)


def read_reports(outputs: list[str]) -> list[RankReport]:
    """Every rank's report in the launchers' outputs, wherever it sits: the workers of one
    launcher share its stdout, so a report need not start a line of its own."""
    pattern = re.escape(REPORT_PREFIX) + r"(\{[^{}]*\})"
    return [RankReport(**json.loads(found)) for out in outputs
            for found in re.findall(pattern, out)]


def _kill_group(proc: subprocess.Popen) -> None:
    """Kill the launcher and every worker it started (its own process group)."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def torchrun_table(result: TorchrunResult) -> str:
    """One line per rank: node, local rank, global rank, CUDA_VISIBLE_DEVICES, the sum."""
    lines = ["node  local rank  global rank  CUDA_VISIBLE_DEVICES  all-reduce of (rank + 1)"]
    lines += [f"{r.node:>4}  {r.local_rank:>10}  {r.rank:>11}  {r.visible:>20}  "
              f"{r.all_reduce:g}" for r in result.reports]
    return "\n".join(lines)


def _worker() -> None:
    """One rank under torchrun: join the job on gloo, all-reduce ``rank + 1``, report."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    try:
        rank = dist.get_rank()
        t = torch.tensor([float(rank + 1)])
        dist.all_reduce(t)
        report = RankReport(node=int(os.environ["GROUP_RANK"]),
                            local_rank=int(os.environ["LOCAL_RANK"]), rank=rank,
                            world_size=dist.get_world_size(),
                            local_world_size=int(os.environ["LOCAL_WORLD_SIZE"]),
                            visible=os.environ.get("CUDA_VISIBLE_DEVICES", ""),
                            all_reduce=float(t.item()), pid=os.getpid())
        # One write of the whole line: print() writes the text and its newline separately,
        # and unbuffered, the ranks of one launcher could run their reports together.
        sys.stdout.write(REPORT_PREFIX + json.dumps(report.__dict__) + "\n")
        sys.stdout.flush()
    finally:
        dist.destroy_process_group()


def _expected_global_rank(node: int, local_rank: int, nproc_per_node: int) -> int:
    return node * nproc_per_node + local_rank


def check_reports(result: TorchrunResult, nproc_per_node: int) -> list[str]:
    """What is wrong with the reports (empty when every rank is where it should be): global
    rank = node x nproc_per_node + local rank, every rank once, the same sum everywhere."""
    reports, problems = result.reports, []
    n = len(reports)
    if sorted(r.rank for r in reports) != list(range(n)):
        problems.append(f"global ranks {[r.rank for r in reports]} are not 0..{n - 1}")
    for r in reports:
        if r.rank != _expected_global_rank(r.node, r.local_rank, nproc_per_node):
            problems.append(f"rank {r.rank} is local rank {r.local_rank} of node {r.node}")
    want = n * (n + 1) / 2
    problems += [f"rank {r.rank} got {r.all_reduce:g}, not {want:g}" for r in reports
                 if r.all_reduce != want]
    return problems


# ---- one all-reduce across 2 x 8 GPUs: flat ring against hierarchical ---------------------

def _flat_meta(comm: Any, numel: int) -> None:
    from mpgpu_edu.collectives import all_reduce

    all_reduce(comm, _meta(numel), algo="ring")


def _hierarchical_meta(comm: Any, numel: int, per_node: int, hierarchical: Callable) -> None:
    hierarchical(comm, _meta(numel), per_node)


def _meta(numel: int) -> Any:
    import torch

    return torch.empty(numel, dtype=torch.float32, device="meta")


def link_forms(preset: str) -> tuple[int, int, tuple[float, float, float, float]]:
    """(nodes, GPUs per node, (alpha, beta) inside a node and between two GPUs of one rail)
    of a multi-node preset: what the closed forms take."""
    from mpgpu_edu.cluster import Cluster
    from mpgpu_edu.viz.nodes import node_shape

    cluster = Cluster.preset(preset)
    nodes, per_node = node_shape(cluster)
    inside, across = cluster.route(0, 1), cluster.route(0, per_node)
    return nodes, per_node, (inside.alpha_s, inside.beta_Bps, across.alpha_s, across.beta_Bps)


def allreduce_runs(preset: str = "2x8xH100-ib", nbytes: int = 2**28,
                   hierarchical: Callable | None = None) -> dict[str, dict]:
    """One all-reduce of ``nbytes`` (fp32, meta) on every GPU of ``preset``, as a flat ring
    and as ``hierarchical(comm, tensor, per_node)`` (the package's by default): for each,
    the trace, the simulated time and its closed form."""
    from mpgpu_edu.cluster import Cluster
    from mpgpu_edu.collectives import cost
    from mpgpu_edu.collectives.hierarchical import all_reduce_hierarchical
    from mpgpu_edu.comm import launch

    nodes, per_node, forms = link_forms(preset)
    cluster, numel = Cluster.preset(preset), nbytes // 4
    adds = (cluster.launch_overhead_s, cluster.memory_Bps)  # each addition: a kernel of its own
    flat = launch(_flat_meta, cluster, numel).trace
    hier = launch(_hierarchical_meta, cluster, numel, per_node,
                  hierarchical or all_reduce_hierarchical).trace
    return {
        "flat ring": {"trace": flat, "seconds": flat.makespan,
                      "closed_form": cost.flat_ring_two_level_time(nodes, per_node, nbytes,
                                                                   *forms),
                      "additions": cost.flat_ring_additions_time(nodes, per_node, nbytes,
                                                                 *adds)},
        "hierarchical": {"trace": hier, "seconds": hier.makespan,
                         "closed_form": cost.hierarchical_allreduce_time(nodes, per_node,
                                                                         nbytes, *forms),
                         "additions": cost.hierarchical_additions_time(nodes, per_node,
                                                                       nbytes, *adds)},
    }


def addition_counts(preset: str = "2x8xH100-ib") -> dict[str, int]:
    """Additions (kernel launches) on the critical path of each all-reduce: the flat ring's
    N - 1, the hierarchical one's (G - 1) + (M - 1)."""
    nodes, per_node, _ = link_forms(preset)
    return {"flat ring": nodes * per_node - 1, "hierarchical": per_node - 1 + nodes - 1}


def latency_terms(preset: str = "2x8xH100-ib", nbytes: int = 2**10) -> dict[str, dict]:
    """Where a small all-reduce's time goes, from the closed forms: for each algorithm the
    messages that cross the network and those inside a node on its critical path, the
    additions, and the total (forms plus additions)."""
    from mpgpu_edu.cluster import Cluster
    from mpgpu_edu.collectives import cost

    nodes, per_node, forms = link_forms(preset)
    cluster = Cluster.preset(preset)
    adds = (cluster.launch_overhead_s, cluster.memory_Bps)
    n = nodes * per_node
    flat = (cost.flat_ring_two_level_time(nodes, per_node, nbytes, *forms)
            + cost.flat_ring_additions_time(nodes, per_node, nbytes, *adds))
    hier = (cost.hierarchical_allreduce_time(nodes, per_node, nbytes, *forms)
            + cost.hierarchical_additions_time(nodes, per_node, nbytes, *adds))
    counts = addition_counts(preset)
    return {"flat ring": {"network": 2 * (n - 1), "nvlink": 0, "additions": counts["flat ring"],
                          "seconds": flat},
            "hierarchical": {"network": 2 * (nodes - 1), "nvlink": 2 * (per_node - 1),
                             "additions": counts["hierarchical"], "seconds": hier}}


def nccl_rails_seconds(preset: str = "2x8xH100-ib", nbytes: int = 2**28) -> float:
    """Simulated seconds of NCCL's ring all-reduce as NCCL runs it across the nodes
    (``collectives.nccl_ring``): one ring per rail (``rail_rings``), pipelined in 2 MiB
    chunks, each addition inside the copy (docs/fidelity.md's two-node rail rows)."""
    import torch

    from mpgpu_edu.cluster import Cluster
    from mpgpu_edu.collectives.multichannel import rail_rings
    from mpgpu_edu.collectives.nccl_ring import all_reduce_nccl
    from mpgpu_edu.comm import launch

    nodes, per_node, _ = link_forms(preset)
    rings = rail_rings(nodes, per_node)

    def program(comm: Any) -> None:
        all_reduce_nccl(comm, torch.empty(nbytes // 4, device="meta"), rings=rings)

    return launch(program, Cluster.preset(preset)).trace.makespan


def plot_allreduce_timelines(runs: dict[str, dict], per_node: int = 8,
                             label: str = "") -> Any:
    """The sends of each run, one row per rank on one time axis: blue inside a node (NVLink),
    vermillion across the network (a NIC), a white edge between consecutive messages. ``runs``
    as ``allreduce_runs`` returns them; ``label`` (a ``Chosen``'s: whose all-reduce it is)
    titles the hierarchical run."""
    from matplotlib.patches import Patch

    from mpgpu_edu.viz.palette import (FONT_SIZE, OKABE_ITO, format_seconds, new_figure, style,
                                       time_axis)

    inside, across = OKABE_ITO["blue"], OKABE_ITO["vermillion"]
    longest = max(r["seconds"] for r in runs.values())
    n = max(r["trace"].n_devices for r in runs.values())
    fig = new_figure(11, 0.26 * n * len(runs) + 1.6)
    axes = fig.subplots(len(runs), 1, sharex=True, squeeze=False)[:, 0]
    for ax, (name, run) in zip(axes, runs.items()):
        for e in run["trace"].events:
            if e.kind != "send" or e.peer is None:
                continue
            crosses = e.device // per_node != e.peer // per_node
            # a white edge separates back-to-back messages, so every step can be counted
            ax.barh(e.device, max(e.end - e.start, longest / 1500), left=e.start, height=0.7,
                    color=across if crosses else inside, edgecolor="white", linewidth=0.7)
        for k in range(1, n // per_node):
            ax.axhline(k * per_node - 0.5, color="black", linewidth=1.0)
        ax.axvline(run["seconds"], color="black", linestyle="--", linewidth=1)
        ax.set_yticks(range(n), [f"rank {d} (node {d // per_node} GPU {d % per_node})"
                                 for d in range(n)], fontsize=FONT_SIZE - 3)
        ax.set_ylim(n - 0.5, -0.5)
        time_axis(ax, longest)
        ax.set_xlim(0, longest * 1.02)
        steps = _label_phases(ax, run["trace"], per_node, n, longest)
        style(ax, grid="x")
        shown = label if label and name != "flat ring" else name
        ax.set_title(f"{shown}: {format_seconds(run['seconds'])} simulated, closed form "
                     f"{format_seconds(run['closed_form'])} (additions free){steps}", loc="left",
                     fontsize=FONT_SIZE)
    for ax in axes[:-1]:
        ax.set_xlabel("")
    axes[0].legend(handles=[Patch(color=inside, label="send inside a node (NVLink)"),
                            Patch(color=across, label="send across nodes (a NIC)")],
                   loc="lower right", bbox_to_anchor=(1.0, 1.12), ncol=2, frameon=False,
                   fontsize=FONT_SIZE - 1)
    return fig


def _label_phases(ax: Any, trace: Any, per_node: int, n: int, longest: float) -> str:
    """What happens left to right. The hierarchical all-reduce (network only in the middle):
    its three phases, in a box right of the run. A flat ring (network from start to end):
    returned as one line for the title, its steps and the ranks whose sends cross."""
    across = [e for e in trace.events if e.kind == "send" and e.peer is not None
              and e.device // per_node != e.peer // per_node]
    if not across:
        return ""
    start, end = min(e.start for e in across), max(e.end for e in across)
    if start <= 0 or end >= trace.makespan:
        crossing = sorted({e.device for e in across})
        steps = max(sum(1 for e in across if e.device == d) for d in crossing)
        return (f"\n{steps} steps, one message per rank each; only ranks "
                f"{' and '.join(map(str, crossing))} send across the network (vermillion), "
                "and every step waits for them")
    ax.text(trace.makespan + longest * 0.03, (n - 1) / 2,
            "left to right:\n1. reduce-scatter inside each node (blue)\n"
            "2. all-reduce of one chunk per rail, across the network (vermillion)\n"
            "3. all-gather inside each node (blue)", ha="left", va="center", fontsize=9,
            bbox={"facecolor": "white", "edgecolor": "#999999", "pad": 4})
    return ""


def allreduce_rows(preset: str = "2x8xH100-ib", sizes: tuple[int, ...] = (2**16, 2**22, 2**28),
                   hierarchical: Callable | None = None) -> list[dict]:
    """Flat ring and hierarchical all-reduce at each size: simulated seconds, closed forms,
    and the speedup each predicts."""
    rows = []
    for nbytes in sizes:
        runs = allreduce_runs(preset, nbytes, hierarchical)
        flat, hier = runs["flat ring"], runs["hierarchical"]
        rows.append({"bytes": nbytes, "flat_s": flat["seconds"], "hier_s": hier["seconds"],
                     "flat_form_s": flat["closed_form"], "hier_form_s": hier["closed_form"],
                     "flat_adds_s": flat["additions"], "hier_adds_s": hier["additions"],
                     "speedup": flat["seconds"] / hier["seconds"],
                     "speedup_form": flat["closed_form"] / hier["closed_form"]})
    return rows


def allreduce_table(rows: list[dict]) -> str:
    """Simulated times; the closed forms with additions free; the same plus the additions
    (``cost.*_additions_time``: a launch and the memory traffic each), which the simulator
    charges."""
    from mpgpu_edu.viz.palette import format_bytes, format_seconds

    def pair(a: float, b: float) -> str:
        return f"{format_seconds(a)} / {format_seconds(b)}"

    lines = [f"{'size':>10}  {'flat / hierarchical':>21}  {'speedup':>7}  "
             f"{'forms, additions free':>21}  {'speedup':>7}  {'forms + additions':>21}"]
    for r in rows:
        lines.append(f"{format_bytes(r['bytes']):>10}  {pair(r['flat_s'], r['hier_s']):>21}  "
                     f"{r['speedup']:>6.2f}x  {pair(r['flat_form_s'], r['hier_form_s']):>21}  "
                     f"{r['speedup_form']:>6.2f}x  {pair(*_with_additions(r)):>21}")
    return "\n".join(lines)


def nccl_rows(preset: str = "2x8xH100-ib", sizes: tuple[int, ...] = (2**16, 2**28),
              hierarchical: Callable | None = None) -> list[dict]:
    """At each size: one flat ring, NCCL's rings on every rail (``nccl_rails_seconds``) and
    the hierarchical all-reduce, simulated seconds."""
    rows = []
    for nbytes in sizes:
        runs = allreduce_runs(preset, nbytes, hierarchical)
        rows.append({"bytes": nbytes, "flat_s": runs["flat ring"]["seconds"],
                     "nccl_s": nccl_rails_seconds(preset, nbytes),
                     "hier_s": runs["hierarchical"]["seconds"]})
    return rows


def nccl_table(rows: list[dict]) -> str:
    from mpgpu_edu.viz.palette import format_bytes, format_seconds

    lines = [f"{'size':>10}  {'one flat ring':>13}  {'NCCL, every rail':>16}  "
             f"{'hierarchical':>12}  {'NCCL / hierarchical':>19}"]
    lines += [f"{format_bytes(r['bytes']):>10}  {format_seconds(r['flat_s']):>13}  "
              f"{format_seconds(r['nccl_s']):>16}  {format_seconds(r['hier_s']):>12}  "
              f"{r['nccl_s'] / r['hier_s']:>19.2f}" for r in rows]
    return "\n".join(lines)


def _with_additions(row: dict) -> tuple[float, float]:
    return row["flat_form_s"] + row["flat_adds_s"], row["hier_form_s"] + row["hier_adds_s"]


def hierarchy_view(log2_bytes: int = 28, preset: str = "2x8xH100-ib",
                   hierarchical: Callable | None = None, label: str | None = None
                   ) -> tuple[Any, dict]:
    """The explorer's view: ``plot_allreduce_timelines`` of one all-reduce of 2**log2_bytes
    bytes on ``preset``, and the numbers it shows."""
    if not 10 <= log2_bytes <= 32:
        raise ValueError(f"log2_bytes must be from 10 (1 KiB) to 32 (4 GiB), got {log2_bytes}")
    runs = allreduce_runs(preset, 2**log2_bytes, hierarchical)
    _, per_node, _ = link_forms(preset)
    fig = plot_allreduce_timelines(runs, per_node, label or "")
    flat, hier = runs["flat ring"], runs["hierarchical"]
    return fig, {"bytes": 2**log2_bytes, "preset": preset, "flat_s": flat["seconds"],
                 "hier_s": hier["seconds"], "speedup": flat["seconds"] / hier["seconds"],
                 "speedup_form": flat["closed_form"] / hier["closed_form"]}


def _describe(info: dict) -> str:
    from mpgpu_edu.viz.palette import format_bytes, format_seconds

    return (f"<b>{format_bytes(info['bytes'])}</b> on {info['preset']}: flat ring "
            f"{format_seconds(info['flat_s'])}, hierarchical {format_seconds(info['hier_s'])}: "
            f"<b>{info['speedup']:.2f}x</b> faster (closed forms: {info['speedup_form']:.2f}x)")


def hierarchy_explorer(hierarchical: Callable | None = None, log2_bytes: int = 24,
                       preset: str = "2x8xH100-ib") -> Any:
    """A size slider (2**k bytes) and a preset menu over ``hierarchy_view``: the flat ring
    and ``hierarchical`` (a ``Chosen`` from ``mp.yours`` names itself in the titles)."""
    from mpgpu_edu.explore.live import Explorer, dropdown, slider

    controls = {"log2_bytes": slider("size: 2^k bytes, k =", log2_bytes, 10, 32),
                "preset": dropdown("cluster", ["2x8xH100-ib", "2x8xA100-ib"], preset)}
    fixed = {"hierarchical": hierarchical, "label": getattr(hierarchical, "label", None)}
    return Explorer(hierarchy_view, controls, _describe, fixed=fixed)


# ---- where each kind of parallelism goes on a 2-node mesh ---------------------------------------

@dataclass(frozen=True)
class Placement:
    """One way to lay a model over 2 x 8 GPUs: a name, ``simulate step``'s setup fields,
    and the reason its step time is what it is."""

    name: str
    strategy: str
    micro_batch: int
    accumulate: int = 1
    tp: int = 0
    visible: str | None = None
    why: str = ""


SPREAD = ",".join(map(str, [0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15]))

# Every placement trains on 16 sequences per step, so step times compare directly.
PLACEMENTS = (
    Placement("TP 8 in each node,\nDP 2 across nodes", "tensor", 8, tp=8,
              why="TP's all-reduces stay on NVLink; only one gradient all-reduce per step "
                  "crosses the network"),
    Placement("TP 8 over both nodes,\nDP 2", "tensor", 8, tp=8, visible=SPREAD,
              why="the same split, but every TP all-reduce (4 per layer and micro-batch) "
                  "now crosses the network"),
    Placement("PP 16 over\nboth nodes", "pipeline", 1, accumulate=16,
              why="one stage boundary crosses the network, once per micro-batch: cheap; "
                  "the bubble (15 of 31 ticks) costs"),
    Placement("ZeRO-3 DP 16\nover both nodes", "zero3", 1,
              why="each layer's weights all-gathered twice, its gradients reduce-scattered: "
                  "flat rings through the network"),
)
# TP over all 16 GPUs is slower still (every all-reduce crosses, thinner matrices) and
# takes the longest to simulate: not in the default list.
TP_16 = Placement("TP 16 over\nboth nodes", "tensor", 16,
                  why="every TP all-reduce crosses the network, and each GPU's matrices are "
                      "thinner")


def placement_key(model: str, preset: str, seq: int, p: Placement) -> str:
    """What a placement's simulated numbers depend on, as one string (the cache's key)."""
    return (f"{model}|{preset}|{seq}|{p.strategy}|{p.micro_batch}|{p.accumulate}|{p.tp}|"
            f"{p.visible}")


@functools.lru_cache(maxsize=64)
def simulate_placement(model: str, preset: str, seq: int, p: Placement) -> dict:
    """Simulate one training step of ``model`` placed as ``p`` (``simulate step``): step
    time, tokens/s, MFU, memory per GPU, whether it fits, and the bytes the busiest GPU
    sends across the network per step. Cached for the life of the process."""
    from mpgpu_edu.cluster import Cluster
    from mpgpu_edu.estimate import StepSetup, simulate_step
    from mpgpu_edu.viz.nodes import node_shape

    _, per_node = node_shape(Cluster.preset(preset))
    setup = StepSetup(model, preset, p.strategy, micro_batch=p.micro_batch, seq=seq,
                      accumulate=p.accumulate, tp=p.tp, visible=p.visible)
    report, trace = simulate_step(setup)
    physical = Cluster.preset(preset, visible=p.visible).logical_to_physical
    across = [0] * report["devices"]
    for e in trace.events:
        if e.kind == "send" and e.peer is not None and (
                physical[e.device] // per_node != physical[e.peer] // per_node):
            across[e.device] += e.nbytes
    return {"step_s": report["step_s"], "tokens_per_s": report["tokens_per_s"],
            "mfu": report["mfu"], "memory": report["memory_total"], "fits": report["fits"],
            "capacity": report["capacity"], "across_bytes": max(across),
            "tokens_per_step": report["tokens_per_step"]}


def placement_rows(model: str = "llama-7b", preset: str = "2x8xH100-ib", seq: int = 2048,
                   placements: tuple[Placement, ...] = PLACEMENTS,
                   stored: bool = True) -> list[dict]:
    """``simulate_placement``'s numbers for every placement, with its name and reason. With
    ``stored`` a placement whose numbers ``_placements_stored.ROWS`` holds (the notebook's
    four, simulated once; a test holds them to a fresh simulation) is not simulated again."""
    from mpgpu_edu.lessons._placements_stored import ROWS

    rows = []
    for p in placements:
        key = placement_key(model, preset, seq, p)
        numbers = ROWS[key] if stored and key in ROWS else simulate_placement(model, preset,
                                                                              seq, p)
        rows.append({"name": p.name, "why": p.why, **numbers})
    return rows


def stored_rows_source(model: str = "llama-7b", preset: str = "2x8xH100-ib",
                       seq: int = 2048) -> str:
    """The text of ``_placements_stored.ROWS`` for ``PLACEMENTS``, freshly simulated."""
    lines = ["ROWS = {"]
    for p in PLACEMENTS:
        numbers = simulate_placement(model, preset, seq, p)
        lines.append(f"    {placement_key(model, preset, seq, p)!r}: {{")
        lines += [f"        {k!r}: {v!r}," for k, v in numbers.items()]
        lines.append("    },")
    return "\n".join(lines + ["}"])


def placements_table(rows: list[dict]) -> str:
    from mpgpu_edu.viz.palette import format_bytes, format_seconds

    lines = [f"{'placement':<38} {'step':>9} {'MFU':>5} {'memory/GPU':>11} "
             f"{'sent across the network (busiest GPU)':>38}"]
    for r in rows:
        lines.append(f"{r['name'].replace(chr(10), ' '):<38} {format_seconds(r['step_s']):>9} "
                     f"{r['mfu']:>5.0%} {format_bytes(r['memory']):>11} "
                     f"{format_bytes(r['across_bytes']):>38}")
    return "\n".join(lines)


def plot_placements(rows: list[dict], title: str = "") -> Any:
    """One bar per placement: simulated step time, the reason written beside it, the
    fastest in green; a placement that does not fit in memory is hatched."""
    from mpgpu_edu.viz.palette import (FONT_SIZE, OKABE_ITO, WARNING_COLOR, format_bytes,
                                       format_seconds, new_figure, style)

    fig = new_figure(12, 0.95 * len(rows) + 1.4)
    ax = fig.add_subplot()
    best = min(range(len(rows)), key=lambda i: rows[i]["step_s"])
    longest = max(r["step_s"] for r in rows)
    for i, r in enumerate(rows):
        color = OKABE_ITO["bluish_green"] if i == best else OKABE_ITO["sky_blue"]
        ax.barh(i, r["step_s"], color=color, hatch=None if r["fits"] else "///",
                edgecolor=WARNING_COLOR if not r["fits"] else "none")
        ax.text(longest * 1.1, i - 0.17,
                f"{format_seconds(r['step_s'])}, MFU {r['mfu']:.0%}; "
                f"{format_bytes(r['across_bytes'])} across the network (busiest GPU)"
                + ("" if r["fits"] else ", does NOT fit in memory"),
                va="center", fontsize=FONT_SIZE - 1, fontweight="bold" if i == best else None)
        ax.text(longest * 1.1, i + 0.2, r["why"], va="center",
                fontsize=FONT_SIZE - 2, color="#333333")
    ax.set_yticks(range(len(rows)), [r["name"] for r in rows], fontsize=FONT_SIZE - 1)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_xlim(0, longest * 1.08)  # the reasons run on to the right, past the axis
    ax.set_xlabel("simulated step time (s), same 16 sequences per step")
    style(ax, grid="x")
    ax.set_title(title or "Where each parallelism goes on 2 nodes x 8 GPUs: tensor "
                 "parallelism inside a node, pipeline or data parallelism across",
                 loc="left", fontsize=FONT_SIZE + 1)
    return fig


if __name__ == "__main__":
    if sys.argv[1:] == ["--placements"]:  # regenerate _placements_stored.py's ROWS
        print(stored_rows_source())
    else:
        _worker()
