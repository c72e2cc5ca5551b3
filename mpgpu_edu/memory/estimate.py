"""How many bytes each device holds, by category, for a model of N parameters.

The one idea: training memory is *bytes per parameter* times parameters, and a strategy
decides which of those bytes every device keeps whole and which it keeps 1/N of.

Bytes per parameter (the convention; Rajbhandari et al., "ZeRO: Memory Optimizations Toward
Training Trillion Parameter Models", SC 2020, section 3.1, where mixed-precision Adam is
2 + 2 + K with K = 12)::

                       parameters   gradients   optimizer                         total
    fp32,  sgd             4            4          0                                 8
    fp32,  sgd-momentum    4            4          4  (momentum)                    12
    fp32,  adam            4            4          8  (two moments)                 16
    mixed, sgd             2            2          4  (fp32 master copy)             8
    mixed, sgd-momentum    2            2          8  (master + momentum)           12
    mixed, adam            2            2         12  (master + two moments, K=12)  16

"mixed" means bf16 (or fp16) weights and gradients with an fp32 master copy of the weights,
which counts as optimizer state: ZeRO-1 shards it with the moments.

Strategies (N = ``devices``)::

    single     one device holds everything
    dp         every replica holds everything (memory does not add up across devices)
    zero1      optimizer state / N
    zero2      optimizer state and gradients / N
    zero3      optimizer state, gradients and parameters / N
    pipeline   parameters, gradients, optimizer state / N (an idealisation: stages are rarely
    tensor     equal, embeddings sit on one stage, and some tensors are replicated)

A sharded category holds ceil(P / N) parameters' worth on the largest shard, as
``torch.chunk`` splits. Activations are added to every device as given: under data parallel
each replica keeps its own micro-batch's activations. Communication buffers are not modelled.
Sizes are bytes, printed in binary units (GiB = 2**30 bytes) as ``mpgpu_edu.cluster.hardware``
gives device memory: a "24 GB" RTX 4090 holds 24 GiB.

The seed's pitfall: 8 cards of 24 GiB are not one 192 GiB card. LLaMA-7B (6.74e9 parameters)
with mixed Adam needs 16 B x 6.74e9 = 100.4 GiB, less than 8 x 24 GiB, yet data parallel asks
each card for all 100.4 GiB; ZeRO-3 over 8 cards asks each for 12.55 GiB, before activations.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mpgpu_edu.cluster.ledger import format_bytes
from mpgpu_edu.cluster.trace import CATEGORIES

OPTIMIZERS = ("sgd", "sgd-momentum", "adam")
PRECISIONS = ("fp32", "mixed")
STRATEGIES = ("single", "dp", "zero1", "zero2", "zero3", "pipeline", "tensor")
# Other names for a strategy, told in the error: FSDP (full sharding) is ZeRO-3's state split.
ALSO_KNOWN_AS = {"fsdp": "zero3", "ddp": "dp"}

STATE_CATEGORIES = ("parameters", "gradients", "optimizer")

# Which of the three state categories each strategy splits over its devices.
SHARDED: dict[str, tuple[str, ...]] = {
    "single": (),
    "dp": (),
    "zero1": ("optimizer",),
    "zero2": ("gradients", "optimizer"),
    "zero3": STATE_CATEGORIES,
    "pipeline": STATE_CATEGORIES,
    "tensor": STATE_CATEGORIES,
}

_OPTIMIZER_STATE_BYTES = {"sgd": 0, "sgd-momentum": 4, "adam": 8}   # fp32 state per parameter
_OPTIMIZER_WHAT = {"sgd": "no state", "sgd-momentum": "momentum", "adam": "two moments"}


def unknown_strategy(strategy: str) -> str:
    """The one line that names an unknown strategy and what to pass instead."""
    same = ALSO_KNOWN_AS.get(str(strategy).lower())
    also = f" ({strategy!r} is {same!r} here)" if same else ""
    return f"unknown strategy {strategy!r}{also}: choose one of {', '.join(STRATEGIES)}"


def bytes_per_param(optimizer: str, precision: str) -> dict[str, int]:
    """Bytes per parameter of ``parameters``, ``gradients`` and ``optimizer`` (see the table)."""
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {optimizer!r}: choose one of {', '.join(OPTIMIZERS)}")
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}: choose one of {', '.join(PRECISIONS)}")
    state = _OPTIMIZER_STATE_BYTES[optimizer]
    if precision == "fp32":
        return {"parameters": 4, "gradients": 4, "optimizer": state}
    return {"parameters": 2, "gradients": 2, "optimizer": 4 + state}   # + fp32 master copy


def convention(optimizer: str, precision: str, strategy: str, devices: int) -> str:
    """One sentence that says what the numbers assume."""
    b = bytes_per_param(optimizer, precision)
    if precision == "fp32":
        opt = f"{b['optimizer']} B fp32 optimizer state ({_OPTIMIZER_WHAT[optimizer]})"
    else:
        opt = (f"{b['optimizer']} B fp32 optimizer state (master copy + "
               f"{_OPTIMIZER_WHAT[optimizer]}; K={b['optimizer']} in the notation of "
               "Rajbhandari et al. 2020)")
    weights = "fp32" if precision == "fp32" else "16-bit"
    sharded = SHARDED[strategy]
    split = (f"{strategy} splits {', '.join(sharded)} over {devices} devices" if sharded
             else f"{strategy}: every device holds everything")
    return (f"{precision} {optimizer}: {b['parameters']} B {weights} parameters + "
            f"{b['gradients']} B {weights} gradients + {opt} = {sum(b.values())} B/parameter; "
            f"{split}; activations as given, per device; GiB = 2^30 bytes")


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes one device holds, by category (``mpgpu_edu.cluster.trace.CATEGORIES``), for one
    setup."""

    n_params: int
    optimizer: str
    precision: str
    strategy: str
    devices: int
    bytes_per_param: dict[str, int]
    per_device: dict[str, int]
    convention: str
    sharded: tuple[str, ...] = field(default=())

    @property
    def per_device_total(self) -> int:
        """Bytes on the fullest device."""
        return sum(self.per_device.values())

    @property
    def total_all_devices(self) -> int:
        """``devices`` x the fullest device: what the whole cluster must provide."""
        return self.devices * self.per_device_total

    def fits(self, gpu_memory_bytes: int) -> bool:
        """Whether every device's share fits in ``gpu_memory_bytes``."""
        return self.per_device_total <= gpu_memory_bytes

    def to_dict(self) -> dict:
        """Plain JSON-ready data."""
        return {"n_params": self.n_params, "optimizer": self.optimizer,
                "precision": self.precision, "strategy": self.strategy,
                "devices": self.devices, "bytes_per_param": dict(self.bytes_per_param),
                "sharded": list(self.sharded), "per_device": dict(self.per_device),
                "per_device_total": self.per_device_total,
                "total_all_devices": self.total_all_devices, "convention": self.convention}


def _as_count(n_params: int | float) -> int:
    if isinstance(n_params, float) and n_params.is_integer():
        n_params = int(n_params)
    if not isinstance(n_params, int) or isinstance(n_params, bool):
        raise ValueError(f"n_params must be a whole number, got {n_params!r}")
    if n_params < 0:
        raise ValueError(f"n_params must not be negative, got {n_params}")
    return n_params


def estimate_memory(n_params: int, optimizer: str, precision: str, strategy: str,
                    devices: int, activations_bytes: int = 0) -> MemoryEstimate:
    """Per-device bytes by category for training ``n_params`` parameters (see module docstring
    for the convention). ``activations_bytes`` is what one device holds and is added as is.

    >>> e = estimate_memory(1000, "adam", "mixed", "zero2", 4)
    >>> e.per_device["parameters"], e.per_device["gradients"], e.per_device["optimizer"]
    (2000, 500, 3000)

    Raises ValueError on an unknown optimizer, precision or strategy, on ``devices`` < 1,
    ``single`` with more than one device, or a negative size.
    """
    n_params = _as_count(n_params)
    per_param = bytes_per_param(optimizer, precision)
    if strategy not in STRATEGIES:
        raise ValueError(unknown_strategy(strategy))
    if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
        raise ValueError(f"devices must be a positive whole number, got {devices!r}")
    if strategy == "single" and devices != 1:
        raise ValueError(f"strategy 'single' uses one device, got devices={devices}")
    if activations_bytes < 0:
        raise ValueError(f"activations_bytes must not be negative, got {activations_bytes}")
    shard = -(-n_params // devices)                      # ceil(P / N): the largest shard
    per_device = {c: 0 for c in CATEGORIES}
    for category in STATE_CATEGORIES:
        held = shard if category in SHARDED[strategy] else n_params
        per_device[category] = held * per_param[category]
    per_device["activations"] = int(activations_bytes)
    return MemoryEstimate(n_params, optimizer, precision, strategy, devices, per_param,
                          per_device, convention(optimizer, precision, strategy, devices),
                          SHARDED[strategy])


def _sci(n: int) -> str:
    """``6738415616`` -> ``"6.74e9"``; small counts stay as written."""
    if n < 10_000:
        return str(n)
    mantissa, exponent = f"{n:.2e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def explain(estimate: MemoryEstimate) -> str:
    """The formula behind each per-device number, one line per category, for notebooks::

        parameters: 1.50e9 × 2 B = 2.79 GiB
        optimizer: 1.50e9 / 8 × 12 B = 2.10 GiB         (zero1 over 8 devices)
    """
    e = estimate
    lines = []
    for category in STATE_CATEGORIES:
        count = _sci(e.n_params)
        if category in e.sharded and e.devices > 1:
            count = f"{count} / {e.devices}"
        lines.append(f"{category}: {count} × {e.bytes_per_param[category]} B = "
                     f"{format_bytes(e.per_device[category])}")
    lines.append(f"activations: {format_bytes(e.per_device['activations'])} (as given)")
    lines.append(f"per device: {format_bytes(e.per_device_total)}")
    lines.append(f"all devices: {e.devices} × {format_bytes(e.per_device_total)} = "
                 f"{format_bytes(e.total_all_devices)}")
    return "\n".join(lines)
