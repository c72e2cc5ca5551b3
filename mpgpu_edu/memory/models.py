"""Model sizes without allocating the model: parameter counts from the architecture.

A 7B-parameter model in fp32 is 25 GiB of weights alone, too much to build on a laptop just to
ask "how big is it?". So a preset is a few numbers (layers, width, heads, MLP width, vocabulary)
and its parameter count is a sum of matrix shapes:

    embedding   V*d (+ P*d for learned positions, GPT-2)
    each layer  attention 4*d*d (+ 4d biases) + MLP 2*d*f or 3*d*f (SwiGLU) (+ biases) + norms
    final norm  d or 2d
    output      V*d, or nothing when tied to the embedding (GPT-2)

For GPT-2 small that is 124,439,808; for LLaMA-7B 6,738,415,616. ``meta_model`` builds the
same shapes as a real ``nn.Module`` on the meta device (shapes, no storage), and
``count_params`` of it agrees with the formula: that is how the formula is tested.

``activation_bytes`` estimates what one forward pass keeps for the backward pass, with the
per-layer formula of Korthikanti et al., "Reducing Activation Recomputation in Large
Transformer Models" (2022), section 4: eager or flash attention, no, selective or full
recomputation, tensor parallelism; ``activation_terms`` adds the embedding and the logits.

Sources: GPT-2, Radford et al. (2019) and the released checkpoints; LLaMA, Touvron et al.,
"LLaMA: Open and Efficient Foundation Language Models" (2023), table 2; gpt-22b, the 22B GPT
of Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models"
(2022), table 3 (48 layers, width 6144, 64 heads, vocabulary 51,200, sequences of 2048).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class DecoderSpec:
    """The shape of a decoder-only transformer: enough to count its parameters."""

    name: str
    n_layers: int
    d_model: int
    n_heads: int
    d_ff: int                     # MLP hidden width
    vocab_size: int
    n_positions: int = 0          # learned position embeddings (GPT-2); 0 for rotary (LLaMA)
    mlp: str = "gelu"             # "gelu": up and down matrices; "swiglu": gate, up and down
    bias: bool = True             # biases on every linear layer (GPT-2) or none (LLaMA)
    norm: str = "layernorm"       # "layernorm": weight and bias; "rmsnorm": weight only
    tied_embeddings: bool = True  # output layer shares the token embedding's matrix


def _gpt2(name: str, n_layers: int, d_model: int, n_heads: int) -> DecoderSpec:
    return DecoderSpec(name, n_layers, d_model, n_heads, d_ff=4 * d_model, vocab_size=50257,
                       n_positions=1024)


def _megatron_gpt(name: str, n_layers: int, d_model: int, n_heads: int) -> DecoderSpec:
    """GPT as Megatron-LM trains it: GPT-2's layer, a 51,200-token vocabulary, 2048 learned
    positions (the models of Korthikanti et al. 2022, table 3)."""
    return DecoderSpec(name, n_layers, d_model, n_heads, d_ff=4 * d_model, vocab_size=51200,
                       n_positions=2048)


def _llama(name: str, n_layers: int, d_model: int, n_heads: int, d_ff: int) -> DecoderSpec:
    return DecoderSpec(name, n_layers, d_model, n_heads, d_ff, vocab_size=32000, mlp="swiglu",
                       bias=False, norm="rmsnorm", tied_embeddings=False)


PRESETS: dict[str, DecoderSpec] = {
    spec.name: spec for spec in (
        _gpt2("gpt2-small", 12, 768, 12),
        _gpt2("gpt2-medium", 24, 1024, 16),
        _gpt2("gpt2-large", 36, 1280, 20),
        _gpt2("gpt2-xl", 48, 1600, 25),
        _megatron_gpt("gpt-22b", 48, 6144, 64),
        _llama("llama-7b", 32, 4096, 32, 11008),
        _llama("llama-13b", 40, 5120, 40, 13824),
    )
}


def get_preset(name: str | DecoderSpec) -> DecoderSpec:
    """The preset called ``name`` (a ``DecoderSpec`` passes through). Raises ValueError with
    the known names otherwise."""
    if isinstance(name, DecoderSpec):
        return name
    if name not in PRESETS:
        raise ValueError(f"unknown model {name!r}: choose one of {', '.join(PRESETS)}")
    return PRESETS[name]


def _norm_params(spec: DecoderSpec) -> int:
    return 2 * spec.d_model if spec.norm == "layernorm" else spec.d_model


def layer_params(spec: DecoderSpec) -> int:
    """Parameters of one transformer layer: attention, MLP and its two norms."""
    d, f = spec.d_model, spec.d_ff
    attention = 4 * d * d + (4 * d if spec.bias else 0)          # q, k, v and output projection
    if spec.mlp == "swiglu":
        mlp = 3 * d * f + ((2 * f + d) if spec.bias else 0)        # gate, up: d->f; down: f->d
    else:
        mlp = 2 * d * f + ((f + d) if spec.bias else 0)            # up: d->f; down: f->d
    return attention + mlp + 2 * _norm_params(spec)


def param_breakdown(spec: str | DecoderSpec) -> dict[str, int]:
    """Parameters by part: ``embedding``, ``layers``, ``final_norm``, ``lm_head`` (0 if tied)."""
    spec = get_preset(spec)
    d = spec.d_model
    return {
        "embedding": spec.vocab_size * d + spec.n_positions * d,
        "layers": spec.n_layers * layer_params(spec),
        "final_norm": _norm_params(spec),
        "lm_head": 0 if spec.tied_embeddings else spec.vocab_size * d,
    }


def spec_params(spec: str | DecoderSpec) -> int:
    """Total parameters of a preset (by name) or a ``DecoderSpec``, from the formula."""
    return sum(param_breakdown(spec).values())


def count_params(module: nn.Module) -> int:
    """Parameters of a real module. A parameter shared by two layers (tied embeddings) counts
    once, as ``module.parameters()`` yields it once. Works on meta-device modules."""
    return sum(p.numel() for p in module.parameters())


def _norm(spec: DecoderSpec) -> nn.Module:
    return nn.LayerNorm(spec.d_model) if spec.norm == "layernorm" else nn.RMSNorm(spec.d_model)


def _layer(spec: DecoderSpec) -> nn.Module:
    d, f, bias = spec.d_model, spec.d_ff, spec.bias
    mlp = {"up": nn.Linear(d, f, bias=bias), "down": nn.Linear(f, d, bias=bias)}
    if spec.mlp == "swiglu":
        mlp["gate"] = nn.Linear(d, f, bias=bias)
    return nn.ModuleDict({"norm1": _norm(spec), "qkv": nn.Linear(d, 3 * d, bias=bias),
                          "proj": nn.Linear(d, d, bias=bias), "norm2": _norm(spec),
                          "mlp": nn.ModuleDict(mlp)})


def meta_model(spec: str | DecoderSpec) -> nn.Module:
    """The preset's parameters as an ``nn.Module`` on the meta device: every shape, no storage,
    so LLaMA-13B costs nothing to build. A skeleton for counting: it has no ``forward``."""
    spec = get_preset(spec)
    with torch.device("meta"):
        parts: dict[str, nn.Module] = {"tok_emb": nn.Embedding(spec.vocab_size, spec.d_model)}
        if spec.n_positions:
            parts["pos_emb"] = nn.Embedding(spec.n_positions, spec.d_model)
        parts["layers"] = nn.ModuleList(_layer(spec) for _ in range(spec.n_layers))
        parts["norm"] = _norm(spec)
        parts["lm_head"] = nn.Linear(spec.d_model, spec.vocab_size, bias=False)
        model = nn.ModuleDict(parts)
    if spec.tied_embeddings:
        model["lm_head"].weight = model["tok_emb"].weight
    return model


ATTENTIONS = ("eager", "flash")
RECOMPUTES = ("none", "selective", "full")


def _activation_args(spec: str | DecoderSpec, batch: int, seq: int, precision: str,
                     attention: str, recompute: str, tensor_parallel: int) -> DecoderSpec:
    """The preset, once every argument of the activation formulas is checked."""
    spec = get_preset(spec)
    if batch <= 0 or seq <= 0:
        raise ValueError(f"batch and seq must be positive, got batch={batch}, seq={seq}")
    if precision not in ("fp32", "mixed"):
        raise ValueError(f"unknown precision {precision!r}: choose fp32 or mixed")
    if attention not in ATTENTIONS:
        raise ValueError(f"unknown attention {attention!r}: choose one of {', '.join(ATTENTIONS)}")
    if recompute not in RECOMPUTES:
        raise ValueError(f"unknown recompute {recompute!r}: choose one of {', '.join(RECOMPUTES)}")
    t = tensor_parallel
    if isinstance(t, bool) or not isinstance(t, int) or t < 1:
        raise ValueError(f"tensor_parallel must be a positive whole number, got {t!r}")
    return spec


def layer_activation_bytes(spec: str | DecoderSpec, batch: int, seq: int,
                           precision: str = "mixed", attention: str = "eager",
                           recompute: str = "none", tensor_parallel: int = 1) -> int:
    """Bytes one transformer layer keeps for backward on one device.

    Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models" (2022),
    section 4, counted tensor by tensor with s = ``seq``, b = ``batch``, h = d_model, a = heads,
    t = ``tensor_parallel`` (no sequence parallelism) and e = 2 bytes per element (mixed) or 4
    (fp32); dropout masks are 1 byte::

        replicated on every rank   two norm inputs, attention input, MLP input    4e sbh
                                   two dropout masks                              2  sbh
        split over t ranks         Q and K, V, projection input                   4e sbh / t
                                   MLP up output, activation output               8e sbh / t
        the attention scores       softmax output, dropout mask, dropout output  (2e+1) as^2b / t

    With e = 2 and t = 1 that is the paper's eq. 1, sbh (34 + 5as/h); with t ranks its eq. 2,
    sbh (10 + 24/t + 5as/(ht)). The score term is the one that grows with s^2:

    - ``attention="flash"`` never writes the s x s scores to memory (it recomputes them in
      backward from a per-row statistic, 4 bytes x a x s x b, left out here), and
      ``recompute="selective"`` (the paper's name for recomputing the attention core) drops
      them too: both leave sbh (10 + 24/t), 34 sbh at t = 1. Flash attention is what current
      training uses; the default, eager, matches what the lessons print.
    - ``recompute="full"`` keeps only each layer's input, e sbh (the paper's 2 sbh), and runs
      the layer's forward again in backward.

    The paper's layer is GPT's (4h MLP, dropout); for SwiGLU models without dropout it is an
    estimate, and the convention everyone quotes.
    """
    spec = _activation_args(spec, batch, seq, precision, attention, recompute, tensor_parallel)
    s, b, h, a, t = seq, batch, spec.d_model, spec.n_heads, tensor_parallel
    e = 2 if precision == "mixed" else 4
    if recompute == "full":
        return e * s * b * h
    replicated = (4 * e + 2) * s * b * h
    split = 12 * e * s * b * h
    if attention == "eager" and recompute == "none":
        split += (2 * e + 1) * a * s * s * b
    return replicated + -(-split // t)                  # ceil: the fullest rank


def activation_terms(spec: str | DecoderSpec, batch: int, seq: int, precision: str = "mixed",
                     attention: str = "eager", recompute: str = "none",
                     tensor_parallel: int = 1) -> dict[str, int]:
    """Activation bytes on one device by part: ``per_layer`` and ``layers`` (all of them, see
    ``layer_activation_bytes``), ``embedding`` and ``output``.

    Outside the layers (Korthikanti et al. 2022, section 4.3): the embedding's dropout mask,
    sbh bytes; before the vocabulary, the final norm's input and the output projection's input,
    e sbh each, and the logits, which the cross-entropy loss keeps in fp32: 4 s b V bytes
    (split over t ranks, as Megatron splits the vocabulary). For LLaMA-7B at 4k tokens the fp32
    logits alone are 0.49 GiB per sequence.
    """
    spec = _activation_args(spec, batch, seq, precision, attention, recompute, tensor_parallel)
    s, b, h, t = seq, batch, spec.d_model, tensor_parallel
    e = 2 if precision == "mixed" else 4
    per_layer = layer_activation_bytes(spec, batch, seq, precision, attention, recompute, t)
    return {"per_layer": per_layer, "layers": spec.n_layers * per_layer,
            "embedding": s * b * h,
            "output": 2 * e * s * b * h + -(-4 * s * b * spec.vocab_size // t)}


def activation_bytes(spec: str | DecoderSpec, batch: int, seq: int, precision: str = "mixed",
                     attention: str = "eager", recompute: str = "none",
                     tensor_parallel: int = 1) -> int:
    """Bytes of activations one forward pass keeps for backward, over all layers, on one device.

    Per layer (see ``layer_activation_bytes``), with the defaults (eager attention, no
    recomputation, one device; Korthikanti et al. 2022, eq. 1)::

        mixed (16-bit activations):  s*b*h * (34 + 5*a*s/h)
        fp32:                        s*b*h * (66 + 9*a*s/h)

    ``attention="flash"`` or ``recompute="selective"``: 34 sbh (66 in fp32);
    ``recompute="full"``: 2 sbh (4 in fp32). Embeddings and the output logits are left out:
    ``activation_terms`` gives them.
    """
    per_layer = layer_activation_bytes(spec, batch, seq, precision, attention, recompute,
                                       tensor_parallel)
    return get_preset(spec).n_layers * per_layer
