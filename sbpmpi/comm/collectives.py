"""Buffer collectives on NumPy and GPU arrays, in place, as torch.distributed names them.

Ranks given as ``src``/``dst`` are world ranks; ``group`` (default WORLD) picks the
communicator. Arguments are checked before any communication (see :mod:`.checks`).
A buffer that receives data on any rank must be C-contiguous; non-contiguous inputs
are copied. Each call is one mpi4py upper-case (buffer) call.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from mpi4py import MPI

from . import checks
from .buffers import ArrayMeta, array_meta, check_same_dtype, output_array_meta, stager
from .call import Call, average, call, host_only
from .dtypes import dtype_info
from .gpu import route as _gpu
from .group import Group, root_rank
from .listbufs import gather_list_in, list_metas, scatter_list_out
from .reduce_op import ReduceOp, mpi_reduction

__all__ = ["barrier", "broadcast", "reduce", "all_reduce", "gather", "all_gather", "scatter",
           "reduce_scatter", "all_to_all"]


def _sig(m: ArrayMeta, **kw: Any) -> list[tuple[str, Any]]:
    return [("dtype", m[0].str), *kw.items()]


def barrier(group: Group | None = None) -> None:
    """Block until every rank of ``group`` has called barrier."""
    c = call("barrier", group)
    with c.mpi_call(0):
        c.comm.Barrier()


def broadcast(arr: Any, src: int, group: Group | None = None) -> None:
    """Copy ``arr`` of world rank ``src`` into ``arr`` on every rank of ``group``."""
    c = call("broadcast", group)
    try:
        m = output_array_meta(arr, "arr", c.name)
        t = dtype_info(m[0]).mpi
        root = root_rank(c.g, src, "src", c.name)
    except (TypeError, ValueError) as e:
        c.refuse(e)
    if checks._enabled:
        c.agree(_sig(m, size=m[1], src=src))
    if m[3] and c.gpu(_gpu.broadcast, arr, m, root):
        return
    me = c.comm.Get_rank()
    with stager(m[3]) as st:
        buf = st.out(arr, m, copy_in=me == root)
        with c.mpi_call(m[1] * m[0].itemsize if me == root else 0, m[0], src, m[3], st.staged):
            c.comm.Bcast([buf, m[1], t], root=root)


def reduce(arr: Any, dst: int, op: ReduceOp = ReduceOp.SUM, group: Group | None = None) -> None:
    """Reduce ``arr`` of every rank with ``op`` into ``arr`` on world rank ``dst``.

    ``arr`` on other ranks is left unchanged.
    """
    c = call("reduce", group)
    try:
        m = output_array_meta(arr, "arr", c.name)
        info = dtype_info(m[0])
        red = mpi_reduction(op, info)
        root = root_rank(c.g, dst, "dst", c.name)
    except (TypeError, ValueError) as e:
        c.refuse(e)
    if checks._enabled:
        c.agree(_sig(m, size=m[1], op=op.name, dst=dst))
    red = c.nan_safe(red, op, m[0], arr)
    me = c.comm.Get_rank()
    with stager(m[3], host_only(red, arr, m)) as st:
        sbuf: Any
        if me == root:
            buf = st.out(arr, m, copy_in=True)
            sbuf, rbuf = MPI.IN_PLACE, [buf, m[1], info.mpi]
        else:
            buf = st.inp(arr, m)
            sbuf, rbuf = [buf, m[1], info.mpi], None
        with c.mpi_call(m[1] * m[0].itemsize, m[0], dst, m[3], st.staged):
            c.comm.Reduce(sbuf, rbuf, op=red.op, root=root)
        if me == root and red.average:
            average(buf, c.g.size)


def all_reduce(arr: Any, op: ReduceOp = ReduceOp.SUM, group: Group | None = None) -> None:
    """Reduce ``arr`` of every rank of ``group`` with ``op``; every rank gets the result."""
    c = call("all_reduce", group)
    try:
        m = output_array_meta(arr, "arr", c.name)
        info = dtype_info(m[0])
        red = mpi_reduction(op, info)
    except (TypeError, ValueError) as e:
        c.refuse(e)
    if checks._enabled:
        c.agree(_sig(m, size=m[1], op=op.name))
    if m[3] and c.gpu(_gpu.all_reduce, arr, m, op):
        return
    red = c.nan_safe(red, op, m[0], arr)
    with stager(m[3], host_only(red, arr, m)) as st:
        buf = st.out(arr, m, copy_in=True)
        with c.mpi_call(m[1] * m[0].itemsize, m[0], None, m[3], st.staged):
            c.comm.Allreduce(MPI.IN_PLACE, [buf, m[1], info.mpi], op=red.op)
        if red.average:
            average(buf, c.g.size)


def _whole(x: Any, p: int, m: ArrayMeta, arg: str, ref: str, op: str, output: bool) -> ArrayMeta:
    """Checks for one array that holds ``p`` blocks of the size of ``m``."""
    mx = output_array_meta(x, arg, op) if output else array_meta(x, arg, op)
    check_same_dtype(mx, m, arg, ref, op)
    if mx[1] != p * m[1]:
        raise ValueError(f"{op}: {arg} has {mx[1]} elements but must have {p} x {m[1]} = "
                         f"{p * m[1]} (group size x {ref}.size)")
    return mx


def _is_list(x: Any) -> bool:
    return isinstance(x, (list, tuple))


def _blocks(x: Any, p: int, m: ArrayMeta, list_arg: str, arg: str, ref: str, op: str,
            output: bool) -> tuple[list[ArrayMeta] | None, ArrayMeta | None]:
    """Checks of ``x``, ``p`` blocks shaped like ``ref`` (meta ``m``): a list of arrays gives
    (their metas, None), one array (None, its meta)."""
    if _is_list(x):
        return list_metas(x, p, m, list_arg, ref, op, output=output), None
    return None, _whole(x, p, m, arg, ref, op, output)


def _rooted(c: Call, arr: Any, x: Any, arg: str, root_arg: str, root_world: int,
            to_root: bool) -> tuple[ArrayMeta, Any, int, int, int, list[ArrayMeta] | None,
                                    ArrayMeta | None]:
    """Checks of gather (``to_root``: ``arr`` goes to the root, which receives ``x``) and
    scatter (the root sends ``x``; ``arr`` receives): (meta of ``arr``, MPI type, root's
    group rank, my group rank, group size, list metas of ``x``, whole-array meta of ``x``).
    Errors go through :meth:`Call.refuse`.
    """
    try:
        op = c.name
        m = array_meta(arr, "arr", op) if to_root else output_array_meta(arr, "arr", op)
        t = dtype_info(m[0]).mpi
        root = root_rank(c.g, root_world, root_arg, op)
        me, p = c.comm.Get_rank(), c.g.size
        if me != root:
            return m, t, root, me, p, None, None
        if x is None:
            raise ValueError(f"{op}: {arg} is required on {root_arg} rank {root_world}")
        return (m, t, root, me, p, *_blocks(x, p, m, arg, arg, "arr", op, to_root))
    except (TypeError, ValueError) as e:
        c.refuse(e)


def gather(arr: Any, gather_list: Any = None, dst: int = 0, group: Group | None = None) -> None:
    """Collect ``arr`` of every rank on world rank ``dst``, in group rank order.

    On ``dst``, ``gather_list`` is a list of group-size arrays shaped like ``arr``, or one
    array of group size x ``arr.size`` elements; it is ignored on other ranks.
    """
    _gather_scatter("gather", arr, gather_list, "gather_list", "dst", dst, group)


def _gather_scatter(name: str, arr: Any, x: Any, arg: str, root_arg: str, root_world: int,
                    group: Group | None) -> None:
    """gather (every rank's ``arr`` goes to block i of the root's ``x``) and scatter
    (block i of the root's ``x`` goes to ``arr`` on group rank i): one body."""
    to_root = name == "gather"
    c = call(name, group)
    m, t, root, me, p, metas, mx = _rooted(c, arr, x, arg, root_arg, root_world, to_root)
    if checks._enabled:
        c.agree(_sig(m, size=m[1], **{root_arg: root_world}))
    with stager(m[3] or (mx is not None and mx[3])) as st:
        whole: Any = None  # the root's blocks as one flat buffer; None elsewhere
        if to_root:
            mine = st.inp(arr, m)
            if mx is not None:
                whole = st.out(x, mx)
            elif metas is not None:
                whole = np.empty(p * m[1], dtype=m[0])
        else:
            if mx is not None:
                whole = st.inp(x, mx)
            elif metas is not None:
                whole = gather_list_in(x, metas, m[0])
            mine = st.out(arr, m)
        blocks = None if whole is None else [whole, m[1], t]
        sent = m[1] if to_root else p * m[1] if me == root else 0
        with c.mpi_call(sent * m[0].itemsize, m[0], root_world, m[3], st.staged):
            if to_root:
                c.comm.Gather([mine, m[1], t], blocks, root=root)
            else:
                c.comm.Scatter(blocks, [mine, m[1], t], root=root)
        if to_root and metas is not None:
            scatter_list_out(whole, x, metas)


def all_gather(out_list_or_array: Any, arr: Any, group: Group | None = None) -> None:
    """Every rank receives ``arr`` of every rank of ``group``, in group rank order.

    ``out_list_or_array``: a list of group-size arrays shaped like ``arr``, or one array of
    group size x ``arr.size`` elements (e.g. shaped ``(group size, *arr.shape)``).
    """
    c = call("all_gather", group)
    op = c.name
    out = out_list_or_array
    try:
        m = array_meta(arr, "arr", op)
        t = dtype_info(m[0]).mpi
        p = c.g.size
        metas, mo = _blocks(out, p, m, "out_list", "out", "arr", op, True)
    except (TypeError, ValueError) as e:
        c.refuse(e)
    if checks._enabled:
        c.agree(_sig(m, size=m[1]))
    if m[3] and mo is not None and mo[3] and c.gpu(_gpu.all_gather, out, arr, m):
        return
    with stager(m[3] or (mo is not None and mo[3])) as st:
        sbuf = st.inp(arr, m)
        rbuf = st.out(out, mo) if mo is not None else np.empty(p * m[1], dtype=m[0])
        with c.mpi_call(m[1] * m[0].itemsize, m[0], None, m[3], st.staged):
            c.comm.Allgather([sbuf, m[1], t], [rbuf, m[1], t])
        if metas is not None:
            scatter_list_out(rbuf, out, metas)


def scatter(arr: Any, scatter_list: Any = None, src: int = 0, group: Group | None = None) -> None:
    """Rank i of ``group`` receives block i of ``scatter_list`` of world rank ``src`` in ``arr``.

    On ``src``, ``scatter_list`` is a list of group-size arrays shaped like ``arr``, or one
    array of group size x ``arr.size`` elements; it is ignored on other ranks.
    """
    _gather_scatter("scatter", arr, scatter_list, "scatter_list", "src", src, group)


def reduce_scatter(out: Any, in_list_or_array: Any, op: ReduceOp = ReduceOp.SUM,
                   group: Group | None = None) -> None:
    """Reduce the inputs of all ranks with ``op``; rank i of ``group`` receives block i in ``out``.

    ``in_list_or_array``: a list of group-size arrays shaped like ``out``, or one array of
    group size x ``out.size`` elements.
    """
    c = call("reduce_scatter", group)
    name = c.name
    x = in_list_or_array
    try:
        m = output_array_meta(out, "out", name)
        info = dtype_info(m[0])
        red = mpi_reduction(op, info)
        p = c.g.size
        metas, mi = _blocks(x, p, m, "in_list", "input", "out", name, False)
    except (TypeError, ValueError) as e:
        c.refuse(e)
    if checks._enabled:
        c.agree(_sig(m, size=m[1], op=op.name))
    if m[3] and mi is not None and mi[3] and c.gpu(_gpu.reduce_scatter, out, x, m, mi, op):
        return
    red = c.nan_safe(red, op, m[0], x)
    with stager(m[3] or (mi is not None and mi[3]), host_only(red, out, m)) as st:
        if mi is not None:
            sbuf = st.inp(x, mi)
        else:
            assert metas is not None
            sbuf = gather_list_in(x, metas, m[0])
        rbuf = st.out(out, m)
        with c.mpi_call(p * m[1] * m[0].itemsize, m[0], None, m[3] or bool(mi and mi[3]),
                        st.staged):
            c.comm.Reduce_scatter_block([sbuf, m[1], info.mpi], [rbuf, m[1], info.mpi],
                                        op=red.op)
        if red.average:
            average(rbuf, p)


def all_to_all(out: Any, in_: Any, group: Group | None = None) -> None:
    """Rank i sends block j of its input to rank j, which stores it as block i of ``out``.

    ``out`` and the input are arrays of group size x block elements each, or lists of
    group-size arrays of one shape.
    """
    c = call("all_to_all", group)
    name = c.name
    try:
        p = c.g.size
        out_metas = mo = None
        if _is_list(out):
            if len(out) != p or not out:
                raise ValueError(f"{name}: out has {len(out)} arrays, expected one per rank "
                                 f"of the group ({p})")
            m = array_meta(out[0], "out[0]", name)
            out_metas = list_metas(out, p, m, "out", "out[0]", name, output=True)
        else:
            mo = output_array_meta(out, "out", name)
            if mo[1] % p:
                raise ValueError(f"{name}: out has {mo[1]} elements, not divisible by the "
                                 f"group size {p}")
            m = (mo[0], mo[1] // p, True, mo[3])
        in_metas, mi = _blocks(in_, p, m, "in", "in", "out block", name, False)
        t = dtype_info(m[0]).mpi
    except (TypeError, ValueError) as e:
        c.refuse(e)
    if checks._enabled:
        c.agree(_sig(m, block=m[1]))
    if (mo is not None and mi is not None and mo[3] and mi[3]
            and c.gpu(_gpu.all_to_all, out, in_, m, mi)):
        return
    with stager(m[3] or (mo is not None and mo[3]) or (mi is not None and mi[3])) as st:
        if mi is not None:
            sbuf = st.inp(in_, mi)
        else:
            assert in_metas is not None
            sbuf = gather_list_in(in_, in_metas, m[0])
        rbuf = st.out(out, mo) if mo is not None else np.empty(p * m[1], dtype=m[0])
        with c.mpi_call(p * m[1] * m[0].itemsize, m[0], None,
                   bool((mo and mo[3]) or (mi and mi[3])), st.staged):
            c.comm.Alltoall([sbuf, m[1], t], [rbuf, m[1], t])
        if out_metas is not None:
            scatter_list_out(rbuf, out, out_metas)
