"""Lesson 06: choosing and debugging."""

from __future__ import annotations

from mpgpu_edu.course._types import CAPSTONE, WARM_UP, Lesson, Prediction, ex

EXERCISES = (
    ex('6.1', 'choose_strategy', 'Choosing a strategy that fits', 5,
       ('Every device is its own budget: what matters is the memory ONE device needs under a '
        'strategy (parameters, gradients, optimizer state and activations), against ONE '
        'device\'s capacity. The optimizer, the precision and the activations you are given '
        'all change that memory.',
        'List the candidates from simplest to most sharded (one device: only "single"), ask '
        'the memory estimator about each in turn, return the first that fits, and "none" '
        'when the loop ends.',
        'for strategy in candidates: if estimate_memory(n_params, optimizer, precision, '
        'strategy, n, activations_bytes).fits(cluster.capacity_bytes(0)): return strategy  '
        '# a Cluster\'s devices are all of one kind: device 0 speaks for every one'),
       WARM_UP),
    ex('6.2', 'exchange_with_partner', 'Debugging: a swap that cannot deadlock', 5,
       ('A blocking send waits for its receiver: if both ranks of a pair start with send, '
        'each waits for the other. One of the two must receive first.',
        'Both ranks must pick roles from facts they both know, without a message: their two '
        'rank numbers. A rank alone keeps a copy of its own tensor.',
        'if partner == comm.rank: return <a copy of tensor>\n'
        'received = <a new tensor shaped like tensor>\n'
        'if <a test on comm.rank and partner that comes out opposite on the two ranks>:\n'
        '    send, then recv\n'
        'else:\n'
        '    recv, then send'),
       WARM_UP),
    ex('6.3', 'smooth_ring', 'Debugging: a halo exchange that cannot deadlock', 10,
       ('Every rank of the broken program waits in a blocking send to its left neighbour, '
        'which waits for ITS left neighbour: a cycle around the whole ring. Nothing that '
        'every rank does identically with blocking sends can break it; let a send be in '
        'flight while the rank receives.',
        'Per step: post both edge sends without waiting (isend), receive the two halos, wait '
        'for the sends, then smooth the padded block. With 2 ranks the left and right '
        'neighbour are the same rank, so both halos come from one peer: give the two '
        'directions different tags, and they cannot be swapped whatever order you receive '
        'them in (with one tag, messages are matched in the order the peer sent them). With '
        '1 rank the halos are your own edges, and no message is sent.',
        'x = block.clone()\n'
        'per step (on 1 rank, no messages: the halos are x\'s own last and first element):\n'
        '    sends = [comm.isend(<my first element>, left, tag=1),\n'
        '             comm.isend(<my last element>, right, tag=2)]\n'
        '    comm.recv(<from_right>, right, tag=1)   # receive in the order the neighbour\n'
        '    comm.recv(<from_left>, left, tag=2)     # sends: NCCL ignores tags\n'
        '    wait for both sends\n'
        '    x = <each element of cat([from_left, x, from_right]) averaged with its two '
        'neighbours>'),
       CAPSTONE),
    ex('6.4', 'find_straggler', 'Debugging: the straggler, from per-rank logs', 10,
       ('Waiting is a symptom, computing is the cause: the rank that holds everyone up '
        'computes the longest, and its victims wait the longest. Do not pick the rank that '
        'waits least: one that spends time between steps (loading data, say) waits little '
        'without computing more.',
        'Parse every line\'s time stamp (the number between "[" and "ms]": from 10 000 ms on '
        'there is no space after "["); per rank and step, compute time = time of "compute '
        'done" minus time of "compute start"; sum over every step (not the slowest one); take '
        'the rank with the most, and compare its total with the median rank\'s total.',
        'for each rank\'s lines:\n'
        '    stamp = float(line[1:line.index("ms]")]) / 1e3   # seconds\n'
        '    "step S: compute start" -> remember the stamp for step S\n'
        '    "step S: compute done..." -> add (stamp - that start) to the rank\'s total\n'
        'slow = <the rank with the largest total; the lowest rank on a tie>\n'
        'return slow, <its total minus the median of all totals>'),
       CAPSTONE),
)

PREDICTIONS = (
    Prediction(
        key="06.fits-7b",
        question="Eight RTX 4090s (24 GiB each, 192 GiB together) and LLaMA-7B with mixed-"
                 "precision Adam and plain data parallelism. Does it fit, before any "
                 "activation?",
        choices=("yes: 192 GiB is more than enough",
                 "no: every card must hold all of the model's training state",
                 "only with a batch of 1"),
        answer=1,
        why="Data parallelism keeps a full replica per card: 16 bytes per parameter, about "
            "100 GiB on each 24 GiB card. Memory does not add up across cards unless you "
            "shard (ZeRO, pipeline, tensor parallelism)."),
    Prediction(
        key="06.straggler",
        question="Five ranks train in lockstep (compute, then an all-reduce) and one of them "
                 "is slow. Which rank's log shows the longest wait in the all-reduce?",
        choices=("the slow rank: it is the one holding things up",
                 "a fast rank: it waits for the slow one",
                 "all ranks wait the same"),
        answer=1,
        why="A collective runs at the pace of its slowest rank: the fast ranks arrive early "
            "and wait, the slow one arrives last and hardly waits at all. The longest waiter "
            "is a victim; look for the rank that computes the longest."),
)

LESSON = Lesson(6, 'choosing and debugging', 'ex06_choosing',
                'notebooks/06_choosing_and_debugging.ipynb', EXERCISES, PREDICTIONS,
                drives_demos=("6.3", "6.4"))
