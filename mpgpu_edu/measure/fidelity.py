"""How close the simulator comes to published measurements: the rows of ``docs/fidelity.md``.

Each ``Row`` names a cluster preset, what is simulated (a large-message all-reduce's bus
bandwidth, a small message's latency, the model FLOP utilisation of a large GEMM, the DRAM
bandwidth one streaming kernel reaches, or a whole training step), the
published number it is compared with and where that number comes from, and whether that
number SET a parameter of the model (``kind="calibration"``: agreement then only shows the
wiring passes the parameter through) or did not (``kind="validation"``). ``published=None``
marks a gap: no published measurement was found for that preset, and the row says so.
``kind="other-config"`` marks a measurement taken on a configuration the preset does not
model (shown in the table, checked neither way; ``known_miss`` says how it differs).

Bandwidth rows model NCCL's ring as NCCL runs it (``collectives.nccl_ring``): 24 channels on
one node, one ring per NIC rail on two, chunks of NCCL's 2 MiB pipelined, the reduction done
inside the copy; not the course's step-by-step ``all_reduce_ring``. The flat two-node rows
run one pipelined ring (``ring_fast.RingAllReduce``) through one NIC.

The rows themselves are data, in ``mpgpu_edu.measure.fidelity_rows`` (importable from here too).
``simulate(row)`` recomputes the simulated number with the package; ``tests/test_fidelity.py``
checks every compared row against its tolerance, and that the table in ``docs/fidelity.md`` is
``render_table()``'s output. Rows whose error is outside the tolerance today carry
``known_miss`` (why); the test expects them to miss, so that a change of the model that fixes
(or breaks) one is noticed.

Bus bandwidth as nccl-tests defines it for all-reduce: ``busbw = 2 (N - 1) / N * S / t``.
"""

from __future__ import annotations

from functools import lru_cache

from mpgpu_edu.measure.fidelity_rows import (  # noqa: F401 - the rows are public here too
    BANDWIDTH_TOLERANCE, GB, GIB, MIB, NCCL_CHUNK_BYTES, ROWS, STEP_ROWS, Row)

# GPT-3 175B: hidden 12288, MLP 4 x hidden; a micro-batch of one 2048-token sequence.
GEMM_M, GEMM_K, GEMM_N = 2048, 12288, 4 * 12288


def rows_for(preset: str) -> list[Row]:
    return [row for row in ROWS if row.preset == preset]


@lru_cache(maxsize=None)
def simulate(row: Row) -> float:
    """The simulated number of ``row``, from the package (same unit as ``row.published``)."""
    import torch

    from mpgpu_edu.cluster import Cluster
    from mpgpu_edu.collectives import all_reduce, cost
    from mpgpu_edu.collectives.multichannel import rail_rings
    from mpgpu_edu.collectives.nccl_ring import all_reduce_nccl
    from mpgpu_edu.collectives.ring_fast import RingAllReduce
    from mpgpu_edu.comm import launch

    cluster = Cluster.preset(row.preset)
    if row.quantity == "step":
        from mpgpu_edu.estimate import StepSetup, simulate_step

        report, _ = simulate_step(StepSetup(cluster=row.preset, **dict(row.step)))
        return report["step_s"]
    if row.quantity == "mfu":
        flops = 2.0 * GEMM_M * GEMM_K * GEMM_N
        nbytes = 2 * (GEMM_M * GEMM_K + GEMM_K * GEMM_N + GEMM_M * GEMM_N)  # bf16
        seconds = cluster.op_seconds(flops, nbytes, "bf16")
        return flops / (seconds * cluster.gpu.peak_flops["bf16"])
    if row.quantity == "membw":
        # One kernel that streams row.nbytes through DRAM (no FLOPs): the bandwidth it
        # reaches, launch included, as a benchmark that times the kernel would report.
        return row.nbytes / cluster.op_seconds(0.0, row.nbytes, "fp32")
    if row.quantity == "latency":
        def pingpong(comm, nbytes):
            t = torch.empty(nbytes, dtype=torch.uint8, device="meta")
            if comm.rank == 0:
                comm.isend(t, 1).wait()
            else:
                comm.irecv(t, 0).wait()

        return launch(pingpong, cluster.with_visible("0,1"), row.nbytes).trace.makespan
    numel = row.nbytes // 4  # fp32, as all_reduce_perf's default
    n = cluster.world_size
    if row.algo in ("nccl", "nccl_rails"):
        rings = rail_rings(2, n // 2) if row.algo == "nccl_rails" else None

        def program(comm):
            all_reduce_nccl(comm, torch.empty(numel, device="meta"), rings=rings)
    elif row.algo == "ring_pipelined":
        segment = NCCL_CHUNK_BYTES if row.segment_bytes is None else row.segment_bytes

        def program(comm):
            RingAllReduce(segment_bytes=segment)(comm, torch.empty(numel, device="meta"))
    else:
        def program(comm):
            all_reduce(comm, torch.empty(numel, device="meta"), algo=row.algo)

    seconds = launch(program, cluster).trace.makespan
    return cost.busbw(row.nbytes, seconds, n)


def relative_error(row: Row) -> float | None:
    """(simulated - published) / published, or None for a gap."""
    if row.published is None:
        return None
    return (simulate(row) - row.published) / row.published


def _fmt(quantity: str, value: float | None) -> str:
    if value is None:
        return "-"
    if quantity in ("busbw", "membw"):
        return f"{value / GB:.1f} GB/s"
    if quantity == "latency":
        return f"{value * 1e6:.1f} us"
    if quantity == "step":
        return f"{value:.3f} s"
    return f"{value:.3f}"


def render_table() -> str:
    """The Markdown table of ``docs/fidelity.md``, computed now."""
    lines = ["| preset | simulated setup | simulated | published | source | rel. error | "
             "tolerance | row kind (what the point set) | within? |",
             "|---|---|---|---|---|---|---|---|---|"]
    for row in ROWS:
        sim = None if row.published is None else simulate(row)
        err = relative_error(row)
        if err is None:
            within = "gap: no measurement"
        elif row.kind == "other-config":
            within = "n/a: other configuration"
        elif abs(err) <= row.tolerance:
            within = "yes"
        else:
            within = "**no**"
        lines.append(
            f"| {row.preset} | {row.setup} | {_fmt(row.quantity, sim)} | "
            f"{_fmt(row.quantity, row.published)}: {row.published_text} | {row.source} | "
            f"{'-' if err is None else f'{err:+.1%}'} | ±{row.tolerance:.0%} | "
            f"{row.kind}: {row.sets} | {within} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(render_table())
