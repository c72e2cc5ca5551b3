"""Topology: how the physical devices of a cluster are wired, and what a transfer occupies.

A transfer from one device to another follows a ``Route``: its latency ``alpha_s``, its
bandwidth ``beta_Bps`` (the slowest link on the way), the *ports* it holds and the *shared
caps* it crosses. A port, such as ``"gpu0.out"`` (device 0's NVSwitch port, sending) or
``"gpu0.up"`` (its PCIe uplink, towards the CPU), carries one transfer at a time: two
transfers that need it queue. A shared cap, such as ``"host0.memory"`` (the host memory that
staged PCIe copies cross) or ``"switch0.up"`` (a PCIe switch's one uplink), is divided fairly
among the transfers crossing it at each moment. That is the whole contention model: a ring on
NVSwitch uses disjoint ports and runs at full speed; the same ring on consumer GPUs shares
host memory; behind one PCIe switch it shares the switch's uplink, four ways.

Ids here are *physical* device ids; ``Cluster`` translates from logical ids.

Builders: ``uniform`` (the textbook model), ``nvswitch``, ``pcie_host`` (each card its own
uplink to a CPU root complex), ``pcie_switch`` (cards sharing a switch uplink), ``multi_node``
(one NIC per rail).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from mpgpu_edu.cluster.hardware import LinkSpec


@dataclass(frozen=True)
class Route:
    """What one transfer costs and occupies: ``alpha_s + nbytes / beta_Bps`` seconds when
    nothing else is in flight. ``resources`` are ports, held by one transfer at a time;
    ``shares`` are (name, bytes/s) caps that concurrent transfers divide fairly.

    ``alpha_holds``: the resources that alpha holds when it is work rather than a delay on
    the wire (a CPU process's per-message system calls and bookkeeping, done by the sender
    and the receiver before the bytes are copied); empty (a GPU link's latency, which
    messages in flight one behind another overlap) by default. Alone, a message costs
    ``alpha + nbytes / beta`` either way; a rank's pipelined messages pay their alphas one
    after another when it holds. ``alpha_shared`` is the fraction of such an alpha that also
    holds the route's ``resources`` (work that competes for cores every rank shares); the rest
    holds only ``alpha_holds``, so two ranks do it side by side."""

    alpha_s: float
    beta_Bps: float
    resources: tuple[str, ...]
    shares: tuple[tuple[str, float], ...] = ()
    alpha_holds: tuple[str, ...] = ()
    alpha_shared: float = 0.0  # the fraction of a held alpha that also holds ``resources``

    def __post_init__(self) -> None:
        # A transfer alone still moves no faster than the narrowest cap it crosses (a socket
        # link slower than the PCIe links around it): ``beta_Bps`` is the rate when alone.
        caps = [rate for _, rate in self.shares if rate > 0]
        if caps and min(caps) < self.beta_Bps:
            object.__setattr__(self, "beta_Bps", min(caps))

    def seconds(self, nbytes: int) -> float:
        """Time of one message of ``nbytes`` on this route when nothing else uses it."""
        return self.alpha_s + nbytes / self.beta_Bps


@dataclass(frozen=True)
class LinkInfo:
    """One wire, for figures. ``a`` and ``b`` name vertices: ``"gpu3"`` is physical device
    3; other names are switches, bridges or the host. ``shared_resource`` names the
    resource that every transfer over this wire competes for, or None when each device has
    its own port. ``beta_Bps`` is the effective bandwidth the simulator uses, ``peak_Bps``
    the spec sheet's (0 when not known)."""

    a: str
    b: str
    spec_name: str
    beta_Bps: float
    shared_resource: str | None = None
    peak_Bps: float = 0.0


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


def _switched(s: int, d: int, alpha_s: float, beta_Bps: float) -> Route:
    """Through a switch (NVSwitch): the sender's and receiver's ports are each shared fairly
    by the transfers using them at once, as NVLink interleaves them, instead of queueing."""
    return Route(alpha_s, beta_Bps, (), ((f"gpu{s}.out", beta_Bps), (f"gpu{d}.in", beta_Bps)))


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
    so any set of transfers with distinct senders and receivers runs at full speed, and
    transfers that leave (or enter) one GPU at once share its port fairly.

    The 4-GPU HGX A100 board wires each pair directly with a third of the links instead of
    using a switch; modelling it as a switch gives one pair up to 3x too much bandwidth but
    keeps the per-GPU total right."""
    links = [LinkInfo(f"gpu{g}", "nvswitch0", link.name, link.beta_Bps, None, link.peak_Bps)
             for g in range(n)]
    return Topology("nvswitch", n, lambda s, d: _switched(s, d, link.alpha_s, link.beta_Bps),
                    links, {"nvswitch0": tuple(range(n))})


def pcie_host(n: int, uplink: LinkSpec, memory: LinkSpec, sockets: int = 1,
              socket_link: LinkSpec | None = None) -> Topology:
    """``n`` consumer GPUs on PCIe, each on its own x16 uplink to a CPU root complex, split
    evenly over ``sockets`` CPUs.

    Consumer cards such as the RTX 4090 have peer-to-peer access disabled, so a GPU-to-GPU
    copy is staged in host memory: the sender writes it up its uplink, the receiver reads it
    down its own. A transfer holds two ports, ``gpu{s}.up`` and ``gpu{d}.down`` (one card's
    uplink in one direction), and shares host memory, which every staged byte crosses twice
    (a write, then a read): its cap is half of ``memory.beta_Bps``. Between sockets the copy
    also shares the inter-socket link (one direction of it) and pays twice the latency for
    the extra hop through the CPUs.
    """
    if not 1 <= sockets <= n:
        raise ValueError(f"sockets must be between 1 and n={n}, got {sockets}")
    if sockets > 1 and socket_link is None:
        raise ValueError("a two-socket box needs socket_link, the link between the CPUs")
    socket_of = [g * sockets // n for g in range(n)]

    def route_of(s: int, d: int) -> Route:
        a, b = socket_of[s], socket_of[d]
        shares: tuple[tuple[str, float], ...] = ((f"host{a}.memory", memory.beta_Bps / 2),)
        alpha = uplink.alpha_s
        if a != b:
            shares += ((f"socket{a}to{b}", socket_link.beta_Bps),)  # type: ignore[union-attr]
            alpha = 2 * uplink.alpha_s
        return Route(alpha, uplink.beta_Bps, (f"gpu{s}.up", f"gpu{d}.down"), shares)

    links = [LinkInfo(f"gpu{g}", f"bridge{socket_of[g]}", uplink.name, uplink.beta_Bps,
                      f"host{socket_of[g]}.memory", uplink.peak_Bps) for g in range(n)]
    links += [LinkInfo(f"bridge{a}", "host", socket_link.name, socket_link.beta_Bps,
                       f"socket{a}to{1 - a}", socket_link.peak_Bps)
              for a in range(sockets) if sockets == 2 and socket_link is not None]
    groups = {f"bridge{a}": tuple(g for g in range(n) if socket_of[g] == a)
              for a in range(sockets)}
    return Topology("pcie_host_bridge", n, route_of, links, groups)


def pcie_switch(n: int, uplink: LinkSpec, memory: LinkSpec, per_switch: int) -> Topology:
    """``n`` consumer GPUs behind PCIe switches, ``per_switch`` cards sharing each switch's
    single x16 uplink to the CPU (as in 8- and 10-card servers built on PCIe switches).

    Each card still has its own x16 port into the switch (``gpu{s}.up``, ``gpu{d}.down``),
    but with peer-to-peer disabled every copy is staged in host memory, so it climbs the
    sender's switch uplink and descends the receiver's: ``switch{k}.up`` and
    ``switch{k}.down`` are caps shared by every card under switch k, on top of host memory.
    """
    if per_switch < 1:
        raise ValueError(f"per_switch must be >= 1, got {per_switch}")
    switch_of = [g // per_switch for g in range(n)]

    def route_of(s: int, d: int) -> Route:
        shares = ((f"switch{switch_of[s]}.up", uplink.beta_Bps),
                  ("host0.memory", memory.beta_Bps / 2),
                  (f"switch{switch_of[d]}.down", uplink.beta_Bps))
        return Route(uplink.alpha_s, uplink.beta_Bps, (f"gpu{s}.up", f"gpu{d}.down"), shares)

    switches = sorted(set(switch_of))
    links = [LinkInfo(f"gpu{g}", f"switch{switch_of[g]}", uplink.name, uplink.beta_Bps,
                      None, uplink.peak_Bps) for g in range(n)]
    links += [LinkInfo(f"switch{k}", "host", uplink.name, uplink.beta_Bps, f"switch{k}.up",
                       uplink.peak_Bps)
              for k in switches]
    groups = {f"switch{k}": tuple(g for g in range(n) if switch_of[g] == k) for k in switches}
    return Topology("pcie_switch", n, route_of, links, groups)


def multi_node(nodes: int, per_node: int, intra_link: LinkSpec, nic: LinkSpec,
               nics_per_node: int = 1) -> Topology:
    """``nodes`` machines of ``per_node`` GPUs on NVSwitch; device ``g`` lives on node
    ``g // per_node`` as its local GPU ``g % per_node``. Each node has ``nics_per_node`` NICs
    on ``nic``'s network; local GPU i uses NIC ``i * nics_per_node // per_node``, so with one
    NIC per GPU (a DGX H100: eight 400 Gb/s NICs) GPU i of every node sits on *rail* i.

    Inside a node a transfer shares the two GPUs' NVSwitch ports. Between nodes it shares
    the sending GPU's NIC (``node{k}.nic{j}.out``) and the receiving GPU's (``.in``), reached
    over PCIe (GPUDirect RDMA), not NVLink, and pays both latencies.
    """
    if nodes < 1 or per_node < 1:
        raise ValueError(f"nodes and per_node must be >= 1, got {nodes} and {per_node}")
    if not 1 <= nics_per_node <= per_node:
        raise ValueError(f"nics_per_node must be between 1 and per_node={per_node}, "
                         f"got {nics_per_node}")
    n = nodes * per_node
    alpha_between = intra_link.alpha_s + nic.alpha_s
    beta_between = min(intra_link.beta_Bps, nic.beta_Bps)

    def nic_of(g: int) -> str:
        return f"node{g // per_node}.nic{(g % per_node) * nics_per_node // per_node}"

    def route_of(s: int, d: int) -> Route:
        if s // per_node == d // per_node:
            return _switched(s, d, intra_link.alpha_s, intra_link.beta_Bps)
        return Route(alpha_between, beta_between, (),
                     ((f"{nic_of(s)}.out", nic.beta_Bps), (f"{nic_of(d)}.in", nic.beta_Bps)))

    links = [LinkInfo(f"gpu{g}", f"node{g // per_node}.nvswitch", intra_link.name,
                      intra_link.beta_Bps, None, intra_link.peak_Bps) for g in range(n)]
    links += [LinkInfo(f"node{k}.nvswitch", "network", nic.name, nic.beta_Bps,
                       f"node{k}.nic{j}", nic.peak_Bps)
              for k in range(nodes) for j in range(nics_per_node)]
    groups = {f"node{k}": tuple(range(k * per_node, (k + 1) * per_node)) for k in range(nodes)}
    return Topology("multi_node", n, route_of, links, groups)


def _check_link(alpha_s: float, beta_Bps: float) -> None:
    if alpha_s < 0:
        raise ValueError(f"alpha_s (latency, seconds) must be >= 0, got {alpha_s}")
    if beta_Bps <= 0:
        raise ValueError(f"beta_Bps (bandwidth, bytes/s) must be > 0, got {beta_Bps}")
