"""A 2-D device mesh: ``dp`` data-parallel replicas of a ``pp``-stage pipeline.

Ranks fill the mesh row by row: rank ``r`` is replica ``r // pp``, stage ``r % pp``.

    >>> print(Mesh(dp=2, pp=3).describe())
    mesh dp=2 x pp=3: 2 replicas of a 3-stage pipeline, 6 ranks
               stage 0  stage 1  stage 2
    replica 0  rank 0   rank 1   rank 2
    replica 1  rank 3   rank 4   rank 5
    pipeline groups (rows): [0, 1, 2], [3, 4, 5]
    data-parallel groups (columns): [0, 3], [1, 4], [2, 5]

Each row is one pipeline: its ranks pass activations and gradients to each other. Each column
holds the same stage in every replica: its ranks average that stage's gradients. So a rank
talks to two groups, and ``make_groups`` builds both from a communicator with ``comm.group``.

Which neighbours share a row is a choice: here a replica's stages sit on consecutive devices,
so on machines of ``pp`` devices each a replica is one machine and every data-parallel group
spans the machines. Whatever the order of DP and PP, tensor parallelism (a third axis, not in
this mesh) takes the innermost neighbours, NVLink inside one machine, because it communicates
inside every layer; data-parallel groups (one gradient all-reduce per step, overlapped with
the backward) and pipeline stages (one activation per microbatch) go across machines.
Megatron-LM's default order is tensor, then data, then pipeline outermost.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mpgpu_edu.comm import Communicator


@dataclass(frozen=True)
class Mesh:
    """``dp`` replicas (rows) x ``pp`` pipeline stages (columns); plain data."""

    dp: int
    pp: int

    def __post_init__(self) -> None:
        for name, value in (("dp", self.dp), ("pp", self.pp)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"mesh {name} must be a whole number >= 1, got {value!r}")

    @property
    def world_size(self) -> int:
        return self.dp * self.pp

    def coords(self, rank: int) -> tuple[int, int]:
        """``(dp_index, pp_index)``: the replica and the stage of ``rank``."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is not in mesh dp={self.dp} x pp={self.pp} "
                             f"(ranks 0..{self.world_size - 1})")
        return divmod(rank, self.pp)

    def rank_of(self, dp_index: int, pp_index: int) -> int:
        """The rank that runs stage ``pp_index`` of replica ``dp_index``."""
        if not (0 <= dp_index < self.dp and 0 <= pp_index < self.pp):
            raise ValueError(f"({dp_index}, {pp_index}) is outside mesh dp={self.dp} x "
                             f"pp={self.pp}")
        return dp_index * self.pp + pp_index

    def replica_ranks(self, dp_index: int) -> list[int]:
        """One row: the ranks of replica ``dp_index``'s pipeline, stage 0 first."""
        return [self.rank_of(dp_index, s) for s in range(self.pp)]

    def stage_ranks(self, pp_index: int) -> list[int]:
        """One column: the ranks holding stage ``pp_index``, one per replica."""
        return [self.rank_of(d, pp_index) for d in range(self.dp)]

    def check(self, world_size: int) -> None:
        """Raise ValueError unless the mesh has exactly ``world_size`` ranks."""
        if world_size != self.world_size:
            raise ValueError(f"mesh dp={self.dp} x pp={self.pp} needs {self.world_size} "
                             f"ranks, but the world size is {world_size}: pick dp and pp "
                             f"whose product is {world_size}")

    def describe(self) -> str:
        """The mesh as a table of ranks, then its groups."""
        width = max(len(f"rank {self.world_size - 1}"), len(f"stage {self.pp - 1}")) + 2
        label = len(f"replica {self.dp - 1}") + 2
        header = " " * label + "".join(f"stage {s}".ljust(width) for s in range(self.pp))
        rows = [f"replica {d}".ljust(label)
                + "".join(f"rank {r}".ljust(width) for r in self.replica_ranks(d))
                for d in range(self.dp)]
        groups = [
            "pipeline groups (rows): " + ", ".join(str(self.replica_ranks(d))
                                                   for d in range(self.dp)),
            "data-parallel groups (columns): " + ", ".join(str(self.stage_ranks(s))
                                                          for s in range(self.pp))]
        title = (f"mesh dp={self.dp} x pp={self.pp}: {self.dp} replicas of a {self.pp}-stage "
                 f"pipeline, {self.world_size} ranks")
        return "\n".join([title, header.rstrip(), *(r.rstrip() for r in rows), *groups])

    def to_dict(self) -> dict[str, Any]:
        """What a figure draws: one cell per rank at (row dp_index, column pp_index), and the
        groups as lists of ranks."""
        cells = [{"rank": r, "dp_index": self.coords(r)[0], "pp_index": self.coords(r)[1]}
                 for r in range(self.world_size)]
        return {"dp": self.dp, "pp": self.pp, "world_size": self.world_size, "cells": cells,
                "pipeline_groups": [self.replica_ranks(d) for d in range(self.dp)],
                "data_parallel_groups": [self.stage_ranks(s) for s in range(self.pp)]}


@dataclass
class MeshGroups:
    """One rank's place in the mesh and its two process groups: ``pipeline`` (its row; group
    rank = stage) and ``data`` (its column; group rank = replica)."""

    mesh: Mesh
    dp_index: int
    pp_index: int
    pipeline: Communicator
    data: Communicator


def make_groups(comm: Communicator, mesh: Mesh) -> MeshGroups:
    """This rank's row and column of ``mesh`` as sub-communicators of ``comm``."""
    mesh.check(comm.world_size)
    dp_index, pp_index = mesh.coords(comm.rank)
    return MeshGroups(mesh, dp_index, pp_index, comm.group(mesh.replica_ranks(dp_index)),
                      comm.group(mesh.stage_ranks(pp_index)))
