"""Where each kind of parallelism goes on a 2-node mesh (lesson 07): a ``Placement`` is one
way to lay a model over 2 x 8 GPUs, ``simulate_placement`` one training step of it, simulated
(``simulate_step``), with the bytes the busiest GPU sends across the network.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from mpgpu_edu.cluster import Cluster
from mpgpu_edu.estimate.step import StepSetup, simulate_step


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
                  "but 15 of 31 ticks are bubble"),
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
