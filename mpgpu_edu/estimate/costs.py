"""What one transformer layer costs on one GPU: its ops on the roofline, for a training step.

A layer of a decoder-only transformer (``memory.DecoderSpec``) on a micro-batch of ``b``
sequences of ``s`` tokens, width h, MLP width f, its matrices split ``t`` ways (Megatron's
tensor parallelism; t = 1 otherwise), bf16 activations and weights. The forward pass, op by
op (e = 2 bytes; the norm, the activation function and the residual adds are one kernel each):

    op                 FLOPs                         bytes read + written
    norm 1             -                             2e sbh
    QKV projection     2 sb h 3h / t                 e (3h^2/t + sbh + 3sbh/t)
    attention core     4 s^2 b h / t                 flash: e 4sbh/t; eager: + 2 x 2e a s^2 b/t
    output projection  2 sb h h / t                  e (h^2/t + sbh/t + sbh)
    residual add       -                             3e sbh
    norm 2             -                             2e sbh
    MLP up (+ gate)    2 sb h f / t (x2 for SwiGLU)  e (hf/t + sbh + sbf/t) (each)
    activation         -                             e 2sbf/t (SwiGLU: 3sbf/t)
    MLP down           2 sb f h / t                  e (fh/t + sbf/t + sbh)
    residual add       -                             3e sbh

Each op costs ``cluster.op_seconds(flops, bytes, "bf16")``: the longer of its FLOPs at the
GPU's training efficiency and its bytes at the GPU's memory bandwidth, plus one kernel
launch (``mpgpu_edu.cluster``). Backward runs every op again at twice the FLOPs and bytes
(the gradients of the input and of the weights). FLOPs follow Narayanan et al. (SC 2021,
eq. 3): a layer's forward is 24 b s h^2 (1 + s / 6h) for GPT's 4h MLP, attention counted
whole (not halved for a causal mask), as MFU is usually reported. Recomputation (Korthikanti
et al. 2022): ``full`` runs the forward again inside backward; ``selective`` runs the
attention core again.

The output layer (logits over the vocabulary V, split t ways) costs 2 s b h V / t FLOPs
forward, and the loss reads and writes the fp32 logits. The optimizer (Adam, mixed
precision: fp32 master weights and two moments) streams 28 bytes per parameter it updates:
read master, moments and the bf16 gradient (14), write master and moments and the bf16 copy
(14), as one fused kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

from mpgpu_edu.memory.models import DecoderSpec

BF16 = 2
ADAM_BYTES_PER_PARAM = 28


@dataclass(frozen=True)
class Op:
    """One kernel: its name, FLOPs and bytes moved through memory."""

    name: str
    flops: float
    nbytes: float


def layer_ops(spec: DecoderSpec, b: int, s: int, t: int = 1, attention: str = "flash") -> list[Op]:
    """The forward ops of one layer (see the module's table), split into two halves by
    tensor parallelism: everything up to the output projection, then the MLP."""
    h, f, a, e = spec.d_model, spec.d_ff, spec.n_heads, BF16
    sbh, sbf = s * b * h, s * b * f
    core_bytes = e * 4 * sbh / t
    if attention == "eager":
        core_bytes += 2 * 2 * e * a * s * s * b / t  # scores written and read, softmax
    ops = [Op("norm 1", 0.0, 2 * e * sbh),
           Op("QKV projection", 2 * sbh * 3 * h / t, e * (3 * h * h / t + sbh + 3 * sbh / t)),
           Op("attention core", 4 * s * s * b * h / t, core_bytes),
           Op("output projection", 2 * sbh * h / t, e * (h * h / t + sbh / t + sbh)),
           Op("residual add", 0.0, 3 * e * sbh),
           Op("norm 2", 0.0, 2 * e * sbh)]
    ups = 2 if spec.mlp == "swiglu" else 1
    ops += [Op("MLP up", 2 * sbh * f / t, e * (h * f / t + sbh + sbf / t)) for _ in range(ups)]
    ops += [Op("activation", 0.0, e * (ups + 1) * sbf / t),
            Op("MLP down", 2 * sbf * h / t, e * (f * h / t + sbf / t + sbh)),
            Op("residual add", 0.0, 3 * e * sbh)]
    return ops


def output_ops(spec: DecoderSpec, b: int, s: int, t: int = 1) -> list[Op]:
    """The final norm, the logits and the loss (fp32 logits read and written)."""
    h, v, e = spec.d_model, spec.vocab_size, BF16
    return [Op("final norm", 0.0, 2 * e * s * b * h),
            Op("logits", 2 * s * b * h * v / t, e * (h * v / t + s * b * h) + 4 * s * b * v / t),
            Op("loss", 0.0, 2 * 4 * s * b * v / t)]


@dataclass(frozen=True)
class PassCost:
    """Seconds of one layer's forward halves (attention, MLP), its backward halves, and the
    extra seconds recomputation adds to backward; ``flops``: the layer's forward FLOPs."""

    forward: tuple[float, float]
    backward: tuple[float, float]
    recompute: tuple[float, float]
    flops: float


def seconds_of(cluster: object, ops: list[Op], scale: float = 1.0) -> float:
    """``ops`` on ``cluster``'s roofline, each at ``scale`` times its FLOPs and bytes."""
    return sum(cluster.op_seconds(scale * op.flops, scale * op.nbytes, "bf16") for op in ops)


def layer_cost(cluster: object, spec: DecoderSpec, b: int, s: int, t: int = 1,
               attention: str = "flash", recompute: str = "none") -> PassCost:
    """One layer's forward and backward on ``cluster`` (see the module)."""
    ops = layer_ops(spec, b, s, t, attention)
    cut = [op.name for op in ops].index("norm 2")
    halves = (ops[:cut], ops[cut:])
    forward = tuple(seconds_of(cluster, half) for half in halves)
    backward = tuple(seconds_of(cluster, half, 2.0) for half in halves)
    if recompute == "full":
        extra = forward
    elif recompute == "selective":
        extra = (seconds_of(cluster, [op for op in halves[0] if op.name == "attention core"]),
                 0.0)
    else:
        extra = (0.0, 0.0)
    return PassCost(forward, backward, extra, sum(op.flops for op in ops))


def model_flops(spec: DecoderSpec, tokens: int, s: int) -> float:
    """Model FLOPs of one training step on ``tokens`` tokens in sequences of ``s``: three
    times the forward FLOPs of every layer and the logits (recomputation not counted)."""
    b = tokens / s
    per_layer = sum(op.flops for op in layer_ops(spec, 1, s)) * b
    logits = sum(op.flops for op in output_ops(spec, 1, s)) * b
    return 3 * (spec.n_layers * per_layer + logits)
