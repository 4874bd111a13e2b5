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

from .. import backend
from ..watchdog import watch
from . import checks
from .buffers import ArrayMeta, check_same_dtype, describe, describe_out, stager
from .dtypes import dtype_info
from .gpu import route as _gpu
from .group import Group, resolve, root_rank
from .listbufs import gather_list_in, list_metas, scatter_list_out
from .reduce_op import MPIReduction, ReduceOp, mpi_reduction
from .tracing import ACTIVE, note

__all__ = ["barrier", "broadcast", "reduce", "all_reduce", "gather", "all_gather", "scatter",
           "reduce_scatter", "all_to_all"]


def _host_only(red: MPIReduction, a: Any, m: ArrayMeta) -> bool:
    """User-defined ops, and averaging a GPU array that is not CuPy, need host memory."""
    return red.host_only or (red.average and m[3] and not backend.is_cupy_array(a))


_NAN_OPS: dict[tuple[ReduceOp, str], MPIReduction] = {}


def _nan_op(op: ReduceOp, dtype: np.dtype) -> MPIReduction:
    """A user-defined MAX/MIN that propagates NaN as ``np.maximum``/``np.minimum`` do."""
    key = (op, dtype.str)
    red = _NAN_OPS.get(key)
    if red is None:
        ufunc = np.maximum if op is ReduceOp.MAX else np.minimum

        def apply(inbuf: Any, inoutbuf: Any, datatype: MPI.Datatype) -> None:
            a = np.frombuffer(inbuf, dtype=dtype)
            b = np.frombuffer(inoutbuf, dtype=dtype)
            ufunc(a, b, out=b)

        red = _NAN_OPS[key] = MPIReduction(MPI.Op.Create(apply, commute=True), host_only=True)
    return red


def _has_nan(a: Any) -> bool:
    ne = a != a  # NaN is the only value unequal to itself (NumPy and CuPy alike)
    return bool(ne.any()) if hasattr(ne, "any") else bool(ne)


def nan_safe(red: MPIReduction, op: ReduceOp, dtype: np.dtype, inputs: Any, comm: Any,
             ranks: Any) -> MPIReduction:
    """``red``, or a NaN-propagating op when a MAX/MIN of floats meets a NaN on any rank.

    MPI's MAX and MIN do not propagate NaN (the result depends on the order in which
    ranks are combined, so ranks can even disagree). One flag is all-reduced first (a few
    microseconds); only when some rank holds a NaN does the reduction run as a
    user-defined op with NumPy's semantics. Collective over ``comm``.
    """
    if op not in (ReduceOp.MAX, ReduceOp.MIN) or dtype.kind != "f" or red.host_only:
        return red
    arrays = inputs if isinstance(inputs, (list, tuple)) else [inputs]
    flag = np.array([any(_has_nan(a) for a in arrays)], dtype=np.uint8)
    with watch("NaN flag of a max/min reduction", ranks):
        comm.Allreduce(MPI.IN_PLACE, [flag, 1, MPI.UNSIGNED_CHAR], op=MPI.MAX)
    return _nan_op(op, dtype) if flag[0] else red


def _sig(m: ArrayMeta, **kw: Any) -> list[tuple[str, Any]]:
    return [("dtype", m[0].str), *kw.items()]


def barrier(group: Group | None = None) -> None:
    """Block until every rank of ``group`` has called barrier."""
    g, comm = resolve(group, "barrier")
    if ACTIVE:
        note("barrier", 0, g)
    with watch("barrier", g.ranks):
        comm.Barrier()


def broadcast(arr: Any, src: int, group: Group | None = None) -> None:
    """Copy ``arr`` of world rank ``src`` into ``arr`` on every rank of ``group``."""
    g, comm = resolve(group, "broadcast")
    try:
        m = describe_out(arr, "arr", "broadcast")
        t = dtype_info(m[0]).mpi
        root = root_rank(g, src, "src", "broadcast")
    except (TypeError, ValueError) as e:
        checks.agree(comm, "broadcast", e)
        raise
    if checks._enabled:
        checks.agree(comm, "broadcast", None, _sig(m, size=m[1], src=src))
    if m[3] and _gpu.ENABLED and _gpu.broadcast(arr, m, root, g, comm):
        return
    me = comm.Get_rank()
    st = stager(m[3])
    try:
        buf = st.out(arr, m, copy_in=me == root)
        if ACTIVE:
            note("broadcast", m[1] * m[0].itemsize if me == root else 0, g, m[0], src,
                 m[3], st.staged)
        with watch("broadcast", g.ranks):
            comm.Bcast([buf, m[1], t], root=root)
        st.finish()
    finally:
        st.release()


def _average(buf: Any, n: int) -> None:
    buf /= n


def reduce(arr: Any, dst: int, op: ReduceOp = ReduceOp.SUM, group: Group | None = None) -> None:
    """Reduce ``arr`` of every rank with ``op`` into ``arr`` on world rank ``dst``.

    ``arr`` on other ranks is left unchanged.
    """
    g, comm = resolve(group, "reduce")
    try:
        m = describe_out(arr, "arr", "reduce")
        info = dtype_info(m[0])
        red = mpi_reduction(op, info)
        root = root_rank(g, dst, "dst", "reduce")
    except (TypeError, ValueError) as e:
        checks.agree(comm, "reduce", e)
        raise
    if checks._enabled:
        checks.agree(comm, "reduce", None, _sig(m, size=m[1], op=op.name, dst=dst))
    red = nan_safe(red, op, m[0], arr, comm, g.ranks)
    me = comm.Get_rank()
    st = stager(m[3], _host_only(red, arr, m))
    try:
        if me == root:
            buf = st.out(arr, m, copy_in=True)
            if ACTIVE:
                note("reduce", m[1] * m[0].itemsize, g, m[0], dst, m[3], st.staged)
            with watch("reduce", g.ranks):
                comm.Reduce(MPI.IN_PLACE, [buf, m[1], info.mpi], op=red.op, root=root)
            if red.average:
                _average(buf, g.size)
            st.finish()
        else:
            buf = st.inp(arr, m)
            if ACTIVE:
                note("reduce", m[1] * m[0].itemsize, g, m[0], dst, m[3], st.staged)
            with watch("reduce", g.ranks):
                comm.Reduce([buf, m[1], info.mpi], None, op=red.op, root=root)
    finally:
        st.release()


def all_reduce(arr: Any, op: ReduceOp = ReduceOp.SUM, group: Group | None = None) -> None:
    """Reduce ``arr`` of every rank of ``group`` with ``op``; every rank gets the result."""
    g, comm = resolve(group, "all_reduce")
    try:
        m = describe_out(arr, "arr", "all_reduce")
        info = dtype_info(m[0])
        red = mpi_reduction(op, info)
    except (TypeError, ValueError) as e:
        checks.agree(comm, "all_reduce", e)
        raise
    if checks._enabled:
        checks.agree(comm, "all_reduce", None, _sig(m, size=m[1], op=op.name))
    if m[3] and _gpu.ENABLED and _gpu.all_reduce(arr, m, op, g, comm):
        return
    red = nan_safe(red, op, m[0], arr, comm, g.ranks)
    st = stager(m[3], _host_only(red, arr, m))
    try:
        buf = st.out(arr, m, copy_in=True)
        if ACTIVE:
            note("all_reduce", m[1] * m[0].itemsize, g, m[0], None, m[3], st.staged)
        with watch("all_reduce", g.ranks):
            comm.Allreduce(MPI.IN_PLACE, [buf, m[1], info.mpi], op=red.op)
        if red.average:
            _average(buf, g.size)
        st.finish()
    finally:
        st.release()


def _whole_out(out: Any, p: int, m: ArrayMeta, arg: str, ref: str, op: str) -> ArrayMeta:
    """Checks for one array that holds ``p`` blocks of the size of ``m``."""
    mo = describe_out(out, arg, op)
    check_same_dtype(mo, m, arg, ref, op)
    if mo[1] != p * m[1]:
        raise ValueError(f"{op}: {arg} has {mo[1]} elements but must have {p} x {m[1]} = "
                         f"{p * m[1]} (group size x {ref}.size)")
    return mo


def _whole_in(x: Any, p: int, m: ArrayMeta, arg: str, ref: str, op: str) -> ArrayMeta:
    mi = describe(x, arg, op)
    check_same_dtype(mi, m, arg, ref, op)
    if mi[1] != p * m[1]:
        raise ValueError(f"{op}: {arg} has {mi[1]} elements but must have {p} x {m[1]} = "
                         f"{p * m[1]} (group size x {ref}.size)")
    return mi


def _is_list(x: Any) -> bool:
    return isinstance(x, (list, tuple))


def gather(arr: Any, gather_list: Any = None, dst: int = 0, group: Group | None = None) -> None:
    """Collect ``arr`` of every rank on world rank ``dst``, in group rank order.

    On ``dst``, ``gather_list`` is a list of group-size arrays shaped like ``arr``, or one
    array of group size x ``arr.size`` elements; it is ignored on other ranks.
    """
    op = "gather"
    g, comm = resolve(group, op)
    try:
        m = describe(arr, "arr", op)
        t = dtype_info(m[0]).mpi
        root = root_rank(g, dst, "dst", op)
        me, p = comm.Get_rank(), g.size
        metas = mo = None
        if me == root:
            if gather_list is None:
                raise ValueError(f"{op}: gather_list is required on dst rank {dst}")
            if _is_list(gather_list):
                metas = list_metas(gather_list, p, m, "gather_list", "arr", op, output=True)
            else:
                mo = _whole_out(gather_list, p, m, "gather_list", "arr", op)
    except (TypeError, ValueError) as e:
        checks.agree(comm, op, e)
        raise
    if checks._enabled:
        checks.agree(comm, op, None, _sig(m, size=m[1], dst=dst))
    st = stager(m[3] or (mo is not None and mo[3]))
    try:
        sbuf = st.inp(arr, m)
        if ACTIVE:
            note(op, m[1] * m[0].itemsize, g, m[0], dst, m[3], st.staged)
        if me != root:
            with watch("gather", g.ranks):
                comm.Gather([sbuf, m[1], t], None, root=root)
            return
        if mo is not None:
            rbuf = st.out(gather_list, mo)
            with watch("gather", g.ranks):
                comm.Gather([sbuf, m[1], t], [rbuf, m[1], t], root=root)
            st.finish()
        else:
            assert metas is not None
            tmp = np.empty(p * m[1], dtype=m[0])
            with watch("gather", g.ranks):
                comm.Gather([sbuf, m[1], t], [tmp, m[1], t], root=root)
            scatter_list_out(tmp, gather_list, metas)
    finally:
        st.release()


def all_gather(out_list_or_array: Any, arr: Any, group: Group | None = None) -> None:
    """Every rank receives ``arr`` of every rank of ``group``, in group rank order.

    ``out_list_or_array``: a list of group-size arrays shaped like ``arr``, or one array of
    group size x ``arr.size`` elements (e.g. shaped ``(group size, *arr.shape)``).
    """
    op = "all_gather"
    g, comm = resolve(group, op)
    out = out_list_or_array
    try:
        m = describe(arr, "arr", op)
        t = dtype_info(m[0]).mpi
        p = g.size
        metas = mo = None
        if _is_list(out):
            metas = list_metas(out, p, m, "out_list", "arr", op, output=True)
        else:
            mo = _whole_out(out, p, m, "out", "arr", op)
    except (TypeError, ValueError) as e:
        checks.agree(comm, op, e)
        raise
    if checks._enabled:
        checks.agree(comm, op, None, _sig(m, size=m[1]))
    if (m[3] and mo is not None and mo[3] and _gpu.ENABLED
            and _gpu.all_gather(out, arr, m, g, comm)):
        return
    st = stager(m[3] or (mo is not None and mo[3]))
    try:
        sbuf = st.inp(arr, m)
        if mo is not None:
            rbuf = st.out(out, mo)
        else:
            rbuf = np.empty(p * m[1], dtype=m[0])
        if ACTIVE:
            note(op, m[1] * m[0].itemsize, g, m[0], None, m[3], st.staged)
        with watch("all_gather", g.ranks):
            comm.Allgather([sbuf, m[1], t], [rbuf, m[1], t])
        if metas is not None:
            scatter_list_out(rbuf, out, metas)
        st.finish()
    finally:
        st.release()


def scatter(arr: Any, scatter_list: Any = None, src: int = 0, group: Group | None = None) -> None:
    """Rank i of ``group`` receives block i of ``scatter_list`` of world rank ``src`` in ``arr``.

    On ``src``, ``scatter_list`` is a list of group-size arrays shaped like ``arr``, or one
    array of group size x ``arr.size`` elements; it is ignored on other ranks.
    """
    op = "scatter"
    g, comm = resolve(group, op)
    try:
        m = describe_out(arr, "arr", op)
        t = dtype_info(m[0]).mpi
        root = root_rank(g, src, "src", op)
        me, p = comm.Get_rank(), g.size
        metas = mi = None
        if me == root:
            if scatter_list is None:
                raise ValueError(f"{op}: scatter_list is required on src rank {src}")
            if _is_list(scatter_list):
                metas = list_metas(scatter_list, p, m, "scatter_list", "arr", op, output=False)
            else:
                mi = _whole_in(scatter_list, p, m, "scatter_list", "arr", op)
    except (TypeError, ValueError) as e:
        checks.agree(comm, op, e)
        raise
    if checks._enabled:
        checks.agree(comm, op, None, _sig(m, size=m[1], src=src))
    st = stager(m[3] or (mi is not None and mi[3]))
    try:
        sbuf = None
        if me == root:
            if mi is not None:
                sbuf = st.inp(scatter_list, mi)
            else:
                assert metas is not None
                sbuf = gather_list_in(scatter_list, metas, m[0])
        rbuf = st.out(arr, m)
        if ACTIVE:
            note(op, p * m[1] * m[0].itemsize if me == root else 0, g, m[0], src, m[3],
                 st.staged)
        with watch("scatter", g.ranks):
            comm.Scatter(None if sbuf is None else [sbuf, m[1], t], [rbuf, m[1], t], root=root)
        st.finish()
    finally:
        st.release()


def reduce_scatter(out: Any, in_list_or_array: Any, op: ReduceOp = ReduceOp.SUM,
                   group: Group | None = None) -> None:
    """Reduce the inputs of all ranks with ``op``; rank i of ``group`` receives block i in ``out``.

    ``in_list_or_array``: a list of group-size arrays shaped like ``out``, or one array of
    group size x ``out.size`` elements.
    """
    name = "reduce_scatter"
    g, comm = resolve(group, name)
    x = in_list_or_array
    try:
        m = describe_out(out, "out", name)
        info = dtype_info(m[0])
        red = mpi_reduction(op, info)
        p = g.size
        metas = mi = None
        if _is_list(x):
            metas = list_metas(x, p, m, "in_list", "out", name, output=False)
        else:
            mi = _whole_in(x, p, m, "input", "out", name)
    except (TypeError, ValueError) as e:
        checks.agree(comm, name, e)
        raise
    if checks._enabled:
        checks.agree(comm, name, None, _sig(m, size=m[1], op=op.name))
    if (m[3] and mi is not None and mi[3] and _gpu.ENABLED
            and _gpu.reduce_scatter(out, x, m, mi, op, g, comm)):
        return
    red = nan_safe(red, op, m[0], x, comm, g.ranks)
    host_only = _host_only(red, out, m)
    st = stager(m[3] or (mi is not None and mi[3]), host_only)
    try:
        if mi is not None:
            sbuf = st.inp(x, mi)
        else:
            assert metas is not None
            sbuf = gather_list_in(x, metas, m[0])
        rbuf = st.out(out, m)
        if ACTIVE:
            note(name, p * m[1] * m[0].itemsize, g, m[0], None, m[3] or bool(mi and mi[3]),
                 st.staged)
        comm.Reduce_scatter_block([sbuf, m[1], info.mpi], [rbuf, m[1], info.mpi], op=red.op)
        if red.average:
            _average(rbuf, p)
        st.finish()
    finally:
        st.release()


def all_to_all(out: Any, in_: Any, group: Group | None = None) -> None:
    """Rank i sends block j of its input to rank j, which stores it as block i of ``out``.

    ``out`` and the input are arrays of group size x block elements each, or lists of
    group-size arrays of one shape.
    """
    name = "all_to_all"
    g, comm = resolve(group, name)
    try:
        p = g.size
        out_metas = in_metas = mo = mi = None
        if _is_list(out):
            if len(out) != p or not out:
                raise ValueError(f"{name}: out has {len(out)} arrays, expected one per rank "
                                 f"of the group ({p})")
            m = describe(out[0], "out[0]", name)
            out_metas = list_metas(out, p, m, "out", "out[0]", name, output=True)
        else:
            mo = describe_out(out, "out", name)
            if mo[1] % p:
                raise ValueError(f"{name}: out has {mo[1]} elements, not divisible by the "
                                 f"group size {p}")
            m = (mo[0], mo[1] // p, True, mo[3])
        if _is_list(in_):
            in_metas = list_metas(in_, p, m, "in", "out block", name, output=False)
        else:
            mi = _whole_in(in_, p, m, "in", "out block", name)
        t = dtype_info(m[0]).mpi
    except (TypeError, ValueError) as e:
        checks.agree(comm, name, e)
        raise
    if checks._enabled:
        checks.agree(comm, name, None, _sig(m, block=m[1]))
    if (mo is not None and mi is not None and mo[3] and mi[3] and _gpu.ENABLED
            and _gpu.all_to_all(out, in_, m, mi, g, comm)):
        return
    st = stager(m[3] or (mo is not None and mo[3]) or (mi is not None and mi[3]))
    try:
        if mi is not None:
            sbuf = st.inp(in_, mi)
        else:
            assert in_metas is not None
            sbuf = gather_list_in(in_, in_metas, m[0])
        if mo is not None:
            rbuf = st.out(out, mo)
        else:
            rbuf = np.empty(p * m[1], dtype=m[0])
        if ACTIVE:
            note(name, p * m[1] * m[0].itemsize, g, m[0], None,
                 bool((mo and mo[3]) or (mi and mi[3])), st.staged)
        with watch("all_to_all", g.ranks):
            comm.Alltoall([sbuf, m[1], t], [rbuf, m[1], t])
        if out_metas is not None:
            scatter_list_out(rbuf, out, out_metas)
        st.finish()
    finally:
        st.release()

