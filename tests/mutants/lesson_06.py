"""Plausible wrong answers for lesson 06 (see tests/mutants/__init__.py)."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

import torch

from mpgpu_edu.memory import estimate_memory
from mpgpu_edu.lessons.choosing_and_debugging import phase_seconds


# ---- 6.1 ------------------------------------------------------------------------------------

def choose_ignoring_optimizer_state(n_params: int, cluster: Any, optimizer: str = "adam",
                                    precision: str = "mixed",
                                    activations_bytes: int = 0) -> str:
    """Counts parameters, gradients and activations, but forgets the optimizer state."""
    n = cluster.world_size
    for strategy in (["single"] if n == 1 else ["dp", "zero1", "zero2", "zero3"]):
        per_device = estimate_memory(n_params, optimizer, precision, strategy, n,
                                     activations_bytes).per_device
        if sum(per_device.values()) - per_device["optimizer"] <= cluster.capacity_bytes(0):
            return strategy
    return "none"


def choose_pooling_memory(n_params: int, cluster: Any, optimizer: str = "adam",
                          precision: str = "mixed", activations_bytes: int = 0) -> str:
    """Adds up every card's memory (8 x 24 GiB = 192 GiB) as if it were one budget."""
    n = cluster.world_size
    for strategy in (["single"] if n == 1 else ["dp", "zero1", "zero2", "zero3"]):
        if estimate_memory(n_params, optimizer, precision, strategy, n,
                           activations_bytes).fits(n * cluster.capacity_bytes(0)):
            return strategy
    return "none"


def choose_ignoring_activations(n_params: int, cluster: Any, optimizer: str = "adam",
                                precision: str = "mixed", activations_bytes: int = 0) -> str:
    """Leaves the activations out of the estimate."""
    n = cluster.world_size
    for strategy in (["single"] if n == 1 else ["dp", "zero1", "zero2", "zero3"]):
        if estimate_memory(n_params, optimizer, precision, strategy,
                           n).fits(cluster.capacity_bytes(0)):
            return strategy
    return "none"



def choose_strict_fit(n_params: int, cluster: Any, optimizer: str = "adam",
                      precision: str = "mixed", activations_bytes: int = 0) -> str:
    """Counts a strategy as fitting only when it needs strictly less than a device's
    capacity: an exact fit is turned down."""
    n = cluster.world_size
    for strategy in (["single"] if n == 1 else ["dp", "zero1", "zero2", "zero3"]):
        if estimate_memory(n_params, optimizer, precision, strategy, n,
                           activations_bytes).per_device_total < cluster.capacity_bytes(0):
            return strategy
    return "none"

def choose_always_adam(n_params: int, cluster: Any, optimizer: str = "adam",
                       precision: str = "mixed", activations_bytes: int = 0) -> str:
    """Passes "adam" to the estimator whatever optimizer it is given: SGD's smaller state is
    never counted, so a model that fits plain data parallelism with SGD gets ZeRO."""
    n = cluster.world_size
    for strategy in (["single"] if n == 1 else ["dp", "zero1", "zero2", "zero3"]):
        if estimate_memory(n_params, "adam", precision, strategy, n,
                           activations_bytes).fits(cluster.capacity_bytes(0)):
            return strategy
    return "none"


def choose_ignoring_precision(n_params: int, cluster: Any, optimizer: str = "adam",
                              precision: str = "mixed", activations_bytes: int = 0) -> str:
    """Passes "mixed" to the estimator whatever precision it is given: fp32's full-size
    parameters and gradients are never counted."""
    n = cluster.world_size
    for strategy in (["single"] if n == 1 else ["dp", "zero1", "zero2", "zero3"]):
        if estimate_memory(n_params, optimizer, "mixed", strategy, n,
                           activations_bytes).fits(cluster.capacity_bytes(0)):
            return strategy
    return "none"

# ---- 6.2 ------------------------------------------------------------------------------------

def swap_both_send_first(comm: Any, tensor: torch.Tensor, partner: int) -> torch.Tensor:
    """Both ranks of a pair send first, then receive: each waits for the other (deadlock)."""
    if partner == comm.rank:
        return tensor.clone()
    received = torch.empty_like(tensor)
    comm.send(tensor, partner)
    comm.recv(received, partner)
    return received


def swap_by_parity(comm: Any, tensor: torch.Tensor, partner: int) -> torch.Tensor:
    """Even ranks send first: deadlocks when two even (or two odd) ranks are partners."""
    if partner == comm.rank:
        return tensor.clone()
    received = torch.empty_like(tensor)
    if comm.rank % 2 == 0:
        comm.send(tensor, partner)
        comm.recv(received, partner)
    else:
        comm.recv(received, partner)
        comm.send(tensor, partner)
    return received


def swap_alone_returns_input(comm: Any, tensor: torch.Tensor, partner: int) -> torch.Tensor:
    """Swaps correctly, but a rank without a partner hands back its input tensor itself,
    not a copy: the caller's later in-place changes reach the "result"."""
    if partner == comm.rank:
        return tensor
    received = torch.empty_like(tensor)
    if comm.rank < partner:
        comm.send(tensor, partner)
        comm.recv(received, partner)
    else:
        comm.recv(received, partner)
        comm.send(tensor, partner)
    return received



def swap_with_isend(comm: Any, tensor: torch.Tensor, partner: int) -> torch.Tensor:
    """Posts its send with isend and waits on it: no deadlock, but not the blocking send and
    recv the exercise asks for."""
    if partner == comm.rank:
        return tensor.clone()
    received = torch.empty_like(tensor)
    work = comm.isend(tensor, partner)
    comm.recv(received, partner)
    work.wait()
    return received


def swap_send_never_waited(comm: Any, tensor: torch.Tensor, partner: int) -> torch.Tensor:
    """isend to the partner, recv, and returns without ever waiting on the send."""
    if partner == comm.rank:
        return tensor.clone()
    received = torch.empty_like(tensor)
    comm.isend(tensor, partner)
    comm.recv(received, partner)
    return received


def swap_float32_buffer(comm: Any, tensor: torch.Tensor, partner: int) -> torch.Tensor:
    """Receives into torch.empty(tensor.shape): a float32 buffer whatever the tensor's dtype."""
    if partner == comm.rank:
        return tensor.clone()
    received = torch.empty(tensor.shape)
    if comm.rank < partner:
        comm.send(tensor, partner)
        comm.recv(received, partner)
    else:
        comm.recv(received, partner)
        comm.send(tensor, partner)
    return received


def swap_flat_buffer(comm: Any, tensor: torch.Tensor, partner: int) -> torch.Tensor:
    """Receives into a 1-D buffer of tensor.numel() elements: right for a 1-D tensor only."""
    if partner == comm.rank:
        return tensor.clone()
    received = torch.empty(tensor.numel(), dtype=tensor.dtype)
    if comm.rank < partner:
        comm.send(tensor, partner)
        comm.recv(received, partner)
    else:
        comm.recv(received, partner)
        comm.send(tensor, partner)
    return received


def swap_through_float32(comm: Any, tensor: torch.Tensor, partner: int) -> torch.Tensor:
    """Sends and receives float32 copies, so the result is float32 whatever the input was."""
    if partner == comm.rank:
        return tensor.clone()
    received = torch.empty(tensor.shape)
    if comm.rank < partner:
        comm.send(tensor.float(), partner)
        comm.recv(received, partner)
    else:
        comm.recv(received, partner)
        comm.send(tensor.float(), partner)
    return received


def swap_with_barrier(comm: Any, tensor: torch.Tensor, partner: int) -> torch.Tensor:
    """Swaps correctly, then calls comm.barrier() "to be safe": messages the swap never
    needed."""
    if partner == comm.rank:
        received = tensor.clone()
    else:
        received = torch.empty_like(tensor)
        if comm.rank < partner:
            comm.send(tensor, partner)
            comm.recv(received, partner)
        else:
            comm.recv(received, partner)
            comm.send(tensor, partner)
    comm.barrier()
    return received

def swap_rounded_through_float32(comm: Any, tensor: torch.Tensor, partner: int) -> torch.Tensor:
    """Sends and receives float32 copies and converts the result back to the tensor's dtype:
    the dtype is right, but a float64 tensor loses its last digits on the way."""
    if partner == comm.rank:
        return tensor.clone()
    received = torch.empty(tensor.shape)
    if comm.rank < partner:
        comm.send(tensor.float(), partner)
        comm.recv(received, partner)
    else:
        comm.recv(received, partner)
        comm.send(tensor.float(), partner)
    return received.to(tensor.dtype)

# ---- 6.3 ------------------------------------------------------------------------------------

def _smooth(x: torch.Tensor, from_left: torch.Tensor, from_right: torch.Tensor) -> torch.Tensor:
    padded = torch.cat([from_left, x, from_right])
    return (padded[:-2] + padded[1:-1] + padded[2:]) / 3


def smooth_blocking_sends(comm: Any, block: torch.Tensor, steps: int) -> torch.Tensor:
    """The broken program itself: blocking sends first on every rank (deadlocks)."""
    n, rank = comm.world_size, comm.rank
    left, right = (rank - 1) % n, (rank + 1) % n
    x = block.clone()
    for _ in range(steps):
        comm.send(x[:1].clone(), left)
        comm.send(x[-1:].clone(), right)
        from_left, from_right = torch.empty(1), torch.empty(1)
        comm.recv(from_left, left)
        comm.recv(from_right, right)
        x = _smooth(x, from_left, from_right)
    return x


def _loop(comm: Any, x: torch.Tensor, steps: int,
          exchange: Callable[[Any, torch.Tensor, int, int], tuple[torch.Tensor, torch.Tensor]]
          ) -> torch.Tensor:
    """``steps`` smoothing steps of ``x``, each step's halos from ``exchange(comm, x, left,
    right)`` (one rank: its own edges, no messages)."""
    n, rank = comm.world_size, comm.rank
    for _ in range(steps):
        if n == 1:
            from_left, from_right = x[-1:], x[:1]
        else:
            from_left, from_right = exchange(comm, x, (rank - 1) % n, (rank + 1) % n)
        x = _smooth(x, from_left, from_right)
    return x


def smooth_by_parity(comm: Any, block: torch.Tensor, steps: int) -> torch.Tensor:
    """Even ranks send first, odd ranks receive first: fine on even rings, deadlocks on odd
    ones (ranks N-1 and 0 are both even)."""
    def exchange(comm: Any, x: torch.Tensor, left: int, right: int) -> tuple:
        from_left, from_right = torch.empty(1), torch.empty(1)
        if comm.rank % 2 == 0:
            comm.send(x[:1].clone(), left, tag=1)
            comm.send(x[-1:].clone(), right, tag=2)
            comm.recv(from_left, left, tag=2)
            comm.recv(from_right, right, tag=1)
        else:
            comm.recv(from_left, left, tag=2)
            comm.recv(from_right, right, tag=1)
            comm.send(x[:1].clone(), left, tag=1)
            comm.send(x[-1:].clone(), right, tag=2)
        return from_left, from_right
    return _loop(comm, block.clone(), steps, exchange)


def _isend_both(comm: Any, x: torch.Tensor, left: int, right: int, tags: tuple[int, int],
                receive: Callable[[torch.Tensor, torch.Tensor], None]
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """isend the left edge (tag ``tags[0]``) and the right edge (``tags[1]``), receive into
    two float32 buffers with ``receive(from_left, from_right)``, wait on the sends."""
    from_left, from_right = torch.empty(1), torch.empty(1)
    sends = [comm.isend(x[:1].clone(), left, tag=tags[0]),
             comm.isend(x[-1:].clone(), right, tag=tags[1])]
    receive(from_left, from_right)
    for work in sends:
        work.wait()
    return from_left, from_right


def smooth_without_tags(comm: Any, block: torch.Tensor, steps: int) -> torch.Tensor:
    """isend both edges with one tag, and receives from the left first: with 2 ranks both
    halos come from one peer, matched in the order it sent them, so they arrive swapped."""
    def exchange(comm: Any, x: torch.Tensor, left: int, right: int) -> tuple:
        return _isend_both(comm, x, left, right, (0, 0),
                           lambda fl, fr: (comm.recv(fl, left), comm.recv(fr, right)))
    return _loop(comm, block.clone(), steps, exchange)


def smooth_halos_swapped(comm: Any, block: torch.Tensor, steps: int) -> torch.Tensor:
    """Pads the block with the halos on the wrong sides (left's edge on the right)."""
    def exchange(comm: Any, x: torch.Tensor, left: int, right: int) -> tuple:
        from_left, from_right = _isend_both(
            comm, x, left, right, (1, 2),
            lambda fl, fr: (comm.recv(fl, left, tag=2), comm.recv(fr, right, tag=1)))
        return from_right, from_left
    return _loop(comm, block.clone(), steps, exchange)


def smooth_chain(comm: Any, block: torch.Tensor, steps: int) -> torch.Tensor:
    """Rank 0 receives first, every other rank sends first: no deadlock, but every step
    waits for a chain of messages around the whole ring."""
    def exchange(comm: Any, x: torch.Tensor, left: int, right: int) -> tuple:
        from_left, from_right = torch.empty(1), torch.empty(1)
        if comm.rank == 0:  # each direction: a chain of blocking sends that rank 0 unblocks
            comm.recv(from_left, left, tag=2)
            comm.send(x[-1:].clone(), right, tag=2)
            comm.recv(from_right, right, tag=1)
            comm.send(x[:1].clone(), left, tag=1)
        else:
            comm.send(x[-1:].clone(), right, tag=2)
            comm.recv(from_left, left, tag=2)
            comm.send(x[:1].clone(), left, tag=1)
            comm.recv(from_right, right, tag=1)
        return from_left, from_right
    return _loop(comm, block.clone(), steps, exchange)


def smooth_through_rank_0(comm: Any, block: torch.Tensor, steps: int) -> torch.Tensor:
    """Gathers every block on rank 0, smooths there and sends the blocks back: right values,
    but whole blocks travel instead of one element per neighbour."""
    n, rank = comm.world_size, comm.rank
    lengths = [torch.zeros(1, dtype=torch.int64) for _ in range(n)]
    if rank == 0:
        lengths[0][0] = len(block)
        for r in range(1, n):
            comm.recv(lengths[r], r, tag=5)
        parts = [block.clone()] + [torch.empty(int(lengths[r])) for r in range(1, n)]
        for r in range(1, n):
            comm.recv(parts[r], r, tag=6)
        x = torch.cat(parts)
        for _ in range(steps):
            x = (torch.roll(x, 1) + x + torch.roll(x, -1)) / 3
        pieces = torch.split(x, [len(p) for p in parts])
        for r in range(1, n):
            comm.send(pieces[r].clone(), r, tag=7)
        return pieces[0].clone()
    comm.send(torch.tensor([len(block)]), 0, tag=5)
    comm.send(block.clone(), 0, tag=6)
    out = torch.empty_like(block)
    comm.recv(out, 0, tag=7)
    return out



def _halo_step(comm: Any, x: torch.Tensor, wait: bool = True,
               halo: Any = torch.empty_like) -> tuple[torch.Tensor, torch.Tensor]:
    """The two halos of one step (as the solution exchanges them); ``wait=False`` leaves the
    sends unwaited, ``halo`` makes the receive buffers."""
    n, rank = comm.world_size, comm.rank
    if n == 1:
        return x[-1:].clone(), x[:1].clone()
    left, right = (rank - 1) % n, (rank + 1) % n
    from_left, from_right = halo(x[:1]), halo(x[:1])
    sends = [comm.isend(x[:1].clone().to(from_left.dtype), left, tag=1),
             comm.isend(x[-1:].clone().to(from_left.dtype), right, tag=2)]
    comm.recv(from_right, right, tag=1)
    comm.recv(from_left, left, tag=2)
    if wait:
        for work in sends:
            work.wait()
    return from_left, from_right


def smooth_in_place(comm: Any, block: torch.Tensor, steps: int) -> torch.Tensor:
    """Smooths the caller's block itself, in place, and returns it: no new tensor."""
    x = block
    for _ in range(steps):
        from_left, from_right = _halo_step(comm, x)
        x.copy_(_smooth(x, from_left, from_right))
    return x


def smooth_overwrites_block(comm: Any, block: torch.Tensor, steps: int) -> torch.Tensor:
    """Returns a new tensor, but writes every step's values into the caller's block too."""
    for _ in range(steps):
        from_left, from_right = _halo_step(comm, block)
        block[:] = _smooth(block, from_left, from_right)
    return block.clone()


def smooth_sends_never_waited(comm: Any, block: torch.Tensor, steps: int) -> torch.Tensor:
    """isend both edges and receives the halos, but never waits on the sends."""
    x = block.clone()
    for _ in range(steps):
        from_left, from_right = _halo_step(comm, x, wait=False)
        x = _smooth(x, from_left, from_right)
    return x


def smooth_float32_halos(comm: Any, block: torch.Tensor, steps: int) -> torch.Tensor:
    """Receives the halos into torch.empty(1): float32 buffers whatever the block's dtype."""
    def exchange(comm: Any, x: torch.Tensor, left: int, right: int) -> tuple:
        return _isend_both(comm, x, left, right, (1, 2),
                           lambda fl, fr: (comm.recv(fr, right, tag=1),
                                           comm.recv(fl, left, tag=2)))
    return _loop(comm, block.clone(), steps, exchange)


def smooth_halos_through_float32(comm: Any, block: torch.Tensor, steps: int) -> torch.Tensor:
    """Sends and receives the halos as float32: a float64 block is smoothed with rounded
    halos (the result's dtype is right, its last digits are not)."""
    x = block.clone()
    for _ in range(steps):
        from_left, from_right = _halo_step(
            comm, x, halo=lambda edge: torch.empty(1, dtype=torch.float32))
        x = _smooth(x, from_left, from_right)
    return x


def smooth_all_float32(comm: Any, block: torch.Tensor, steps: int) -> torch.Tensor:
    """Converts the block to float32 first: a float64 block comes back float32."""
    x = block.float()
    for _ in range(steps):
        from_left, from_right = _halo_step(comm, x)
        x = _smooth(x, from_left, from_right)
    return x


def smooth_with_barrier(comm: Any, block: torch.Tensor, steps: int) -> torch.Tensor:
    """The right exchange, plus a comm.barrier() every step: every rank then waits for all
    the others, and its empty messages are traffic a step never needed."""
    x = block.clone()
    for _ in range(steps):
        from_left, from_right = _halo_step(comm, x)
        comm.barrier()
        x = _smooth(x, from_left, from_right)
    return x

def smooth_zero_steps_returns_block(comm: Any, block: torch.Tensor, steps: int) -> torch.Tensor:
    """Right for one step or more, but with 0 steps hands back the caller's block itself,
    not a new tensor."""
    if steps == 0:
        return block
    x = block.clone()
    for _ in range(steps):
        from_left, from_right = _halo_step(comm, x)
        x = _smooth(x, from_left, from_right)
    return x

# ---- 6.4 ------------------------------------------------------------------------------------

def straggler_longest_waiter(logs: list[list[str]]) -> tuple[int, float]:
    """Names the rank that waited longest in the all-reduces: a victim of the straggler."""
    phases = phase_seconds(logs)
    waits = [p["wait"] for p in phases]
    rank = max(range(len(waits)), key=waits.__getitem__)
    totals = [p["compute"] for p in phases]
    return rank, totals[rank] - statistics.median(totals)


def straggler_first_step_only(logs: list[list[str]]) -> tuple[int, float]:
    """Reads step 0 only: the right rank, but its delay over the whole run is wrong."""
    firsts = phase_seconds([[line for line in lines if "step 0:" in line] for lines in logs])
    totals = [p["compute"] for p in firsts]
    rank = max(range(len(totals)), key=totals.__getitem__)
    return rank, totals[rank] - statistics.median(totals)


def straggler_against_the_mean(logs: list[list[str]]) -> tuple[int, float]:
    """Compares with the mean of all ranks (which the straggler itself pulls up), not the
    median rank."""
    totals = [p["compute"] for p in phase_seconds(logs)]
    rank = max(range(len(totals)), key=totals.__getitem__)
    return rank, totals[rank] - statistics.mean(totals)


def straggler_last_to_start_step(logs: list[list[str]]) -> tuple[int, float]:
    """Counts time from the start of the run to each rank's last "compute done": every rank
    ends near the same time, so the delay is lost."""
    totals = []
    for lines in logs:
        done = [float(line[1:line.index("ms]")]) / 1e3 for line in lines
                if "compute done" in line]
        totals.append(done[-1])
    rank = max(range(len(totals)), key=totals.__getitem__)
    return rank, totals[rank] - statistics.median(totals)



def straggler_least_waiter(logs: list[list[str]]) -> tuple[int, float]:
    """Reads the waits instead of the compute: names the rank that waited least in the
    all-reduces, and how much less than the median rank it waited."""
    waits = [p["wait"] for p in phase_seconds(logs)]
    rank = min(range(len(waits)), key=waits.__getitem__)
    return rank, statistics.median(waits) - waits[rank]


def straggler_seconds_from_waits(logs: list[list[str]]) -> tuple[int, float]:
    """The right rank, but its seconds are how much less it waited than the median rank, not
    how much longer it computed."""
    phases = phase_seconds(logs)
    totals = [p["compute"] for p in phases]
    waits = [p["wait"] for p in phases]
    rank = max(range(len(totals)), key=totals.__getitem__)
    return rank, statistics.median(waits) - waits[rank]


def straggler_counting_time_between_steps(logs: list[list[str]]) -> tuple[int, float]:
    """Times each step's compute from the end of the previous all-reduce (or the start of the
    run), so time a rank spends between steps counts as compute."""
    totals = []
    for lines in logs:
        since, total = 0.0, 0.0
        for line in lines:
            stamp = float(line[1:line.index("ms]")]) / 1e3
            if "compute done" in line:
                total += stamp - since
            elif "all-reduce done" in line:
                since = stamp
        totals.append(total)
    rank = max(range(len(totals)), key=totals.__getitem__)
    return rank, totals[rank] - statistics.median(totals)


def straggler_ties_to_highest(logs: list[list[str]]) -> tuple[int, float]:
    """Right totals, but on a tie it names the highest of the equally slow ranks."""
    totals = [p["compute"] for p in phase_seconds(logs)]
    rank = max(range(len(totals)), key=lambda r: (totals[r], r))
    return rank, totals[rank] - statistics.median(totals)


def straggler_delay_per_all_reduce(logs: list[list[str]]) -> tuple[int, float]:
    """Sums, step by step, how much later than the next slowest rank it finished computing
    (how long it held up each all-reduce), not its total over the median rank's."""
    per_step = []
    for lines in logs:
        steps: dict[int, float] = {}
        for line in lines:
            stamp = float(line[1:line.index("ms]")]) / 1e3
            step = line.split("step ")[1].split(":")[0] if "step " in line else None
            if "compute start" in line:
                steps[int(step)] = -stamp
            elif "compute done" in line:
                steps[int(step)] += stamp
        per_step.append(steps)
    totals = [sum(steps.values()) for steps in per_step]
    rank = max(range(len(totals)), key=totals.__getitem__)
    delay = 0.0
    for step in per_step[rank]:
        others = [steps[step] for r, steps in enumerate(per_step) if r != rank]
        delay += per_step[rank][step] - max(others, default=per_step[rank][step])
    return rank, delay

def _compute_per_step(lines: list[str], stamp_of: Any) -> list[float]:
    """Each step's compute ("compute start" to "compute done") of one rank's log, in seconds,
    with ``stamp_of(line)`` reading a line's time stamp in milliseconds."""
    started: dict[str, float] = {}
    out = []
    for line in lines:
        step, _, text = line[line.index("ms]") + 4:].partition(": ")
        if text == "compute start":
            started[step] = stamp_of(line) / 1e3
        elif text.startswith("compute done"):
            out.append(stamp_of(line) / 1e3 - started[step])
    return out


def straggler_slowest_step(logs: list[list[str]]) -> tuple[int, float]:
    """Names the rank with the slowest single step, not the most compute summed over the
    run; its seconds are that rank's total over the median rank's."""
    per_step = [_compute_per_step(lines, lambda line: float(line[1:line.index("ms]")]))
                for lines in logs]
    slowest = [max(steps) for steps in per_step]
    rank = max(range(len(slowest)), key=slowest.__getitem__)
    totals = [sum(steps) for steps in per_step]
    return rank, totals[rank] - statistics.median(totals)


def straggler_split_on_spaces(logs: list[list[str]]) -> tuple[int, float]:
    """Reads a time stamp as ``float(line.split()[1])``: right while the stamps have a space
    after "[", a ValueError from 10 000 ms on ("[12600.0000 ms]")."""
    totals = [sum(_compute_per_step(lines, lambda line: float(line.split()[1])))
              for lines in logs]
    rank = max(range(len(totals)), key=totals.__getitem__)
    return rank, totals[rank] - statistics.median(totals)

MUTANTS: dict[str, list[str]] = {
    "6.1": ["choose_ignoring_optimizer_state", "choose_pooling_memory",
            "choose_ignoring_activations", "choose_strict_fit", "choose_always_adam",
            "choose_ignoring_precision"],
    "6.2": ["swap_both_send_first", "swap_by_parity", "swap_alone_returns_input",
            "swap_with_isend", "swap_send_never_waited", "swap_float32_buffer",
            "swap_flat_buffer", "swap_through_float32", "swap_with_barrier",
            "swap_rounded_through_float32"],
    "6.3": ["smooth_blocking_sends", "smooth_by_parity", "smooth_without_tags",
            "smooth_halos_swapped", "smooth_chain", "smooth_through_rank_0", "smooth_in_place",
            "smooth_overwrites_block", "smooth_sends_never_waited", "smooth_float32_halos",
            "smooth_halos_through_float32", "smooth_all_float32", "smooth_with_barrier",
            "smooth_zero_steps_returns_block"],
    "6.4": ["straggler_longest_waiter", "straggler_first_step_only",
            "straggler_against_the_mean", "straggler_last_to_start_step",
            "straggler_least_waiter", "straggler_seconds_from_waits",
            "straggler_counting_time_between_steps", "straggler_ties_to_highest",
            "straggler_delay_per_all_reduce", "straggler_slowest_step",
            "straggler_split_on_spaces"],
}
