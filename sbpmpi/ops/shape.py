"""Ops that move or select elements: transpose, reshape, getitem, cat, and astype.

None of these does arithmetic, so every partial SBP passes through unchanged
(``astype`` only where the cast keeps the reduction exact). A split passes through
a dim the op carries whole (wildcard ``S(d)``); any other split is boxed first.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import numpy as np

from ..core.dtypes import as_dtype
from ..tensor import GlobalTensor
from .call import OpCall, arg_summary, norm_dim, tensor_arg
from .kernel import with_into
from .op import GlobalOp
from .signature import PMAX, PMIN, S_D, B, DimMatch, P, Signature

__all__ = ["MOVE", "ASTYPE", "CAT", "SCATTER", "transpose", "reshape", "getitem", "astype",
           "cat", "scatter", "reshape_matches"]

def _carried(ordered_when: str = "") -> tuple[Signature, ...]:
    """Each SBP kind carried through as it is: S(d) -> S(d), B -> B, each partial to itself
    (partial_max/min only ``when`` the op keeps order, if given)."""
    return (Signature((S_D,), S_D), Signature((B,), B), Signature((P,), P),
            Signature((PMAX,), PMAX, when=ordered_when),
            Signature((PMIN,), PMIN, when=ordered_when))


MOVE = _carried()  # transpose, reshape, getitem: S(d) for the dims carried whole
# astype: P only for a cast to the same dtype (see admissible); float -> float casts are
# monotone, so partial_max/min survive them
ASTYPE = _carried(ordered_when="float")
CAT = _carried()  # every input takes the pattern: S(d) for d other than the cat dim


def _ints(op: str, args: tuple[Any, ...], what: str) -> tuple[int, ...]:
    if len(args) == 1 and isinstance(args[0], (list, tuple)):
        args = tuple(args[0])
    for a in args:
        if isinstance(a, (bool, np.bool_)) or not isinstance(a, (int, np.integer)):
            raise TypeError(f"{op}: {what} entries must be ints, got {type(a).__name__} {a!r}")
    return tuple(int(a) for a in args)


# ---- transpose -----------------------------------------------------------------------------

def _transpose(x: Any, *axes: Any) -> OpCall:
    """Build the OpCall of ``transpose``."""
    x = tensor_arg("transpose", x)
    n = x.ndim
    perm = _ints("transpose", axes, "axes") if axes and axes != (None,) else \
        tuple(range(n - 1, -1, -1))
    if len(perm) != n:
        raise ValueError(f"transpose: axes {perm} must name each of the {n} dims once")
    perm = tuple(norm_dim("transpose", p, n, "axis") for p in perm)
    if sorted(perm) != list(range(n)):
        raise ValueError(f"transpose: axes {perm} are not a permutation of the {n} dims")
    out_shape = tuple(x.shape[p] for p in perm)

    def kernel(xp: ModuleType, local: Sequence[Any], shape: tuple[int, ...]) -> Any:
        return xp.transpose(local[0], perm)

    def into(xp: ModuleType, local: Sequence[Any], shape: tuple[int, ...], out: Any) -> None:
        xp.copyto(out, xp.transpose(local[0], perm))

    with_into(kernel, into)

    dims = {"d": tuple(DimMatch((perm[j],), j) for j in range(n))}
    return OpCall("transpose", (x,), MOVE, dims, out_shape, x.dtype, kernel,
                  params=f"axes={perm}", labels=("x",))


transpose = GlobalOp("transpose", _transpose, MOVE, doc=(
    "Permute the dims of a global tensor (reverse them when no axes are given, as ``.T``)."))


# ---- reshape -------------------------------------------------------------------------------

def reshape_matches(src: tuple[int, ...], dst: tuple[int, ...],
                    parts: int = 0) -> tuple[DimMatch, ...]:
    """Dims a row-major reshape carries whole: same size and same product of the dims before.

    A split of such a dim cuts the same rows in the input and the output; any other
    split would need the data to move. With ``parts`` (the number of ranks of the mesh),
    a dim also keeps its split when the reshape cuts it into a leading dim and others
    (``(T, H * D) -> (T, H, D)``) or merges it with the dims after it (the reverse), and
    that leading dim divides by ``parts``: then every split of it along any mesh axes
    cuts the same elements as the split of the whole dim (heads stay split).
    """
    out = []
    for i, n in enumerate(src):
        before = math.prod(src[:i])
        for j, m in enumerate(dst):
            if math.prod(dst[:j]) != before:
                continue
            if m == n:
                out.append(DimMatch((i,), j))
                break
            if parts and n and m and (
                    _leading(n, dst[j:], m, parts) or _leading(m, src[i:], n, parts)):
                out.append(DimMatch((i,), j))
                break
    return tuple(out)


def _leading(whole: int, pieces: tuple[int, ...], lead: int, parts: int) -> bool:
    """Whether ``pieces`` (starting with ``lead``) multiply up to ``whole`` exactly at some
    prefix, and ``lead`` divides by ``parts`` (so its blocks are whole multiples)."""
    if lead % parts or whole % lead:
        return False
    acc = 1
    for k in pieces:
        acc *= k
        if acc == whole:
            return True
        if acc > whole or k == 0:
            return False
    return False


def _reshape(x: Any, *shape: Any) -> OpCall:
    """Build the OpCall of ``reshape``."""
    x = tensor_arg("reshape", x)
    want = _ints("reshape", shape, "shape")
    total = x.size
    if sum(1 for n in want if n == -1) > 1 or any(n < -1 for n in want):
        raise ValueError(f"reshape: shape {want} may hold one -1 and no other negative size")
    if -1 in want:
        rest = math.prod(n for n in want if n != -1)
        if rest == 0 or total % rest:
            raise ValueError(f"reshape: cannot reshape a tensor of shape {x.shape} ({total} "
                             f"elements) into {want}")
        want = tuple(total // rest if n == -1 else n for n in want)
    if math.prod(want) != total:
        raise ValueError(f"reshape: cannot reshape a tensor of shape {x.shape} ({total} "
                         f"elements) into {want}")

    def kernel(xp: ModuleType, local: Sequence[Any], shape: tuple[int, ...]) -> Any:
        return xp.reshape(local[0], shape)

    def into(xp: ModuleType, local: Sequence[Any], shape: tuple[int, ...], out: Any) -> None:
        a = local[0]
        xp.copyto(out.reshape(a.shape), a)  # C order both ways: reshape's values

    with_into(kernel, into)

    parts = math.prod(x.placement.hierarchy)
    return OpCall("reshape", (x,), MOVE, {"d": reshape_matches(x.shape, want, parts)}, want,
                  x.dtype,
                  kernel, params=f"shape={want}", labels=("x",))


reshape = GlobalOp("reshape", _reshape, MOVE, doc=(
    "Reshape a global tensor (row-major, one ``-1`` allowed). A split survives on a dim "
    "the reshape keeps whole, and on a dim cut into (or merged from) a leading dim that "
    "divides by the mesh's number of ranks (``(T, H * D) <-> (T, H, D)``: split heads "
    "stay split); other splits are boxed first."))


# ---- getitem -------------------------------------------------------------------------------

def index_key(key: Any, shape: tuple[int, ...]) -> tuple[tuple[Any, ...], tuple[DimMatch, ...]]:
    """Normalised key (ints, slices, None) and the dims it keeps whole."""
    items = key if isinstance(key, tuple) else (key,)
    for k in items:
        ok = k is None or k is Ellipsis or isinstance(k, slice) or (
            isinstance(k, (int, np.integer)) and not isinstance(k, (bool, np.bool_)))
        if not ok:
            raise TypeError(f"getitem: index {k!r} is not supported: use ints, slices, None and "
                            f"... (no arrays or booleans); got {arg_summary(k)}")
        if isinstance(k, slice):
            for part in (k.start, k.stop, k.step):
                if part is not None and (isinstance(part, (bool, np.bool_))
                                         or not isinstance(part, (int, np.integer))):
                    raise TypeError(f"getitem: slice {k} must have int or None bounds")
    if sum(1 for k in items if k is Ellipsis) > 1:
        raise IndexError("getitem: an index can only have a single ellipsis ('...')")
    n_real = sum(1 for k in items if k is not None and k is not Ellipsis)
    if n_real > len(shape):
        raise IndexError(f"getitem: too many indices for a tensor of {len(shape)} dims: "
                         f"{n_real} were given")
    if Ellipsis in items:
        e = items.index(Ellipsis)
        items = items[:e] + (slice(None),) * (len(shape) - n_real) + items[e + 1:]
    else:
        items = items + (slice(None),) * (len(shape) - n_real)
    out: list[Any] = []
    matches = []
    d = j = 0
    for k in items:
        if k is None:
            out.append(None)
            j += 1
            continue
        n = shape[d]
        if isinstance(k, slice):
            if k.step == 0:
                raise ValueError("getitem: slice step cannot be zero")
            if k.indices(n) == (0, n, 1):
                matches.append(DimMatch((d,), j))
            out.append(k)
            j += 1
        else:
            if not -n <= k < n:
                raise IndexError(f"getitem: index {k} is out of bounds for dim {d} of size {n}")
            out.append(int(k) % n)
        d += 1
    return tuple(out), tuple(matches)


def _getitem(x: Any, key: Any) -> OpCall:
    """Build the OpCall of ``getitem``."""
    x = tensor_arg("getitem", x)
    k, matches = index_key(key, x.shape)
    out_shape = tuple(np.broadcast_to(np.empty((), dtype=np.int8), x.shape)[k].shape)

    def kernel(xp: ModuleType, local: Sequence[Any], shape: tuple[int, ...]) -> Any:
        return local[0][k]

    return OpCall("getitem", (x,), MOVE, {"d": matches}, out_shape, x.dtype, kernel,
                  params=f"key={key!r}", labels=("x",), view=True)


getitem = GlobalOp("getitem", _getitem, MOVE, doc=(
    "``x[key]`` with ints, slices (any step), None and ``...`` on any dim. A dim kept "
    "whole (``:``) keeps its split; a split dim that is indexed is boxed first. As "
    "NumPy's basic indexing, the result is a view of ``x`` (writes into either reach the "
    "other) where nothing moved; where ``x`` had to be boxed it is a copy, and writes "
    "into it raise ``CopyWriteError``."))


# ---- astype --------------------------------------------------------------------------------

def _astype(x: Any, dtype: Any) -> OpCall:
    """Build the OpCall of ``astype``."""
    x = tensor_arg("astype", x)
    try:
        dt = as_dtype(dtype)
    except TypeError as e:
        raise TypeError(f"astype: dtype {dtype!r} is not a NumPy dtype") from e

    def kernel(xp: ModuleType, local: Sequence[Any], shape: tuple[int, ...]) -> Any:
        return local[0].astype(dt)

    def into(xp: ModuleType, local: Sequence[Any], shape: tuple[int, ...], out: Any) -> None:
        xp.copyto(out, local[0], casting="unsafe")  # astype's cast

    with_into(kernel, into)

    dims = {"d": tuple(DimMatch((d,), d) for d in range(x.ndim))}
    return OpCall("astype", (x,), ASTYPE, dims, x.shape, dt, kernel, params=f"dtype={dt}",
                  labels=("x",))


astype = GlobalOp("astype", _astype, ASTYPE, doc="Cast a global tensor to ``dtype``.")


# ---- cat -----------------------------------------------------------------------------------

def _cat(tensors: Any, dim: Any = 0) -> OpCall:
    """Build the OpCall of ``cat``."""
    if isinstance(tensors, GlobalTensor) or not isinstance(tensors, (list, tuple)):
        raise TypeError(f"cat: tensors must be a list or tuple of GlobalTensors, got "
                        f"{arg_summary(tensors)}")
    if not tensors:
        raise ValueError("cat: needs at least one tensor")
    ts = tuple(tensor_arg("cat", t, f"tensors[{i}]") for i, t in enumerate(tensors))
    n = ts[0].ndim
    if n == 0:
        raise ValueError("cat: cannot concatenate 0-d tensors")
    for i, t in enumerate(ts):
        if t.ndim != n:
            raise ValueError(f"cat: tensors[{i}] has {t.ndim} dims but tensors[0] has {n}")
    d = norm_dim("cat", dim, n)
    for i, t in enumerate(ts):
        for k in range(n):
            if k != d and t.shape[k] != ts[0].shape[k]:
                raise ValueError(f"cat: tensors[{i}] has shape {t.shape} but tensors[0] has "
                                 f"{ts[0].shape}; they may differ only in dim {d}")
    out_shape = tuple(sum(t.shape[d] for t in ts) if k == d else ts[0].shape[k]
                      for k in range(n))
    dtype = np.result_type(*[t.dtype for t in ts])
    table = tuple(Signature(sig.inputs * len(ts), sig.output, sig.when) for sig in CAT)
    dims = {"d": tuple(DimMatch((k,) * len(ts), k) for k in range(n) if k != d)}

    def kernel(xp: ModuleType, local: Sequence[Any], shape: tuple[int, ...]) -> Any:
        return xp.concatenate([a.astype(dtype, copy=False) for a in local], axis=d)

    def into(xp: ModuleType, local: Sequence[Any], shape: tuple[int, ...], out: Any) -> None:
        xp.concatenate([a.astype(dtype, copy=False) for a in local], axis=d, out=out)

    with_into(kernel, into)

    return OpCall("cat", ts, table, dims, out_shape, np.dtype(dtype), kernel,
                  params=f"dim={d}", labels=tuple(f"t{i}" for i in range(len(ts))))


cat = GlobalOp("cat", _cat, CAT, doc=(
    "Concatenate global tensors along ``dim``; splits of other dims pass through, a "
    "split of ``dim`` is boxed first (each input row of ``cat.table`` applies to all)."))


# ---- scatter: the backward of getitem ---------------------------------------------------------


SCATTER = (  # as getitem's table, without partial max/min (zeros are not their identity)
    Signature((S_D,), S_D),
    Signature((B,), B),
    Signature((P,), P),
)


def _scatter_build(g: GlobalTensor, shape: tuple[int, ...], key: Any) -> OpCall:
    k, matches = index_key(key, shape)
    dtype = g.dtype

    def kernel(xp: ModuleType, local: Sequence[Any], out_shape: tuple[int, ...]) -> Any:
        z = xp.zeros(out_shape, dtype=dtype)
        z[k] = local[0]
        return z

    def into(xp: ModuleType, local: Sequence[Any], out_shape: tuple[int, ...],
             out: Any) -> None:
        out.fill(0)
        out[k] = local[0]

    with_into(kernel, into)

    dims = {"d": tuple(DimMatch((m.output,), m.inputs[0]) for m in matches)}
    return OpCall("scatter", (g,), SCATTER, dims, tuple(shape), dtype, kernel,
                  params=f"shape={tuple(shape)}, key={key!r}", labels=("g",))


scatter = GlobalOp("scatter", _scatter_build, SCATTER, doc=(
    "``scatter(g, shape, key)``: zeros of ``shape`` with ``g`` written at ``[key]`` (the "
    "backward of getitem). A dim the key keeps whole keeps its split."))
