"""Buffer collectives on NumPy and GPU arrays, in place, as torch.distributed names them.

Ranks given as ``src``/``dst`` are world ranks; ``group`` (default WORLD) picks the
communicator. Arguments are checked before any communication (see :mod:`..agreement.checks`).
A buffer that receives data on any rank must be C-contiguous; non-contiguous inputs
are copied. Each call is one mpi4py upper-case (buffer) call.
"""

from __future__ import annotations

import functools
from typing import Any, Literal, overload

import numpy as np
from mpi4py import MPI

from ..agreement import checks
from ..buffers import HOST, ArrayMeta, array_meta, check_same_dtype, output_array_meta, stager
from ..call import Call, average, call, host_only
from ..dtypes import dtype_info
from ..gpu import route as _gpu
from ..group import Group, root_rank
from ..reduce_op import MPIReduction, ReduceOp, mpi_reduction
from .listbufs import gather_list_in, list_metas, scatter_list_out
from .work import CollectiveWork

__all__ = ["barrier", "broadcast", "reduce", "all_reduce", "gather", "all_gather", "scatter",
           "reduce_scatter", "all_to_all"]


def _sig(m: ArrayMeta, **kw: Any) -> list[tuple[str, Any]]:
    return [("dtype", m.dtype.str), *kw.items()]


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
        t = dtype_info(m.dtype).mpi
        root = root_rank(c.g, src, "src", c.name)
    except (TypeError, ValueError) as e:
        c.refuse(e)
    sig = _sig(m, size=m.size, src=src) if checks.checking() else None
    if c.gpu(_gpu.broadcast, m.on_gpu, sig, arr, m, root):
        return
    me = c.comm.Get_rank()
    with stager(m.on_gpu) as st:
        buf = st.out(arr, m, copy_in=me == root)
        with c.mpi_call(m.nbytes if me == root else 0, m.dtype, src, m.on_gpu, st.staged):
            c.comm.Bcast([buf, m.size, t], root=root)


def reduce(arr: Any, dst: int, op: ReduceOp = ReduceOp.SUM, group: Group | None = None) -> None:
    """Reduce ``arr`` of every rank with ``op`` into ``arr`` on world rank ``dst``.

    ``arr`` on other ranks is left unchanged.
    """
    c = call("reduce", group)
    try:
        m = output_array_meta(arr, "arr", c.name)
        info = dtype_info(m.dtype)
        red = mpi_reduction(op, info)
        root = root_rank(c.g, dst, "dst", c.name)
    except (TypeError, ValueError) as e:
        c.refuse(e)
    if checks.checking():
        c.agree(_sig(m, size=m.size, op=op.name, dst=dst))
    red = c.nan_safe(red, op, m.dtype, arr)
    me = c.comm.Get_rank()
    with stager(m.on_gpu, host_only(red, arr, m)) as st:
        sbuf: Any
        if me == root:
            buf = st.out(arr, m, copy_in=True)
            sbuf, rbuf = MPI.IN_PLACE, [buf, m.size, info.mpi]
        else:
            buf = st.inp(arr, m)
            sbuf, rbuf = [buf, m.size, info.mpi], None
        with c.mpi_call(m.nbytes, m.dtype, dst, m.on_gpu, st.staged):
            c.comm.Reduce(sbuf, rbuf, op=red.op, root=root)
        if me == root and red.average:
            average(buf, c.g.size)


@overload
def all_reduce(arr: Any, op: ReduceOp = ..., group: Group | None = ...,
               async_op: Literal[False] = ...) -> None: ...


@overload
def all_reduce(arr: Any, op: ReduceOp = ..., group: Group | None = ..., *,
               async_op: Literal[True]) -> CollectiveWork: ...


@overload
def all_reduce(arr: Any, op: ReduceOp, group: Group | None,
               async_op: Literal[True]) -> CollectiveWork: ...


def all_reduce(arr: Any, op: ReduceOp = ReduceOp.SUM, group: Group | None = None,
               async_op: bool = False) -> CollectiveWork | None:
    """Reduce ``arr`` of every rank of ``group`` with ``op``; every rank gets the result.

    With ``async_op=True`` the reduction is started (``MPI_Iallreduce``) and a
    :class:`~sbpmpi.comm.collectives.work.CollectiveWork` is returned: ``arr`` holds the
    result once its ``wait()`` (or a ``test()`` that returns True) has completed it, and
    must not be touched before. Every rank of the group starts its non-blocking
    collectives in the same order, as for blocking ones. Returns None otherwise.
    """
    c = call("all_reduce", group)
    _check_async(c, async_op)
    try:
        m = output_array_meta(arr, "arr", c.name)
        info = dtype_info(m.dtype)
        red = mpi_reduction(op, info)
    except (TypeError, ValueError) as e:
        c.refuse(e)
    sig = (_sig(m, size=m.size, op=op.name, **({"async_op": True} if async_op else {}))
           if checks.checking() else None)
    if c.gpu(_gpu.all_reduce, m.on_gpu, sig, arr, m, op):
        return CollectiveWork(c.name, None, HOST, None, None) if async_op else None
    red = c.nan_safe(red, op, m.dtype, arr)
    if async_op:
        return _start_all_reduce(c, arr, m, info.mpi, red)
    with stager(m.on_gpu, host_only(red, arr, m)) as st:
        buf = st.out(arr, m, copy_in=True)
        with c.mpi_call(m.nbytes, m.dtype, None, m.on_gpu, st.staged):
            c.comm.Allreduce(MPI.IN_PLACE, [buf, m.size, info.mpi], op=red.op)
        if red.average:
            average(buf, c.g.size)
    return None


def _check_async(c: Call, async_op: Any) -> None:
    """Refuse an ``async_op`` that is not a bool (before any communication)."""
    if type(async_op) is not bool:
        c.refuse(TypeError(f"{c.name}: async_op must be a bool, got "
                           f"{type(async_op).__name__} {async_op!r}"))


def _start_all_reduce(c: Call, arr: Any, m: ArrayMeta, t: MPI.Datatype,
                      red: MPIReduction) -> CollectiveWork:
    """Post ``MPI_Iallreduce`` for :func:`all_reduce`; the work finishes it (averaging,
    copying a staged result back) and releases the staging buffers."""
    st = stager(m.on_gpu, host_only(red, arr, m))
    try:
        buf = st.out(arr, m, copy_in=True)
        ctx = c.mpi_call(m.nbytes, m.dtype, None, m.on_gpu, st.staged, nonblocking=True)
        req = c.comm.Iallreduce(MPI.IN_PLACE, [buf, m.size, t], op=red.op)
    except BaseException:
        st.release()
        raise
    after = functools.partial(average, buf, c.g.size) if red.average else None
    return CollectiveWork(c.name, req, st, buf, ctx, after)


def _whole(x: Any, p: int, m: ArrayMeta, arg: str, ref: str, op: str, output: bool) -> ArrayMeta:
    """Checks for one array that holds ``p`` blocks of the size of ``m``."""
    mx = output_array_meta(x, arg, op) if output else array_meta(x, arg, op)
    check_same_dtype(mx, m, arg, ref, op)
    if mx.size != p * m.size:
        raise ValueError(f"{op}: {arg} has {mx.size} elements but must have {p} x {m.size} = "
                         f"{p * m.size} (group size x {ref}.size)")
    return mx


def _is_list(x: Any) -> bool:
    return isinstance(x, (list, tuple))


def _blocks(x: Any, p: int, m: ArrayMeta, *, list_arg: str, arg: str, ref: str, op: str,
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
        t = dtype_info(m.dtype).mpi
        root = root_rank(c.g, root_world, root_arg, op)
        me, p = c.comm.Get_rank(), c.g.size
        if me != root:
            return m, t, root, me, p, None, None
        if x is None:
            raise ValueError(f"{op}: {arg} is required on {root_arg} rank {root_world}")
        return (m, t, root, me, p, *_blocks(x, p, m, list_arg=arg, arg=arg, ref="arr", op=op,
                                          output=to_root))
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
    if checks.checking():
        c.agree(_sig(m, size=m.size, **{root_arg: root_world}))
    with stager(m.on_gpu or (mx is not None and mx.on_gpu)) as st:
        whole: Any = None  # the root's blocks as one flat buffer; None elsewhere
        if to_root:
            mine = st.inp(arr, m)
            if mx is not None:
                whole = st.out(x, mx)
            elif metas is not None:
                whole = np.empty(p * m.size, dtype=m.dtype)
        else:
            if mx is not None:
                whole = st.inp(x, mx)
            elif metas is not None:
                whole = gather_list_in(x, metas, m.dtype)
            mine = st.out(arr, m)
        blocks = None if whole is None else [whole, m.size, t]
        sent = m.size if to_root else p * m.size if me == root else 0
        with c.mpi_call(sent * m.dtype.itemsize, m.dtype, root_world, m.on_gpu, st.staged):
            if to_root:
                c.comm.Gather([mine, m.size, t], blocks, root=root)
            else:
                c.comm.Scatter(blocks, [mine, m.size, t], root=root)
        if to_root and metas is not None:
            scatter_list_out(whole, x, metas)


@overload
def all_gather(out_list_or_array: Any, arr: Any, group: Group | None = ...,
               async_op: Literal[False] = ...) -> None: ...


@overload
def all_gather(out_list_or_array: Any, arr: Any, group: Group | None = ..., *,
               async_op: Literal[True]) -> CollectiveWork: ...


@overload
def all_gather(out_list_or_array: Any, arr: Any, group: Group | None,
               async_op: Literal[True]) -> CollectiveWork: ...


def all_gather(out_list_or_array: Any, arr: Any, group: Group | None = None,
               async_op: bool = False) -> CollectiveWork | None:
    """Every rank receives ``arr`` of every rank of ``group``, in group rank order.

    ``out_list_or_array``: a list of group-size arrays shaped like ``arr``, or one array of
    group size x ``arr.size`` elements (e.g. shaped ``(group size, *arr.shape)``).

    With ``async_op=True`` (one output array only) the gather is started
    (``MPI_Iallgather``) and a :class:`~sbpmpi.comm.collectives.work.CollectiveWork` is
    returned, as :func:`all_reduce` does: the output holds the result once it completes,
    and neither array may be touched before. Returns None otherwise.
    """
    c = call("all_gather", group)
    op = c.name
    out = out_list_or_array
    _check_async(c, async_op)
    if async_op and _is_list(out):
        c.refuse(TypeError("all_gather: async_op=True needs one output array, got a list"))
    try:
        m = array_meta(arr, "arr", op)
        t = dtype_info(m.dtype).mpi
        p = c.g.size
        metas, mo = _blocks(out, p, m, list_arg="out_list", arg="out", ref="arr", op=op,
                            output=True)
    except (TypeError, ValueError) as e:
        c.refuse(e)
    sig = (_sig(m, size=m.size, **({"async_op": True} if async_op else {}))
           if checks.checking() else None)
    if c.gpu(_gpu.all_gather, m.on_gpu and mo is not None and mo.on_gpu, sig, out, arr, m):
        return CollectiveWork(c.name, None, HOST, None, None) if async_op else None
    if async_op:
        assert mo is not None
        return _start_all_gather(c, out, arr, m, mo, t)
    with stager(m.on_gpu or (mo is not None and mo.on_gpu)) as st:
        sbuf = st.inp(arr, m)
        rbuf = st.out(out, mo) if mo is not None else np.empty(p * m.size, dtype=m.dtype)
        with c.mpi_call(m.nbytes, m.dtype, None, m.on_gpu, st.staged):
            c.comm.Allgather([sbuf, m.size, t], [rbuf, m.size, t])
        if metas is not None:
            scatter_list_out(rbuf, out, metas)
    return None


def _start_all_gather(c: Call, out: Any, arr: Any, m: ArrayMeta, mo: ArrayMeta,
                      t: MPI.Datatype) -> CollectiveWork:
    """Post ``MPI_Iallgather`` for :func:`all_gather`; the work copies a staged result back
    and releases the staging buffers."""
    st = stager(m.on_gpu or mo.on_gpu)
    try:
        sbuf = st.inp(arr, m)
        rbuf = st.out(out, mo)
        ctx = c.mpi_call(m.nbytes, m.dtype, None, m.on_gpu, st.staged, nonblocking=True)
        req = c.comm.Iallgather([sbuf, m.size, t], [rbuf, m.size, t])
    except BaseException:
        st.release()
        raise
    return CollectiveWork(c.name, req, st, (sbuf, rbuf), ctx)


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
        info = dtype_info(m.dtype)
        red = mpi_reduction(op, info)
        p = c.g.size
        metas, mi = _blocks(x, p, m, list_arg="in_list", arg="input", ref="out", op=name,
                            output=False)
    except (TypeError, ValueError) as e:
        c.refuse(e)
    sig = _sig(m, size=m.size, op=op.name) if checks.checking() else None
    if c.gpu(_gpu.reduce_scatter, m.on_gpu and mi is not None and mi.on_gpu, sig, out, x, m, mi,
             op):
        return
    red = c.nan_safe(red, op, m.dtype, x)
    with stager(m.on_gpu or (mi is not None and mi.on_gpu), host_only(red, out, m)) as st:
        if mi is not None:
            sbuf = st.inp(x, mi)
        else:
            assert metas is not None
            sbuf = gather_list_in(x, metas, m.dtype)
        rbuf = st.out(out, m)
        with c.mpi_call(p * m.nbytes, m.dtype, None, m.on_gpu or bool(mi and mi.on_gpu),
                        st.staged):
            c.comm.Reduce_scatter_block([sbuf, m.size, info.mpi], [rbuf, m.size, info.mpi],
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
            if mo.size % p:
                raise ValueError(f"{name}: out has {mo.size} elements, not divisible by the "
                                 f"group size {p}")
            m = ArrayMeta.of(mo.dtype, mo.size // p, True, mo.on_gpu)
        in_metas, mi = _blocks(in_, p, m, list_arg="in", arg="in", ref="out block", op=name,
                               output=False)
        t = dtype_info(m.dtype).mpi
    except (TypeError, ValueError) as e:
        c.refuse(e)
    sig = _sig(m, block=m.size) if checks.checking() else None
    if c.gpu(_gpu.all_to_all, mo is not None and mi is not None and mo.on_gpu and mi.on_gpu,
             sig, out, in_, m, mi):
        return
    with stager(m.on_gpu or (mo is not None and mo.on_gpu) or (mi is not None and mi.on_gpu)) as st:
        if mi is not None:
            sbuf = st.inp(in_, mi)
        else:
            assert in_metas is not None
            sbuf = gather_list_in(in_, in_metas, m.dtype)
        rbuf = st.out(out, mo) if mo is not None else np.empty(p * m.size, dtype=m.dtype)
        with c.mpi_call(p * m.nbytes, m.dtype, None,
                   bool((mo and mo.on_gpu) or (mi and mi.on_gpu)), st.staged):
            c.comm.Alltoall([sbuf, m.size, t], [rbuf, m.size, t])
        if out_metas is not None:
            scatter_list_out(rbuf, out, out_metas)
