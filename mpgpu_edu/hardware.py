"""Hardware profiles: what one device can compute and what one link can carry.

Every number here comes from a public spec sheet or standard, cited in its ``source``. A
device is described by its dense peak FLOP/s per dtype and its memory; a link by the
alpha-beta model: sending ``n`` bytes takes ``alpha_s + n / beta_Bps`` seconds, where
``alpha_s`` is the fixed latency of one message and ``beta_Bps`` the bandwidth in *one
direction* (links are full duplex).

Peak numbers are what the hardware can do at best; real training reaches a fraction of
them, which ``Cluster.efficiency`` accounts for. Each link's ``source`` says whether its
``beta_Bps`` is a peak (line rate) or an effective (measured-style) number.

Memory is in binary units: a "24 GB" card holds 24 GiB of DRAM (chips come in powers of
two), of which CUDA reports a little less as usable.
"""

from __future__ import annotations

from dataclasses import dataclass, field

GIB = 2**30
DTYPES = ("fp32", "bf16", "fp16")


@dataclass(frozen=True)
class GPUSpec:
    """A device profile: dense peak FLOP/s per dtype (``"fp32"``, ``"bf16"``, ``"fp16"``),
    memory in bytes, and where the numbers come from. ``label`` is the marketing name used
    in messages (falls back to ``name``)."""

    name: str
    peak_flops: dict[str, float] = field(hash=False)
    memory_bytes: int
    source: str
    label: str = ""

    @property
    def display_name(self) -> str:
        return self.label or self.name


@dataclass(frozen=True)
class LinkSpec:
    """A link profile: latency ``alpha_s`` (s) and one-direction bandwidth ``beta_Bps``
    (bytes/s). Time for one message of n bytes: ``alpha_s + n / beta_Bps``."""

    name: str
    alpha_s: float
    beta_Bps: float
    source: str

    def seconds(self, nbytes: int) -> float:
        """Alpha-beta time of one message of ``nbytes`` on this link alone."""
        return self.alpha_s + nbytes / self.beta_Bps


# "fp32" is plain FP32 on the CUDA cores: PyTorch leaves TF32 matmuls off by default.
# "bf16"/"fp16" are dense Tensor Core rates with FP32 accumulation, as used in mixed-precision
# training; spec sheets often print the 2:4-sparsity rate, which is twice these.
GPUS: dict[str, GPUSpec] = {
    "RTX4090-24GB": GPUSpec(
        name="RTX4090-24GB",
        label="NVIDIA GeForce RTX 4090",
        peak_flops={"fp32": 82.6e12, "bf16": 165.2e12, "fp16": 165.2e12},
        memory_bytes=24 * GIB,
        source=("NVIDIA Ada Lovelace GPU Architecture whitepaper (v2.1), Appendix A, RTX 4090: "
                "82.6 TFLOPS FP32; 165.2 TFLOPS FP16/BF16 Tensor with FP32 accumulate "
                "(dense; 330.4 with sparsity); 24 GB GDDR6X"),
    ),
    "A100-80GB": GPUSpec(
        name="A100-80GB",
        label="NVIDIA A100-SXM4-80GB",
        peak_flops={"fp32": 19.5e12, "bf16": 312e12, "fp16": 312e12},
        memory_bytes=80 * GIB,
        source=("NVIDIA A100 Tensor Core GPU datasheet, A100 80GB SXM: 19.5 TFLOPS FP32; "
                "312 TFLOPS BF16/FP16 Tensor Core (dense; 624 with sparsity); 80 GB HBM2e"),
    ),
    "H100-SXM-80GB": GPUSpec(
        name="H100-SXM-80GB",
        label="NVIDIA H100 80GB HBM3",
        peak_flops={"fp32": 67e12, "bf16": 989.5e12, "fp16": 989.5e12},
        memory_bytes=80 * GIB,
        source=("NVIDIA H100 Tensor Core GPU datasheet, H100 SXM: 67 TFLOPS FP32; "
                "1,979 TFLOPS BF16/FP16 Tensor Core with sparsity, i.e. 989.5 dense; "
                "80 GB HBM3"),
    ),
    # Not a GPU: the device profile of one CPU process, so the gloo presets use the same code.
    "CPU-16GB": GPUSpec(
        name="CPU-16GB",
        label="CPU (gloo process)",
        peak_flops={"fp32": 200e9, "bf16": 100e9, "fp16": 100e9},
        memory_bytes=16 * GIB,
        source=("rough default for one process on a laptop CPU: a few cores with AVX2 FMA "
                "(~200 GFLOP/s FP32; half precision is emulated on most CPUs, so slower); "
                "16 GiB of RAM. `mpgpu-edu calibrate` measures this machine instead"),
    ),
}

LINKS: dict[str, LinkSpec] = {
    "pcie4-x16": LinkSpec(
        name="pcie4-x16", alpha_s=10e-6, beta_Bps=25e9,
        source=("effective. PCI-SIG PCI Express Base Specification 4.0: 16 GT/s x 16 lanes, "
                "128b/130b encoding = 31.5 GB/s raw per direction; packet headers and flow "
                "control leave ~25 GB/s for pinned-memory copies (CUDA bandwidthTest). "
                "Latency ~10 us per message including the copy launch"),
    ),
    "pcie5-x16": LinkSpec(
        name="pcie5-x16", alpha_s=10e-6, beta_Bps=50e9,
        source=("effective. PCI-SIG PCI Express Base Specification 5.0: 32 GT/s x 16 lanes "
                "= 63 GB/s raw per direction; ~50 GB/s effective. Latency ~10 us"),
    ),
    "nvlink3": LinkSpec(
        name="nvlink3", alpha_s=3e-6, beta_Bps=300e9,
        source=("peak. NVIDIA A100 Tensor Core GPU Architecture whitepaper: 12 third-generation "
                "NVLinks x 25 GB/s = 300 GB/s per direction per GPU (600 GB/s total); NCCL "
                "typically measures ~80% of it. Latency a few us"),
    ),
    "nvlink4-nvswitch": LinkSpec(
        name="nvlink4-nvswitch", alpha_s=3e-6, beta_Bps=450e9,
        source=("peak. NVIDIA H100 Tensor Core GPU datasheet / Hopper architecture whitepaper: "
                "18 fourth-generation NVLinks x 25 GB/s = 450 GB/s per direction per GPU "
                "(900 GB/s total) through NVSwitch; NCCL typically measures ~80% of it. "
                "Latency a few us"),
    ),
    "ib-hdr": LinkSpec(
        name="ib-hdr", alpha_s=5e-6, beta_Bps=25e9,
        source=("peak (line rate). InfiniBand HDR, NVIDIA ConnectX-6 / Quantum datasheets: "
                "200 Gb/s = 25 GB/s per direction per port. Latency ~5 us GPU to GPU "
                "(about 1 us in the switch and adapter, the rest in software)"),
    ),
    "ib-ndr": LinkSpec(
        name="ib-ndr", alpha_s=5e-6, beta_Bps=50e9,
        source=("peak (line rate). InfiniBand NDR, NVIDIA ConnectX-7 / Quantum-2 datasheets: "
                "400 Gb/s = 50 GB/s per direction per port. Latency ~5 us GPU to GPU"),
    ),
    "loopback-gloo": LinkSpec(
        name="loopback-gloo", alpha_s=30e-6, beta_Bps=2e9,
        source=("rough default for gloo over TCP loopback between processes on one machine "
                "(~30 us per message, ~2 GB/s); `mpgpu-edu calibrate` measures this machine "
                "and replaces it"),
    ),
}
