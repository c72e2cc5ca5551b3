"""Topology: how the physical devices of a cluster are wired, and what a transfer occupies.

A transfer from one device to another follows a ``Route``: its latency ``alpha_s``, its
bandwidth ``beta_Bps`` (the slowest link on the way) and the *resources* it holds, such as
``"gpu0.out"`` (device 0's sending port) or ``"bridge0.fabric"`` (a PCIe host bridge). The
simulator holds every resource on a route for ``nbytes / beta_Bps`` seconds, so two
transfers that share a resource queue behind each other. That is the whole contention
model: a ring on NVSwitch uses disjoint ports and runs at full speed; the same ring on
consumer GPUs under one PCIe bridge pushes every message through that bridge.

Ids here are *physical* device ids; ``Cluster`` translates from logical ids.

Builders: ``uniform`` (the textbook model), ``nvswitch``, ``pcie_host_bridge``,
``multi_node``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from mpgpu_edu.hardware import LinkSpec


@dataclass(frozen=True)
class Route:
    """What one transfer costs and occupies: ``alpha_s + nbytes / beta_Bps`` seconds."""

    alpha_s: float
    beta_Bps: float
    resources: tuple[str, ...]

    def seconds(self, nbytes: int) -> float:
        """Time of one message of ``nbytes`` on this route when nothing else uses it."""
        return self.alpha_s + nbytes / self.beta_Bps


@dataclass(frozen=True)
class LinkInfo:
    """One wire, for figures. ``a`` and ``b`` name vertices: ``"gpu3"`` is physical device
    3; other names are switches, bridges or the host. ``shared_resource`` names the
    resource that every transfer over this wire competes for, or None when each device has
    its own port."""

    a: str
    b: str
    spec_name: str
    beta_Bps: float
    shared_resource: str | None = None


class Topology:
    """The wiring of ``n_devices`` physical devices: a route for every ordered pair."""

    def __init__(self, kind: str, n_devices: int, route_of: Callable[[int, int], Route],
                 links: list[LinkInfo], groups: dict[str, tuple[int, ...]]) -> None:
        if n_devices < 1:
            raise ValueError(f"a topology needs at least 1 device, got n_devices={n_devices}")
        self.kind = kind
        self.n_devices = n_devices
        self._routes = {(s, d): route_of(s, d)
                        for s in range(n_devices) for d in range(n_devices) if s != d}
        self._links = list(links)
        self._groups = dict(groups)

    def route(self, src_phys: int, dst_phys: int) -> Route:
        """The route from physical device ``src_phys`` to ``dst_phys``."""
        for device in (src_phys, dst_phys):
            if not 0 <= device < self.n_devices:
                raise ValueError(f"device {device} does not exist: this {self.kind} topology "
                                 f"has {self.n_devices} devices (0..{self.n_devices - 1})")
        if src_phys == dst_phys:
            raise ValueError(f"a transfer from device {src_phys} to itself uses no link; "
                             "copy the tensor locally instead of sending it")
        return self._routes[(src_phys, dst_phys)]

    def links(self) -> list[LinkInfo]:
        """Every wire, for drawing the cluster."""
        return list(self._links)

    def groups(self) -> dict[str, tuple[int, ...]]:
        """Which devices sit together: under one PCIe bridge, one NVSwitch, one node."""
        return dict(self._groups)

    def __repr__(self) -> str:
        return f"Topology(kind={self.kind!r}, n_devices={self.n_devices})"


def _ports(s: int, d: int) -> tuple[str, str]:
    return (f"gpu{s}.out", f"gpu{d}.in")


def uniform(n: int, alpha_s: float, beta_Bps: float, spec_name: str = "uniform") -> Topology:
    """The textbook alpha-beta model: every device has its own out and in port at
    ``beta_Bps``, so transfers contend only when they leave or enter the same device."""
    _check_link(alpha_s, beta_Bps)
    links = [LinkInfo(f"gpu{a}", f"gpu{b}", spec_name, beta_Bps)
             for a in range(n) for b in range(a + 1, n)]
    return Topology("uniform", n, lambda s, d: Route(alpha_s, beta_Bps, _ports(s, d)),
                    links, {"all": tuple(range(n))})


def nvswitch(n: int, link: LinkSpec) -> Topology:
    """``n`` GPUs on an NVSwitch: each GPU has its own full-bandwidth port into the switch,
    so any set of transfers with distinct senders and receivers runs at full speed.

    The 4-GPU HGX A100 board wires each pair directly with a third of the links instead of
    using a switch; modelling it as a switch gives one pair up to 3x too much bandwidth but
    keeps the per-GPU total right."""
    links = [LinkInfo(f"gpu{g}", "nvswitch0", link.name, link.beta_Bps) for g in range(n)]
    return Topology("nvswitch", n, lambda s, d: Route(link.alpha_s, link.beta_Bps, _ports(s, d)),
                    links, {"nvswitch0": tuple(range(n))})


def pcie_host_bridge(n: int, link: LinkSpec, bridges: int = 1) -> Topology:
    """``n`` GPUs on PCIe, split evenly over ``bridges`` host bridges (CPU root complexes).

    Consumer GPUs such as the RTX 4090 have no peer-to-peer access, so a GPU-to-GPU copy
    goes through host memory: up through the bridge and back down. Every GPU under one
    bridge therefore shares it, and we model the bridge as one resource with the bandwidth
    of a single x16 link. Crossing to another bridge passes both (and pays twice the
    latency for the extra hop through the CPUs).
    """
    if not 1 <= bridges <= n:
        raise ValueError(f"bridges must be between 1 and n={n}, got {bridges}")
    bridge_of = [g * bridges // n for g in range(n)]

    def route_of(s: int, d: int) -> Route:
        a, b = bridge_of[s], bridge_of[d]
        if a == b:
            return Route(link.alpha_s, link.beta_Bps,
                         (f"gpu{s}.out", f"bridge{a}.fabric", f"gpu{d}.in"))
        return Route(2 * link.alpha_s, link.beta_Bps,
                     (f"gpu{s}.out", f"bridge{a}.fabric", f"bridge{b}.fabric", f"gpu{d}.in"))

    links = [LinkInfo(f"gpu{g}", f"bridge{bridge_of[g]}", link.name, link.beta_Bps,
                      f"bridge{bridge_of[g]}.fabric") for g in range(n)]
    links += [LinkInfo(f"bridge{b}", "host", link.name, link.beta_Bps, f"bridge{b}.fabric")
              for b in range(bridges)]
    groups = {f"bridge{b}": tuple(g for g in range(n) if bridge_of[g] == b)
              for b in range(bridges)}
    return Topology("pcie_host_bridge", n, route_of, links, groups)


def multi_node(nodes: int, per_node: int, intra_link: LinkSpec,
               inter_link: LinkSpec) -> Topology:
    """``nodes`` machines of ``per_node`` GPUs each; device ``g`` lives on node
    ``g // per_node``. Inside a node: NVSwitch ports. Between nodes: the transfer also holds
    the sending node's NIC (``"node{k}.nic.out"``) and the receiving node's
    (``"node{k}.nic.in"``) at the network's bandwidth, and pays both latencies.

    One NIC per node is the simple picture; a DGX H100 has one 400 Gb/s NIC per GPU, so
    real inter-node bandwidth can be up to ``per_node`` times higher.
    """
    if nodes < 1 or per_node < 1:
        raise ValueError(f"nodes and per_node must be >= 1, got {nodes} and {per_node}")
    n = nodes * per_node
    alpha_between = intra_link.alpha_s + inter_link.alpha_s
    beta_between = min(intra_link.beta_Bps, inter_link.beta_Bps)

    def route_of(s: int, d: int) -> Route:
        a, b = s // per_node, d // per_node
        if a == b:
            return Route(intra_link.alpha_s, intra_link.beta_Bps, _ports(s, d))
        return Route(alpha_between, beta_between,
                     (f"gpu{s}.out", f"node{a}.nic.out", f"node{b}.nic.in", f"gpu{d}.in"))

    links = [LinkInfo(f"gpu{g}", f"node{g // per_node}.nvswitch", intra_link.name,
                      intra_link.beta_Bps) for g in range(n)]
    links += [LinkInfo(f"node{k}.nvswitch", "network", inter_link.name, inter_link.beta_Bps,
                       f"node{k}.nic") for k in range(nodes)]
    groups = {f"node{k}": tuple(range(k * per_node, (k + 1) * per_node)) for k in range(nodes)}
    return Topology("multi_node", n, route_of, links, groups)


def _check_link(alpha_s: float, beta_Bps: float) -> None:
    if alpha_s < 0:
        raise ValueError(f"alpha_s (latency, seconds) must be >= 0, got {alpha_s}")
    if beta_Bps <= 0:
        raise ValueError(f"beta_Bps (bandwidth, bytes/s) must be > 0, got {beta_Bps}")
