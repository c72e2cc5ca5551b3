"""What one simulated training step needs, worked out once from a ``StepSetup``: the cluster,
each rank's layers, the seconds of every layer's forward, backward and recomputation on the
roofline, message sizes and optimizer seconds (``plan_step``); and the memory per device of
the busiest device (``memory_per_device``)."""

from __future__ import annotations

from dataclasses import dataclass

from mpgpu_edu.cluster import Cluster
from mpgpu_edu.estimate.costs import (ADAM_BYTES_PER_PARAM, layer_cost, output_ops,
                                      seconds_of)
from mpgpu_edu.memory import activation_terms, estimate_memory, get_preset
from mpgpu_edu.memory.models import layer_params, param_breakdown, spec_params

STRATEGIES = ("dp", "zero1", "zero3", "pipeline", "tensor")
BUCKET_BYTES = 25 * 2**20


@dataclass(frozen=True)
class StepSetup:
    """One training step: model and cluster presets, strategy, micro-batch size (sequences
    per device per micro-batch), sequence length, micro-batches per step, attention and
    recomputation (as ``mpgpu-edu memory``)."""

    model: str = "gpt2-small"
    cluster: str = "8xA100-nvlink"
    strategy: str = "dp"
    micro_batch: int = 8
    seq: int = 1024
    accumulate: int = 1
    attention: str = "flash"
    recompute: str = "none"
    tp: int = 0                 # tensor: ranks per Megatron group (0: all of them)
    visible: str | None = None  # CUDA_VISIBLE_DEVICES on the preset (None: all, in order)


@dataclass(frozen=True)
class Plan:
    """Everything the SPMD program needs, worked out once."""

    strategy: str
    n: int
    k: int
    layers: tuple[tuple[int, int], ...]   # per rank (pipeline: its stage's range of layers)
    fwd: tuple[float, float]
    bwd: tuple[float, float]
    rec: tuple[float, float]
    out_fwd: float
    out_bwd: float
    layer_elems: int                      # bf16 elements of one layer's weights
    head_elems: int                       # embedding (+ output layer)
    act_elems: int                        # one micro-batch's activation at a layer boundary
    opt_s: list[float]                    # optimizer seconds per rank
    tp: int = 1                           # tensor: ranks per Megatron group


def check_setup(setup: StepSetup) -> None:
    if setup.strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {setup.strategy!r}: choose one of "
                         f"{', '.join(STRATEGIES)}")
    for name in ("micro_batch", "seq", "accumulate"):
        value = getattr(setup, name)
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 2**20:
            raise ValueError(f"{name} must be a whole number from 1 to 2**20, got {value!r}")
    activation_terms(setup.model, 1, 1, "mixed", setup.attention, setup.recompute)  # names
    if setup.tp and setup.strategy != "tensor":
        raise ValueError(f"tp (ranks per tensor-parallel group) applies to strategy tensor, "
                         f"not {setup.strategy}: leave it 0")


def tp_of(setup: StepSetup, n: int) -> int:
    """Ranks per tensor-parallel group (1 unless the strategy is tensor)."""
    if setup.strategy != "tensor":
        return 1
    t = setup.tp or n
    if isinstance(t, bool) or not isinstance(t, int) or t < 1 or n % t:
        raise ValueError(f"tp must divide the {n} devices, got {setup.tp!r}")
    return t


def plan_step(setup: StepSetup) -> tuple[Plan, Cluster]:
    check_setup(setup)
    cluster = Cluster.preset(setup.cluster, visible=setup.visible)
    spec, n = get_preset(setup.model), cluster.world_size
    t = tp_of(setup, n)
    b, s = setup.micro_batch, setup.seq
    cost = layer_cost(cluster, spec, b, s, t, setup.attention, setup.recompute)
    out = output_ops(spec, b, s, t)
    parts = param_breakdown(spec)
    head = parts["embedding"] + parts["lm_head"] + parts["final_norm"]
    if setup.strategy == "pipeline":
        if spec.n_layers < n:
            raise ValueError(f"{setup.model} has {spec.n_layers} layers, fewer than the {n} "
                             "pipeline stages: pick a smaller cluster or another strategy")
        bounds = [round(i * spec.n_layers / n) for i in range(n + 1)]
        layers = tuple((bounds[i], bounds[i + 1]) for i in range(n))
        owned = [(hi - lo) * layer_params(spec) + (head if i in (0, n - 1) else 0)
                 for i, (lo, hi) in enumerate(layers)]
    else:
        layers = ((0, spec.n_layers),) * n
        total = spec_params(spec)
        split = t if setup.strategy == "tensor" else n
        owned = [total / split if setup.strategy in ("zero1", "zero3", "tensor") else total] * n
    opt = [cluster.op_seconds(0.0, ADAM_BYTES_PER_PARAM * p, "bf16") for p in owned]
    return Plan(setup.strategy, n, setup.accumulate, layers, cost.forward, cost.backward,
                 cost.recompute, seconds_of(cluster, out), seconds_of(cluster, out, 2.0),
                 layer_params(spec), head, b * s * spec.d_model, opt, t), cluster


def memory_per_device(setup: StepSetup, n: int) -> dict[str, int]:
    """Bytes per device by category (``mpgpu_edu.memory``) for the busiest device."""
    spec = get_preset(setup.model)
    t = tp_of(setup, n)
    acts = activation_terms(spec, setup.micro_batch, setup.seq, "mixed", setup.attention,
                            setup.recompute, t)
    one = acts["layers"] + acts["embedding"] + acts["output"]
    if setup.strategy == "pipeline":
        one = min(n, setup.accumulate) * (acts["layers"] // n + acts["embedding"])
    return estimate_memory(spec_params(spec), "adam", "mixed", setup.strategy,
                           t if setup.strategy == "tensor" else n, one).per_device
