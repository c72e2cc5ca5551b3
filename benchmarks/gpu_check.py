"""The simulator against a real GPU: memory, compute time, bandwidth and (2+ GPUs) NCCL.

    python benchmarks/gpu_check.py --results benchmarks/RESULTS.md     # about 1-3 GPU minutes
    python benchmarks/gpu_check.py --dry-run                           # the same on CPU, seconds

Four parts, each a number the package predicts next to the one the device gives:

1. memory: one Adam training step of an MLP (fp32), in steady state (the second step, when
   the optimizer state already exists). Predicted twice: ``estimate_memory`` (bytes per
   parameter, plus the activations) and the memory ledger of the same step on the simulator
   (meta tensors: the bytes without the storage). Measured: ``torch.cuda.max_memory_allocated``.
2. compute: the simulated time of that step on the device's hardware profile (FLOPs / (peak x
   the presets' efficiency)) and the measured time, in fp32 and bf16; the implied efficiency
   is FLOPs / (measured time x peak). And two memory-bound operations, a large elementwise add
   and an Adam step, in GB/s against the device's memory bandwidth.
3. with two or more GPUs: the ring all-reduce, DDP and a pipeline on NCCL, each against the
   simulator on the matching preset (same losses, same sums; simulated against measured time).
4. the report: a section between ``<!-- gpu_check -->`` markers in ``--results``.

The profile is picked by ``torch.cuda.get_device_name`` (``PROFILE_BY_NAME``; an unknown GPU
gets ``DEFAULT_PROFILE`` and the report says so). ``--dry-run`` runs every part on the CPU
with tiny sizes (part 3 on two gloo processes) and writes to a temporary file unless
``--results`` is given: it checks that the script runs, not the numbers.
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

from mpgpu_edu.measure.recording import replace_section  # noqa: E402
from mpgpu_edu.cluster import Cluster  # noqa: E402
from mpgpu_edu.comm import launch  # noqa: E402
from mpgpu_edu.replica.data import loss_fn, make_batch, make_mlp  # noqa: E402
from mpgpu_edu.cluster.hardware import GPUS  # noqa: E402
from mpgpu_edu.memory import estimate_memory  # noqa: E402
from mpgpu_edu.memory.measure import (saved_activations, track_gradients,  # noqa: E402
                                      track_optimizer_state, track_parameters)

MARKER = "<!-- gpu_check -->"
# (substring of torch.cuda.get_device_name, profile in mpgpu_edu.cluster.hardware, cluster preset).
# An H200 is an H100's chip (the same dense peaks) with more and faster memory.
PROFILE_BY_NAME = (("H200", "H100-SXM-80GB", "8xH100-nvswitch"),
                   ("H100", "H100-SXM-80GB", "8xH100-nvswitch"),
                   ("A100", "A100-80GB", "8xA100-nvlink"),
                   ("4090", "RTX4090-24GB", "8xRTX4090-pcie"))
DEFAULT_PROFILE = ("H100-SXM-80GB", "8xH100-nvswitch")
# Memory bandwidth (bytes/s) from the spec sheets; mpgpu_edu.cluster.hardware has no such field.
BANDWIDTH_BY_NAME = (("H200", 4.8e12, "NVIDIA H200 datasheet: 4.8 TB/s HBM3e"),
                     ("H100", 3.35e12, "NVIDIA H100 datasheet, SXM: 3.35 TB/s HBM3"),
                     ("A100", 2.039e12, "NVIDIA A100 datasheet, 80GB SXM: 2,039 GB/s"),
                     ("4090", 1.008e12, "NVIDIA Ada whitepaper, RTX 4090: 1,008 GB/s"))
FULL = {"sizes": (4096, 8192, 8192, 4096), "batch": 8192, "repeats": 10,
        "add_numel": 2**28, "allreduce_numel": 2**26}
DRY = {"sizes": (32, 64, 64, 32), "batch": 16, "repeats": 2,
       "add_numel": 2**16, "allreduce_numel": 2**12}
FIELDS = ("device", "torch", "cuda", "gpus", "profile", "model", "parameters",
          "memory_estimate_bytes", "memory_ledger_bytes", "memory_measured_bytes",
          "measured_over_ledger", "step_flops_fp32", "step_flops_bf16",
          "simulated_step_s_fp32", "measured_step_s_fp32", "implied_efficiency_fp32",
          "simulated_step_s_bf16", "measured_step_s_bf16", "implied_efficiency_bf16",
          "add_GBps", "adam_GBps", "spec_bandwidth_GBps", "add_fraction_of_spec",
          "multi_gpu")


def pick_profile(device_name: str) -> tuple[str, str, bool]:
    """(hardware profile, cluster preset, whether the name was known) for a device name."""
    for key, profile, preset in PROFILE_BY_NAME:
        if key in device_name:
            return profile, preset, True
    return (*DEFAULT_PROFILE, False)


def spec_bandwidth(device_name: str) -> float | None:
    """The device's memory bandwidth in bytes/s, or None when the table does not know it."""
    return next((bw for key, bw, _ in BANDWIDTH_BY_NAME if key in device_name), None)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], Any], device: torch.device, repeats: int) -> float:
    """Median wall-clock seconds of ``fn()`` after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def training_step(model: torch.nn.Module, opt: torch.optim.Optimizer,
                  batch: tuple[torch.Tensor, torch.Tensor]) -> None:
    opt.zero_grad(set_to_none=False)         # gradients stay allocated, as the ledger says
    loss_fn(model(batch[0]), batch[1]).backward()
    opt.step()


def ledger_step(comm: Any, sizes: tuple[int, ...], batch: int, dtype: torch.dtype) -> dict:
    """Two Adam steps on meta tensors, on the simulator: the ledger records the bytes, the
    compute regions the FLOPs and the simulated time. Returns the second step's numbers."""
    model = make_mlp(sizes, device="meta").to(dtype)
    x, y = (t.to(dtype) for t in make_batch(batch, sizes[0], sizes[-1], device="meta"))
    opt = torch.optim.Adam(model.parameters())
    track_parameters(comm, model)
    grads, state = track_gradients(comm, model), track_optimizer_state(comm, opt)
    acts_bytes = 0
    for _ in range(2):
        with comm.compute("forward"), saved_activations(comm) as acts:
            loss = loss_fn(model(x), y)
        with comm.compute("backward"):
            loss.backward()
        grads.update()
        acts_bytes = acts.nbytes
        acts.free()
        opt.step()
        state.update()
    return {"activations": acts_bytes}


def simulate_step(profile: str, sizes: tuple[int, ...], batch: int,
                  dtype: torch.dtype) -> dict:
    """Ledger peak, activations, FLOPs and simulated seconds of one steady-state step."""
    # The profile's own efficiency, memory bandwidth and launch cost: the roofline the
    # presets use.
    cluster = Cluster("gpu_check", GPUS[profile], Cluster.uniform(1, 1e-5, 1e10).topology)
    run = launch(ledger_step, cluster, sizes, batch, dtype)
    events = run.trace.on(0, stream="compute")
    half = events[len(events) // 2:]                          # the second step
    return {"peak": run.trace.peak_memory(0), "activations": run.results[0]["activations"],
            "flops": sum(e.flops for e in half), "seconds": sum(e.duration for e in half)}


def measure_step(device: torch.device, sizes: tuple[int, ...], batch: int,
                 dtype: torch.dtype, repeats: int) -> dict:
    """Peak bytes of a steady-state step (CUDA only, else None) and its median seconds."""
    model = make_mlp(sizes, device=device).to(dtype)
    x, y = (t.to(dtype) for t in make_batch(batch, sizes[0], sizes[-1], device=device))
    opt = torch.optim.Adam(model.parameters())
    training_step(model, opt, (x, y))                        # creates the optimizer state
    peak = None
    if device.type == "cuda":
        _sync(device)
        torch.cuda.reset_peak_memory_stats(device)
        training_step(model, opt, (x, y))
        _sync(device)
        peak = torch.cuda.max_memory_allocated(device)
    seconds = timed(lambda: training_step(model, opt, (x, y)), device, repeats)
    adam = timed(opt.step, device, repeats)
    n_params = sum(p.numel() for p in model.parameters())
    # Adam reads parameter, gradient and two moments, writes parameter and two moments
    adam_bytes = 7 * n_params * model[0].weight.element_size()
    del model, opt, x, y
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return {"peak": peak, "seconds": seconds, "adam_GBps": adam_bytes / adam / 1e9}


def elementwise_add_GBps(device: torch.device, numel: int, repeats: int) -> float:
    """``c = a + b`` on fp32 vectors: reads two, writes one."""
    a, b = torch.rand(numel, device=device), torch.rand(numel, device=device)
    c = torch.empty_like(a)
    seconds = timed(lambda: torch.add(a, b, out=c), device, repeats)
    return 3 * numel * 4 / seconds / 1e9


def ring_allreduce(comm: Any, numel: int, repeats: int) -> dict:
    """The course's ring all-reduce on ``numel`` fp32 elements per rank, checked against the
    exact sum; the median seconds over ``repeats`` calls (rank 0's wall clock; on the
    simulator the trace has the time)."""
    from mpgpu_edu.collectives.allreduce import all_reduce_ring

    n = comm.world_size
    tensor = torch.empty(numel, device=comm.device)
    times = []
    for _ in range(repeats):
        tensor.fill_(comm.rank + 1.0)
        comm.barrier()
        getattr(comm, "sync", lambda: None)()
        start = time.perf_counter()
        all_reduce_ring(comm, tensor)
        getattr(comm, "sync", lambda: None)()
        times.append(time.perf_counter() - start)
    exact = bool(torch.all(tensor == n * (n + 1) / 2))
    return {"seconds": statistics.median(times), "exact": exact}


def multi_gpu(backend: str, world_size: int, preset: str, numel: int, repeats: int) -> dict:
    """Ring all-reduce, DDP and a pipeline on ``backend`` against the simulator on
    ``preset`` (its first ``world_size`` devices). A part that fails reports its error."""
    import gpu_check  # workers import this script by module name, not as __main__

    from mpgpu_edu.cli.runners import run_strategy

    cluster = Cluster.preset(preset, visible=",".join(map(str, range(world_size))))
    out: dict[str, Any] = {"backend": backend, "world_size": world_size, "preset": preset}
    try:
        real = launch(gpu_check.ring_allreduce, world_size, numel, repeats, backend=backend,
                      timeout=300).results[0]
        sim = launch(gpu_check.ring_allreduce, cluster, numel, 1)
        out["allreduce"] = {"bytes": 4 * numel, "measured_s": real["seconds"],
                            "simulated_s": sim.trace.makespan,
                            "exact": real["exact"] and sim.results[0]["exact"]}
    except Exception as exc:  # noqa: BLE001 - the report says what failed, the rest goes on
        out["allreduce"] = {"error": f"{type(exc).__name__}: {exc}".splitlines()[0]}
    # DDP's demo takes the Cluster itself, the pipeline's a preset name (it picks the devices)
    for strategy, sim_cluster in (("ddp", cluster), ("pipeline", preset)):
        try:
            real = run_strategy(strategy, backend, world_size, 3, "sgd")
            sim = run_strategy(strategy, "sim", world_size, 3, "sgd", cluster=sim_cluster)
            out[strategy] = {"max_abs_param_diff": real["max_abs_param_diff"],
                             "simulator_max_abs_param_diff": sim["max_abs_param_diff"],
                             "max_abs_loss_diff_vs_simulator": max(
                                 abs(a - b) for a, b in zip(real["losses"], sim["losses"])),
                             "measured_s": real["makespan_s"], "simulated_s": sim["makespan_s"]}
        except Exception as exc:  # noqa: BLE001
            out[strategy] = {"error": f"{type(exc).__name__}: {exc}".splitlines()[0]}
    return out


def check(dry_run: bool) -> dict[str, Any]:
    """Every number of the report, by name (``FIELDS``)."""
    sizes_cfg = DRY if dry_run else FULL
    gpus = torch.cuda.device_count()
    device = torch.device("cpu" if dry_run or gpus == 0 else "cuda:0")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    profile, preset, known = pick_profile(name)
    if device.type == "cpu":
        profile, preset, known = "CPU-16GB", "2xCPU-gloo", True
    sizes, batch, repeats = sizes_cfg["sizes"], sizes_cfg["batch"], sizes_cfg["repeats"]
    n_params = sum(a * b + b for a, b in zip(sizes, sizes[1:]))
    r: dict[str, Any] = {
        "device": name, "torch": torch.__version__, "cuda": torch.version.cuda or "none",
        "gpus": gpus, "profile": profile + ("" if known else f" (default: {name} unknown)"),
        "model": f"MLP {list(sizes)}, batch {batch}, Adam", "parameters": n_params}
    for dtype, key in ((torch.float32, "fp32"), (torch.bfloat16, "bf16")):
        sim = simulate_step(profile, sizes, batch, dtype)
        real = measure_step(device, sizes, batch, dtype, repeats)
        peak_flops = GPUS[profile].peak_flops[key]
        r[f"step_flops_{key}"] = sim["flops"]
        r[f"simulated_step_s_{key}"] = sim["seconds"]
        r[f"measured_step_s_{key}"] = real["seconds"]
        r[f"implied_efficiency_{key}"] = sim["flops"] / (real["seconds"] * peak_flops)
        if key == "fp32":
            estimate = estimate_memory(n_params, "adam", "fp32", "single", 1, sim["activations"])
            r["memory_estimate_bytes"] = estimate.per_device_total
            r["memory_ledger_bytes"] = sim["peak"]
            r["memory_measured_bytes"] = real["peak"]
            r["measured_over_ledger"] = (None if real["peak"] is None
                                         else real["peak"] / sim["peak"])
            r["adam_GBps"] = real["adam_GBps"]
    r["add_GBps"] = elementwise_add_GBps(device, sizes_cfg["add_numel"], repeats)
    bandwidth = spec_bandwidth(name)
    r["spec_bandwidth_GBps"] = None if bandwidth is None else bandwidth / 1e9
    r["add_fraction_of_spec"] = None if bandwidth is None else r["add_GBps"] * 1e9 / bandwidth
    if gpus >= 2 and not dry_run:
        r["multi_gpu"] = multi_gpu("nccl", min(gpus, 4), preset, sizes_cfg["allreduce_numel"],
                                   repeats)
    elif dry_run:
        r["multi_gpu"] = multi_gpu("gloo", 2, "2xCPU-gloo", sizes_cfg["allreduce_numel"], 1)
    else:
        r["multi_gpu"] = f"skipped: {gpus} GPU(s), NCCL needs 2 or more"
    return r


def _cell(value: Any) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def render(r: dict[str, Any], command: str) -> str:
    """The Markdown section, between the markers: one row per field."""
    rows = [f"| {key} | {_cell(r[key])} |" for key in FIELDS if key != "multi_gpu"]
    multi = r["multi_gpu"]
    if isinstance(multi, dict):
        for part, value in multi.items():
            cells = (", ".join(f"{k} {_cell(v)}" for k, v in value.items())
                     if isinstance(value, dict) else _cell(value))
            rows.append(f"| multi_gpu.{part} | {cells} |")
    else:
        rows.append(f"| multi_gpu | {multi} |")
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return "\n".join([
        MARKER, "## The simulator against a real GPU", "", f"Command: `{command}` ({when})", "",
        "| field | value |", "|---|---|", *rows, "",
        "Memory in bytes (estimate: `estimate_memory`, 16 B per fp32 Adam parameter plus the "
        "ledger's activations; ledger: the simulator's peak; measured: "
        "`torch.cuda.max_memory_allocated` of the second step). Times in seconds, medians; "
        "simulated on the profile's roofline (its efficiency, memory bandwidth and launch "
        "cost, as the presets use them); implied efficiency = "
        "FLOPs / (measured time x the profile's peak). Bandwidth in GB/s (10^9 bytes/s).",
        MARKER])


def write_section(path: Path, section: str) -> None:
    """Replace (or append) this script's section, between two markers, in ``path``."""
    replace_section(path, MARKER, section)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true",
                        help="CPU, tiny sizes; writes to a temporary file unless --results")
    parser.add_argument("--results", help="Markdown file to write the section into")
    args = parser.parse_args(argv)
    if args.results is None and not args.dry_run:
        parser.error("give --results PATH (or --dry-run)")
    results = check(args.dry_run)
    path = Path(args.results) if args.results else Path(tempfile.mkdtemp()) / "RESULTS.md"
    command = " ".join(["python", "benchmarks/gpu_check.py",
                        *(sys.argv[1:] if argv is None else argv)])
    write_section(path, render(results, command))
    print(path.read_text())
    print(f"written to {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
