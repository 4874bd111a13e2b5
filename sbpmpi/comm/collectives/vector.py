"""Vector collectives: blocks of different sizes per rank (uneven splits).

``counts`` and ``displs`` are in elements of flat C-contiguous buffers, one entry per
rank of the group, in group rank order; ``displs`` defaults to the packed layout
(exclusive prefix sums of ``counts``). Counts and displacements beyond 2**31 - 1 use
MPI's large-count calls (mpi4py 4 picks them where the MPI library has them).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...core.layout import block_starts
from ..agreement import checks
from ..buffers import ArrayMeta, array_meta, check_same_dtype, output_array_meta, stager
from ..call import Call, average, call, host_only
from ..dtypes import dtype_info
from ..gpu import route as _gpu
from ..group import Group, root_rank
from ..reduce_op import ReduceOp, mpi_reduction

__all__ = ["all_gather_v", "gather_v", "scatter_v", "reduce_scatter_v", "all_to_all_v"]


def _counts(counts: Any, p: int, arg: str, op: str) -> list[int]:
    """``counts`` as a list of ``p`` non-negative ints."""
    try:
        out = list(map(int, counts))
    except (TypeError, ValueError):
        raise TypeError(f"{op}: {arg} must be a sequence of ints, got {counts!r}") from None
    if len(out) != p:
        raise ValueError(f"{op}: {arg} has {len(out)} entries, expected one per rank of the "
                         f"group ({p}): {out}")
    if out and min(out) < 0:
        raise ValueError(f"{op}: {arg} must be non-negative, got {out}")
    return out


def _layout(counts: Any, displs: Any, p: int, carg: str, darg: str,
            op: str) -> tuple[list[int], list[int], int]:
    """(counts, displs, elements a buffer needs); displs default to the packed layout."""
    c = _counts(counts, p, carg, op)
    if displs is None:
        return c, block_starts(c), sum(c)
    d = _counts(displs, p, darg, op)
    return c, d, max((di + ci for ci, di in zip(c, d) if ci), default=0)


def _arr_out(arr: Any, out: Any, op: str) -> tuple[ArrayMeta, ArrayMeta]:
    """(meta of the input ``arr``, meta of the output ``out``), of one dtype."""
    m = array_meta(arr, "arr", op)
    mo = output_array_meta(out, "out", op)
    check_same_dtype(mo, m, "out", "arr", op)
    return m, mo


def _check_extent(m: ArrayMeta, need: int, arg: str, what: str, op: str) -> None:
    if m.size < need:
        raise ValueError(f"{op}: {arg} has {m.size} elements but {what} need {need}")


def _check_mine(m: ArrayMeta, counts: list[int], me: int, arg: str, carg: str, op: str) -> None:
    if m.size != counts[me]:
        raise ValueError(f"{op}: {arg} has {m.size} elements but {carg}[{me}] = {counts[me]} "
                         f"(this rank is group rank {me})")


def _rooted_v(c: Call, arr: Any, x: Any, counts: Any, displs: Any, *, root_arg: str,
              root_world: int, to_root: bool) -> tuple[ArrayMeta, int, list[int], list[int],
                                                       int, ArrayMeta | None, Any]:
    """Checks of gather_v (``to_root``: the root receives ``x``) and scatter_v (the root
    sends ``x``): (meta of ``arr``, root's group rank, counts, displs, elements ``x`` needs,
    meta of ``x`` on the root, MPI type); errors go through :meth:`Call.refuse`."""
    try:
        op = c.name
        me, p = c.comm.Get_rank(), c.g.size
        m = array_meta(arr, "arr", op) if to_root else output_array_meta(arr, "arr", op)
        root = root_rank(c.g, root_world, root_arg, op)
        cs, d, need = _layout(counts, displs, p, "counts", "displs", op)
        _check_mine(m, cs, me, "arr", "counts", op)
        mx = None
        if me == root:
            arg = "out" if to_root else "in"
            if x is None:
                what = "out" if to_root else "the input"
                raise ValueError(f"{op}: {what} is required on {root_arg} rank {root_world}")
            mx = output_array_meta(x, arg, op) if to_root else array_meta(x, arg, op)
            check_same_dtype(mx, m, arg, "arr", op)
            _check_extent(mx, need, arg, "counts and displs", op)
        return m, root, cs, d, need, mx, dtype_info(m.dtype).mpi
    except (TypeError, ValueError) as e:
        c.refuse(e)


def all_gather_v(out: Any, arr: Any, counts: Sequence[int], displs: Sequence[int] | None = None,
                 group: Group | None = None) -> None:
    """Every rank receives ``arr`` of group rank i at ``out[displs[i]:][:counts[i]]`` (flat)."""
    c = call("all_gather_v", group)
    op = c.name
    try:
        me, p = c.comm.Get_rank(), c.g.size
        m, mo = _arr_out(arr, out, op)
        cs, d, need = _layout(counts, displs, p, "counts", "displs", op)
        _check_mine(m, cs, me, "arr", "counts", op)
        _check_extent(mo, need, "out", "counts and displs", op)
        t = dtype_info(m.dtype).mpi
    except (TypeError, ValueError) as e:
        c.refuse(e)
    sig = [("dtype", m.dtype.str), ("counts", cs), ("displs", d)] if checks.checking() else None
    if c.gpu(_gpu.all_gather_v, m.on_gpu and mo.on_gpu, sig, out, arr, m, counts=cs, displs=d,
             need=need):
        return
    with stager(m.on_gpu or mo.on_gpu) as st:
        sbuf = st.inp(arr, m)
        rbuf = st.out(out, mo, copy_in=need < mo.size or displs is not None)  # keep the gaps
        with c.mpi_call(m.nbytes, m.dtype, None, m.on_gpu or mo.on_gpu, st.staged):
            c.comm.Allgatherv([sbuf, m.size, t], [rbuf, (cs, d), t])


def gather_v(arr: Any, out: Any, counts: Sequence[int], displs: Sequence[int] | None = None,
             dst: int = 0, group: Group | None = None) -> None:
    """World rank ``dst`` receives ``arr`` of group rank i at ``out[displs[i]:][:counts[i]]``.

    ``out`` is used on ``dst`` only (pass None elsewhere).
    """
    _gather_scatter_v("gather_v", arr, out, counts, displs, root_arg="dst", root_world=dst,
                      group=group)


def scatter_v(arr: Any, in_: Any, counts: Sequence[int], displs: Sequence[int] | None = None,
              src: int = 0, group: Group | None = None) -> None:
    """Group rank i receives ``in_[displs[i]:][:counts[i]]`` (flat) of world rank ``src`` in ``arr``.

    ``in_`` is used on ``src`` only (pass None elsewhere).
    """
    _gather_scatter_v("scatter_v", arr, in_, counts, displs, root_arg="src", root_world=src,
                      group=group)


def _gather_scatter_v(name: str, arr: Any, x: Any, counts: Any, displs: Any, *, root_arg: str,
                      root_world: int, group: Group | None) -> None:
    """gather_v (every rank's ``arr`` goes to its block of the root's ``x``) and scatter_v
    (the root's ``x`` is cut into every rank's ``arr``): one body."""
    to_root = name == "gather_v"
    c = call(name, group)
    m, root, cs, d, need, mx, t = _rooted_v(c, arr, x, counts, displs, root_arg=root_arg,
                                           root_world=root_world, to_root=to_root)
    if checks.checking():
        c.agree([("dtype", m.dtype.str), ("counts", cs), ("displs", d), (root_arg, root_world)])
    with stager(m.on_gpu or (mx is not None and mx.on_gpu)) as st:
        if to_root:
            mine = st.inp(arr, m)
            whole = None if mx is None else st.out(x, mx, copy_in=need < mx.size or
                                                   displs is not None)  # keep the gaps
        else:
            whole = None if mx is None else st.inp(x, mx)
            mine = st.out(arr, m)
        blocks = None if whole is None else [whole, (cs, d), t]
        sent = m.size if to_root else 0 if mx is None else mx.size
        with c.mpi_call(sent * m.dtype.itemsize, m.dtype, root_world, m.on_gpu, st.staged):
            if to_root:
                c.comm.Gatherv([mine, m.size, t], blocks, root=root)
            else:
                c.comm.Scatterv(blocks, [mine, m.size, t], root=root)


def reduce_scatter_v(out: Any, arr: Any, counts: Sequence[int], op: ReduceOp = ReduceOp.SUM,
                     group: Group | None = None) -> None:
    """Reduce ``arr`` (``sum(counts)`` elements) over the group; rank i gets block i in ``out``.

    Block i is ``counts[i]`` elements, packed in group rank order.
    """
    c = call("reduce_scatter_v", group)
    name = c.name
    try:
        me, p = c.comm.Get_rank(), c.g.size
        mi, m = _arr_out(arr, out, name)
        cs = _counts(counts, p, "counts", name)
        _check_mine(m, cs, me, "out", "counts", name)
        if mi.size != sum(cs):
            raise ValueError(f"{name}: arr has {mi.size} elements but sum(counts) = {sum(cs)}")
        info = dtype_info(m.dtype)
        red = mpi_reduction(op, info)
    except (TypeError, ValueError) as e:
        c.refuse(e)
    sig = [("dtype", m.dtype.str), ("counts", cs), ("op", op.name)] if checks.checking() else None
    if c.gpu(_gpu.reduce_scatter_v, m.on_gpu and mi.on_gpu, sig, out, arr, m, mi, cs, op):
        return
    red = c.nan_safe(red, op, m.dtype, arr)
    with stager(m.on_gpu or mi.on_gpu, host_only(red, out, m)) as st:
        sbuf = st.inp(arr, mi)
        rbuf = st.out(out, m)
        with c.mpi_call(mi.size * m.dtype.itemsize, m.dtype, None, m.on_gpu or mi.on_gpu, st.staged):
            c.comm.Reduce_scatter([sbuf, mi.size, info.mpi], [rbuf, m.size, info.mpi], cs,
                                  op=red.op)
        if red.average:
            average(rbuf, p)


def all_to_all_v(out: Any, out_counts: Sequence[int], arr: Any, in_counts: Sequence[int],
                 out_displs: Sequence[int] | None = None, in_displs: Sequence[int] | None = None,
                 group: Group | None = None) -> None:
    """Rank i sends ``arr[in_displs[j]:][:in_counts[j]]`` to rank j, which stores it at
    ``out[out_displs[i]:][:out_counts[i]]`` (flat; ``out_counts[i]`` on rank j must equal
    ``in_counts[j]`` on rank i)."""
    c = call("all_to_all_v", group)
    op = c.name
    try:
        p = c.g.size
        m, mo = _arr_out(arr, out, op)
        oc, od, oneed = _layout(out_counts, out_displs, p, "out_counts", "out_displs", op)
        ic, idd, ineed = _layout(in_counts, in_displs, p, "in_counts", "in_displs", op)
        _check_extent(mo, oneed, "out", "out_counts and out_displs", op)
        _check_extent(m, ineed, "arr", "in_counts and in_displs", op)
        t = dtype_info(m.dtype).mpi
    except (TypeError, ValueError) as e:
        c.refuse(e)
    if checks.checking():
        sigs = c.agree([("dtype", m.dtype.str)], extra=(ic, oc))
        for i, (_, (ici, _)) in enumerate(sigs):
            for j, (_, (_, ocj)) in enumerate(sigs):
                if ici[j] != ocj[i]:
                    raise ValueError(
                        f"{op}: group rank {i} sends in_counts[{j}] = {ici[j]} elements to "
                        f"group rank {j}, which expects out_counts[{i}] = {ocj[i]}")
    # (checked mode agreed above, with the counts: the route takes a vote of its own)
    if c.gpu(_gpu.all_to_all_v, m.on_gpu and mo.on_gpu, None, out, arr, m, out_counts=oc,
             out_displs=od, out_need=oneed, in_counts=ic, in_displs=idd):
        return
    with stager(m.on_gpu or mo.on_gpu) as st:
        sbuf = st.inp(arr, m)
        rbuf = st.out(out, mo, copy_in=oneed < mo.size or out_displs is not None)
        with c.mpi_call(sum(ic) * m.dtype.itemsize, m.dtype, None, m.on_gpu or mo.on_gpu, st.staged):
            c.comm.Alltoallv([sbuf, (ic, idd), t], [rbuf, (oc, od), t])
