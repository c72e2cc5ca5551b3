"""The rows of ``docs/fidelity.md`` as data: each simulated setup beside the published
measurement it is compared with, its source, and what that number set in the model.

``mpgpu_edu.measure.fidelity`` explains the kinds of row and recomputes the simulated side.
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 2**30
MIB = 2**20
BANDWIDTH_TOLERANCE = 0.15

# nccl-tests' own figures are in GB/s (10^9 bytes/s).
GB = 1e9


@dataclass(frozen=True)
class Row:
    """One line of the fidelity table."""

    key: str
    preset: str
    # "busbw" (bytes/s), "latency" (s), "mfu" (fraction of peak), "step" (s), "membw" (bytes/s
    # that one streaming kernel reaches in DRAM)
    quantity: str
    setup: str  # what is simulated, in words
    published: float | None
    published_text: str  # the published figure as the source states it
    source: str
    kind: str  # "calibration", "validation", "other-config" or "gap"
    sets: str  # which parameter the published point set (calibration) or "none"
    tolerance: float = BANDWIDTH_TOLERANCE
    # "nccl" (collectives.nccl_ring, 24 channels), "nccl_rails" (the same, one ring per NIC
    # rail), "ring_pipelined" (RingAllReduce, segments of ``segment_bytes``), or an
    # ``all_reduce`` algo: "ring", "tree", "naive"
    algo: str = "ring_pipelined"
    nbytes: int = GIB
    # Why the row is outside its tolerance today ("" when it is not); for a gap, why there is
    # no published number; for "other-config", how the measured machine differs.
    known_miss: str = ""
    segment_bytes: int | None = None  # for "ring_pipelined"; None: NCCL_CHUNK_BYTES
    step: tuple[tuple[str, object], ...] = ()  # for "step": estimate.StepSetup's arguments


# NCCL's ring all-reduce moves data in chunks of ALLREDUCE_CHUNKSTEPS (NCCL_STEPS / 2 = 4)
# steps of NCCL_BUFFSIZE / NCCL_STEPS (4 MiB / 8 = 512 KiB, Simple protocol): 2 MiB per
# chunk and channel (src/include/collectives.h and the NCCL_BUFFSIZE default). The pipelined
# ring's segment is set to that chunk; it is also ring_fast.SEGMENT_BYTES. Not fitted.
NCCL_CHUNK_BYTES = 2 * MIB

_NCCL = "NCCL's ring (24 channels, 2 MiB chunks, reduction in the copy), 1 GiB"
_RAILS = ("NCCL's ring on two nodes: one ring per rail (8 NICs), 2 MiB chunks, reduction in "
          "the copy, 1 GiB")

ROWS: tuple[Row, ...] = (
    # --- NVLink / NVSwitch nodes ---------------------------------------------------------
    Row("h100x8-ring-1g", "8xH100-nvswitch", "busbw", _NCCL,
        370 * GB, "~370 GB/s busbw with NCCL_ALGO=RING on 8x H100",
        "NVIDIA/nccl-tests#212 (sjeaugey, NVIDIA)", "calibration",
        "nvlink4-nvswitch beta_Bps = 370 GB/s", algo="nccl"),
    Row("h100x4-ring-1g", "4xH100-nvswitch", "busbw", _NCCL,
        370 * GB, "~370 GB/s busbw with NCCL_ALGO=RING (stated for 8x H100; ring busbw is "
        "defined to be independent of N, no 4-GPU measurement found)",
        "NVIDIA/nccl-tests#212 (sjeaugey, NVIDIA)", "calibration",
        "nvlink4-nvswitch beta_Bps (same source as the 8-GPU row, not an independent point)",
        algo="nccl"),
    Row("a100x8-ring-1g", "8xA100-nvlink", "busbw", _NCCL,
        200 * GB, "~200 GB/s busbw, all_reduce_perf on 8x A100-SXM4-80GB (as cited in "
        "mpgpu_edu/cluster/hardware.py)", "NVIDIA/nccl-tests#149", "calibration",
        "nvlink3 beta_Bps = 205 GB/s (set so that this row matches)", algo="nccl"),
    Row("a100x4-ring-1g", "4xA100-nvlink", "busbw", _NCCL,
        200 * GB, "~200 GB/s busbw (measured on 8x A100; no 4-GPU measurement found)",
        "NVIDIA/nccl-tests#149", "calibration",
        "nvlink3 beta_Bps (same source as the 8-GPU row, not an independent point)",
        algo="nccl"),
    Row("h100-p2p-8b", "8xH100-nvswitch", "latency", "one 8-byte send/recv between 2 GPUs",
        3e-6, "~3 us sendrecv_perf over NVLink at small sizes, 2x H100 (as cited in "
        "mpgpu_edu/cluster/hardware.py)", "NVIDIA/nccl#1487", "calibration",
        "nvlink4-nvswitch alpha_s = 3 us", nbytes=8),
    # --- PCIe workstations ---------------------------------------------------------------
    Row("rtx4090x4-ring-1g", "4xRTX4090-pcie", "busbw",
        "pipelined ring all-reduce (2 MiB segments), 1 GiB",
        25.95 * GB, "25.95 GB/s busbw at 1 GiB (25.72-25.95 over 256 MiB-1 GiB), "
        "all_reduce_perf -g 4 on 4x RTX 4090", "tinygrad/open-gpu-kernel-modules#36",
        "other-config", "nothing on this preset's path (pcie4-x16 beta_Bps = 24 GB/s is NCCL's "
        "topology-model figure; this P2P measurement was its match)",
        known_miss=("the measurement is not the preset's configuration: it was posted in the "
                    "tracker of the P2P-enabling driver, by a user whose p2pBandwidthLatencyTest "
                    "on the same four cards (same bus ids) in that thread shows P2P access "
                    "between all of them, so copies went GPU to GPU over PCIe; the preset "
                    "models stock consumer cards without P2P, whose copies are staged through "
                    "host memory (one shared 153.6 GB/s cap), so the row is evidence neither "
                    "for nor against the model")),
    Row("rtx4090-p2p-8b", "4xRTX4090-pcie", "latency", "one 8-byte send/recv between 2 GPUs",
        11.6e-6, "11.3-11.9 us, alltoall_perf 8-64 B on 2x RTX 4090 with P2P disabled "
        "(midpoint used)", "tinygrad/open-gpu-kernel-modules#17", "calibration",
        "pcie4-x16 alpha_s = 11 us", nbytes=8),
    Row("rtx4090x4-switch", "4xRTX4090-pcie-switch", "busbw", "ring all-reduce, 1 GiB",
        None, "none found", "-", "gap", "none",
        known_miss="no published nccl-tests result for four RTX 4090s behind one PCIe switch "
                   "uplink was found: none of the RTX 4090 runs found (tinygrad/open-gpu-kernel-"
                   "modules#36, NVIDIA/nccl-tests#269, #270, #307, NVIDIA/nccl#1530) states "
                   "such a switch"),
    Row("rtx4090x8", "8xRTX4090-pcie", "busbw", "ring all-reduce, 1 GiB",
        None, "none readable", "-", "gap", "none",
        known_miss="8x RTX 4090 all_reduce_perf runs are posted in NVIDIA/nccl-tests#269 and "
                   "#270 (NCCL_ALGO=RING, 256 B-1 GiB), NVIDIA/nccl#1530 (8 B-128 MiB, ring "
                   "and tree) and NVIDIA/nccl-tests#307, but in the stored copies available "
                   "here what can be read of each post stops before its result lines (the "
                   "command, the devices, the table header or NCCL's log), so no number is "
                   "quoted"),
    # --- two nodes, one NIC per GPU ------------------------------------------------------
    Row("a100-2x8-flat-ring", "2x8xA100-ib", "busbw",
        "flat pipelined ring (2 MiB segments) over 16 GPUs, through one NIC, 1 GiB",
        24 * GB, "24 GB/s per 200G HDR NIC ('we usually consider 24GB/s is the peak "
        "performance per 200G NIC'; 3 nodes of 8x A100 with 4 NICs reached ~96 GB/s)",
        "NVIDIA/nccl-tests#119 (sjeaugey, NVIDIA)", "calibration",
        "ib-hdr beta_Bps = 24 GB/s"),
    Row("a100-2x8-multichannel", "2x8xA100-ib", "busbw", _RAILS,
        192 * GB, "192 GB/s AllReduce busbw measured on a DGX-A100 system with 8x 200 Gb/s "
        "IB cards (in a thread on two-node NCCL_ALGO=RING runs; the node count of NVIDIA's "
        "figure is not stated)", "NVIDIA/nccl#812 (AddyLaddy, NVIDIA)", "validation",
        "none (ib-hdr beta_Bps came from NVIDIA/nccl-tests#119)", algo="nccl_rails"),
    Row("h100-2x8-flat-ring", "2x8xH100-ib", "busbw",
        "flat pipelined ring (2 MiB segments) over 16 GPUs, through one NIC, 1 GiB",
        47 * GB, "'for NDR @ 400Gbps you should see 46-48GB/s per NIC' (midpoint used)",
        "NVIDIA/nccl-tests#290 (AddyLaddy, NVIDIA)", "calibration",
        "ib-ndr beta_Bps = 47 GB/s"),
    Row("h100-2x8-multichannel", "2x8xH100-ib", "busbw", _RAILS,
        370 * GB, "no two-node measurement found: the expected ~370 GB/s is min(NVLink 370, "
        "8 x 47 NDR) from the two calibration points above, not a measurement",
        "NVIDIA/nccl-tests#212 and #290 (combined)", "calibration",
        "nvlink4-nvswitch and ib-ndr beta_Bps (derived, not an independent point)",
        algo="nccl_rails"),
    # --- CPU (gloo) presets --------------------------------------------------------------
    Row("gloo-2", "2xCPU-gloo", "busbw", "ring all-reduce, 1 GiB", None, "none", "-", "gap",
        "none", known_miss="the gloo presets are rough defaults for a laptop (loopback-gloo: "
        "30 us, 2 GB/s), not a measurement of any machine, and no published gloo loopback "
        "all-reduce on a laptop was found. What benchmarks/RESULTS.md records on this "
        "repository's own machine (2 cores, virtualised) is not the row's quantity: "
        "`benchmarks/calibrate_vs_measured.py --runs 3 --repeats 15` fits alpha 459-519 us and "
        "beta 2.00-2.56 GB/s for 2 ranks (load 0.53 before, 1.24 after), and compares our "
        "rings with the simulator on that fit up to 64 MiB; no all-reduce bus bandwidth at "
        "1 GiB is recorded, and the fit set nothing in the presets. `mpgpu-edu calibrate` "
        "measures the machine it runs on instead"),
    Row("gloo-4", "4xCPU-gloo", "busbw", "ring all-reduce, 1 GiB", None, "none", "-", "gap",
        "none", known_miss="as 2xCPU-gloo; benchmarks/RESULTS.md has no 4-rank calibration "
        "(its 4-rank all-reduce section records only ratios of our rings to "
        "torch.distributed's)"),
    # --- compute -------------------------------------------------------------------------
    Row("a100-mfu-gemm", "8xA100-nvlink", "mfu",
        "one GPT-3-class BF16 GEMM (2048 tokens x 12288 x 49152, the MLP's first matmul "
        "of GPT-3 175B at micro-batch 1) at the efficiency the simulator charges every "
        "matmul of a training step: a whole run's sustained rate, not a lone kernel's",
        0.52, "163 TFLOP/s per GPU, 52% of peak: GPT 1T on 3,072 A100s",
        "Narayanan et al., 'Efficient Large-Scale Language Model Training on GPU Clusters "
        "Using Megatron-LM', SC 2021", "calibration", "A100 efficiency = 0.52"),
    Row("h100-mfu-gemm", "8xH100-nvswitch", "mfu",
        "the same GEMM on an H100",
        0.405, "38-43% BF16 MFU, Llama 3 405B pre-training on 8,192-16,384 H100s (midpoint "
        "used)", "Dubey et al., 'The Llama 3 Herd of Models', 2024, Table 4", "calibration",
        "H100 efficiency = 0.40"),
    # --- the RTX 4090's two assumed figures, against measurements that set neither --------
    Row("rtx4090-mfu-gemm", "4xRTX4090-pcie", "mfu",
        "the same GEMM on an RTX 4090 (efficiency 0.52, assumed as the A100's)",
        0.29 * 312e12 / 165.2e12,
        "'on 1x 4090 GPU, I am getting 29% MFU while training GPT-2 124M': nanoGPT's "
        "estimate_mfu divides by the A100's 312 TFLOP/s (model.py: flops_promised = 312e12), "
        "so 90.5 TFLOP/s, 0.548 of the RTX 4090's 165.2 dense BF16 (a single report, its "
        "configuration not given)", "karpathy/nanoGPT#182 (akjindal53244)", "validation",
        "none (RTX 4090 efficiency 0.52 is the A100's, from Narayanan et al. 2021)"),
    Row("rtx4090-lone-gemm", "4xRTX4090-pcie", "mfu",
        "the same GEMM on an RTX 4090, against a lone square GEMM timed in a microbenchmark",
        160.17e12 / 165.2e12,
        "BF16: 8192x8192: 160.17 TFLOPS (torch.matmul, PyTorch 2.7, CUDA 12.8; 164.81 at "
        "2048), so 0.970 of the RTX 4090's 165.2 dense BF16; FP16 167.1 TFLOP/s at n = 2048 "
        "in mli/transformers-benchmarks#4", "zzc0721/torch-performance-test-data#78 (exynos967)",
        "other-config", "nothing (RTX 4090 efficiency 0.52 is the A100's training rate)",
        known_miss=("a microbenchmark times one large square GEMM alone, back to back, and it "
                    "runs near peak; the simulator's efficiency is a training run's sustained "
                    "rate (GPT 1T's 52% on A100s, assumed for the RTX 4090), charged to every "
                    "matmul of a step, with attention, small and memory-bound kernels and "
                    "waits all inside it: it models whole steps, not a lone kernel, and has no "
                    "efficiency that varies with a kernel's shape")),
    Row("rtx4090-membw", "4xRTX4090-pcie", "membw",
        "one streaming kernel over 1 GiB on an RTX 4090 (roofline: bytes / effective memory "
        "bandwidth, plus one launch)",
        921.32 * GB, "921.32 GB/s global memory bandwidth (clpeak, float16 vectors; 866.65 "
        "with float), one RTX 4090 at a 248 W power limit, Windows 11",
        "krrishnarraj/clpeak#106 (moyang)", "validation",
        "none (RTX 4090 effective_memory_Bps = 86.7% of the 1,008 GB/s peak, the fraction "
        "measured on an H100: 2,903 of 3,350 GB/s, github.com/aigatech/vpbenchmarking)",
        nbytes=GIB),
    Row("rtx4090-membw-copy", "4xRTX4090-pcie", "membw",
        "one kernel that copies 64 MiB on an RTX 4090: 128 MiB read and written (roofline: "
        "bytes / effective memory bandwidth, plus one launch)",
        895 * GB, "T_tot3=895 GB/s: copyto! of a 64 MiB Float32 array, read and write "
        "counted (smaller arrays report over 2 TB/s: the L2 cache, not DRAM)",
        "JuliaGPU/CUDA.jl#1860 (Yangyang-Tan)", "validation",
        "none (as the row above: the fraction of peak measured on an H100)",
        nbytes=128 * MIB),
)


# Korthikanti et al. 2022, table 3 (configuration) and table 5 (end-to-end iteration time): the
# 22B GPT on one DGX A100 (8 GPUs, TP 8, no data or pipeline parallelism), global batch 4 =
# one micro-batch of 4 sequences of 2048 tokens. Their kernels of 2022 materialise the
# attention scores (Megatron's fused softmax), so the rows simulate eager attention.
_KORTHIKANTI = ("Korthikanti et al., 'Reducing Activation Recomputation in Large Transformer "
                "Models', 2022, tables 3 and 5")
_22B = (("model", "gpt-22b"), ("strategy", "tensor"), ("micro_batch", 4), ("seq", 2048),
        ("accumulate", 1), ("attention", "eager"))
STEP_ROWS: tuple[Row, ...] = (
    Row("a100x8-22b-tp8-selective", "8xA100-nvlink", "step",
        "one training step of the 22B GPT, tensor parallel over 8 GPUs, micro-batch 4 x 2048 "
        "tokens, selective recomputation (simulate step)",
        1.10, "1.10 s per iteration, 41.5% MFU, with sequence parallelism and selective "
        "recomputation ('present work'; the simulator has no sequence parallelism, which the "
        "paper measures as 3% faster per layer)", _KORTHIKANTI, "validation",
        "none (A100 efficiency 0.52 came from Narayanan et al. 2021's 1T run on 3,072 GPUs; "
        "nvlink3 beta from NVIDIA/nccl-tests#149)",
        step=_22B + (("recompute", "selective"),)),
    Row("a100x8-22b-tp8-full", "8xA100-nvlink", "step",
        "the same step with full recomputation",
        1.42, "1.42 s per iteration with full recomputation, without sequence parallelism",
        _KORTHIKANTI, "validation", "none (as the row above)",
        step=_22B + (("recompute", "full"),)),
)
ROWS = ROWS + STEP_ROWS
