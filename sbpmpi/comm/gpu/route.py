"""The route of each collective call while the GPU transport is ``ipc``, decided by the
whole group, and the IPC calls themselves.

A call goes one of three ways, the same on every rank of its group:

- the **MPI path**: each rank hands MPI its own buffers, host arrays as they are and device
  arrays directly or staged (:mod:`..buffers`). MPI matches calls, not buffers, so ranks
  with host arrays, staged device arrays and device pointers meet in the same MPI call;
- **IPC on one node** (:mod:`.ipc`);
- **hierarchical IPC** across nodes (:mod:`.hier`).

While ``ipc`` is off every call takes the MPI path and nothing needs deciding (the
collectives read ``STATE.enabled`` first). While it is on:

1. A call whose group is known to have no IPC path for it (it spans nodes unevenly, or
   the collective has no hierarchical form) takes the MPI path at once: the group built
   its transport together, so every rank knows it alike.
2. Otherwise this rank makes its offer (:func:`.ipc.make_offer`): ready only when every
   array of the call is an exportable device array and its exports succeeded.
3. The group decides in one small exchange whether every rank's offer is ready (the
   caller's ``agree``: :meth:`sbpmpi.comm.call.Call.gpu`, which in checked mode is the
   signature agreement itself). Only then does any rank build the transport (on first
   use) and enter the protocol; else every rank takes the MPI path.

So a rank with host arrays, memory that cannot be exported or an export that fails sends
the whole group down the MPI path before anyone enters a phase, on one node and across
nodes alike.

Each entry point takes ``agree`` (this rank's readiness -> whether every rank of the
group is ready), ``device`` (every array of the call on this rank is a GPU array), the
call's arguments (checked by the caller already), the group and its communicator. It
returns True when it carried out the call over CUDA IPC, False (on every rank alike) when
the call takes the MPI path.

Boxing's point-to-point moves (:mod:`sbpmpi.runtime.execute`) are pairs of sends and
receives, not collective over a group, so they take the MPI path: an IPC form needs the
moves of a conversion made one collective step over its placement group first.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
from mpi4py import MPI

from ... import backend, config
from ...backend import device_copy
from ..buffers import ArrayMeta
from ..group import Group
from ..lifecycle.watchdog import watch
from ..reduce_op import ReduceOp
from ..trace import ACTIVE, note
from . import schedule as S
from .device import Device
from .hier import Hierarchical, node_split
from .ipc import Buffer, IpcTransport, Offer, make_offer
from .select import ipc_chosen

Transport = IpcTransport | Hierarchical
#: this rank's readiness -> whether every rank of the group is ready (one exchange)
Agree = Callable[[bool], bool]


class GroupCall(NamedTuple):
    """What every entry point is asked with: how the group decides, whether every array of
    the call on this rank is a GPU array, the group and its communicator."""

    agree: Agree
    device: bool
    g: Group
    comm: MPI.Intracomm

__all__ = ["STATE", "RouteState", "Agree", "GroupCall", "Role", "IpcCall", "set_device", "get_device",
           "transport_for",
           "transports", "all_gather", "all_gather_v", "reduce_scatter", "reduce_scatter_v",
           "all_reduce", "all_to_all", "all_to_all_v", "broadcast"]

# all-reduce reads every peer's whole buffer (p + 1 device operations) up to this size, or
# at 2 ranks (the same bytes either way); above it, reduce-scatter + all-gather (2p
# operations, 2(p-1)/p of the bytes); both hold two node barriers. To tune on a GPU.
DIRECT_ALL_REDUCE_BYTES = 256 << 10


@dataclass
class RouteState:
    """This rank's IPC state: whether ipc is the transport, the device and why there is
    none, and each group's transport (built on first use, collectively)."""

    #: On when the GPU transport is ipc (.select decides; follows the settings).
    enabled: bool = False
    device: Device | None = None
    device_reason: str = ""
    transports: dict[tuple[int, ...], Transport | str] = field(default_factory=dict)

    def follow(self, _: object = None) -> None:
        """Follow the settings (the hook :func:`sbpmpi.config.on_update` calls)."""
        self.enabled = ipc_chosen()

    def set_device(self, device: Device | None) -> None:
        """Use ``device``, closing the mappings of the transports built so far."""
        for t in self.transports.values():
            if isinstance(t, Hierarchical):
                t.close_all()
                t.node.comm.Free()
            elif isinstance(t, IpcTransport):
                t.close_all()
                t.comm.Free()
        self.transports.clear()
        self.device, self.device_reason = device, ""

    def get_device(self) -> Device | None:
        """The device, made on first use (CuPy's), or None with the reason kept."""
        if self.device is None and not self.device_reason:
            if not backend.cupy_available():
                self.device_reason = "no CuPy / no GPU"
            else:
                try:
                    from .device import CupyDevice

                    self.device = CupyDevice()
                except Exception as e:
                    self.device_reason = f"CUDA IPC unavailable: {type(e).__name__}: {e}"
        return self.device


STATE = RouteState(enabled=ipc_chosen())
config.on_update("gpu_transport", STATE.follow)
config.on_update("cuda_aware", STATE.follow)  # ipc stays off beside a CUDA-aware MPI (.select)


def set_device(device: Device | None) -> None:
    """Use ``device`` for IPC (a stand-in in tests; None: CuPy's, found on first use).

    Closes the mappings of the transports built so far.
    """
    STATE.set_device(device)


def get_device() -> Device | None:
    """The device used for IPC, or None (with the reason in :func:`device_reason`)."""
    return STATE.get_device()


def device_reason() -> str:
    return STATE.device_reason


def transport_for(g: Group, comm: MPI.Intracomm, dev: Device) -> Transport | str:
    """The IPC transport of group ``g`` (hierarchical when it spans nodes), or why it has
    none. Collective over the group on first use: called once every rank of it agreed to
    take the IPC path (so every rank has ``dev``)."""
    hit = STATE.transports.get(g.ranks)
    if hit is None:
        node = node_split(comm)
        if node.Get_size() == comm.Get_size():
            hit = IpcTransport(dev, node)
        else:
            h = Hierarchical.build(IpcTransport(dev, node), comm)
            if isinstance(h, str):
                node.Free()
            hit = h
        STATE.transports[g.ranks] = hit
    return hit


def transports() -> dict[tuple[int, ...], Transport | str]:
    """Group ranks -> its transport or why it has none (for sbpmpi.comm.info)."""
    return dict(STATE.transports)


class Role(NamedTuple):
    """One buffer of this rank in a call: the array and its bytes."""

    array: Any
    nbytes: int


class IpcCall(NamedTuple):
    """What one collective asks of the IPC path on this rank."""

    name: str
    roles: Mapping[str, Role]  # "in" / "out"
    make: Callable[[np.ndarray], S.Schedule]  # the flat schedule (of the gathered meta)
    reads: tuple[str, ...] = ("in",)  # the roles peers read on one node
    hier: Callable[[Hierarchical, Offer], bool] | None = None  # the hierarchical form
    hier_reads: tuple[str, ...] = ("out",)  # the roles peers read in it
    meta: Any = ()
    op: ReduceOp | None = None
    average: str | None = None  # the role divided by the group size after an AVG
    traced: int = 0


def _no_path(g: Group, hierarchical_form: bool) -> bool:
    """True when the group is known (on every rank alike) to have no IPC path for a call."""
    t = STATE.transports.get(g.ranks)
    return isinstance(t, str) or (isinstance(t, Hierarchical) and not hierarchical_form)


def _decline(agree: Agree, g: Group) -> bool:
    """This rank cannot take the IPC path (host arrays): the group hears it."""
    agree(False)
    _count_fallback(STATE.transports.get(g.ranks), "some of its arrays are host arrays")
    return False


def _contig(a: Any, m: ArrayMeta) -> Any:
    return a if m.contiguous else device_copy.ascontiguous_device(a)


def _exported(c: IpcCall, known: Transport | str | None) -> tuple[str, ...]:
    """The roles to export: those the group's path reads (both paths' before it is built)."""
    if isinstance(known, IpcTransport):
        return c.reads
    if isinstance(known, Hierarchical):
        return c.hier_reads
    return tuple(dict.fromkeys(c.reads + (c.hier_reads if c.hier else ())))


def _offer(c: IpcCall, known: Transport | str | None, dev: Device | None) -> Offer:
    """Step 2 of the route: this rank's offer on the IPC device ``dev`` (None: it has none)."""
    if dev is None:
        bufs = {role: Buffer(0, r.nbytes) for role, r in c.roles.items()}
        return Offer(bufs, {}, False, f"no device can export memory ({STATE.device_reason})")
    owned = all(dev.owns(r.array) for r in c.roles.values())
    bufs = {role: Buffer(dev.pointer(r.array) if owned and r.nbytes else 0, r.nbytes)
            for role, r in c.roles.items()}
    return make_offer(dev, bufs, _exported(c, known), owned)


def _count_fallback(known: Transport | str | None, why_not: str) -> None:
    """A call of a group with a transport took the MPI path: count it, and keep why this
    rank was not ready (``""``: it was)."""
    if known is None or isinstance(known, str):
        return
    node = known.node if isinstance(known, Hierarchical) else known
    node.stats["fallbacks"] += 1
    if why_not:
        node.last_error = why_not


def _run(agree: Agree, g: Group, comm: MPI.Intracomm, m: ArrayMeta, c: IpcCall) -> bool:
    """Steps 2 and 3 of the route, then the call over IPC when the group agreed."""
    known = STATE.transports.get(g.ranks)
    dev = get_device()
    offer = _offer(c, known, dev)
    if not agree(offer.ready):
        _count_fallback(known, offer.reason)
        return False
    assert dev is not None  # ready implies a device
    t = transport_for(g, comm, dev)
    if isinstance(t, str):
        return False  # the same on every rank of the group
    with watch(c.name, g.ranks):
        if isinstance(t, IpcTransport):
            done = t.run(c.name, offer, c.make, c.meta, m.dtype, c.op)
        elif c.hier is not None:
            done = c.hier(t, offer)
        else:
            return False  # no hierarchical form: the same on every rank of the group
    if done:
        if c.average is not None and c.op is ReduceOp.AVG:
            r = c.roles[c.average]
            if r.nbytes:
                dev.divide(dev.pointer(r.array), r.nbytes, m.dtype, g.size)
        if ACTIVE:
            note(c.name, c.traced, g, m.dtype, device=True)
    return done


def all_gather(gc: GroupCall, out: Any, arr: Any, m: ArrayMeta) -> bool:
    """``out`` (p blocks) gets ``arr`` of every rank."""
    agree, device, g, comm = gc
    if _no_path(g, True):
        return False
    if not device:
        return _decline(agree, g)
    p, me = g.size, comm.Get_rank()
    nb = m.nbytes
    arr = _contig(arr, m)
    counts, displs = [nb] * p, [k * nb for k in range(p)]
    return _run(agree, g, comm, m, IpcCall(
        "all_gather", {"in": Role(arr, nb), "out": Role(out, p * nb)},
        lambda _: S.all_gather_v(p, me, counts, displs), traced=nb,
        hier=lambda h, o: h.all_gather_v("all_gather", o, counts, displs)))


def all_gather_v(gc: GroupCall, out: Any, arr: Any, m: ArrayMeta, *, counts: Sequence[int],
                 displs: Sequence[int], need: int) -> bool:
    """``out`` gets ``arr`` of every rank, rank k's ``counts[k]`` elements at ``displs[k]``
    (``need`` elements in all)."""
    agree, device, g, comm = gc
    if _no_path(g, True):
        return False
    if not device:
        return _decline(agree, g)
    p, me, it = g.size, comm.Get_rank(), m.dtype.itemsize
    arr = _contig(arr, m)
    cb, db = [c * it for c in counts], [d * it for d in displs]
    return _run(agree, g, comm, m, IpcCall(
        "all_gather_v", {"in": Role(arr, m.size * it), "out": Role(out, need * it)},
        lambda _: S.all_gather_v(p, me, cb, db), traced=m.size * it,
        hier=lambda h, o: h.all_gather_v("all_gather_v", o, cb, db)))


def reduce_scatter(gc: GroupCall, out: Any, x: Any, m: ArrayMeta, mi: ArrayMeta,
                   op: ReduceOp) -> bool:
    """``out`` = block ``me`` of the reduction of the packed inputs (p blocks of m.size)."""
    return reduce_scatter_v(gc, out, x, m, mi, [m.size] * gc.g.size, op, name="reduce_scatter")


def reduce_scatter_v(gc: GroupCall, out: Any, x: Any, m: ArrayMeta, mi: ArrayMeta,
                     counts: Sequence[int], op: ReduceOp, *,
                     name: str = "reduce_scatter_v") -> bool:
    """``out`` = block ``me`` (``counts[me]`` elements) of the reduction of the packed
    inputs."""
    agree, device, g, comm = gc
    if _no_path(g, False):
        return False
    if not device:
        return _decline(agree, g)
    p, me, it = g.size, comm.Get_rank(), m.dtype.itemsize
    x = _contig(x, mi)
    return _run(agree, g, comm, m, IpcCall(
        name, {"in": Role(x, mi.size * it), "out": Role(out, m.size * it)},
        lambda _: S.reduce_scatter_v(p, me, [c * it for c in counts]), op=op,
        average="out", traced=mi.size * it))


def all_reduce(gc: GroupCall, arr: Any, m: ArrayMeta, op: ReduceOp) -> bool:
    """``arr`` = the reduction of every rank's ``arr``."""
    agree, device, g, comm = gc
    if _no_path(g, True):
        return False
    if not device:
        return _decline(agree, g)
    p, me, it = g.size, comm.Get_rank(), m.dtype.itemsize
    nb = m.size * it
    direct = p == 2 or nb <= DIRECT_ALL_REDUCE_BYTES
    return _run(agree, g, comm, m, IpcCall(
        "all_reduce", {"in": Role(arr, nb), "out": Role(arr, nb)},
        lambda _: (S.all_reduce_direct if direct else S.all_reduce)(p, me, m.size, it),
        reads=("out",), op=op, average="out", traced=nb,
        hier=lambda h, o: h.all_reduce("all_reduce", o, m.size, m.dtype, op)))


def all_to_all(gc: GroupCall, out: Any, x: Any, m: ArrayMeta, mi: ArrayMeta) -> bool:
    """Block j of rank i's input goes to block i of rank j's ``out`` (blocks of m.size)."""
    agree, device, g, comm = gc
    if _no_path(g, False):
        return False
    if not device:
        return _decline(agree, g)
    p, me, it = g.size, comm.Get_rank(), m.dtype.itemsize
    b = m.size * it
    x = _contig(x, mi)
    return _run(agree, g, comm, m, IpcCall(
        "all_to_all", {"in": Role(x, p * b), "out": Role(out, p * b)},
        lambda _: S.all_to_all_v(p, me, [[b] * p] * p, [[j * b for j in range(p)]] * p,
                                 [k * b for k in range(p)]), traced=p * b))


def all_to_all_v(gc: GroupCall, out: Any, arr: Any, m: ArrayMeta, *,
                 out_counts: Sequence[int], out_displs: Sequence[int], out_need: int,
                 in_counts: Sequence[int], in_displs: Sequence[int]) -> bool:
    """Rank i's ``arr[in_displs[j]:][:in_counts[j]]`` to ``out[out_displs[i]:][:out_counts[i]]``
    of rank j (``out_need`` elements of ``out`` in all). Every rank's counts ride in the
    records, so every rank checks that what each rank sends is what its receiver expects,
    alike, before any copy (a copy of the sender's count would write past the receiver's
    block, even past ``out``)."""
    agree, device, g, comm = gc
    oc, od, oneed, ic, idd = out_counts, out_displs, out_need, in_counts, in_displs
    if _no_path(g, False):
        return False
    if not device:
        return _decline(agree, g)
    p, me, it = g.size, comm.Get_rank(), m.dtype.itemsize
    arr = _contig(arr, m)

    def make(meta: np.ndarray) -> S.Schedule:
        sent, placed, expected = meta[:, :p], meta[:, p:2 * p], meta[:, 2 * p:]
        wrong = _count_mismatch(sent, expected)
        if wrong:
            raise ValueError(f"all_to_all_v: {wrong}")
        return S.all_to_all_v(p, me, (sent * it).tolist(), (placed * it).tolist(),
                              [d * it for d in od])
    return _run(agree, g, comm, m, IpcCall(
        "all_to_all_v", {"in": Role(arr, m.size * it), "out": Role(out, oneed * it)}, make,
        meta=[*ic, *idd, *oc], traced=sum(ic) * it))


def _count_mismatch(sent: np.ndarray, expected: np.ndarray) -> str:
    """The first pair of ranks (in row order) whose all-to-all-v counts disagree, in the
    words of comm's checked mode; ``""`` when none. ``sent[i, j]``: the elements group rank
    i sends to j (its ``in_counts[j]``); ``expected[j, i]``: those j expects from i (its
    ``out_counts[i]``)."""
    bad = np.argwhere(sent != expected.T)
    if not bad.size:
        return ""
    i, j = (int(v) for v in bad[0])
    return (f"group rank {i} sends in_counts[{j}] = {int(sent[i, j])} elements to group rank "
            f"{j}, which expects out_counts[{i}] = {int(expected[j, i])}")


def broadcast(gc: GroupCall, arr: Any, m: ArrayMeta, root: int) -> bool:
    """``arr`` of world rank ``root`` on every rank."""
    agree, device, g, comm = gc
    if _no_path(g, False):
        return False
    if not device:
        return _decline(agree, g)
    p, me = g.size, comm.Get_rank()
    nb = m.nbytes
    return _run(agree, g, comm, m, IpcCall(
        "broadcast", {"in": Role(arr, nb), "out": Role(arr, nb)},
        lambda _: S.broadcast(p, me, root, nb), traced=nb if me == root else 0))
