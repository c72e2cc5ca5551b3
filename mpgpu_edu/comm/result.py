"""What a launch returns (``LaunchResult``) and what it runs on (``resolve_cluster``): shared
by the simulator's launcher (``launch``) and the worker pool (``pool``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mpgpu_edu.comm import ops
from mpgpu_edu.comm.base import CommStats
from mpgpu_edu.comm.replay import replay
from mpgpu_edu.cluster.trace import Trace


@dataclass
class LaunchResult:
    """What a launch returns: per-rank results, the trace, per-rank stats and logs."""

    results: list[Any]
    trace: Trace
    stats: list[CommStats]
    logs: list[list[str]]
    cluster: Any = None
    backend: str = "sim"
    ledgers: list[Any] = field(default_factory=list)
    op_lists: dict[tuple[int, int], list[ops.Op]] = field(default_factory=dict, repr=False)

    @property
    def bytes_sent_per_rank(self) -> list[int]:
        return [s.bytes_sent for s in self.stats]

    @property
    def bytes_received_per_rank(self) -> list[int]:
        return [s.bytes_received for s in self.stats]

    def bytes_per_link(self) -> dict[tuple[int, int], int]:
        """Bytes sent from each rank to each peer: {(src, dst): bytes}."""
        return {(src, dst): b for src, s in enumerate(self.stats) for dst, b in s.sent_to.items()}

    def retime(self, cluster: Any) -> Trace:
        """The same run's timeline on another cluster of the same world size (simulator only)."""
        if not self.op_lists:
            raise ValueError("only a simulated run can be re-timed")
        if cluster.world_size != len(self.results):
            raise ValueError(f"this run has {len(self.results)} ranks but the cluster has "
                             f"{cluster.world_size} devices: pick a cluster of the same size")
        return replay(self.op_lists, cluster, len(self.results),
                      {"cluster": getattr(cluster, "name", "")})[0]


def resolve_cluster(cluster: Any) -> Any:
    """A ``Cluster``, a preset name, or an int N (N devices on a uniform 10 GB/s, 10 us
    network) -> a ``Cluster``."""
    from mpgpu_edu.cluster import Cluster

    if isinstance(cluster, str):
        return Cluster.preset(cluster)
    if isinstance(cluster, bool) or cluster is None:
        raise TypeError("launch needs a cluster: a Cluster, a preset name or a number of ranks")
    if isinstance(cluster, int):
        if cluster < 1:
            raise ValueError(f"world size must be at least 1, got {cluster}")
        return Cluster.uniform(cluster, alpha_s=1e-5, beta_Bps=1e10)
    return cluster
