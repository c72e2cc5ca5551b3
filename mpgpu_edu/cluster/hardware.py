"""Hardware profiles: what one device can compute and what one link can carry.

Every number here comes from a public spec sheet or standard, cited in its ``source``. A
device is described by its dense peak FLOP/s per dtype and its memory; a link by the
alpha-beta model: sending ``n`` bytes takes ``alpha_s + n / beta_Bps`` seconds, where
``alpha_s`` is the fixed latency of one message and ``beta_Bps`` the bandwidth in *one
direction* (links are full duplex).

Peak numbers are what the hardware can do at best; real training reaches a fraction of
them: each GPU's ``efficiency`` is one published measurement of that fraction, and its
``effective_memory_Bps`` one measurement of the DRAM bandwidth that elementwise ops see.
A link carries both: ``beta_Bps`` is effective (what NCCL reaches, from published nccl-tests
results), which the simulator uses; ``peak_Bps`` the spec sheet's line rate; its ``source``
cites both.

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
    in messages (falls back to ``name``).

    The roofline: an op takes the longer of its FLOPs over ``peak * efficiency`` and its
    bytes over ``effective_memory_Bps``, plus ``launch_overhead_s``. ``memory_Bps`` is the
    spec sheet's DRAM bandwidth, ``effective_memory_Bps`` what a streaming kernel measures;
    ``efficiency`` is the fraction of peak FLOP/s that published training runs reach.
    ``compute_source`` cites those three numbers and the launch overhead."""

    name: str
    peak_flops: dict[str, float] = field(hash=False)
    memory_bytes: int
    source: str
    label: str = ""
    memory_Bps: float = 0.0
    effective_memory_Bps: float = 0.0
    efficiency: float = 0.5
    launch_overhead_s: float = 5e-6
    compute_source: str = ""

    @property
    def display_name(self) -> str:
        return self.label or self.name


@dataclass(frozen=True)
class LinkSpec:
    """A link profile: latency ``alpha_s`` (s) and one-direction bandwidth ``beta_Bps``
    (bytes/s). Time for one message of n bytes: ``alpha_s + n / beta_Bps``.

    ``beta_Bps`` is the *effective* bandwidth, what NCCL reaches on this link (published
    nccl-tests bus bandwidth at large messages), and the simulator uses it; ``peak_Bps`` is
    the spec sheet's line rate, kept so that lessons can show both. ``source`` cites both."""

    name: str
    alpha_s: float
    beta_Bps: float
    source: str
    peak_Bps: float = 0.0

    def seconds(self, nbytes: int) -> float:
        """Alpha-beta time of one message of ``nbytes`` on this link alone."""
        return self.alpha_s + nbytes / self.beta_Bps


def _by_name(*specs: GPUSpec | LinkSpec) -> dict:
    """``{spec.name: spec}`` in the order given: each profile writes its name once."""
    return {spec.name: spec for spec in specs}


# "fp32" is plain FP32 on the CUDA cores: PyTorch leaves TF32 matmuls off by default.
# "bf16"/"fp16" are dense Tensor Core rates with FP32 accumulation, as used in mixed-precision
# training; spec sheets often print the 2:4-sparsity rate, which is twice these.
# Launch overhead: an eager PyTorch op costs a few microseconds of CPU dispatch plus the
# cudaLaunchKernel call before the GPU starts it, however small the op (NVIDIA Technical Blog,
# A. Gray, "Getting Started with CUDA Graphs", 2019: a few us per short kernel, which is
# what CUDA Graphs remove). 5 us is the figure used for every GPU.
_LAUNCH = ("launch ~5 us per kernel: eager PyTorch dispatch plus cudaLaunchKernel (NVIDIA "
           "Technical Blog, 'Getting Started with CUDA Graphs', 2019)")
# Effective HBM3 bandwidth of an H100 SXM: a device-to-device copy measured 2,903 GB/s,
# 86.7% of the 3,350 GB/s peak (Voltage Park / AI @ Georgia Tech, github.com/aigatech/
# vpbenchmarking, README, "Memory Bandwidth - Single Node (8x H100)"). The A100's effective
# figure is a measured read kernel (88% of peak, cited below). The RTX 4090's applies the
# H100's 86.7% to its spec sheet peak (873.5 GB/s); a measurement that set nothing, clpeak's
# 921.32 GB/s on one RTX 4090 (krrishnarraj/clpeak#106), is 5.5% above it, and
# docs/fidelity.md keeps that comparison as a validation row.
_STREAM_FRACTION = 2903e9 / 3350e9

GPUS: dict[str, GPUSpec] = _by_name(
    GPUSpec(
        name="RTX4090-24GB",
        label="NVIDIA GeForce RTX 4090",
        peak_flops={"fp32": 82.6e12, "bf16": 165.2e12, "fp16": 165.2e12},
        memory_bytes=24 * GIB,
        source=("NVIDIA Ada Lovelace GPU Architecture whitepaper (v2.1), Appendix A, RTX 4090: "
                "82.6 TFLOPS FP32; 165.2 TFLOPS FP16/BF16 Tensor with FP32 accumulate "
                "(dense; 330.4 with sparsity); 24 GB GDDR6X"),
        memory_Bps=1008e9,
        effective_memory_Bps=1008e9 * _STREAM_FRACTION,
        efficiency=0.52,
        compute_source=("memory: peak 1,008 GB/s GDDR6X (Ada whitepaper, Appendix A); effective "
                        "86.7% of peak, the fraction measured on an H100, checked against "
                        "clpeak's 921.32 GB/s global memory bandwidth on one RTX 4090 at a "
                        "248 W power limit (krrishnarraj/clpeak#106): 5.2% below it. "
                        "efficiency 0.52 as the A100's, checked against 29% of the A100's "
                        "312 TFLOP/s (nanoGPT's MFU unit), i.e. 0.548 of the RTX 4090's 165.2, "
                        "reported for GPT-2 124M training on one RTX 4090 (karpathy/nanoGPT"
                        "#182); the checks are validation rows of docs/fidelity.md. " + _LAUNCH),
    ),
    GPUSpec(
        name="A100-80GB",
        label="NVIDIA A100-SXM4-80GB",
        peak_flops={"fp32": 19.5e12, "bf16": 312e12, "fp16": 312e12},
        memory_bytes=80 * GIB,
        source=("NVIDIA A100 Tensor Core GPU datasheet, A100 80GB SXM: 19.5 TFLOPS FP32; "
                "312 TFLOPS BF16/FP16 Tensor Core (dense; 624 with sparsity); 80 GB HBM2e"),
        memory_Bps=2039e9,
        effective_memory_Bps=1.80e12,
        efficiency=0.52,
        compute_source=("memory: peak 2,039 GB/s HBM2e (A100 datasheet, 80GB SXM); effective "
                        "1.80 TB/s, a DRAM read kernel on an A100 80GB SXM that Nsight Compute "
                        "also puts at 88% of peak (NVIDIA developer forums, 'Trouble to Reach "
                        "Peak Bandwidth of A100', topic 339083; the thread notes ~90% as the "
                        "best any kernel reached in an NVIDIA GTC talk). efficiency 0.52: GPT 1T on 3,072 A100s reached "
                        "163 TFLOP/s per GPU, 52% of peak (Narayanan et al., 'Efficient "
                        "Large-Scale Language Model Training on GPU Clusters Using "
                        "Megatron-LM', SC 2021). " + _LAUNCH),
    ),
    GPUSpec(
        name="H100-SXM-80GB",
        label="NVIDIA H100 80GB HBM3",
        peak_flops={"fp32": 67e12, "bf16": 989.5e12, "fp16": 989.5e12},
        memory_bytes=80 * GIB,
        source=("NVIDIA H100 Tensor Core GPU datasheet, H100 SXM: 67 TFLOPS FP32; "
                "1,979 TFLOPS BF16/FP16 Tensor Core with sparsity, i.e. 989.5 dense; "
                "80 GB HBM3"),
        memory_Bps=3350e9,
        effective_memory_Bps=2903e9,
        efficiency=0.40,
        compute_source=("memory: peak 3,350 GB/s HBM3 (H100 datasheet, SXM); effective 2,903 "
                        "GB/s measured device-to-device (github.com/aigatech/vpbenchmarking). "
                        "efficiency 0.40: Llama 3 405B pre-training reached 38-43% BF16 model "
                        "FLOPs utilisation on 8,192-16,384 H100s (Dubey et al., 'The Llama 3 "
                        "Herd of Models', 2024, Table 4). " + _LAUNCH),
    ),
    # Not a GPU: the device profile of one CPU process, so the gloo presets use the same code.
    GPUSpec(
        name="CPU-16GB",
        label="CPU (gloo process)",
        peak_flops={"fp32": 200e9, "bf16": 100e9, "fp16": 100e9},
        memory_bytes=16 * GIB,
        source=("rough default for one process on a laptop CPU: a few cores with AVX2 FMA "
                "(~200 GFLOP/s FP32; half precision is emulated on most CPUs, so slower); "
                "16 GiB of RAM. `mpgpu-edu calibrate` measures this machine instead"),
        memory_Bps=20e9,
        effective_memory_Bps=10e9,
        efficiency=0.5,
        compute_source=("rough default, not a measurement: one core streams ~10 GB/s of a "
                        "dual-channel DDR4 system's ~20-40 GB/s; efficiency 0.5; launch ~5 us "
                        "of eager PyTorch dispatch per op. `mpgpu-edu calibrate` measures "
                        "the memory bandwidth and the per-op overhead of this machine"),
    ),
)

LINKS: dict[str, LinkSpec] = _by_name(
    LinkSpec(
        name="pcie4-x16", alpha_s=11e-6, beta_Bps=24e9, peak_Bps=31.5e9,
        source=("peak: PCI-SIG PCI Express Base Specification 4.0, 16 GT/s x 16 lanes, "
                "128b/130b = 31.5 GB/s per direction. effective 24 GB/s: NCCL's own model of a "
                "Gen4 x16 link (NCCL_DEBUG=INFO topology 'PCI[24.0]', NVIDIA/nccl-tests#307; "
                "PCI_BW 12.0 per Gen3 x16 in NCCL's src/graph/topo.h), matched by 4x RTX "
                "4090 all_reduce_perf at 25.7-26.0 GB/s busbw, 256 MiB-2 GiB, posted in "
                "tinygrad/open-gpu-kernel-modules#36 (the tracker of a P2P-enabling driver). "
                "alpha 11 us: 2x RTX 4090 with P2P disabled, nccl-tests alltoall of 8-64 B "
                "takes 11.3-11.9 us "
                "(tinygrad/open-gpu-kernel-modules#17)"),
    ),
    LinkSpec(
        name="pcie5-x16", alpha_s=11e-6, beta_Bps=48e9, peak_Bps=63e9,
        source=("peak: PCI-SIG PCI Express Base Specification 5.0, 32 GT/s x 16 lanes = 63 "
                "GB/s per direction. effective 48 GB/s: twice the Gen4 figure (NCCL scales "
                "its PCIe model with the link speed); no Gen5 nccl-tests result cited. alpha "
                "as Gen4"),
    ),
    LinkSpec(
        name="nvlink3", alpha_s=3e-6, beta_Bps=205e9, peak_Bps=300e9,
        source=("peak: NVIDIA A100 Tensor Core GPU Architecture whitepaper, 12 NVLink3 x 25 "
                "GB/s = 300 GB/s per direction per GPU. effective 205 GB/s: 8x "
                "A100-SXM4-80GB all_reduce_perf measured ~200 GB/s busbw "
                "(NVIDIA/nccl-tests#149), which NCCL's ring as the simulator models it "
                "(collectives/nccl_ring.py: 24 channels, reduction in the copy) reaches at a "
                "per-direction rate of 205; 8x A100 sendrecv_perf 195 GB/s per direction "
                "(li-plus/playground, cuda/nccl.md) agrees. alpha 3 us: the "
                "NVLink4 figure (no A100 small-message measurement cited)"),
    ),
    LinkSpec(
        name="nvlink4-nvswitch", alpha_s=3e-6, beta_Bps=370e9, peak_Bps=450e9,
        source=("peak: NVIDIA H100 datasheet / Hopper whitepaper, 18 NVLink4 x 25 GB/s = 450 "
                "GB/s per direction per GPU through NVSwitch. effective 370 GB/s: 'with the "
                "protocol overhead (~20%) NCCL can get an effective NVLink bandwidth of "
                "370GB/s', the busbw of 8x H100 with NCCL_ALGO=RING (sjeaugey, "
                "NVIDIA/nccl-tests#212; NVLink SHARP, not modelled, reaches ~480 busbw). "
                "alpha 3 us: sendrecv_perf over NVLink takes ~3 us for small messages "
                "(NVIDIA/nccl#1487, 2x H100) and 3.7 us at 1 KiB (NVIDIA/nccl#1984, H800)"),
    ),
    LinkSpec(
        name="ib-hdr", alpha_s=5e-6, beta_Bps=24e9, peak_Bps=25e9,
        source=("peak: InfiniBand HDR, NVIDIA ConnectX-6 / Quantum datasheets, 200 Gb/s = 25 "
                "GB/s per direction per port. effective 24 GB/s: 3 nodes of 8x A100 with 4 "
                "HDR NICs each peaked at ~96 GB/s all_reduce busbw, 24 GB/s per NIC "
                "(NVIDIA/nccl-tests#119). alpha ~5 us GPU to GPU, not calibrated"),
    ),
    LinkSpec(
        name="ib-ndr", alpha_s=5e-6, beta_Bps=47e9, peak_Bps=50e9,
        source=("peak: InfiniBand NDR, NVIDIA ConnectX-7 / Quantum-2 datasheets, 400 Gb/s = 50 "
                "GB/s per direction per port. effective 47 GB/s: 'for NDR @ 400Gbps you should "
                "see 46-48GB/s per NIC' (NVIDIA's answer in NVIDIA/nccl-tests#290). alpha "
                "~5 us GPU to GPU, not calibrated"),
    ),
    # Not links between GPUs but the shared parts that PCIe copies cross in a workstation.
    LinkSpec(
        name="host-ddr4-8ch", alpha_s=0.0, beta_Bps=0.75 * 204.8e9, peak_Bps=204.8e9,
        source=("host memory of one CPU with 8 channels of DDR4-3200 (AMD Threadripper PRO / "
                "EPYC, Intel Xeon Ice Lake-SP, the CPUs with enough lanes for four x16 cards): "
                "peak 8 x 3200 MT/s x 8 B = 204.8 GB/s (JEDEC DDR4). effective 75% of peak, "
                "an assumption: STREAM commonly reaches 70-80% of the DDR wire rate (e.g. TI "
                "SPRAD45A, table 3-3: 74-78%); no STREAM result on these CPUs is cited. "
                "Counts reads and writes together"),
    ),
    LinkSpec(
        name="upi-xeon", alpha_s=0.0, beta_Bps=10e9, peak_Bps=2 * 20.8e9,
        source=("the link between two Xeon sockets: peak 2 UPI links x 10.4 GT/s = 20.8 GB/s "
                "per direction each (Skylake-SP; Wikipedia, 'Intel Ultra Path "
                "Interconnect'). effective 10 GB/s for GPU traffic: NCCL's model of a Skylake UPI "
                "path (SKL_QPI_BW 10.0, src/graph/topo.h)"),
    ),
    LinkSpec(
        name="loopback-gloo", alpha_s=30e-6, beta_Bps=2e9,
        source=("rough default for gloo over TCP loopback between processes on one machine "
                "(~30 us per message, ~2 GB/s); `mpgpu-edu calibrate` measures this machine "
                "and replaces it"),
    ),
)
