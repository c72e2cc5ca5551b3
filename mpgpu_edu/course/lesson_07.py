"""Lesson 07: many machines."""

from __future__ import annotations

from mpgpu_edu.course._types import CAPSTONE, WARM_UP, Lesson, Prediction, ex

EXERCISES = (
    ex('7.1', 'node_and_rail_groups', 'Nodes and rails: the groups of a 2-level cluster', 3,
       ("torchrun numbers the ranks node by node: node k's GPUs are ranks k * per_node, "
        "k * per_node + 1, and so on. A rail is the same local GPU on every node: read the "
        "same table by columns instead of rows.",
        "Refuse bad input first (both at least 1, per_node divides world_size: else "
        "ValueError). With M = world_size // per_node nodes and rank(k, i) = k * per_node + i "
        "(node k, local rank i), node k lists rank(k, i) for every local rank i; rail i "
        "lists rank(k, i) for every node k.",
        "if <a size below 1, or a remainder>: raise ValueError(...)\n"
        "rank(k, i) = k * per_node + i   # node k, local rank i\n"
        "nodes = [[rank(k, i) for i in ...] for k in ...]\n"
        "rails = [[rank(k, i) for k in ...] for i in ...]   # the same cells, by column"),
       WARM_UP),
    ex('7.2', 'hierarchical_all_reduce', 'The hierarchical all-reduce, on comm sub-groups', 13,
       ("Keep the bulk of the bytes on the fast links. Inside a node, a reduce-scatter leaves "
        "each GPU with the node's sum of one chunk (1/per_node of the tensor). Only that "
        "chunk travels across the network, between the GPUs that hold the same chunk on "
        "other nodes: one rail. Then the node shares the finished chunks.",
        "Make two groups with comm.group: your node's ranks and your rail's ranks (7.1 gives "
        "both). Split tensor.view(-1) into per_node chunks with torch.tensor_split. Phase 1: "
        "ring_reduce_scatter on the node group: it leaves local rank i with chunk "
        "(i + 1) % per_node finished. Phase 2: ring_all_reduce(rail, that chunk); for the "
        "mean, divide by the world size (that chunk now, or the whole tensor at the end). "
        "Phase 3: ring_all_gather on the "
        "node group.",
        "node, local = divmod(comm.rank, per_node)\n"
        "inside = comm.group(<my node's ranks>); rail = comm.group(<my rail's ranks>)\n"
        "chunks = list(torch.tensor_split(tensor.view(-1), per_node))\n"
        "ring_reduce_scatter(inside, chunks)\n"
        "mine = chunks[...]   # the chunk the reduce-scatter finished here\n"
        "ring_all_reduce(rail, mine)   # then mine.div_(world_size) for the mean\n"
        "ring_all_gather(inside, chunks)"),
       CAPSTONE),
)

PREDICTIONS = (
    Prediction(
        key="07.global-rank",
        question=("Two machines each run `torchrun --nnodes 2 --node-rank K --nproc-per-node 8 "
                  "...`. The process with LOCAL_RANK=3 on the machine started with "
                  "--node-rank 1: what is its global RANK?"),
        choices=("3: local ranks are the ranks", "4: one rank per node before it, plus 3",
                 "11: node 1's ranks start at 8", "19: ranks count GPUs and NICs"),
        answer=2,
        why=("Global rank = node x nproc_per_node + local rank = 1 x 8 + 3 = 11. LOCAL_RANK "
             "picks the GPU (cuda:3 under that machine's CUDA_VISIBLE_DEVICES); RANK is the "
             "process's place in the whole job, what send and recv address.")),
    Prediction(
        key="07.flat-vs-hierarchical",
        question=("One 256 MiB all-reduce over 2 nodes x 8 H100 (NVLink 370 GB/s inside a "
                  "node, one 400 Gb/s NIC, 47 GB/s, per GPU across). Every step of the flat "
                  "ring waits for a hop through a NIC; the hierarchical one moves most bytes "
                  "over NVLink and only a small chunk through every NIC at once (its NVLink "
                  "phases still take 2(G-1) = 14 steps). How much faster is it?"),
        choices=("about the same: every rank sends about 2S either way",
                 "about 2x", "about 5x", "about 16x: 8 NICs at work instead of 1, 2x fewer steps"),
        answer=2,
        why=("A flat ring's every step waits for its slowest hop: the two GPUs at the nodes' "
             "edges send 2(N-1)/N S = 480 MiB each through one NIC at 47 GB/s. The "
             "hierarchical all-reduce sends 2(G-1)/G S over NVLink (8x faster) and only "
             "2(M-1)/(GM) S = 32 MiB per GPU across, on all 8 NICs at once. Its NVLink phases "
             "now dominate, so the gain is about 5x, not 16x. That is against one naive ring. "
             "NCCL's remedy, one ring per rail (every NIC busy too), takes 2.44 ms here against "
             "the hierarchical 2.34 ms; but it still pays 2(N-1) network latencies, the "
             "hierarchical one 2(M-1), so against it the hierarchical all-reduce wins most on "
             "small messages and with many nodes.")),
)

LESSON = Lesson(7, 'many machines', 'ex07_many_machines', 'notebooks/07_many_machines.ipynb',
                EXERCISES, PREDICTIONS, drives_demos=('7.2',))
