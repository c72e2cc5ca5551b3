"""Lesson 06's demos: the comparison table of the four strategies, and programs that go wrong.

The table's numbers are ``mpgpu_edu.estimate.choosing``'s (``Setting``, ``strategy_rows``,
what each strategy assumes), its HTML, text and figure ``mpgpu_edu.viz.choosing``'s; the
debugging figures (``plot_wait_for``, ``plot_smoothing``) ``mpgpu_edu.viz.debugging``'s.

The programs that go wrong, all SPMD and importable (gloo workers import them by name):
``both_send_first`` (deadlocks), ``straggler`` (logs; one slow rank), ``bad_shard`` (one rank
raises), ``forgot_to_send`` (a rank waits forever). For the debugging capstones:
``smooth_ring_broken`` (a halo exchange around a ring that deadlocks on every world size) and
``straggler_steps`` (several steps, one slow rank, per-rank logs to read).
"""

from __future__ import annotations

import re
from collections.abc import Callable

import torch

from mpgpu_edu.cluster import Cluster
from mpgpu_edu.collectives import all_reduce
from mpgpu_edu.comm import Communicator, LaunchResult
from mpgpu_edu.estimate.choosing import Setting, fewest_devices, strategy_rows
from mpgpu_edu.memory import estimate_memory, spec_params
from mpgpu_edu.viz.choosing import (comparison_html, comparison_text, describe_setting,
                                    memory_table, plot_comparison)
from mpgpu_edu.viz.debugging import plot_smoothing, plot_wait_for
from mpgpu_edu.viz.palette import format_bytes

__all__ = ["Setting", "format_bytes", "bad_shard", "both_send_first", "comparison_html",
           "comparison_text", "describe_setting", "estimate_memory", "fewest_devices",
           "find_straggler_reference", "forgot_to_send", "longest_waiter", "memory_table",
           "phase_seconds", "plot_comparison", "plot_smoothing", "plot_wait_for", "run_smoothing",
           "run_straggler", "smooth_on_one_device", "smooth_ring_broken", "smooth_ring_reference",
           "spec_params", "spike_blocks", "straggler", "straggler_cluster", "straggler_steps",
           "strategy_rows"]


# ---- programs that go wrong ------------------------------------------------------------------

def both_send_first(comm: Communicator) -> torch.Tensor:
    """Two ranks swap a tensor, each with a blocking send first: each waits in ``send`` for
    the other to receive, so neither ever does (a deadlock)."""
    other = 1 - comm.rank
    mine, theirs = torch.full((4,), float(comm.rank)), torch.empty(4)
    comm.send(mine, other)
    comm.recv(theirs, other)
    return theirs


def straggler(comm: Communicator, slow_rank: int, step_seconds: float = 0.02) -> float:
    """One step on every rank: compute, then an all-reduce of a small result. ``slow_rank``
    computes three times longer (a slower card, a busy data loader); everyone else waits for
    it in the all-reduce. Each rank logs what it does. Returns the all-reduced sum."""
    seconds = step_seconds * (3 if comm.rank == slow_rank else 1)
    comm.log(f"start: my step will take {seconds * 1e3:.0f} ms")
    with comm.compute("forward", "step", seconds=seconds):  # real processes sleep it out
        result = torch.tensor([float(comm.rank)], device=comm.device)
    comm.log("computed; entering the all-reduce")
    all_reduce(comm, result)
    comm.log(f"all-reduce done: sum of ranks = {result.item():g}")
    return result.item()


def bad_shard(comm: Communicator, bad_rank: int = 2) -> float:
    """Every rank multiplies its data shard (4 samples x 8 features) by the same weights,
    then all-reduces the result; ``bad_rank``'s shard has 7 features (a malformed file), so
    its matmul raises and only that rank's traceback says why."""
    features = 7 if comm.rank == bad_rank else 8
    comm.log(f"loaded my shard: 4 samples x {features} features")
    shard, weights = torch.ones(4, features), torch.ones(8, 2)
    out = (shard @ weights).sum().reshape(1)
    all_reduce(comm, out)
    return out.item()


def forgot_to_send(comm: Communicator) -> None:
    """Rank 0 waits for a tensor from rank 1; rank 1 sends only ``if comm.rank == 2`` (a typo
    for 1), so it finishes without sending and rank 0 waits forever."""
    if comm.rank == 0:
        comm.log("waiting for rank 1's tensor")
        got = torch.empty(4)
        comm.recv(got, 1)
    elif comm.rank == 2:  # the bug: meant comm.rank == 1
        comm.send(torch.ones(4), 0)
    comm.log("done")


# ---- the debugging capstones: a halo exchange that deadlocks, and a straggler -----------------

def smooth_ring_broken(comm: Communicator, block: torch.Tensor, steps: int) -> torch.Tensor:
    """Smooth a ring-shaped array, ``steps`` times, spread over the ranks: the array is every
    rank's ``block`` in rank order, and its ends touch (after the last element of rank N-1
    comes the first of rank 0). One step replaces every element by the mean of itself and its
    two neighbours, so a rank needs one element from each neighbouring rank (its *halo*).

    The bug: each rank first sends its edges with blocking sends, then receives. Every rank
    waits in its first send for its left neighbour to receive, and that neighbour waits in
    its own send: a cycle around the whole ring."""
    n, rank = comm.world_size, comm.rank
    left, right = (rank - 1) % n, (rank + 1) % n
    x = block.clone()
    for step in range(steps):
        comm.log(f"step {step}: sending my edges to ranks {left} and {right}")
        comm.send(x[:1].clone(), left)
        comm.send(x[-1:].clone(), right)
        from_left, from_right = torch.empty(1), torch.empty(1)
        comm.recv(from_left, left)
        comm.recv(from_right, right)
        comm.log(f"step {step}: got both halos")
        padded = torch.cat([from_left, x, from_right])
        x = (padded[:-2] + padded[1:-1] + padded[2:]) / 3
    return x


def smooth_ring_reference(comm: Communicator, block: torch.Tensor,
                          steps: int) -> torch.Tensor:
    """The package's halo exchange that cannot deadlock (what a demo runs until yours passes):
    both edges in flight at once, directions told apart by tag."""
    n, rank = comm.world_size, comm.rank
    left, right = (rank - 1) % n, (rank + 1) % n
    x = block.clone()
    for _ in range(steps):
        if n == 1:
            from_left, from_right = x[-1:].clone(), x[:1].clone()
        else:
            from_left, from_right = torch.empty_like(x[:1]), torch.empty_like(x[:1])
            sends = [comm.isend(x[:1].clone(), left, tag=1),
                     comm.isend(x[-1:].clone(), right, tag=2)]
            comm.recv(from_left, left, tag=2)
            comm.recv(from_right, right, tag=1)
            for work in sends:
                work.wait()
        padded = torch.cat([from_left, x, from_right])
        x = (padded[:-2] + padded[1:-1] + padded[2:]) / 3
    return x


def smooth_on_one_device(blocks: list[torch.Tensor], steps: int) -> list[torch.Tensor]:
    """The oracle: the same smoothing on the whole array at once, split back into blocks."""
    x = torch.cat(blocks).double()
    for _ in range(steps):
        x = (torch.roll(x, 1) + x + torch.roll(x, -1)) / 3
    return [part.float() for part in torch.split(x, [len(b) for b in blocks])]


def spike_blocks(world_size: int, length: int) -> list[torch.Tensor]:
    """A ring of ``world_size * length`` zeros with one spike of 1 in the middle of rank 0's
    block, cut into equal blocks: smoothing spreads the spike over the ranks."""
    blocks = [torch.zeros(length) for _ in range(world_size)]
    blocks[0][length // 2] = 1.0
    return blocks


def run_smoothing(fn: Callable[..., torch.Tensor], blocks: list[torch.Tensor],
                  steps: int) -> torch.Tensor:
    """The whole smoothed array after ``steps`` steps of ``fn`` on ``len(blocks)`` ranks."""
    from mpgpu_edu.comm import launch

    cluster = Cluster.uniform(len(blocks), alpha_s=1e-5, beta_Bps=1e9)
    result = launch(lambda comm: fn(comm, blocks[comm.rank].clone(), steps), cluster)
    return torch.cat(result.results)


def straggler_steps(comm: Communicator, slow_rank: int, steps: int = 3,
                    step_seconds: float = 0.02, slowdown: tuple[float, ...] = (3.0,),
                    grad_numel: int = 1 << 20) -> None:
    """``steps`` training steps on every rank: compute, then a ring all-reduce of
    ``grad_numel`` fp32 gradients (a meta tensor: timed, never allocated). A rank's compute
    takes ``step_seconds`` give or take 10% (ranks are never exactly alike);
    ``slow_rank``'s is ``slowdown[step % len(slowdown)]`` times longer (a slower card, a data
    loader that falls behind). Every rank logs when its compute starts and ends and when the
    all-reduce is done; rank 0 also logs the step's end."""
    grads = torch.empty(grad_numel, dtype=torch.float32, device="meta")
    for step in range(steps):
        seconds = step_seconds * (1 + 0.1 * ((3 * comm.rank + 5 * step) % 7) / 6)
        if comm.rank == slow_rank:
            seconds *= slowdown[step % len(slowdown)]
        comm.log(f"step {step}: compute start")
        with comm.compute("forward", f"step {step}", seconds=seconds):
            pass
        comm.log(f"step {step}: compute done, waiting in all-reduce")
        all_reduce(comm, grads, op="mean", algo="ring")
        comm.log(f"step {step}: all-reduce done")
        if comm.rank == 0:
            comm.log(f"step {step}: gradients averaged over {comm.world_size} ranks")


def straggler_cluster(world_size: int) -> Cluster:
    """The cluster the straggler runs on: the textbook ``Cluster.uniform``, every device its
    own port at 10 us and 1 GB/s, additions free, so the logs show the straggler alone."""
    return Cluster.uniform(world_size, alpha_s=1e-5, beta_Bps=1e9)


def run_straggler(world_size: int, slow_rank: int, steps: int = 3,
                  slowdown: tuple[float, ...] = (3.0,)) -> LaunchResult:
    """``straggler_steps`` on ``straggler_cluster(world_size)``."""
    from mpgpu_edu.comm import launch

    return launch(straggler_steps, straggler_cluster(world_size), slow_rank, steps,
                  slowdown=slowdown)


_STAMP = re.compile(r"^\[\s*([0-9.]+) ms\] step (\d+): compute (start|done)")


def phase_seconds(logs: list[list[str]]) -> list[dict[str, float]]:
    """Per rank, from its log alone: total ``compute`` (compute start to compute done) and
    total ``wait`` (compute done to all-reduce done) over every step, in seconds."""
    out = []
    for lines in logs:
        stamps: dict[tuple[int, str], float] = {}
        done_at: dict[int, float] = {}
        for line in lines:
            match = _STAMP.match(line)
            if match:
                stamps[(int(match[2]), match[3])] = float(match[1]) / 1e3
            elif "all-reduce done" in line:
                done_at[int(line.split("step ")[1].split(":")[0])] = float(
                    line[1:line.index("ms]")]) / 1e3
        steps = sorted({step for step, _ in stamps})
        compute = sum(stamps[(s, "done")] - stamps[(s, "start")] for s in steps)
        wait = sum(done_at[s] - stamps[(s, "done")] for s in steps if s in done_at)
        out.append({"compute": compute, "wait": wait})
    return out


def find_straggler_reference(logs: list[list[str]]) -> tuple[int, float]:
    """The package's answer to exercise 6.4 (what a demo runs until yours passes)."""
    import statistics

    totals = [phases["compute"] for phases in phase_seconds(logs)]
    slow = max(range(len(totals)), key=totals.__getitem__)
    return slow, totals[slow] - statistics.median(totals)


def longest_waiter(logs: list[list[str]]) -> int:
    """The rank that waited longest in the all-reduces: a victim, not the culprit."""
    waits = [phases["wait"] for phases in phase_seconds(logs)]
    return max(range(len(waits)), key=waits.__getitem__)
