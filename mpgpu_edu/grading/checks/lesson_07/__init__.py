"""Checks of lesson 07: the groups of a 2-level cluster and the hierarchical all-reduce.

Oracles: ``collectives.hierarchical.node_groups`` / ``rail_groups`` for the groups,
``collectives.cost.hierarchical_allreduce_time`` for the time (the closed form the
notebook derives and the exercise file gives, solved), the sum (or mean) of
every rank's tensor for the values, ``cost.hierarchical_bytes_sent`` for the bytes each rank
sends inside its node and across the network. The capstone runs with every built-in
collective switched off (``from_scratch``) on a two-level cluster: NVSwitch-like links inside
each node, one NIC per GPU between nodes, free additions, so that its simulated time must
equal the closed form; a flat ring, or whole tensors sent across, or the groups swapped, send
the wrong bytes on the wrong links.

Modules: ``groups`` (7.1), ``hierarchical`` (7.2).
"""

from __future__ import annotations

from mpgpu_edu.grading.checks import Case
from mpgpu_edu.grading.checks._support import each
from mpgpu_edu.grading.checks.lesson_07.groups import (_groups_agree, _groups_bad_compute,
                                                       _groups_bad_judge, _groups_compute,
                                                       _groups_examples)
from mpgpu_edu.grading.checks.lesson_07.hierarchical import (_HIER_EDGES, _HIER_MAIN,
                                                             _HIER_SHAPES, _hier_all,
                                                             _hier_compute, _hier_examples,
                                                             _hier_time, _hier_traffic,
                                                             _hier_values)

CASES: dict[str, list[Case]] = {
    "7.1": [
        Case("the docstring's example; 2 x 8, 4 x 2, 1 node, 1 GPU per node", 1,
             *each([dict(world_size=w, per_node=p) for w, p in
                    [(6, 2), (16, 8), (8, 2), (3, 3), (3, 1)]],
                   _groups_compute, _groups_agree)),
        Case("ValueError: sizes below 1, or per_node not dividing world_size", 1,
             _groups_bad_compute, _groups_bad_judge),
        Case("hidden: random clusters", 1,
             *each(_groups_examples(), _groups_compute, _groups_agree), hidden=True),
    ],
    "7.2": [
        Case("sums and means in place on 2 nodes x 4", 3,
             *each(_HIER_MAIN, _hier_compute, _hier_values)),
        Case("traffic: 2(G-1)/G S inside the node, 2(M-1)/(GM) S across, on its own rail", 3,
             *each(_HIER_SHAPES, _hier_compute, _hier_traffic)),
        Case("time: the closed form on a two-level cluster", 3,
             *each(_HIER_SHAPES, _hier_compute, _hier_time)),
        Case("sizes that do not divide, 3 nodes, 1 node, 1 GPU per node", 2,
             *each(_HIER_EDGES, _hier_compute, _hier_values)),
        Case("hidden: random clusters, sizes and ops", 2,
             *each(_hier_examples(), _hier_compute, _hier_all), hidden=True, timeout_s=40.0),
    ],
}


# The package's own implementation of each exercise: it must not run while the exercise is
# checked (``from_scratch`` switches it off, with the other collectives, for 7.2).
# Run with every rank in a process of its own in class grading (see lesson 01's checks).
RANKS_APART = ("7.2",)

REFERENCES = {"7.1": ["mpgpu_edu.collectives.hierarchical:node_groups",
                      "mpgpu_edu.collectives.hierarchical:rail_groups",
                      "mpgpu_edu.hybrid.mesh:Mesh", "mpgpu_edu.hybrid.mesh:make_groups",
                      "mpgpu_edu.cluster.topology:Topology.groups"],
              "7.2": ["mpgpu_edu.collectives.hierarchical:all_reduce_hierarchical"]}
