"""Hierarchical collectives for groups that span nodes: CUDA IPC on each node, one MPI
exchange between nodes.

Used when every node holds the same number ``m >= 2`` of the group's ranks. The ranks of a
node are one IPC transport; the ranks with the same local index ``l`` on every node form
the *cross* communicator, whose leg goes through pinned host buffers (MPI, staged):

- all-reduce: IPC reduce-scatter on the node (rank ``l`` holds node block ``l``), the
  cross all-reduce of block ``l`` (``1/m`` of the bytes per rank instead of all of them),
  IPC all-gather on the node;
- all-gather(v): the cross all-gather of the blocks of the ranks with local index ``l``
  (written to their places in ``out``), then IPC copies of the other local indices' blocks
  from the node peers that hold them, read at the places each peer wrote them (its own
  displacements, gathered with the node's records).

With ``m >= 2`` this moves ``m`` times fewer bytes through host memory and MPI than the
flat staged call, and the node legs run at device speed, so it is the cheaper plan under
every cost row of :mod:`sbpmpi.boxing.cost`; with ``m = 1`` it is the flat call, which is
used instead.

The inter-node leg runs as a hook inside the node protocol (:mod:`.ipc`). Before its MPI
exchange the ranks of each cross communicator agree on one error flag, so that a rank
whose local part failed (a host buffer, a device copy) does not leave its partners on the
other nodes waiting: they all raise, naming the cause, and the node barriers carry it to
every rank. A failure *after* that exchange (the copy back from host memory, the node
all-gather) reaches the failing node only, through its final barrier; so every call
closes with one more agreement between nodes (:meth:`Hierarchical.closing`): the node
protocol's outcome is the same on every rank of a node, and one 8-byte
``Allreduce(MAX)`` of it over each cross communicator tells every node. Where a node
failed, one all-gather of the nodes' errors follows and every rank raises the same
:class:`.ipc.IpcError`, naming each failing node's ranks and causes; else the call
returns on every rank. MAX and MIN of floats go through
:func:`sbpmpi.comm.nan_reduction.nan_safe`, as on the flat MPI path: NaN propagates as in
NumPy, whatever node holds it. The setting
:data:`sbpmpi.config.ipc_node_size` (``SBPMPI_IPC_NODE_SIZE=k``) splits each node into
pseudo-nodes of ``k`` ranks, so that one machine exercises this path. A pseudo-node is a
property of the process, as a machine is: ranks with machine-local ranks ``0..k-1`` form
one, ``k..2k-1`` the next, whatever group a call is on, so that no group maps memory
across pseudo-nodes.

Whether a call takes this path was decided by the whole group before (:mod:`.route`): the
node legs run from offers every rank of every node made ready, so no node falls back
while another goes on into the inter-node leg. Every rank of a node runs the same number
of phases (an empty one where it has nothing to copy).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
from mpi4py import MPI

from ... import config
from ...core.layout import block_starts
from ..buffers import PINNED_POOL
from ..dtypes import dtype_info
from ..lifecycle.world import get_local_rank
from ..nan_reduction import nan_safe
from ..reduce_op import ReduceOp, mpi_reduction
from . import schedule as S
from .ipc import IpcError, IpcTransport, Offer

__all__ = ["Hierarchical", "node_split", "pseudo_node", "NodeAllReduce", "NodePlace",
           "node_all_reduce_schedules", "node_all_gather_schedule"]


def pseudo_node() -> int | None:
    """This process's pseudo-node on its machine (machine-local rank // ``ipc_node_size``),
    or None when the setting is unset (the machine is the node)."""
    k = config.ipc_node_size.value
    return None if k is None else get_local_rank() // k


def node_split(comm: MPI.Intracomm) -> MPI.Comm:
    """The ranks of ``comm`` on this node (MPI's shared-memory split), or on this process's
    pseudo-node (:func:`pseudo_node`, when the setting ``ipc_node_size`` is set)."""
    node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
    color = pseudo_node()
    if color is None:
        return node
    sub = node.Split(color, key=node.Get_rank())
    node.Free()
    return sub


class NodeAllReduce(NamedTuple):
    """The two node halves of the hierarchical all-reduce."""

    reduce_scatter: S.Schedule  # after it, node rank l holds the node's block l in place
    all_gather: S.Schedule


def node_all_reduce_schedules(m: int, local: int, count: int, itemsize: int) -> NodeAllReduce:
    """The halves of the node all-reduce: after the first, node rank ``l`` holds the node's
    reduction of block ``l`` of ``blocks(count, m)`` in place."""
    full = S.all_reduce(m, local, count, itemsize)
    if not full.phases:  # count == 0 or m == 1: the same on every rank
        return NodeAllReduce(S.Schedule((), exports=("out",)), S.Schedule((), exports=("out",)))
    return NodeAllReduce(S.Schedule(full.phases[:1], ("out",), full.tmp_bytes),
                         S.Schedule(full.phases[1:], ("out",)))


def node_all_gather_schedule(members: Sequence[Sequence[int]], local: int,
                             nbytes: Sequence[int], displs: Sequence[int],
                             peer_displs: Sequence[Sequence[int]]) -> S.Schedule:
    """Node rank ``local`` copies, from each node peer k, the blocks of the group ranks with
    local index k (``members[node][k]``), which the peer's cross leg wrote into its ``out``
    at the peer's displacements: ``peer_displs[k][node]`` (each rank passes its own
    ``displs``, which may differ by rank), to this rank's ``displs``. One phase on every
    rank, empty where there is nothing to copy."""
    m = len(members[0])
    moves = tuple(S.Move(S.COPY, k, "out", peer_displs[k][j], "out", displs[row[k]],
                         nbytes[row[k]])
                  for k in [(local + i) % m for i in range(1, m)]
                  for j, row in enumerate(members) if nbytes[row[k]])
    return S.Schedule((moves,), exports=("out",))


class NodePlace(NamedTuple):
    """Where a rank of the group sits: its local index on its node, and its node's size."""

    local: int
    node_size: int


@dataclass
class Hierarchical:
    """IPC inside each node of a group, MPI (staged) between them."""

    node: IpcTransport
    cross: MPI.Comm
    members: list[list[int]]  # group ranks: members[node index][local index]

    @property
    def local(self) -> int:
        return self.node.rank

    @property
    def m(self) -> int:
        return self.node.size

    @property
    def device(self) -> Any:
        return self.node.device

    @property
    def stats(self) -> dict[str, int]:
        return self.node.stats

    @property
    def mapped(self) -> Any:
        return self.node.mapped

    def close_all(self) -> None:
        self.node.close_all()
        self.cross.Free()

    @classmethod
    def build(cls, node: IpcTransport, comm: MPI.Intracomm) -> Hierarchical | str:
        """Collective over ``comm``: the hierarchy, or why there is none."""
        me, local, m = comm.Get_rank(), node.rank, node.size
        places = [NodePlace(*p) for p in comm.allgather((local, m))]
        sizes = {p.node_size for p in places}
        if len(sizes) != 1 or m < 2:
            return (f"the group spans nodes with {sorted(sizes)} of its ranks each: "
                    "hierarchical IPC needs the same number (>= 2) on every node")
        cross = comm.Split(local, key=me)
        node_of = comm.allgather(cross.Get_rank())  # a rank's cross rank is its node's index
        members = [[0] * m for _ in range(comm.Get_size() // m)]
        for r, (p, j) in enumerate(zip(places, node_of)):
            members[j][p.local] = r
        return cls(node, cross, members)

    # -- the inter-node legs (staged through pinned host memory) --------------------------

    def _host(self, nbytes: int) -> np.ndarray:
        return PINNED_POOL.acquire(max(nbytes, 1))

    @property
    def cross_ranks(self) -> tuple[int, ...]:
        """The group ranks of this rank's cross communicator, in its order."""
        return tuple(row[self.local] for row in self.members)

    def _agree(self, err: BaseException | None) -> None:
        """Collective over ``cross``: raise on every rank of it when any has failed."""
        flag = np.array([int(err is not None)], dtype=np.int64)
        self.cross.Allreduce(MPI.IN_PLACE, flag, op=MPI.MAX)
        if flag[0]:
            me = self.cross_ranks[self.cross.Get_rank()]
            mine = f"group rank {me}: {type(err).__name__}: {err}" if err is not None else ""
            causes = "; ".join(c for c in self.cross.allgather(mine) if c)
            raise IpcError(f"the inter-node leg failed on {causes}") from err

    def closing(self, name: str, run: Callable[[], bool]) -> bool:
        """Collective over the group: ``run`` (the node protocol, with the inter-node leg
        inside), then one agreement on its outcome across nodes, so that a failure on any
        rank, in any phase, raises the same error on every rank.

        The node protocol's barriers make its outcome (returned, or the error naming every
        failing node rank) the same on every rank of a node, the final barrier included; so
        one 8-byte ``Allreduce(MAX)`` over ``cross``, which holds one rank of every node,
        tells every rank, each cross communicator in parallel."""
        err: Exception | None = None
        done = False
        try:
            done = run()
        except Exception as e:  # the ranks on the other nodes must hear of it
            err = e
        flag = np.array([int(err is not None)], dtype=np.int64)
        self.cross.Allreduce(MPI.IN_PLACE, flag, op=MPI.MAX)  # >= 2 nodes: see build
        if flag[0]:
            raise IpcError(f"{name}: hierarchical CUDA IPC failed on "
                           f"{self._node_causes(err)}") from err
        return done

    def _node_causes(self, err: BaseException | None) -> str:
        """Collective over ``cross``, after the closing agreement reported a failure: each
        failing node's error (the same on each of its ranks), in the same words on every
        rank of the group."""
        mine = "" if err is None else (str(err) if isinstance(err, IpcError)
                                       else f"{type(err).__name__}: {err}")
        return "; ".join(
            f"the node of group ranks {', '.join(map(str, row))}: {c}"
            for row, c in zip(self.members, self.cross.allgather(mine)) if c)

    def all_reduce(self, name: str, offer: Offer, count: int, dtype: np.dtype,
                   op: ReduceOp) -> bool:
        """In place on the offer's ``out`` buffer (``count`` elements)."""
        it = dtype.itemsize
        rs, ag = node_all_reduce_schedules(self.m, self.local, count, it)
        a, b = S.blocks(count, self.m)[self.local]
        red = mpi_reduction(op, dtype_info(dtype))
        t = dtype_info(dtype).mpi

        def cross_leg(ptrs: Mapping[str, int], failure: str | None) -> None:
            n = (b - a) * it
            if self.cross.Get_size() == 1:
                return
            h: np.ndarray | None = None
            err: BaseException | None = IpcError(failure) if failure else None
            try:
                if err is not None:
                    raise err
                h = self._host(n)
                if n:
                    self.device.copy(h.ctypes.data, ptrs["out"] + a * it, n)
                    self.device.synchronize()
            except Exception as e:  # the partners on the other nodes must hear of it
                err = e
            try:
                self._agree(err)
                assert h is not None
                r = nan_safe(red, op, dtype, h[:n].view(dtype), self.cross, self.cross_ranks)
                self.cross.Allreduce(MPI.IN_PLACE, [h, b - a, t], op=r.op)
                if n:
                    self.device.copy(ptrs["out"] + a * it, h.ctypes.data, n)
                    self.device.synchronize()
            finally:
                if h is not None:
                    PINNED_POOL.release(h)

        sched = S.Schedule(rs.phases + ((),) + ag.phases if count else (), ("out",),
                           rs.tmp_bytes)
        hook_at = len(rs.phases)
        return self.closing(name, lambda: self.node.run(
            name, offer, lambda _: sched, (), dtype, op, {hook_at: cross_leg} if count else None))

    def all_gather_v(self, name: str, offer: Offer, nbytes: Sequence[int],
                     displs: Sequence[int]) -> bool:
        """Rank r's ``in`` (``nbytes[r]``) to ``out[displs[r]:]`` of every rank."""
        rows = self.members
        mine = [row[self.local] for row in rows]  # the group ranks of my cross comm

        def cross_leg(ptrs: Mapping[str, int], failure: str | None) -> None:
            sizes = [nbytes[r] for r in mine]
            me = mine[self.cross.Get_rank()]
            h: np.ndarray | None = None
            err: BaseException | None = IpcError(failure) if failure else None
            try:
                if err is not None:
                    raise err
                h = self._host(sum(sizes))
                if nbytes[me]:
                    self.device.copy(h.ctypes.data, ptrs["in"], nbytes[me])
                    self.device.synchronize()
            except Exception as e:  # the partners on the other nodes must hear of it
                err = e
            try:
                self._agree(err)
                assert h is not None
                send = h[:nbytes[me]].copy()
                self.cross.Allgatherv([send, MPI.BYTE], [h, (sizes, block_starts(sizes)), MPI.BYTE])
                off = 0
                for r, n in zip(mine, sizes):
                    if n:
                        self.device.copy(ptrs["out"] + displs[r], h.ctypes.data + off, n)
                    off += n
                self.device.synchronize()
            finally:
                if h is not None:
                    PINNED_POOL.release(h)

        def make(peer_displs: np.ndarray) -> S.Schedule:
            node_moves = node_all_gather_schedule(rows, self.local, nbytes, displs,
                                                  peer_displs.tolist())
            return S.Schedule(((),) + node_moves.phases, ("out",))

        # where this rank's cross leg writes (its own displacements), for its node peers
        return self.closing(name, lambda: self.node.run(
            name, offer, make, [displs[r] for r in mine], None, None, {0: cross_leg}))
