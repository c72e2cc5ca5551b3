"""Lesson 01: communication."""

from __future__ import annotations

from mpgpu_edu.course._types import CAPSTONE, Lesson, Prediction, ex

EXERCISES = (
    ex('1.1', 'p2p_time', 'Point-to-point cost: alpha + n / beta', 3,
       ('One message pays the latency of its route once, then its bytes at the route\'s '
        'bandwidth.',
        'Ask the cluster for the route between the two logical devices: the route knows its '
        'alpha_s and beta_Bps.',
        'route = cluster.route(src, dst)\nreturn route.alpha_s + ... / route.beta_Bps')),
    ex('1.2', 'naive_all_reduce', 'Naive all-reduce through rank 0', 5,
       ('Rank 0 is the hub: it collects every other rank\'s tensor, adds them into its own, '
        'then sends the total back to each of them.',
        'Branch on comm.rank. Any other rank: send its tensor to 0, then receive the total '
        'into the same tensor. Rank 0: a loop that receives into a scratch buffer and adds, '
        'then a second loop that sends.',
        'if comm.rank != 0:\n    comm.send(tensor, 0); comm.recv(tensor, 0); return\n'
        'buffer = torch.empty_like(tensor)\nfor peer in range(1, N):\n'
        '    comm.recv(buffer, peer); tensor.add_(...)\nfor peer in range(1, N): ...')),
    ex('1.3', 'ring_all_reduce', 'Ring all-reduce', 10,
       ('Split the tensor into N chunks. N - 1 steps of "pass one chunk right, add the one '
        'from the left" leave each rank with one chunk summed over all ranks '
        '(reduce-scatter); N - 1 more steps pass the finished chunks round (all-gather).',
        'torch.tensor_split(tensor.view(-1), N) gives views: writing a chunk writes the '
        'tensor. Every step is ring_shift\'s pattern: isend one chunk to (r + 1) % N, recv '
        'from (r - 1) % N into a buffer, wait, then add (first phase) or copy (second). In '
        'each step a rank sends the chunk it updated in the step before.',
        'chunks = list(torch.tensor_split(tensor.view(-1), N))\n'
        'scratch = torch.empty_like(chunks[0])   # chunk 0 is the longest\n'
        'for k in range(N - 1):   # reduce-scatter\n'
        '    into = chunks[(r - 2 - k) % N]\n'
        '    work = comm.isend(chunks[(r - 1 - k) % N], (r + 1) % N)\n'
        '    comm.recv(scratch[:into.numel()], (r - 1) % N); work.wait(); into.add_(...)\n'
        '# now chunk r of rank r holds the full sum\n'
        'for k in range(N - 1):   # all-gather: isend chunks[(r - k) % N], '
        'recv into chunks[(r - 1 - k) % N]\n'
        '    ...'),
       CAPSTONE),
    ex('1.4', 'ring_reduce_scatter', 'Ring reduce-scatter', 6,
       ('The first half of the ring all-reduce: N - 1 steps, each passing one partial chunk '
        'right and adding the one from the left. Pick the order so that the chunk that '
        'arrives complete last on rank r is chunk r.',
        'Work on a flat copy split with torch.tensor_split, and one receive buffer as large as '
        'the largest chunk. In step k the chunk to send and the chunk to add into depend only '
        'on r and k. Return a copy of chunk r.',
        'for k in range(N - 1):\n    into = chunks[(r - 2 - k) % N]\n'
        '    work = comm.isend(chunks[(r - 1 - k) % N], right)\n'
        '    comm.recv(buffer[:into.numel()], left); work.wait(); into.add_(...)')),
    ex('1.5', 'ring_all_gather', 'Ring all-gather', 5,
       ('N slots, one per rank; yours starts filled. In every step each rank forwards to the '
        'right the slot it filled last, so after N - 1 steps every slot has gone round.',
        'slots = [torch.empty_like(tensor) for _ in range(N)], slots[r] a copy of tensor; in '
        'step k isend one slot right and recv into another from the left (ring_shift\'s '
        'pattern).',
        'for k in range(N - 1):\n    work = comm.isend(slots[(r - k) % N], right)\n'
        '    comm.recv(slots[(r - 1 - k) % N], left); work.wait()')),
    ex('1.6', 'tree_all_reduce', 'Tree all-reduce (choose 1.6 or 1.7)', 10,
       ('A binary tree in rank order: rank r\'s parent is (r - 1) // 2, its children are '
        '2r + 1 and 2r + 2 (those below N). Partial sums flow up to rank 0, then the total '
        'flows back down the same edges; a rank waits only for its own subtree.',
        'Up: a rank needs the sums of both its subtrees before it sends its own to its parent; '
        'take the two children\'s tensors at the same time (post both receives before '
        'waiting on either), each into a scratch tensor of its own. Then every rank but 0 '
        'sends up and receives the total back. Down: start the sends to both children before '
        'waiting on either.',
        'children = [c for c in (2*r + 1, 2*r + 2) if c < N]\n'
        'works = [comm.irecv(<a scratch tensor per child: torch.empty_like(tensor)>, c)\n'
        '         for c in children]\n'
        '# wait on every work; add each scratch tensor into tensor\n'
        '# r > 0: send tensor to the parent, then receive the total into tensor\n'
        '# down: one isend per child, and only then wait on them'),
       CAPSTONE),
    ex('1.7', 'composed_all_reduce', 'All-reduce composed: reduce-scatter then all-gather '
       '(choose 1.6 or 1.7)', 10,
       ('all-reduce = reduce-scatter + all-gather: your 1.4 leaves each rank one summed chunk, '
        'your 1.5 gives every rank every chunk. The catch: the traffic asked for is 2(N - 1) '
        'messages of ceil(numel / N) elements, N chunks of one size in both halves, and '
        'tensor_split\'s chunks differ when N does not divide the size.',
        'Pad a flat copy with zeros to a multiple of N BEFORE the reduce-scatter, reduce-scatter '
        'it, all-gather your chunk, concatenate, drop the padding, and copy the result into '
        'tensor (in place). Make the padded buffer where tensor lives (tensor.new_zeros): the '
        'lesson\'s figures run your function on meta tensors.',
        'chunk = -(-numel // N)   # ceil(numel / N)\n'
        'padded = tensor.new_zeros(N * chunk)   # same dtype and device as tensor\n'
        'padded[:numel] = ...     # a flat copy of tensor\n'
        'mine = ring_reduce_scatter(comm, padded)\n'
        'full = ...               # every rank\'s chunk, in rank order, as one flat tensor\n'
        'tensor.copy_(...)        # drop the padding, keep tensor\'s shape'),
       CAPSTONE),
)

PREDICTIONS = (
    Prediction(
        key="01.ring-vs-naive",
        question=("All-reduce of 256 MiB of gradients on 8 A100s (NVSwitch): the ring against "
                  "the naive all-reduce through rank 0. Which is faster, and by about how "
                  "much?"),
        choices=("about the same: both move the whole tensor",
                 "the ring, about 2x faster",
                 "the ring, about 8x faster",
                 "naive: it sends fewer messages"),
        answer=2,
        why=("Both are bandwidth-bound at this size. Rank 0 of the naive all-reduce moves "
             "(N - 1) S = 7 S each way, one message after the other; every ring rank sends "
             "2(N - 1)/N S = 1.75 S in total, all links at once. The ratio, 2(N - 1) S against "
             "2(N - 1)/N S, is N = 8."),
    ),
    Prediction(
        key="01.ring-doubling",
        question=("Ring all-reduce of 256 MiB on NVSwitch: going from 4 to 8 GPUs multiplies "
                  "its time by about"),
        choices=("0.5: twice the links", "1.2: hardly more", "2: twice the ranks",
                 "4: twice the steps, each on twice the ranks"),
        answer=1,
        why=("Each rank sends 2(N - 1)/N of the tensor: 1.5 S on 4 GPUs, 1.75 S on 8, a "
             "factor 7/6. Only the latency term, 2(N - 1) alpha, grows with N, and at 256 MiB "
             "it is negligible."),
    ),
)

LESSON = Lesson(1, 'communication', 'ex01_communication', 'notebooks/01_communication.ipynb',
                EXERCISES, PREDICTIONS, drives_demos=("1.2", "1.3", "1.6", "1.7"))
