"""Closed forms: how long each collective takes, and how many bytes it moves.

The model (alpha-beta, Hockney 1994): one message of ``nbytes`` between two devices takes
``alpha + nbytes / beta`` seconds, ``alpha`` the latency (s) and ``beta`` the bandwidth (B/s).
The forms assume the uniform topology of ``Cluster.uniform(n, alpha_s, beta_Bps)``: each
device has its own port out and its own port in, so messages with distinct senders and
distinct receivers run side by side. On that cluster the simulator gives exactly these
numbers (tests check it to 1e-9). Where messages share a cap (host memory behind staged PCIe
copies, a PCIe switch's uplink) they divide its bandwidth: ``staged_*`` below give the forms
for k concurrent messages each getting ``min(beta, C / k)``; the gap to the forms above is
contention. ``rail_ring_allreduce_time`` is the multi-channel ring over NIC rails;
``hierarchical_allreduce_time`` and ``flat_ring_two_level_time`` are the hierarchical
all-reduce and one flat ring on nodes with two link classes (NVLink inside, NICs between).

Conventions:
- ``n`` ranks, ``nbytes`` (S) the size of the tensor each rank holds.
- Additions (and the division of a mean) cost zero simulated time: the collectives open no
  compute regions, so only messages take time.
- A message of 0 bytes still costs ``alpha``.

Derivations, with ``m = alpha + S / beta`` the time of one whole-tensor message:
- linear broadcast / reduce: the root sends (receives) N - 1 messages one after another:
  ``(N - 1) m``.
- naive all-reduce = linear reduce + linear broadcast: ``2 (N - 1) m``.
- binomial tree, ``k = ceil(log2 N)``: the root receives from ranks 1, 2, 4, ..., 2^(k-1)
  in turn (all exist, as 2^(k-1) < N), and rank 2^j has finished its own subtree (of
  height j) by the time the root asks, so the root is never kept waiting: the reduce takes
  exactly ``k m`` for *every* N, powers of two or not; the broadcast mirrors it. Tree
  all-reduce: ``2 k m``.
- ring: 2 (N - 1) steps, in each every rank sends one chunk of S / N bytes to its right
  neighbour: ``2 (N - 1) (alpha + S / (N beta))``. When N does not divide the element count
  the chunks differ by one element and the simulator is slightly (at most one element per
  step) slower than this form.

Bandwidth figures follow nccl-tests (NVIDIA, ``doc/PERFORMANCE.md``): ``algbw = S / t``, and
for all-reduce ``busbw = algbw * 2 (N - 1) / N``, which is the per-link bandwidth the ring
achieved, so it can be compared with the hardware's link speed whatever N is.
"""

from __future__ import annotations

from collections.abc import Callable


def ceil_log2(n: int) -> int:
    """Rounds of a binomial tree on ``n`` ranks: ``ceil(log2 n)``, computed exactly."""
    _check_n(n)
    return (n - 1).bit_length()


def message_time(nbytes: float, alpha_s: float, beta_Bps: float) -> float:
    """One message: ``alpha + S / beta``."""
    return alpha_s + nbytes / beta_Bps


def bus_bandwidth(nbytes: float, world_size: int, seconds: float) -> float:
    """nccl-tests' bus bandwidth of an all-reduce: ``S / t x 2(N - 1) / N``, the rate each
    rank's link must carry, comparable across N (and the link's bandwidth for an ideal
    ring)."""
    return nbytes / seconds * 2 * (world_size - 1) / world_size


def broadcast_time(n: int, nbytes: float, alpha_s: float, beta_Bps: float) -> float:
    """Linear broadcast (``basic.broadcast``): ``(N - 1)(alpha + S / beta)``."""
    _check_n(n)
    return (n - 1) * message_time(nbytes, alpha_s, beta_Bps)


def reduce_time(n: int, nbytes: float, alpha_s: float, beta_Bps: float) -> float:
    """Linear reduce (``basic.reduce``): ``(N - 1)(alpha + S / beta)``."""
    return broadcast_time(n, nbytes, alpha_s, beta_Bps)


def gather_time(n: int, nbytes: float, alpha_s: float, beta_Bps: float) -> float:
    """Linear gather (and scatter) of ``nbytes`` per rank: ``(N - 1)(alpha + s / beta)``."""
    return broadcast_time(n, nbytes, alpha_s, beta_Bps)


def tree_broadcast_time(n: int, nbytes: float, alpha_s: float, beta_Bps: float) -> float:
    """Binomial-tree broadcast (``basic.broadcast_tree``): ``ceil(log2 N)(alpha + S / beta)``.
    ``tree_reduce_time`` is the same."""
    return ceil_log2(n) * message_time(nbytes, alpha_s, beta_Bps)


def tree_reduce_time(n: int, nbytes: float, alpha_s: float, beta_Bps: float) -> float:
    """Binomial-tree reduce (``basic.reduce_tree``): ``ceil(log2 N)(alpha + S / beta)``."""
    return tree_broadcast_time(n, nbytes, alpha_s, beta_Bps)


def ring_reduce_scatter_time(n: int, nbytes: float, alpha_s: float, beta_Bps: float) -> float:
    """Ring reduce-scatter of an S-byte tensor: ``(N - 1)(alpha + S / (N beta))``.
    Ring all-gather with an S-byte *output* (S / N bytes from each rank) is the same."""
    _check_n(n)
    return (n - 1) * message_time(nbytes / n, alpha_s, beta_Bps)


def ring_all_gather_time(n: int, nbytes: float, alpha_s: float, beta_Bps: float) -> float:
    """Ring all-gather whose output has S bytes: ``(N - 1)(alpha + S / (N beta))``."""
    return ring_reduce_scatter_time(n, nbytes, alpha_s, beta_Bps)


def naive_allreduce_time(n: int, nbytes: float, alpha_s: float, beta_Bps: float) -> float:
    """Naive all-reduce (linear reduce to rank 0, linear broadcast):
    ``2 (N - 1)(alpha + S / beta)``."""
    return 2 * broadcast_time(n, nbytes, alpha_s, beta_Bps)


def tree_allreduce_time(n: int, nbytes: float, alpha_s: float, beta_Bps: float) -> float:
    """Tree all-reduce (binomial reduce, binomial broadcast):
    ``2 ceil(log2 N)(alpha + S / beta)``."""
    return 2 * tree_broadcast_time(n, nbytes, alpha_s, beta_Bps)


def ring_allreduce_time(n: int, nbytes: float, alpha_s: float, beta_Bps: float) -> float:
    """Ring all-reduce: ``2 (N - 1) alpha + 2 (N - 1) / N * S / beta``."""
    _check_n(n)
    return 2 * (n - 1) * alpha_s + 2 * (n - 1) / n * nbytes / beta_Bps


ALLREDUCE_TIME: dict[str, Callable[[int, float, float, float], float]] = {
    "naive": naive_allreduce_time,
    "tree": tree_allreduce_time,
    "ring": ring_allreduce_time,
}

ALLREDUCE_FORMULA: dict[str, str] = {
    "naive": "2(N-1)(alpha + S/beta)",
    "tree": "2 ceil(log2 N)(alpha + S/beta)",
    "ring": "2(N-1) alpha + 2(N-1)/N S/beta",
}


def allreduce_time(algo: str, n: int, nbytes: float, alpha_s: float, beta_Bps: float) -> float:
    """The closed form of the all-reduce named ``algo`` (``"naive"``, ``"tree"``, ``"ring"``)."""
    if algo not in ALLREDUCE_TIME:
        raise ValueError(f"unknown all-reduce algorithm {algo!r}: choose one of "
                         + ", ".join(ALLREDUCE_TIME))
    return ALLREDUCE_TIME[algo](n, nbytes, alpha_s, beta_Bps)


def shared_rate(beta_Bps: float, shared_Bps: float, k: int) -> float:
    """Bandwidth of each of ``k`` equal messages crossing one cap of ``shared_Bps`` at once,
    each also limited to its own link's ``beta_Bps``: ``min(beta, C / k)`` (fair share)."""
    if k < 1:
        raise ValueError(f"k (concurrent messages) must be >= 1, got {k}")
    return min(beta_Bps, shared_Bps / k)


def staged_ring_allreduce_time(n: int, nbytes: float, alpha_s: float, beta_Bps: float,
                               shared_Bps: float) -> float:
    """Ring all-reduce when all N messages of a step share one cap ``C`` (consumer GPUs whose
    copies are staged in host memory): ``2 (N - 1)(alpha + S / (N min(beta, C / N)))``."""
    _check_n(n)
    return 2 * (n - 1) * message_time(nbytes / n, alpha_s, shared_rate(beta_Bps, shared_Bps, n))


def staged_naive_allreduce_time(n: int, nbytes: float, alpha_s: float, beta_Bps: float,
                                shared_Bps: float) -> float:
    """Naive all-reduce through a cap ``C``: one message at a time, so only ``min(beta, C)``
    matters: ``2 (N - 1)(alpha + S / min(beta, C))``."""
    return naive_allreduce_time(n, nbytes, alpha_s, shared_rate(beta_Bps, shared_Bps, 1))


def rail_ring_allreduce_time(nodes: int, per_node: int, nbytes: float, intra_alpha_s: float,
                             intra_beta_Bps: float, nic_alpha_s: float,
                             nic_beta_Bps: float) -> float:
    """Multi-channel ring all-reduce with one ring per rail (``multichannel``) on ``nodes``
    nodes of ``per_node`` GPUs, one NIC per GPU. N = nodes x per_node ranks, C = per_node
    channels, chunks of c = S / (C N) bytes. In each of the 2(N - 1) steps every GPU sends
    C - 1 chunks over NVLink (its port shared by them) and one through its NIC, at once; the
    step lasts as long as the slower: ``max((C - 1) c / B_nvl + a_nvl,
    c / min(B_nic, B_nvl) + a_nvl + a_nic)``. Bus bandwidth tends to
    ``min(C B_nic, C / (C - 1) B_nvl)``. With one node it is C rings inside a node."""
    _check_n(nodes)
    _check_n(per_node)
    n, c = nodes * per_node, nbytes / (per_node * nodes * per_node)
    nvlink = (per_node - 1) * c / intra_beta_Bps + intra_alpha_s
    network = c / min(nic_beta_Bps, intra_beta_Bps) + intra_alpha_s + nic_alpha_s
    step = max(nvlink, network) if nodes > 1 else per_node * c / intra_beta_Bps + intra_alpha_s
    return 2 * (n - 1) * step


def hierarchical_allreduce_time(nodes: int, per_node: int, nbytes: float,
                                intra_alpha_s: float, intra_beta_Bps: float,
                                inter_alpha_s: float, inter_beta_Bps: float) -> float:
    """Hierarchical all-reduce (``hierarchical``) on ``nodes`` (M) nodes of ``per_node`` (G)
    GPUs, one NIC rail per local GPU: a ring reduce-scatter in each node, a ring all-reduce
    of each 1/G chunk across the nodes on its rail (all rails at once), a ring all-gather
    in each node. ``intra_*`` is a link inside a node, ``inter_*`` the route between two
    GPUs of one rail on different nodes (both latencies, the slower bandwidth):
    ``2 (G - 1)(a_intra + S / (G b_intra)) + 2 (M - 1)(a_inter + S / (G M b_inter))``."""
    _check_n(nodes)
    _check_n(per_node)
    inside = 2 * ring_reduce_scatter_time(per_node, nbytes, intra_alpha_s, intra_beta_Bps)
    across = ring_allreduce_time(nodes, nbytes / per_node, inter_alpha_s, inter_beta_Bps)
    return inside + across


def flat_ring_two_level_time(nodes: int, per_node: int, nbytes: float, intra_alpha_s: float,
                             intra_beta_Bps: float, inter_alpha_s: float,
                             inter_beta_Bps: float) -> float:
    """One flat ring (``all_reduce_ring``) over all N = M G ranks in rank order on M > 1
    nodes: every one of its 2(N - 1) steps moves S / N bytes on every hop at once, and the
    hops that leave a node (G - 1 to G, ..., N - 1 to 0) set the pace:
    ``2 (N - 1) max(a_intra + S / (N b_intra), a_inter + S / (N b_inter))``. With one node
    it is ``ring_allreduce_time`` on the intra-node link."""
    _check_n(nodes)
    _check_n(per_node)
    n = nodes * per_node
    if nodes == 1:
        return ring_allreduce_time(n, nbytes, intra_alpha_s, intra_beta_Bps)
    step = max(message_time(nbytes / n, intra_alpha_s, intra_beta_Bps),
               message_time(nbytes / n, inter_alpha_s, inter_beta_Bps))
    return 2 * (n - 1) * step


def addition_time(nbytes: float, launch_s: float, memory_Bps: float) -> float:
    """One addition of two ``nbytes`` chunks as its own kernel: a launch, then two reads and
    one write through memory: ``launch + 3 S / memory_bandwidth`` (free memory: 0 s)."""
    return launch_s + (3 * nbytes / memory_Bps if memory_Bps else 0.0)


def flat_ring_additions_time(nodes: int, per_node: int, nbytes: float, launch_s: float,
                             memory_Bps: float) -> float:
    """The additions on a flat ring's critical path: its reduce-scatter's N - 1 steps each
    end with one addition of an S / N chunk. Add it to ``flat_ring_two_level_time``."""
    _check_n(nodes)
    _check_n(per_node)
    n = nodes * per_node
    return (n - 1) * addition_time(nbytes / n, launch_s, memory_Bps)


def hierarchical_additions_time(nodes: int, per_node: int, nbytes: float, launch_s: float,
                                memory_Bps: float) -> float:
    """The additions on the hierarchical all-reduce's critical path: G - 1 of an S / G chunk
    in the node's reduce-scatter, M - 1 of an S / (G M) chunk in the rail's. Add it to
    ``hierarchical_allreduce_time``."""
    _check_n(nodes)
    _check_n(per_node)
    return ((per_node - 1) * addition_time(nbytes / per_node, launch_s, memory_Bps)
            + (nodes - 1) * addition_time(nbytes / (per_node * nodes), launch_s, memory_Bps))


def hierarchical_bytes_sent(nodes: int, per_node: int, nbytes: float) -> dict[str, float]:
    """Bytes each rank sends in the hierarchical all-reduce, per link class:
    ``{"intra": 2 (G - 1) / G S, "inter": 2 (M - 1) / (G M) S}`` (exact when G M divides the
    element count). A flat ring's ranks at a node's edge send ``2 (N - 1) / N S`` across."""
    _check_n(nodes)
    _check_n(per_node)
    return {"intra": 2 * (per_node - 1) / per_node * nbytes,
            "inter": 2 * (nodes - 1) / (per_node * nodes) * nbytes}


def algbw(nbytes: float, seconds: float) -> float:
    """Algorithm bandwidth (nccl-tests): ``S / t`` in bytes/s, S the tensor size."""
    if seconds <= 0:
        raise ValueError(f"algbw needs a positive time, got {seconds} s")
    return nbytes / seconds


def busbw(nbytes: float, seconds: float, n: int) -> float:
    """Bus bandwidth of an all-reduce (nccl-tests): ``algbw * 2 (N - 1) / N`` in bytes/s.
    It is 0 for N = 1, where nothing crosses a link."""
    _check_n(n)
    return algbw(nbytes, seconds) * 2 * (n - 1) / n


def ring_allreduce_bytes_sent(n: int, nbytes: float) -> float:
    """Bytes every rank sends (and receives) in ring all-reduce: ``2 (N - 1) / N * S``,
    exact when N divides the element count."""
    _check_n(n)
    return 2 * (n - 1) / n * nbytes


def naive_allreduce_root_bytes(n: int, nbytes: float) -> float:
    """Bytes rank 0 receives in naive all-reduce, and again sends: ``(N - 1) S`` each way
    (every other rank sends S and receives S)."""
    _check_n(n)
    return (n - 1) * nbytes


def tree_allreduce_root_bytes(n: int, nbytes: float) -> float:
    """Bytes rank 0 receives in tree all-reduce, and again sends: ``ceil(log2 N) S``."""
    return ceil_log2(n) * nbytes


def _check_n(n: int) -> None:
    if n < 1:
        raise ValueError(f"the number of ranks must be at least 1, got {n}")
