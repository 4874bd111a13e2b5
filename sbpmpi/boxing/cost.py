"""The cost table of boxing: one alpha-beta model per communication primitive.

Every modelled time in sbpmpi comes from here. A primitive on a group of ``p`` ranks
moving a buffer of ``n`` bytes costs

    alpha * rounds(p) + beta * factor(p) * n

where ``rounds`` counts the latency-bound message rounds (as the usual short-message
algorithms need them) and ``factor`` is the algorithmic share of ``n`` that each rank
sends (and receives; the usual long-message algorithms reach it):

==============  ==========================  ==================  ===========================
primitive       n (bytes)                   rounds(p)           factor(p)
==============  ==========================  ==================  ===========================
all_gather      gathered output per rank    ceil(log2 p)        (p-1)/p
reduce_scatter  input per rank              ceil(log2 p)        (p-1)/p
all_reduce      buffer per rank             ceil(log2 p)        2(p-1)/p
all_to_all      p x input per rank (|T|)    p-1                 (p-1)/p^2
broadcast       buffer                      ceil(log2 p)        min(ceil(log2 p), 2(p-1)/p)
p2p             most bytes one rank moves   messages            1
copy            bytes copied locally        1 (per step)        1
==============  ==========================  ==================  ===========================

Host (``"cpu"``) and device (``"cuda"``) buffers have separate parameters. The table
in use must be the same on every rank (plans are computed independently on each rank);
:func:`sbpmpi.runtime.calibrate` measures one and installs it everywhere.

Hosts: a table may carry the job's :class:`Topology` (the node, or host, of every world
rank) and a ``network`` row, the parameters of the links between hosts. A collective
over a group whose ranks span hosts (:func:`group_seconds`) costs the larger of its
time on the row of its buffers and its time on the network for the bytes that cross:
each rank's share ``factor * n`` goes to the group's other ranks, the fraction of them on
other hosts crosses, and the ranks of one host share its link (:meth:`Topology.link_bytes`).
Without a topology, or for groups inside one host, the cost is exactly the formula above,
so plans on one host do not change.

This module is pure: functions take the table to use (``None``: :data:`DEFAULT_TABLE`).
The table *in use* on this rank (installed, calibrated, or the defaults with the device
row of the GPU transport in use) is kept by :mod:`sbpmpi.runtime.cost_table`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace

__all__ = [
    "PRIMITIVES",
    "AlphaBeta",
    "DeviceCosts",
    "CostTable",
    "DEFAULT_TABLE",
    "DEFAULT_NETWORK",
    "Topology",
    "rounds",
    "factor",
    "primitive_seconds",
    "group_seconds",
    "network_seconds",
    "crossing_parties",
    "copy_seconds",
    "step_seconds",
    "GPU_TRANSPORT_COSTS",
    "table_for_transport",
]

PRIMITIVES = ("all_gather", "reduce_scatter", "all_reduce", "all_to_all", "broadcast", "p2p",
              "copy")


@dataclass(frozen=True)
class AlphaBeta:
    """Latency ``alpha`` (seconds per round) and inverse bandwidth ``beta`` (seconds per byte)."""

    alpha: float
    beta: float

    def __post_init__(self) -> None:
        for name in ("alpha", "beta"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise ValueError(f"{name} must be a positive finite number of seconds, got {v!r}")


@dataclass(frozen=True)
class DeviceCosts:
    """Alpha-beta parameters of every primitive for one kind of buffer (host or device).

    ``step``: fixed seconds each plan step costs on top (dispatch, allocation), so that
    of two plans moving the same bytes the one with fewer steps wins.
    """

    all_gather: AlphaBeta
    reduce_scatter: AlphaBeta
    all_reduce: AlphaBeta
    all_to_all: AlphaBeta
    broadcast: AlphaBeta
    p2p: AlphaBeta
    copy: AlphaBeta
    step: float = 2e-6

    def __post_init__(self) -> None:
        if not isinstance(self.step, (int, float)) or not math.isfinite(self.step) \
                or self.step < 0:
            raise ValueError(f"step must be a non-negative number of seconds, got {self.step!r}")

    @classmethod
    def uniform(cls, alpha: float, beta: float, copy_alpha: float, copy_beta: float,
                p2p_alpha: float | None = None, step: float = 2e-6) -> DeviceCosts:
        """The same collective parameters for every primitive, and a copy rate."""
        ab = AlphaBeta(alpha, beta)
        return cls(ab, ab, ab, ab, ab, AlphaBeta(p2p_alpha or alpha, beta),
                   AlphaBeta(copy_alpha, copy_beta), step)

    def get(self, primitive: str) -> AlphaBeta:
        if primitive not in PRIMITIVES:
            raise ValueError(f"primitive {primitive!r} is not one of {PRIMITIVES}")
        return getattr(self, primitive)  # type: ignore[no-any-return]

    def with_(self, primitive: str, alpha: float | None = None,
              beta: float | None = None) -> DeviceCosts:
        """A copy with one primitive's parameters replaced."""
        old = self.get(primitive)
        new = AlphaBeta(old.alpha if alpha is None else alpha, old.beta if beta is None else beta)
        return replace(self, **{primitive: new})  # type: ignore[arg-type]


@dataclass(frozen=True)
class Topology:
    """The node (host) of every world rank: ``nodes[r]`` is rank ``r``'s node, numbered
    from 0 (as :func:`sbpmpi.env.topology` gives them)."""

    nodes: tuple[int, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.nodes, tuple) or not self.nodes or any(
                isinstance(k, bool) or not isinstance(k, int) or k < 0 for k in self.nodes):
            raise ValueError(f"nodes must be a non-empty tuple of node numbers >= 0, got "
                             f"{self.nodes!r}")

    @property
    def count(self) -> int:
        """The number of nodes."""
        return len(set(self.nodes))

    def by_node(self, group: Sequence[int]) -> tuple[tuple[int, ...], ...]:
        """The ranks of ``group`` on each of its nodes, in group order, the nodes in the
        order their first rank appears in ``group``."""
        out: dict[int, list[int]] = {}
        for r in group:
            out.setdefault(self.nodes[r], []).append(r)
        return tuple(tuple(v) for v in out.values())

    def spans(self, group: Sequence[int]) -> bool:
        """Whether ``group`` has ranks on more than one node."""
        return len({self.nodes[r] for r in group}) > 1

    def link_bytes(self, groups: Sequence[Sequence[int]], per_rank: float) -> float:
        """The most bytes one node's link carries when every rank of ``groups`` sends
        ``per_rank`` bytes spread evenly over its group's other ranks (0 when no group
        spans nodes)."""
        load: dict[int, float] = {}
        for g in groups:
            p = len(g)
            if p < 2 or not self.spans(g):
                continue
            here: dict[int, int] = {}
            for r in g:
                here[self.nodes[r]] = here.get(self.nodes[r], 0) + 1
            for r in g:
                k = self.nodes[r]
                load[k] = load.get(k, 0.0) + per_rank * (p - here[k]) / (p - 1)
        return max(load.values(), default=0.0)


@dataclass(frozen=True)
class CostTable:
    """Host and device parameters, and where they came from; where the job spans hosts,
    its ``topology`` and the ``network`` row (the links between hosts)."""

    host: DeviceCosts
    device: DeviceCosts
    source: str = "defaults"
    network: DeviceCosts | None = None
    topology: Topology | None = None

    def __hash__(self) -> int:  # cached: tables key the plan caches
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash((self.host, self.device, self.source, self.network, self.topology))
            object.__setattr__(self, "_hash", h)
        return h  # type: ignore[no-any-return]

    @property
    def network_costs(self) -> DeviceCosts:
        """The parameters of the links between hosts (:data:`DEFAULT_NETWORK` if unset)."""
        return self.network or DEFAULT_NETWORK

    def with_topology(self, topology: Topology | None,
                      network: DeviceCosts | None = None) -> CostTable:
        """This table for a job on ``topology`` (the network row kept, or ``network``)."""
        return replace(self, topology=topology, network=network or self.network)

    def params(self, device_type: str) -> DeviceCosts:
        """Parameters for buffers of ``device_type`` (``"cpu"`` or ``"cuda"``)."""
        if device_type == "cpu":
            return self.host
        if device_type == "cuda":
            return self.device
        raise ValueError(f"device type {device_type!r} is not one of ('cpu', 'cuda')")

    def __str__(self) -> str:
        lines = [f"boxing cost table ({self.source})",
                 f"  {'primitive':<15}{'cpu alpha':>11}{'cpu GB/s':>10}"
                 f"{'cuda alpha':>12}{'cuda GB/s':>11}"]
        for f in fields(DeviceCosts):
            if f.name == "step":
                continue
            h, d = getattr(self.host, f.name), getattr(self.device, f.name)
            lines.append(f"  {f.name:<15}{h.alpha * 1e6:>9.2f}us{1e-9 / h.beta:>10.2f}"
                         f"{d.alpha * 1e6:>10.2f}us{1e-9 / d.beta:>11.2f}")
        lines.append(f"  {'per step':<15}{self.host.step * 1e6:>9.2f}us{'':>10}"
                     f"{self.device.step * 1e6:>10.2f}us")
        if self.topology is not None and self.topology.count > 1:
            lines.append(f"  between hosts ({self.topology.count} hosts; "
                         f"{'measured' if self.network else 'defaults'}):")
            net = self.network_costs
            for f in fields(DeviceCosts):
                if f.name in ("step", "copy"):
                    continue
                n = getattr(net, f.name)
                lines.append(f"  {f.name:<15}{n.alpha * 1e6:>9.2f}us{1e-9 / n.beta:>10.2f}")
        return "\n".join(lines)


# Defaults: shared-memory MPI between processes of one node for host buffers; a
# CUDA-aware (or staged) MPI between GPUs for device buffers. Calibrate for real numbers.
DEFAULT_TABLE = CostTable(
    host=DeviceCosts.uniform(alpha=4e-6, beta=1 / 4e9, copy_alpha=1e-6, copy_beta=1 / 8e9,
                             p2p_alpha=3e-6, step=2e-6),
    device=DeviceCosts.uniform(alpha=15e-6, beta=1 / 20e9, copy_alpha=8e-6,
                               copy_beta=1 / 500e9, p2p_alpha=10e-6, step=10e-6),
)

# The links between hosts, until calibrate() measures them: a 10 Gbit/s network with a
# few tens of microseconds per message round.
DEFAULT_NETWORK = DeviceCosts.uniform(alpha=30e-6, beta=1 / 1.25e9, copy_alpha=1e-6,
                                      copy_beta=1 / 8e9, p2p_alpha=25e-6, step=2e-6)

# Device rows per GPU transport, estimated from measurements on one GPU shared by two
# ranks (docs/benchmarks.md, "GPU transport defaults"): a staged step goes device ->
# pinned host -> MPI shared memory -> device, so it pays a large fixed cost and host
# bandwidth; a CUDA IPC copy reads a peer's buffer at device bandwidth, plus a stream
# synchronisation and node barriers per call. "mpi" (a CUDA-aware library) keeps the
# generic defaults.
# calibrate() replaces them with measurements.
# Point-to-point moves (boxing's send_recv) are not carried by IPC yet: the ipc row keeps
# the staged p2p parameters (on a CUDA-aware MPI, calibrate() measures what they are).
_STAGED = DeviceCosts.uniform(alpha=80e-6, beta=1 / 1.5e9, copy_alpha=8e-6,
                              copy_beta=1 / 500e9, p2p_alpha=60e-6, step=100e-6)
GPU_TRANSPORT_COSTS: dict[str, DeviceCosts] = {
    "mpi": DEFAULT_TABLE.device,
    "staged": _STAGED,
    "ipc": replace(DeviceCosts.uniform(alpha=25e-6, beta=1 / 200e9, copy_alpha=8e-6,
                                       copy_beta=1 / 500e9, step=10e-6), p2p=_STAGED.p2p),
}


def table_for_transport(transport: str, table: CostTable = DEFAULT_TABLE) -> CostTable:
    """``table`` with the default device row of GPU ``transport`` (``ipc``/``mpi``/``staged``)."""
    row = GPU_TRANSPORT_COSTS.get(transport)
    if row is None:
        raise ValueError(f"transport {transport!r} is not one of {tuple(GPU_TRANSPORT_COSTS)}")
    if row is table.device:
        return table
    return replace(table, device=row, source=f"{table.source}; device row: {transport} defaults")


def _log2(p: int) -> int:
    return (p - 1).bit_length()  # ceil(log2 p) for p >= 1


def rounds(primitive: str, p: int) -> float:
    """Latency rounds of ``primitive`` on ``p`` ranks (messages for p2p)."""
    if primitive in ("all_gather", "reduce_scatter", "broadcast", "all_reduce"):
        return float(_log2(p))  # all_reduce: recursive doubling for short messages
    if primitive == "all_to_all":
        return float(p - 1)
    if primitive in ("p2p", "copy"):
        return float(p)
    raise ValueError(f"primitive {primitive!r} is not one of {PRIMITIVES}")


def factor(primitive: str, p: int) -> float:
    """Algorithmic share of the buffer each rank sends and receives."""
    if p <= 1 and primitive not in ("p2p", "copy"):
        return 0.0
    if primitive in ("all_gather", "reduce_scatter"):
        return (p - 1) / p
    if primitive == "all_reduce":
        return 2 * (p - 1) / p
    if primitive == "all_to_all":
        return (p - 1) / (p * p)
    if primitive == "broadcast":
        return min(float(_log2(p)), 2 * (p - 1) / p)
    if primitive in ("p2p", "copy"):
        return 1.0
    raise ValueError(f"primitive {primitive!r} is not one of {PRIMITIVES}")


def primitive_seconds(primitive: str, p: int, nbytes: float, device_type: str = "cpu",
                      table: CostTable | None = None) -> float:
    """Modelled seconds of one collective ``primitive`` over ``p`` ranks on ``nbytes``.

    For ``p2p``, ``p`` is the number of messages of the busiest rank and ``nbytes`` the
    bytes it sends or receives.
    """
    ab = (table or DEFAULT_TABLE).params(device_type).get(primitive)
    if primitive != "p2p" and p <= 1:
        return 0.0
    return ab.alpha * rounds(primitive, p) + ab.beta * factor(primitive, p) * float(nbytes)


def half_width_seconds(kind: str, p: int, nbytes: float, device_type: str = "cpu",
                       table: CostTable | None = None) -> float:
    """Modelled seconds of a reduction (``kind``: all_reduce or reduce_scatter) of ``nbytes``
    of 2-byte values over ``p`` ranks, as :mod:`sbpmpi.runtime.half_width` runs it: an
    all-to-all of the half-width blocks, a float32 sum (the blocks widened: twice their
    bytes copied), and for all_reduce a half-width all-gather of the sums. The bytes on
    the wire are those of the float32 reduction halved; the latency is the all-to-all's
    ``p - 1`` rounds. (2-byte integer sums, which MPI adds itself, are charged the same.)
    """
    if p <= 1:
        return 0.0
    secs = primitive_seconds("all_to_all", p, p * float(nbytes), device_type, table)
    secs += copy_seconds(2 * float(nbytes), device_type, table, ops=p)
    if kind == "all_reduce":
        secs += primitive_seconds("all_gather", p, float(nbytes), device_type, table)
    return secs


def step_seconds(device_type: str = "cpu", table: CostTable | None = None) -> float:
    """The fixed cost of one plan step."""
    return (table or DEFAULT_TABLE).params(device_type).step


def network_seconds(primitive: str, p: int, link_bytes: float,
                    table: CostTable | None = None) -> float:
    """Modelled seconds of ``primitive`` on the links between hosts when the busiest host's
    link carries ``link_bytes``; ``p``: the parties whose rounds cross hosts (the hosts a
    group spans; for p2p and all_to_all the messages that cross)."""
    net = (table or DEFAULT_TABLE).network_costs.get(primitive)
    r = float(p) if primitive in ("p2p", "all_to_all") else rounds(primitive, p)
    return net.alpha * r + net.beta * float(link_bytes)


def crossing_parties(primitive: str, groups: Sequence[Sequence[int]], topology: Topology) -> int:
    """The ``p`` of :func:`network_seconds` for a collective on ``groups``: the most hosts
    one group spans (a ring or recursive doubling over ranks placed host by host crosses
    hosts in the rounds of that many parties), for all_to_all the most messages of one
    rank to other hosts."""
    most = 1
    for g in groups:
        parts = topology.by_node(g)
        most = max(most, len(g) - min(len(x) for x in parts) if primitive == "all_to_all"
                   else len(parts))
    return most


def group_seconds(primitive: str, groups: Sequence[Sequence[int]], nbytes: float,
                  device_type: str = "cpu", table: CostTable | None = None) -> float:
    """Modelled seconds of one collective ``primitive`` run at once on each of ``groups``
    (equal sizes) on ``nbytes``: :func:`primitive_seconds`, or, where the table has a
    topology and a group spans hosts, the time on the network for the bytes that cross
    when that is longer."""
    t = table or DEFAULT_TABLE
    p = len(groups[0]) if groups else 1
    secs = primitive_seconds(primitive, p, nbytes, device_type, t)
    if t.topology is None or p <= 1:
        return secs
    load = t.topology.link_bytes(groups, factor(primitive, p) * float(nbytes))
    if load == 0:
        return secs
    return max(secs, network_seconds(primitive, crossing_parties(primitive, groups, t.topology),
                                     load, t))


def copy_seconds(nbytes: float, device_type: str = "cpu", table: CostTable | None = None,
                 ops: int = 1) -> float:
    """Modelled seconds of ``ops`` local steps copying or filling ``nbytes`` bytes in all."""
    ab = (table or DEFAULT_TABLE).params(device_type).copy
    return ab.alpha * ops + ab.beta * float(nbytes)
