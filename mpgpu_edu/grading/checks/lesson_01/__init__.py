"""Checks of lesson 01: message cost and collectives built from send and recv.

Every collective case runs the learner's function on the simulator with the built-in
collectives disabled (``from_scratch``); *compute* hands the judge what each rank holds and
sent (``launch_facts``: the run's record, which the grader replays), and *judge* checks
values, bytes and messages per rank, who talks to whom, how many isend/irecv works each rank
left unwaited (``works``), and the time against the grader's own reference. Whether a returned
tensor shares memory with the input is recorded in *compute* as plain data.

In class grading the all-reduces and halves built from scratch (``RANKS_APART``) run every
rank in a process of its own that imports the learner's file itself and holds only its own
input (``comm.apart``, ``compute.InRanks``): a rank cannot sum inputs it was never given and
send ring-shaped messages for show, and the record of its messages is kept where no code of
the submission runs. 1.7's calls of the learner's own 1.4 and 1.5 can only be counted in
each rank's own process (``counting_calls``): that case tells the learner and earns no
points.

Modules: ``p2p`` (1.1), ``all_reduce`` (what the all-reduces 1.2, 1.3, 1.6 and 1.7 share),
``traffic`` (each all-reduce's bytes and messages per rank), ``scatter_gather`` (1.4, 1.5).
"""

from __future__ import annotations

from mpgpu_edu.collectives import all_reduce_ring
from mpgpu_edu.grading.checks import FEEDBACK, Case
from mpgpu_edu.grading.checks.lesson_01.all_reduce import (_all_reduce_facts, _hidden_case,
                                                           _meta_case, _sums_case, _time_case,
                                                           _waits_case, fully_connected)
from mpgpu_edu.grading.checks.lesson_01.p2p import _p2p_case
from mpgpu_edu.grading.checks.lesson_01.scatter_gather import (_half_hidden, _half_traffic_case,
                                                               _judge_all_gather,
                                                               _judge_new_tensors,
                                                               _judge_reduce_scatter,
                                                               _judge_reduce_scatter_kept,
                                                               _values_case)
from mpgpu_edu.grading.checks.lesson_01.traffic import (_judge_naive_hidden,
                                                        _judge_naive_traffic,
                                                        _judge_padded_ring_traffic,
                                                        _judge_ring_hidden,
                                                        _judge_ring_traffic,
                                                        _judge_tree_hidden,
                                                        _judge_tree_traffic, _naive_traffic,
                                                        _composed_case, _traffic_case,
                                                        _tree_traffic)
from mpgpu_edu.lessons.communication import binary_tree_all_reduce


RANKS_APART = ("1.2", "1.3", "1.4", "1.5", "1.6", "1.7")

REFERENCES = {  # the package's own implementation, out of reach while the learner's runs (the
    # collectives of 1.2-1.7 are, for every case: ``from_scratch``)
    "1.1": ["mpgpu_edu.cluster.topology:Route.seconds", "mpgpu_edu.cluster.hardware:LinkSpec.seconds",
            "mpgpu_edu.collectives.cost:*", "mpgpu_edu.ps.async_:Links.transfer"],  # every closed form: a broadcast of 2 is one message
    "1.6": ["mpgpu_edu.lessons.communication:binary_tree_all_reduce"],  # the lesson's tree
}

CASES: dict[str, list[Case]] = {
    "1.1": [
        _p2p_case("uniform cluster: alpha + n / beta", "uniform"),
        _p2p_case("presets: matches a simulated send, on every kind of route", "preset"),
        _p2p_case("logical ids under CUDA_VISIBLE_DEVICES", "visible"),
    ],
    "1.2": [
        _sums_case("sums in place on 4 ranks", 1, "1.2", [(4, 100)]),
        _sums_case("world sizes 1, 2, 3, 5; 2-D and float64 tensors", 1, "1.2",
                   [(1, 5), (2, 5), (3, 7), (5, 11), (3, (2, 3)), (3, (7, "float64"))]),
        _naive_traffic(),
        _meta_case("1.2", _judge_naive_traffic),
        _hidden_case("1.2", _all_reduce_facts, _judge_naive_hidden),
    ],
    "1.3": [
        _sums_case("sums in place on 4 ranks", 1, "1.3", [(4, 1000)]),
        _meta_case("1.3", _judge_ring_traffic),
        _sums_case("any size and shape: uneven chunks, fewer elements than ranks, 2-D, "
                   "float64", 2, "1.3", [(3, 10), (5, 3), (2, 1), (1, 4), (4, (2, 5)),
                                         (3, (10, "float64"))]),
        _traffic_case("traffic: 2(N-1)/N of the tensor, to the right neighbour", 2, "1.3"),
        _waits_case("1.3", 1, [(4, 1000), (3, 10)]),
        _time_case("time: every link busy at once", "1.3", all_reduce_ring, "ring",
                   [(4, 2**18 + 3)], "do all ranks send at the same time?"),
        _hidden_case("1.3", _all_reduce_facts, _judge_ring_hidden(padded=False)),
    ],
    "1.4": [
        _values_case("each rank gets its chunk of the sum, in the input's dtype", "1.4",
                     _judge_reduce_scatter, [(4, (12,)), (3, (10,)), (5, (3,)), (1, (4,)),
                                             (3, (2, 5)), (3, (7,), "float64")]),
        _half_traffic_case("traffic: (N-1)/N of the tensor, to the right neighbour", 3, "1.4",
                           _judge_reduce_scatter, "reduce-scatter"),
        _half_hidden("1.4", _judge_reduce_scatter),
        _values_case("the caller's tensor left as it was, a new tensor returned " + FEEDBACK,
                     "1.4", _judge_reduce_scatter_kept, [(4, (12,)), (1, (4,))], points=0),
    ],
    "1.5": [
        _values_case("every rank gets every tensor, in its dtype", "1.5", _judge_all_gather,
                     [(4, (2, 3)), (3, (5,)), (1, (2,)), (5, (1,)), (3, (2, 2), "float64")],
                     points=3),
        _values_case("new tensors: no entry is the caller's tensor, which is left as it was "
                     + FEEDBACK, "1.5", _judge_new_tensors, [(4, (2, 3)), (1, (2,))],
                     points=0),
        _half_traffic_case("traffic: N-1 tensors, to the right neighbour", 1, "1.5",
                           _judge_all_gather, "all-gather"),
        _half_hidden("1.5", _judge_all_gather),
    ],
    "1.6": [
        _sums_case("sums in place, N = 1 to 7; 2-D and float64 tensors", 2, "1.6",
                   [(1, 4), (2, 5), (3, 6), (4, 4), (5, 3), (6, 7), (7, 10), (3, (2, 3)),
                    (5, (6, "float64"))]),
        _tree_traffic(),
        _meta_case("1.6", _judge_tree_traffic),
        _time_case("time: both subtrees at once, on a fully connected cluster", "1.6",
                   binary_tree_all_reduce, "reference binary tree", [(7, 4096), (6, 4096)],
                   "on this cluster a rank can take both children's messages (and send to "
                   "both) at once: does it wait for one before it starts on the other, or wait "
                   "for ranks outside its subtree?", cluster=fully_connected,
                   faster="a binary tree can be: does it follow the tree?"),
        _hidden_case("1.6", _all_reduce_facts, _judge_tree_hidden, points=2),
    ],
    "1.7": [
        _sums_case("sums in place, any size and shape, float64 too", 2, "1.7",
                   [(4, 1000), (3, 10), (5, 3), (2, 1), (1, 4), (4, (3, 5)),
                    (3, (11, "float64"))]),
        _traffic_case("traffic: 2(N-1)/N of the tensor, padded, to the right neighbour", 3,
                      "1.7", padded=True),
        _composed_case("1.7", ("ring_reduce_scatter", "ring_all_gather")),
        _meta_case("1.7", _judge_padded_ring_traffic),
        _time_case("time: as fast as the ring", "1.7", all_reduce_ring, "ring",
                   [(4, 2**18 + 3)], "do all ranks send at the same time?"),
        _hidden_case("1.7", _all_reduce_facts, _judge_ring_hidden(padded=True), points=2),
    ],
}
