"""A simulated cluster: devices of one kind, how they are wired, and which ones a process sees.

``Cluster.preset("8xA100-nvlink", visible="2,3")`` is eight A100s on NVSwitch of which the
process sees physical GPUs 2 and 3, as ``cuda:0`` and ``cuda:1`` (logical ids 0 and 1;
``world_size == 2``). Everything a strategy asks of the cluster takes logical ids; the
cluster translates them to physical ones, as CUDA does.

Cost model. Compute, per op (the roofline): ``max(flops / (peak * efficiency),
bytes / memory_Bps) + launch_overhead_s``, summed over the ops a region runs; adds and copies
have no FLOPs but their bytes. Communication: a ``Route`` (alpha, beta, the resources it
holds), see ``topology``.

``efficiency`` is the fraction of peak FLOP/s that training reaches, ``memory_Bps`` the
effective memory bandwidth, ``launch_overhead_s`` the fixed cost of one kernel: presets take
all three from their GPU's profile, where each is cited (``GPUSpec.compute_source``).
``Cluster.uniform`` uses efficiency 1.0, free memory traffic and no launch overhead, so its
numbers match closed forms.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from mpgpu_edu.cluster import topology as topo
from mpgpu_edu.cluster.ledger import (CATEGORIES, MemoryLedger, SimulatedOutOfMemoryError,
                                      format_bytes)
from mpgpu_edu.cluster.topology import LinkInfo, Route, Topology
from mpgpu_edu.cluster.visible import check_visible, device_ids_to_physical, parse_visible
from mpgpu_edu.cluster.hardware import DTYPES, GPUS, LINKS, GPUSpec

__all__ = ["CATEGORIES", "Cluster", "LinkInfo", "MemoryLedger", "Route", "first_devices",
           "SimulatedOutOfMemoryError", "Topology", "check_visible", "device_ids_to_physical",
           "format_bytes", "parse_visible"]


_DTYPE_ALIASES = {"float32": "fp32", "float": "fp32", "bfloat16": "bf16", "float16": "fp16",
                  "half": "fp16"}


@dataclass(frozen=True)
class _Preset:
    gpu: str
    build: Callable[[], Topology]


def _gloo(n: int) -> Topology:
    link = LINKS["loopback-gloo"]
    return topo.uniform(n, link.alpha_s, link.beta_Bps, spec_name=link.name)


def _workstation(n: int, sockets: int = 1) -> Topology:
    return topo.pcie_host(n, LINKS["pcie4-x16"], LINKS["host-ddr4-8ch"], sockets,
                          LINKS["upi-xeon"] if sockets > 1 else None)


def _rails(intra: str, nic: str) -> Topology:
    return topo.multi_node(2, 8, LINKS[intra], LINKS[nic], nics_per_node=8)


# PCIe boxes: every card on its own x16 uplink to a CPU; "-switch": four cards behind one
# PCIe switch uplink. Multi-node: DGX/HGX nodes with one NIC per GPU (rail-optimised).
_PRESETS: dict[str, _Preset] = {
    "4xRTX4090-pcie": _Preset("RTX4090-24GB", lambda: _workstation(4)),
    "4xRTX4090-pcie-switch": _Preset("RTX4090-24GB",
                                     lambda: topo.pcie_switch(4, LINKS["pcie4-x16"],
                                                              LINKS["host-ddr4-8ch"], 4)),
    "8xRTX4090-pcie": _Preset("RTX4090-24GB", lambda: _workstation(8, sockets=2)),
    "4xA100-nvlink": _Preset("A100-80GB", lambda: topo.nvswitch(4, LINKS["nvlink3"])),
    "8xA100-nvlink": _Preset("A100-80GB", lambda: topo.nvswitch(8, LINKS["nvlink3"])),
    "4xH100-nvswitch": _Preset("H100-SXM-80GB",
                               lambda: topo.nvswitch(4, LINKS["nvlink4-nvswitch"])),
    "8xH100-nvswitch": _Preset("H100-SXM-80GB",
                               lambda: topo.nvswitch(8, LINKS["nvlink4-nvswitch"])),
    "2x8xA100-ib": _Preset("A100-80GB", lambda: _rails("nvlink3", "ib-hdr")),
    "2x8xH100-ib": _Preset("H100-SXM-80GB", lambda: _rails("nvlink4-nvswitch", "ib-ndr")),
    "2xCPU-gloo": _Preset("CPU-16GB", lambda: _gloo(2)),
    "4xCPU-gloo": _Preset("CPU-16GB", lambda: _gloo(4)),
}


class Cluster:
    """Physical devices of one kind (``gpu``) wired by ``topology``, of which the process
    sees ``visible`` (physical ids, in logical order) under
    ``CUDA_VISIBLE_DEVICES=visible_value``."""

    def __init__(self, name: str, gpu: GPUSpec, topology: Topology, visible: str | None = None,
                 efficiency: float | None = None, launch_overhead_s: float | None = None,
                 memory_Bps: float | None = None) -> None:
        efficiency = gpu.efficiency if efficiency is None else efficiency
        if launch_overhead_s is None:
            launch_overhead_s = gpu.launch_overhead_s
        memory_Bps = gpu.effective_memory_Bps if memory_Bps is None else memory_Bps
        if not 0 < efficiency <= 1:
            raise ValueError(f"efficiency is a fraction of peak in (0, 1], got {efficiency}")
        if launch_overhead_s < 0:
            raise ValueError(f"launch_overhead_s must be >= 0, got {launch_overhead_s}")
        self.name = name
        self.gpu = gpu
        self.topology = topology
        self.visible_value = visible
        self.visible = parse_visible(visible, topology.n_devices)
        if memory_Bps < 0:
            raise ValueError(f"memory_Bps must be >= 0 (0: memory traffic is free), got "
                             f"{memory_Bps}")
        self.efficiency = efficiency
        self.launch_overhead_s = launch_overhead_s
        self.memory_Bps = memory_Bps

    @classmethod
    def preset(cls, name: str, visible: str | None = None) -> Cluster:
        """A named cluster (see ``presets()``); ``visible`` acts as CUDA_VISIBLE_DEVICES."""
        if name not in _PRESETS:
            raise ValueError(f"unknown cluster preset {name!r}; choose one of "
                             + ", ".join(_PRESETS))
        preset = _PRESETS[name]
        return cls(name, GPUS[preset.gpu], preset.build(), visible)

    @classmethod
    def uniform(cls, n: int, alpha_s: float, beta_Bps: float, gpu: str | GPUSpec = "H100-SXM-80GB",
                efficiency: float = 1.0) -> Cluster:
        """``n`` devices, each with its own port of latency ``alpha_s`` and bandwidth
        ``beta_Bps``: the textbook model, with no launch overhead and free memory traffic
        (adds and copies cost 0 s), so that closed forms hold exactly."""
        spec = gpu if isinstance(gpu, GPUSpec) else _gpu(gpu)
        return cls(f"uniform-{n}", spec, topo.uniform(n, alpha_s, beta_Bps), None,
                   efficiency=efficiency, launch_overhead_s=0.0, memory_Bps=0.0)

    @staticmethod
    def presets() -> list[str]:
        """The preset names, smallest consumer setup first."""
        return list(_PRESETS)

    def with_visible(self, value: str | None) -> Cluster:
        """The same machine seen through ``CUDA_VISIBLE_DEVICES=value``."""
        return Cluster(self.name, self.gpu, self.topology, value, self.efficiency,
                       self.launch_overhead_s, self.memory_Bps)

    @property
    def world_size(self) -> int:
        """Number of visible devices (logical ids ``0..world_size-1``)."""
        return len(self.visible)

    @property
    def n_physical(self) -> int:
        return self.topology.n_devices

    @property
    def logical_to_physical(self) -> list[int]:
        return list(self.visible)

    def physical(self, logical: int) -> int:
        """The physical id behind logical device ``logical`` (``cuda:logical``)."""
        if not 0 <= logical < self.world_size:
            visible = (f"logical devices 0..{self.world_size - 1}" if self.world_size
                       else "no devices are visible")
            raise ValueError(f"device {logical} does not exist: world_size is "
                             f"{self.world_size} ({visible})")
        return self.visible[logical]

    def route(self, src_logical: int, dst_logical: int) -> Route:
        """The route of a transfer between two logical devices."""
        return self.topology.route(self.physical(src_logical), self.physical(dst_logical))

    def compute_seconds(self, flops: float, dtype: object = "fp32") -> float:
        """``flops / (peak[dtype] * efficiency) + launch_overhead_s``. ``dtype`` is
        ``"fp32"``, ``"bf16"``, ``"fp16"`` or the matching ``torch.dtype``."""
        if flops < 0:
            raise ValueError(f"flops must be >= 0, got {flops}")
        return self.flop_seconds(flops, dtype) + self.launch_overhead_s

    def flop_seconds(self, flops: float, dtype: object = "fp32") -> float:
        """``flops / (peak[dtype] * efficiency)``: the compute side of the roofline."""
        return flops / (self.gpu.peak_flops[_dtype_key(dtype)] * self.efficiency)

    def memory_seconds(self, nbytes: float) -> float:
        """``nbytes / memory_Bps``: the memory side of the roofline (0 when memory is free,
        ``memory_Bps == 0``)."""
        if nbytes < 0:
            raise ValueError(f"nbytes must be >= 0, got {nbytes}")
        return nbytes / self.memory_Bps if self.memory_Bps else 0.0

    def op_seconds(self, flops: float, nbytes: float, dtype: object = "fp32") -> float:
        """One kernel on the roofline: ``max(flop_seconds, memory_seconds) +
        launch_overhead_s``. An add of two n-byte tensors moves 3n bytes (two reads, one
        write) and has no FLOPs in torch's count."""
        return (max(self.flop_seconds(flops, dtype), self.memory_seconds(nbytes))
                + self.launch_overhead_s)

    def capacity_bytes(self, logical: int) -> int:
        """Memory of logical device ``logical``, in bytes."""
        self.physical(logical)
        return self.gpu.memory_bytes

    def new_ledgers(self) -> list[MemoryLedger]:
        """A fresh memory ledger per visible device, indexed by logical id."""
        return [MemoryLedger(logical, self.capacity_bytes(logical),
                             f"{self.gpu.display_name}, physical GPU {phys}")
                for logical, phys in enumerate(self.visible)]

    def visible_warnings(self) -> list[str]:
        """What CUDA would ignore or misread in this cluster's CUDA_VISIBLE_DEVICES."""
        return check_visible(self.visible_value, self.n_physical)

    def describe(self) -> str:
        """A few lines: devices, links, what this process sees, the compute model."""
        seen = ", ".join(f"cuda:{i} -> GPU {p}" for i, p in enumerate(self.visible)) or "none"
        value = "unset" if self.visible_value is None else repr(self.visible_value)
        links = sorted({(info.spec_name, info.beta_Bps) for info in self.topology.links()})
        peak = self.gpu.peak_flops
        lines = [
            f"{self.name}: {self.n_physical} x {self.gpu.display_name} "
            f"({format_bytes(self.gpu.memory_bytes)} each), {self.topology.kind} topology",
            "links: " + "; ".join(f"{spec} {beta / 1e9:g} GB/s per direction"
                                  for spec, beta in links),
            "groups: " + "; ".join(f"{g}: {list(ids)}"
                                   for g, ids in self.topology.groups().items()),
            f"visible (CUDA_VISIBLE_DEVICES {value}): {seen}; world_size {self.world_size}",
            "compute: peak " + ", ".join(f"{d} {peak[d] / 1e12:g} TFLOP/s" for d in DTYPES)
            + f"; efficiency {self.efficiency:g}; memory "
            + (f"{self.memory_Bps / 1e9:g} GB/s" if self.memory_Bps else "free")
            + f"; launch overhead {self.launch_overhead_s * 1e6:g} us per kernel",
        ]
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (f"Cluster({self.name!r}, gpu={self.gpu.name!r}, "
                f"visible={self.visible}, world_size={self.world_size})")


def first_devices(cluster: Cluster | str, world_size: int | None) -> Cluster:
    """``cluster`` (or the preset so named) seeing its first ``world_size`` devices only
    (``CUDA_VISIBLE_DEVICES=0,1,...``); all of them when ``world_size`` is None."""
    cluster = Cluster.preset(cluster) if isinstance(cluster, str) else cluster
    if world_size is None:
        return cluster
    return cluster.with_visible(",".join(str(i) for i in range(world_size)))


def _gpu(name: str) -> GPUSpec:
    if name not in GPUS:
        raise ValueError(f"unknown gpu {name!r}; choose one of " + ", ".join(GPUS))
    return GPUS[name]


def _dtype_key(dtype: object) -> str:
    key = str(dtype).removeprefix("torch.")
    key = _DTYPE_ALIASES.get(key, key)
    if key not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; use one of " + ", ".join(DTYPES)
                         + " (or torch.float32, torch.bfloat16, torch.float16)")
    return key
