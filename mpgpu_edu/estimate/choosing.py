"""The numbers behind lesson 06's comparison table: data, pipeline, tensor and hybrid
parallelism for one model on one cluster (``strategy_rows``), with memory per device from
``mpgpu_edu.memory`` and communication per device from the closed forms of
``mpgpu_edu.collectives.cost``. Every strategy processes the same global batch per step in
microbatches of the same size, with mixed-precision Adam (bf16 activations and gradients).

- data parallel: N replicas, B/N sequences each; a ring all-reduce of the bf16 gradients.
- pipeline (1F1B): N stages, M microbatches; each middle stage sends M activations forward
  and M gradients back; stage 0 holds min(N, M) microbatches of its layers' activations.
- tensor (Megatron): every layer split N ways; per microbatch and layer two all-reduces
  forward (g) and two backward (f) of the layer's activations. Activations per layer
  s*b*h*(10 + 24/t + 5*a*s/(h*t)) bytes (Korthikanti et al. 2022, table 2, no sequence
  parallelism).
- hybrid (DP x PP): ``hybrid_dp`` replicas of an N / hybrid_dp stage pipeline.

Times are closed forms on the route between devices 0 and 1 (its alpha and effective
bandwidth), as if every device sent at that speed at once; nothing overlaps with compute and
the additions inside the all-reduces are not counted. On a switched fabric (NVSwitch) the
simulator, which charges those additions, comes close; the closed form is a lower bound where
concurrent transfers share something: on the consumer PCIe presets GPU-to-GPU copies are
staged through host memory, a cap split among concurrent transfers, and on two sockets the
ring crosses the slower socket link; on ``4xRTX4090-pcie-switch`` all four cards share one
switch uplink.

The table itself (HTML, text, figure) is ``mpgpu_edu.viz.choosing``'s.
"""

from __future__ import annotations

from dataclasses import dataclass

from mpgpu_edu.cluster import Cluster
from mpgpu_edu.collectives.cost import message_time, ring_allreduce_bytes_sent, ring_allreduce_time
from mpgpu_edu.memory import activation_bytes, estimate_memory, get_preset, spec_params

BF16 = 2

# What the numbers cannot say: when each strategy is the right tool (the seed's four criteria).
QUALITIES: dict[str, dict[str, str]] = {
    "data parallel": {
        "splits": "the batch: every device a full replica",
        "model size": "must fit on one device (ZeRO shards its optimizer state)",
        "data size": "more data, more replicas: scales almost linearly",
        "hardware": "any; one all-reduce per step, which can overlap the backward",
        "development cost": "low: wrap the model in DDP"},
    "pipeline parallel": {
        "splits": "the layers into stages, one per device",
        "model size": "up to N devices' memory",
        "data size": "needs many microbatches per step to hide the bubble",
        "hardware": "modest: one activation per microbatch at each cut; across machines",
        "development cost": "medium: balance the stages, pick a schedule"},
    "tensor parallel": {
        "splits": "every layer's matrices",
        "model size": "up to N devices' memory; activations inside each block split N ways, "
                      "those at its input and output (LayerNorm, dropout) replicated unless "
                      "sequence parallel",
        "data size": "any batch size",
        "hardware": "NVLink / NVSwitch: all-reduces inside every layer; one machine",
        "development cost": "high: rewrite every layer (Megatron's f and g)"},
    "hybrid DP x PP": {
        "splits": "both: replicas of a pipeline",
        "model size": "the largest: stages per replica, replicas for throughput",
        "data size": "large: replicas and microbatches",
        "hardware": "fast links inside a group, slower between groups",
        "development cost": "highest: two kinds of groups to set up and tune"},
}
COLUMNS = ("splits", "model size", "data size", "hardware", "development cost")


@dataclass(frozen=True)
class Setting:
    """One training job: a model preset, a cluster preset, the global batch per step
    (sequences of ``seq`` tokens), microbatches per step and the hybrid's replicas."""

    model: str = "llama-7b"
    cluster: str = "8xA100-nvlink"
    batch: int = 32
    seq: int = 1024
    microbatches: int = 8
    hybrid_dp: int = 2


@dataclass(frozen=True)
class Row:
    """One strategy in numbers: bytes per device by category, bytes each device sends per
    step, their time on the wire, and the pipeline bubble (idle / total)."""

    name: str
    per_device: dict[str, int]
    capacity: int
    comm_bytes: float
    comm_seconds: float
    bubble: float

    @property
    def memory(self) -> int:
        return sum(self.per_device.values())

    @property
    def fits(self) -> bool:
        return self.memory <= self.capacity


@dataclass(frozen=True)
class _Job:
    """What every row needs, worked out once from a Setting."""

    setting: Setting
    n: int             # devices
    params: int
    d_model: int
    alpha: float
    beta: float
    capacity: int

    @classmethod
    def of(cls, setting: Setting) -> _Job:
        cluster = Cluster.preset(setting.cluster)
        route = cluster.route(0, 1)
        return cls(setting, cluster.world_size, spec_params(setting.model),
                   get_preset(setting.model).d_model, route.alpha_s, route.beta_Bps,
                   cluster.capacity_bytes(0))

    def memory(self, strategy: str, devices: int, activations: int) -> dict[str, int]:
        return estimate_memory(self.params, "adam", "mixed", strategy, devices,
                               activations).per_device

    def boundary(self, sequences: int) -> int:
        """Bytes of one activation at a cut (or of a layer's output) for ``sequences``."""
        return sequences * self.setting.seq * self.d_model * BF16

    def activations(self, sequences: int) -> int:
        return activation_bytes(self.setting.model, sequences, self.setting.seq)


def _data_parallel(job: _Job) -> Row:
    grads = BF16 * job.params
    return Row("data parallel", job.memory("dp", job.n, job.activations(
        job.setting.batch // job.n)), job.capacity, ring_allreduce_bytes_sent(job.n, grads),
        ring_allreduce_time(job.n, grads, job.alpha, job.beta), 0.0)


def _pipeline(job: _Job, stages: int, sequences: int) -> tuple[int, float, float, float]:
    """1F1B with ``stages`` stages, microbatches of ``sequences``: stage 0's activations,
    bytes a middle stage sends per step, their time, and the bubble."""
    m = job.setting.microbatches
    held = min(stages, m) * job.activations(sequences) // stages
    message = job.boundary(sequences)
    return (held, 2 * m * message, 2 * m * message_time(message, job.alpha, job.beta),
            (stages - 1) / (m + stages - 1))


def _pipeline_parallel(job: _Job) -> Row:
    held, sent, seconds, bubble = _pipeline(job, job.n, job.setting.batch
                                            // job.setting.microbatches)
    return Row("pipeline parallel", job.memory("pipeline", job.n, held), job.capacity, sent,
               seconds, bubble)


def _tensor_parallel(job: _Job) -> Row:
    """Megatron without sequence parallelism: per layer, s*b*h*(10 + 24/t + 5*a*s/(h*t))
    bytes of activations; per microbatch and layer, two all-reduces forward, two backward."""
    spec, s, t = get_preset(job.setting.model), job.setting.seq, job.n
    b = job.setting.batch // job.setting.microbatches
    per_layer = s * b * spec.d_model * (10 + 24 / t) + 5 * spec.n_heads * s * s * b / t
    calls = 4 * spec.n_layers * job.setting.microbatches
    message = job.boundary(b)
    return Row("tensor parallel", job.memory("tensor", t, int(spec.n_layers * per_layer)),
               job.capacity, calls * ring_allreduce_bytes_sent(t, message),
               calls * ring_allreduce_time(t, message, job.alpha, job.beta), 0.0)


def _hybrid(job: _Job) -> Row:
    dp = job.setting.hybrid_dp
    pp = job.n // dp
    held, sent, seconds, bubble = _pipeline(job, pp, job.setting.batch // dp
                                            // job.setting.microbatches)
    stage_grads = BF16 * job.params / pp
    return Row("hybrid DP x PP", job.memory("pipeline", pp, held), job.capacity,
               sent + ring_allreduce_bytes_sent(dp, stage_grads),
               seconds + ring_allreduce_time(dp, stage_grads, job.alpha, job.beta), bubble)


def strategy_rows(setting: Setting) -> list[Row]:
    """Memory per device and communication per device per step of the four strategies
    (see the module's docstring for what each assumes)."""
    job = _Job.of(setting)
    return [_data_parallel(job), _pipeline_parallel(job), _tensor_parallel(job), _hybrid(job)]


def step_compute_seconds(setting: Setting) -> float:
    """One step's training compute per device: 6 x parameters x tokens / N FLOPs in bf16 at
    the cluster's efficiency (the same for every strategy; bubbles not counted)."""
    cluster = Cluster.preset(setting.cluster)
    flops = 6 * spec_params(setting.model) * setting.batch * setting.seq
    return cluster.compute_seconds(flops / cluster.world_size, "bf16")


def fewest_devices(model: str, strategy: str, gpu: str, most: int = 64) -> int | None:
    """The fewest devices of kind ``gpu`` (a key of ``hardware.GPUS``) on which ``strategy``
    holds ``model``'s parameters, gradients and mixed-precision Adam state, before
    activations; None if even ``most`` are not enough."""
    from mpgpu_edu.cluster.hardware import GPUS

    for n in range(1, most + 1):
        if estimate_memory(spec_params(model), "adam", "mixed", strategy,
                           n).fits(GPUS[gpu].memory_bytes):
            return n
    return None
