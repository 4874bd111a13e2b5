"""Entry points the collectives call for GPU arrays when the transport is ``ipc``.

Each function returns True when it carried out the call over CUDA IPC, False (on every
rank of the group alike) when the call must take the MPI path: the group spans nodes,
no device can export memory, or some rank's arrays cannot be exported. Arguments were
checked by the caller already. The collectives test :data:`ENABLED` first, so host calls
and the other transports pay one attribute read.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from mpi4py import MPI

from ... import backend, config
from ...backend import device_copy
from ..buffers import ArrayMeta
from ..group import Group
from ..reduce_op import ReduceOp
from ..tracing import ACTIVE, note
from ..watchdog import watch
from . import schedule as S
from .device import Device
from .hier import Hierarchical, node_split
from .ipc import Buffer, IpcTransport
from .select import ipc_chosen

Transport = IpcTransport | Hierarchical

__all__ = ["ENABLED", "set_device", "get_device", "transport_for", "transports",
           "all_gather", "all_gather_v", "reduce_scatter", "reduce_scatter_v", "all_reduce",
           "all_to_all", "all_to_all_v", "broadcast", "exchange"]

# On when the GPU transport is ipc (.select decides; kept here for the collectives' test).
ENABLED: bool = ipc_chosen()
# all-reduce reads every peer's whole buffer (2 synchronisations) up to this size, or at
# 2 ranks (the same bytes either way); above it, reduce-scatter + all-gather (3). To tune
# on a GPU.
DIRECT_ALL_REDUCE_BYTES = 256 << 10
_device: Device | None = None
_device_reason = ""
_transports: dict[tuple[int, ...], Transport | str] = {}


def _follow(_: object) -> None:
    global ENABLED
    ENABLED = ipc_chosen()


config.on_update("gpu_transport", _follow)


def set_device(device: Device | None) -> None:
    """Use ``device`` for IPC (a stand-in in tests; None: CuPy's, found on first use).

    Closes the mappings of the transports built so far.
    """
    global _device, _device_reason
    for t in _transports.values():
        if isinstance(t, Hierarchical):
            t.close_all()
            t.node.comm.Free()
        elif isinstance(t, IpcTransport):
            t.close_all()
            t.comm.Free()
    _transports.clear()
    _device, _device_reason = device, ""


def get_device() -> Device | None:
    """The device used for IPC, or None (with the reason in :func:`device_reason`)."""
    global _device, _device_reason
    if _device is None and not _device_reason:
        if not backend.cupy_available():
            _device_reason = "no CuPy / no GPU"
        else:
            try:
                from .device import CupyDevice

                _device = CupyDevice()
            except Exception as e:
                _device_reason = f"CUDA IPC unavailable: {type(e).__name__}: {e}"
    return _device


def device_reason() -> str:
    return _device_reason


def transport_for(g: Group, comm: MPI.Intracomm) -> Transport | str:
    """The IPC transport of group ``g`` (hierarchical when it spans nodes), or why it has
    none (collective over the group on first use)."""
    hit = _transports.get(g.ranks)
    if hit is None:
        dev = get_device()
        node = node_split(comm)
        one_node = node.Get_size() == comm.Get_size()
        have = comm.allreduce(int(dev is not None), op=MPI.MIN)
        if not have or dev is None:
            node.Free()
            hit = "some rank has no device that can export memory" + (
                f" ({_device_reason})" if _device_reason else "")
        elif one_node:
            hit = IpcTransport(dev, node)
        else:
            h = Hierarchical.build(IpcTransport(dev, node), comm)
            if isinstance(h, str):
                node.Free()
            hit = h
        _transports[g.ranks] = hit
    return hit


def transports() -> dict[tuple[int, ...], Transport | str]:
    """Group ranks -> its transport or why it has none (for sbpmpi.comm.info)."""
    return dict(_transports)


def _owned(dev: Device, arrays: Sequence[Any]) -> bool:
    return all(dev.owns(a) for a in arrays)


def _contig(a: Any, m: ArrayMeta) -> Any:
    return a if m.contiguous else device_copy.ascontiguous_device(a)


def _run(name: str, g: Group, comm: MPI.Intracomm, m: ArrayMeta, arrays: Sequence[Any],
         roles: dict[str, tuple[Any, int]], make: Callable[[np.ndarray], S.Schedule],
         meta: Any = (), op: ReduceOp | None = None, average: tuple[Any, int] | None = None,
         traced: int = 0, export: tuple[str, ...] = ("in",),
         hier: Callable[[Hierarchical, dict[str, Buffer]], bool] | None = None) -> bool:
    if not ENABLED:
        return False
    t = transport_for(g, comm)
    if isinstance(t, str) or (isinstance(t, Hierarchical) and hier is None):
        return False  # the same on every rank of the group
    dev = t.device
    ok = _owned(dev, arrays)
    bufs = {r: Buffer(dev.pointer(a) if ok and n else 0, n) for r, (a, n) in roles.items()}
    if isinstance(t, Hierarchical):
        assert hier is not None
        if not comm.allreduce(int(ok), op=MPI.MIN):  # every node must agree, not just one
            t.stats["fallbacks"] += 1
            return False
        with watch(name, g.ranks):
            done = hier(t, bufs)
    else:
        with watch(name, g.ranks):
            done = t.run(name, bufs, ok, make, meta, m.dtype, op, export)
    if done:
        if average is not None and op is ReduceOp.AVG and average[1]:
            dev.divide(dev.pointer(average[0]), average[1], m.dtype, g.size)
        if ACTIVE:
            note(name, traced, g, m.dtype, None, True, False)
    return done


def all_gather(out: Any, arr: Any, m: ArrayMeta, g: Group, comm: MPI.Intracomm) -> bool:
    """``out`` (p blocks) gets ``arr`` of every rank."""
    p, me = g.size, comm.Get_rank()
    nb = m.nbytes
    arr = _contig(arr, m)
    counts, displs = [nb] * p, [k * nb for k in range(p)]
    return _run("all_gather", g, comm, m, (out, arr), {"in": (arr, nb), "out": (out, p * nb)},
                lambda _: S.all_gather_v(p, me, counts, displs), traced=nb,
                hier=lambda h, b: h.all_gather_v("all_gather", b["in"].ptr, b["out"].ptr,
                                                 p * nb, True, counts, displs))


def all_gather_v(out: Any, arr: Any, m: ArrayMeta, counts: Sequence[int],
                 displs: Sequence[int], need: int, g: Group, comm: MPI.Intracomm) -> bool:
    p, me, it = g.size, comm.Get_rank(), m.dtype.itemsize
    arr = _contig(arr, m)
    cb, db = [c * it for c in counts], [d * it for d in displs]
    return _run("all_gather_v", g, comm, m, (out, arr),
                {"in": (arr, m.size * it), "out": (out, need * it)},
                lambda _: S.all_gather_v(p, me, cb, db), traced=m.size * it,
                hier=lambda h, b: h.all_gather_v("all_gather_v", b["in"].ptr, b["out"].ptr,
                                                 need * it, True, cb, db))


def reduce_scatter(out: Any, x: Any, m: ArrayMeta, mi: ArrayMeta, op: ReduceOp,
                   g: Group, comm: MPI.Intracomm) -> bool:
    """``out`` = block ``me`` of the reduction of the packed inputs (p blocks of m.size)."""
    return reduce_scatter_v(out, x, m, mi, [m.size] * g.size, op, g, comm, "reduce_scatter")


def reduce_scatter_v(out: Any, x: Any, m: ArrayMeta, mi: ArrayMeta,
                     counts: Sequence[int], op: ReduceOp, g: Group, comm: MPI.Intracomm,
                     name: str = "reduce_scatter_v") -> bool:
    p, me, it = g.size, comm.Get_rank(), m.dtype.itemsize
    x = _contig(x, mi)
    return _run(name, g, comm, m, (out, x), {"in": (x, mi.size * it), "out": (out, m.size * it)},
                lambda _: S.reduce_scatter_v(p, me, [c * it for c in counts]), op=op,
                average=(out, m.size * it), traced=mi.size * it)


def all_reduce(arr: Any, m: ArrayMeta, op: ReduceOp, g: Group,
               comm: MPI.Intracomm) -> bool:
    p, me, it = g.size, comm.Get_rank(), m.dtype.itemsize
    nb = m.size * it
    return _run("all_reduce", g, comm, m, (arr,), {"in": (arr, nb), "out": (arr, nb)},
                lambda _: (S.all_reduce_direct if p == 2 or nb <= DIRECT_ALL_REDUCE_BYTES
                           else S.all_reduce)(p, me, m.size, it), op=op, average=(arr, nb),
                traced=nb,
                export=("out",),
                hier=lambda h, b: h.all_reduce("all_reduce", b["out"].ptr, True, m.size, m.dtype, op))


def all_to_all(out: Any, x: Any, m: ArrayMeta, mi: ArrayMeta, g: Group,
               comm: MPI.Intracomm) -> bool:
    """Block j of rank i's input goes to block i of rank j's ``out`` (blocks of m.size)."""
    p, me, it = g.size, comm.Get_rank(), m.dtype.itemsize
    b = m.size * it
    x = _contig(x, mi)
    return _run("all_to_all", g, comm, m, (out, x), {"in": (x, p * b), "out": (out, p * b)},
                lambda _: S.all_to_all_v(p, me, [[b] * p] * p, [[j * b for j in range(p)]] * p,
                                         [k * b for k in range(p)]), traced=p * b)


def all_to_all_v(out: Any, oc: Sequence[int], od: Sequence[int], oneed: int, arr: Any,
                 ic: Sequence[int], idd: Sequence[int], m: ArrayMeta, g: Group,
                 comm: MPI.Intracomm) -> bool:
    p, me, it = g.size, comm.Get_rank(), m.dtype.itemsize
    arr = _contig(arr, m)

    def make(meta: np.ndarray) -> S.Schedule:
        return S.all_to_all_v(p, me, (meta[:, :p] * it).tolist(), (meta[:, p:] * it).tolist(),
                              [d * it for d in od])
    return _run("all_to_all_v", g, comm, m, (out, arr),
                {"in": (arr, m.size * it), "out": (out, oneed * it)}, make,
                meta=list(ic) + list(idd), traced=sum(ic) * it)


def broadcast(arr: Any, m: ArrayMeta, root: int, g: Group, comm: MPI.Intracomm) -> bool:
    p, me = g.size, comm.Get_rank()
    nb = m.nbytes
    return _run("broadcast", g, comm, m, (arr,), {"in": (arr, nb), "out": (arr, nb)},
                lambda _: S.broadcast(p, me, root, nb), traced=nb if me == root else 0)


def exchange(out: Any, arr: Any, m: ArrayMeta, moves: Sequence[S.P2P], out_nbytes: int,
             g: Group, comm: MPI.Intracomm) -> bool:
    """Point-to-point moves between the ranks of ``g`` (every rank passes the same list):
    bytes of rank ``src``'s ``arr`` land in rank ``dst``'s ``out``."""
    p, me = g.size, comm.Get_rank()
    arr = _contig(arr, m)
    nb = m.nbytes
    return _run("exchange", g, comm, m, (out, arr), {"in": (arr, nb), "out": (out, out_nbytes)},
                lambda _: S.exchange(p, me, moves), traced=nb)
