"""Creating global tensors: from a generator, from a global value, or from local shards.

Creation computes each rank's shard from global indices: no rank builds the whole
tensor and nothing is communicated, except in ``to_global`` from local shards (planned by
:mod:`sbpmpi.boxing.assembly`, run by :mod:`sbpmpi.runtime.assembly`: each rank
receives at most its own shard).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from . import backend, comm
from .boxing.assembly import LocalShard, plan_assembly
from .core import random as _random
from .core.dtypes import as_dtype, float32, is_bfloat16, is_floating, is_half
from .core.dtypes import below_one as largest_below_one
from .core.layout import Layout
from .core.modes import current_modes
from .core.placement import Placement
from .core.reduction import identity_value
from .core.sbp import SBP, check_partials
from .env import get_rank
from .tensor import GlobalTensor

__all__ = ["randn", "rand", "zeros", "ones", "full", "arange", "tensor", "to_global"]

_DEFAULT_FLOAT = np.float32


_F = TypeVar("_F", bound=Callable[..., GlobalTensor])


def _grad_option(fn: _F) -> _F:
    """Handle ``requires_grad=`` of a creation function: the result becomes a leaf that
    requires grad (floating dtypes only; the same TypeError on every rank otherwise)."""

    @functools.wraps(fn)
    def wrapped(*args: Any, requires_grad: bool = False, **kwargs: Any) -> GlobalTensor:
        if not isinstance(requires_grad, (bool, np.bool_)):
            raise TypeError(f"{fn.__name__}: requires_grad must be a bool, got "
                            f"{type(requires_grad).__name__} {requires_grad!r}")
        out = fn(*args, **kwargs)
        if requires_grad:
            out.requires_grad_(True)  # a TypeError for integer, bool and complex dtypes
        return out

    return wrapped  # type: ignore[return-value]


def _shape_arg(shape: tuple[Any, ...], name: str = "shape") -> tuple[int, ...]:
    if len(shape) == 1 and isinstance(shape[0], (list, tuple)):
        shape = tuple(shape[0])
    out = []
    for n in shape:
        if isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer)):
            raise TypeError(f"{name} entries must be ints, got {type(n).__name__} {n!r}")
        if n < 0:
            raise ValueError(f"{name} {tuple(shape)} has a negative size {n}")
        out.append(int(n))
    return tuple(out)


def _dtype_arg(dtype: Any, default: Any) -> np.dtype:
    if dtype is None:
        return np.dtype(default)
    try:
        return as_dtype(dtype)
    except TypeError as e:
        raise TypeError(f"dtype {dtype!r} is not a NumPy dtype") from e


def _layout(shape: tuple[int, ...], placement: Any, sbp: Any) -> Layout:
    if placement is None:
        raise TypeError("placement= is required, e.g. sm.placement('cpu', ranks=[0, 1])")
    if not isinstance(placement, Placement):
        raise TypeError(f"placement must be an sm.placement, got {type(placement).__name__}")
    if sbp is None:
        raise TypeError("sbp= is required, e.g. sm.sbp.split(0) or sm.sbp.broadcast")
    backend.check_device_available(placement)
    return Layout.make(shape, placement, sbp)


def _build(layout: Layout, dtype: np.dtype,
           fill: Callable[[Any, tuple[tuple[int, int], ...]], Any]) -> GlobalTensor:
    """Shard of this rank from ``fill(xp, ranges)``; identity on non-holding partial ranks."""
    check_partials(layout.sbp, dtype)  # same error on every rank, e.g. partial_max of complex
    me = get_rank()
    ranges = layout.local_ranges(me)
    if ranges is None:
        return GlobalTensor(np.empty(layout.local_shape(me), dtype=dtype), layout, dtype)
    xp = backend.get_xp(layout.placement.type)
    shape = tuple(b - a for a, b in ranges)
    op = layout.identity_op(me)
    if op is not None:
        return GlobalTensor(xp.full(shape, identity_value(op, dtype), dtype=dtype), layout, dtype)
    local = xp.ascontiguousarray(xp.asarray(fill(xp, ranges)).astype(dtype, copy=False))
    return GlobalTensor(local.reshape(shape), layout, dtype)


def _random_values(name: str, shape: Any, placement: Placement | None,
                   sbp: SBP | Sequence[SBP] | None, dtype: Any,
                   draw: Callable[..., Any], below_one: bool = False) -> GlobalTensor:
    """randn and rand: ``draw(xp, shape, ranges, seed, call, dtype)`` from the next random
    stream, in a floating dtype; ``below_one``: values in [0, 1) also after rounding."""
    shp = _shape_arg(shape)
    layout = _layout(shp, placement, sbp)
    dt = _dtype_arg(dtype, _DEFAULT_FLOAT)
    if not is_floating(dt):
        raise TypeError(f"{name} needs a floating dtype, got {dt}")
    seed, call = _random.next_stream()
    # half-width dtypes: float32's values, then rounded (the same draw at every width)
    drawn = float32 if is_half(dt) else dt
    if drawn is dt or not below_one:
        return _build(layout, dt, lambda xp, r: xp.asarray(draw(xp, shp, r, seed, call, drawn))
                      .astype(drawn, copy=False))
    top = largest_below_one(dt)  # rounding a float32 just below 1 to half width may give 1

    def values(xp: Any, r: Any) -> Any:
        v = xp.asarray(draw(xp, shp, r, seed, call, drawn)).astype(drawn, copy=False)
        return xp.minimum(v.astype(dt), top)
    return _build(layout, dt, values)


@_grad_option
def randn(*shape: Any, placement: Placement | None = None, sbp: SBP | Sequence[SBP] | None = None,
          dtype: Any = None, requires_grad: bool = False) -> GlobalTensor:
    """Standard normal values; depend only on the seed and the global index."""
    return _random_values("randn", shape, placement, sbp, dtype,
                          lambda xp, shp, r, seed, call, dt: _random.normal(xp, shp, r, seed,
                                                                             call))


@_grad_option
def rand(*shape: Any, placement: Placement | None = None, sbp: SBP | Sequence[SBP] | None = None,
         dtype: Any = None, requires_grad: bool = False) -> GlobalTensor:
    """Uniform values in [0, 1); depend only on the seed and the global index."""
    return _random_values("rand", shape, placement, sbp, dtype, _random.uniform,
                          below_one=True)


@_grad_option
def full(shape: Any, value: Any, *, placement: Placement | None = None,
         sbp: SBP | Sequence[SBP] | None = None, dtype: Any = None,
         requires_grad: bool = False) -> GlobalTensor:
    """A tensor filled with ``value``."""
    shp = _shape_arg((shape,) if isinstance(shape, int) else tuple(shape))
    layout = _layout(shp, placement, sbp)
    if np.ndim(value) != 0:
        raise TypeError(f"full: value must be a scalar, got {type(value).__name__} of shape "
                        f"{np.shape(value)}; use sm.tensor(data, ...) for an array value")
    if dtype is None:
        dtype = (np.bool_ if isinstance(value, (bool, np.bool_)) else
                 np.int64 if isinstance(value, (int, np.integer)) else
                 np.complex64 if isinstance(value, complex) else
                 np.asarray(value).dtype if isinstance(value, np.generic) else _DEFAULT_FLOAT)
    dt = _dtype_arg(dtype, _DEFAULT_FLOAT)
    return _build(layout, dt, lambda xp, r: xp.full(tuple(b - a for a, b in r), value, dtype=dt))


@_grad_option
def zeros(*shape: Any, placement: Placement | None = None, sbp: SBP | Sequence[SBP] | None = None,
          dtype: Any = None, requires_grad: bool = False) -> GlobalTensor:
    """A tensor of zeros."""
    return full(_shape_arg(shape), 0, placement=placement, sbp=sbp,
                dtype=_dtype_arg(dtype, _DEFAULT_FLOAT))


@_grad_option
def ones(*shape: Any, placement: Placement | None = None, sbp: SBP | Sequence[SBP] | None = None,
         dtype: Any = None, requires_grad: bool = False) -> GlobalTensor:
    """A tensor of ones."""
    return full(_shape_arg(shape), 1, placement=placement, sbp=sbp,
                dtype=_dtype_arg(dtype, _DEFAULT_FLOAT))


@_grad_option
def arange(start: Any, stop: Any = None, step: Any = 1, *, placement: Placement | None = None,
           sbp: SBP | Sequence[SBP] | None = None, dtype: Any = None,
         requires_grad: bool = False) -> GlobalTensor:
    """``start, start + step, ...`` below ``stop`` (``arange(n)`` is ``0, 1, ..., n-1``)."""
    if stop is None:
        start, stop = 0, start
    for name, v in (("start", start), ("stop", stop), ("step", step)):
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer,
                                                                  np.floating)):
            raise TypeError(f"arange {name} must be a real number, got {type(v).__name__} {v!r}")
        if not np.isfinite(v):
            raise ValueError(f"arange {name} must be finite, got {v!r}")
    if step == 0:
        raise ValueError("arange step must not be zero")
    n = max(0, int(np.ceil((stop - start) / step)))
    if dtype is None:
        ints = all(isinstance(v, (int, np.integer)) for v in (start, stop, step))
        dtype = np.int64 if ints else _DEFAULT_FLOAT
    dt = _dtype_arg(dtype, np.int64)
    layout = _layout((n,), placement, sbp)
    return _build(layout, dt, lambda xp, r: start + step * xp.arange(r[0][0], r[0][1]))


@_grad_option
def tensor(data: Any, *, placement: Placement | None = None,
           sbp: SBP | Sequence[SBP] | None = None, dtype: Any = None,
         requires_grad: bool = False) -> GlobalTensor:
    """A global tensor whose value is ``data`` (identical on every rank; no communication).

    Each rank keeps its slice; a partial SBP keeps the value on the first rank of each
    partial mesh axis and the reduction's identity elsewhere, so the value is exact.
    """
    if isinstance(data, GlobalTensor):
        raise TypeError("sm.tensor takes the whole global value; to convert a GlobalTensor "
                        "use x.to_global(placement=..., sbp=...)")
    value = backend.asnumpy(backend.from_dlpack(data)) if not isinstance(data, (list, tuple)) \
        else np.asarray(data)
    value = np.asarray(value)
    if value.dtype == object:
        raise TypeError("sm.tensor: data must be numeric (got an object array; ragged lists?)")
    dt = _dtype_arg(dtype, value.dtype)
    layout = _layout(value.shape, placement, sbp)
    value = value.astype(dt, copy=False)  # once, so a bad cast fails on every rank
    # a copy: the shard must not alias the caller's array
    out = _build(layout, dt, lambda xp, r: xp.array(value[tuple(slice(a, b) for a, b in r)]))
    # a step being captured as a graph (sm.graph): data may be its input
    if (recorder := current_modes().recorder) is not None:
        recorder.created(("tensor", layout, dt), lambda d: tensor(
            d, placement=placement, sbp=sbp, dtype=dtype)._local, data, out._local,
            _shard_into(layout))
    return out


def _shard_into(layout: Layout) -> Callable[[list[Any], Any, Any], None] | None:
    """How a replay writes this rank's shard of a host array into a given array (cast as
    ``tensor`` casts), or None where ``tensor`` makes it otherwise (on a device, or a
    partial's identity elsewhere than its holder)."""
    ranges = layout.local_ranges(get_rank())
    if layout.placement.type != "cpu" or ranges is None \
            or layout.identity_op(get_rank()) is not None:
        return None
    region = tuple(slice(a, b) for a, b in ranges)
    return lambda a, out, scratch: np.copyto(out, a[0][region], casting="unsafe")


# -- local arrays -> global tensor ------------------------------------------------------------
#
# Named steps: the arguments are checked (the same on every rank); each member prepares
# its array (a check and, if needed, a copy to the placement's device; an error is kept
# for the exchange); one small collective tells every rank every array's shape and dtype
# (or the error a rank met); boxing checks them and plans the data movement from that
# metadata alone, so a bad input raises the same error on every rank before any data
# moves; the runtime moves the data.

@dataclass(frozen=True)
class _Prepared:
    """This rank's array ready for the exchange: on the placement's device; ``owned``:
    ours to write into (else it is, or views, the caller's)."""

    array: Any
    owned: bool

    def shard(self) -> LocalShard:
        """What the metadata exchange tells the other ranks about it."""
        dt = np.dtype(self.array.dtype)
        # bfloat16's .str is raw bytes ('<V2'): its name is what np.dtype reads back
        return LocalShard(tuple(int(n) for n in self.array.shape),
                          dt.name if is_bfloat16(dt) else dt.str)


@dataclass(frozen=True)
class _LocalError:
    """What a rank reports in the metadata exchange when its local array is unusable."""

    message: str


def _check_arguments(local: Any, placement: Any, sbp: Any, grad_sbp: Any) -> None:
    """TypeError for arguments ``sm.to_global`` of a local array cannot take."""
    if grad_sbp is not None:
        raise TypeError("grad_sbp= applies to converting a GlobalTensor (its gradient's "
                        f"layout); got it with a local {type(local).__name__}")
    if placement is None or not isinstance(placement, Placement):
        raise TypeError("placement= must be an sm.placement, e.g. sm.placement('cpu', [0, 1]); "
                        f"got {placement!r}")
    if sbp is None:
        raise TypeError("sbp= is required, e.g. sm.sbp.split(0)")


def _prepared(local: Any, placement: Placement) -> _Prepared | _LocalError:
    """A member rank's ``local`` as an array on the placement's device, or the error that
    makes it unusable (reported to every rank by the exchange)."""
    try:
        if local is None:
            raise TypeError(f"rank {get_rank()} is in the placement but passed no local array")
        if not (isinstance(local, np.ndarray) or hasattr(local, "__dlpack__")
                or hasattr(local, "__cuda_array_interface__")):
            raise TypeError(
                f"local must be an array (NumPy, CuPy or any DLPack array), got "
                f"{type(local).__name__}; use sm.tensor(data, ...) for a global value")
        arr = backend.from_dlpack(local)
        if np.dtype(arr.dtype).kind not in "biufc" and not is_floating(arr.dtype):
            raise TypeError(f"local array dtype {arr.dtype} is not numeric")
        if backend.device_type_of(arr) != placement.type:
            return _Prepared(backend.to_device(arr, placement.type), True)  # a new array
        return _Prepared(arr, False)
    except Exception as e:  # any failure: raised on every rank after the exchange
        return _LocalError(f"{type(e).__name__}: {e}")


def _exchanged_shards(mine: LocalShard | _LocalError | None,
                      placement: Placement) -> tuple[LocalShard, ...]:
    """Every member's :class:`LocalShard`, in the placement's rank order, from one
    all-gather over the world (collective); the same TypeError on every rank when some
    rank could not use its array, naming the first such rank and its error."""
    everyone = comm.all_gather_object(mine)
    shards: list[LocalShard] = []
    for r, m in enumerate(everyone):
        if isinstance(m, _LocalError):
            raise TypeError(f"to_global: rank {r} could not use its local array: {m.message}")
    for r in placement.rank_list:
        m = everyone[r]
        assert isinstance(m, LocalShard)  # a member sends its shard or its error
        shards.append(m)
    return tuple(shards)


@_grad_option
def to_global(local: Any, *, placement: Placement | None = None,
              sbp: SBP | Sequence[SBP] | None = None, requires_grad: bool = False,
              grad_sbp: SBP | Sequence[SBP] | None = None) -> GlobalTensor:
    """Make a global tensor from this rank's shard ``local`` (collective over the world).

    ``split(d)``: the global tensor is the shards concatenated along ``d``; uneven shards
    move to the balanced split point to point, each rank receiving only the rows it must
    hold. ``broadcast``: the first rank's shard along each broadcast mesh axis is sent
    to the others. ``partial_*``: the shards' reduction, no transfer. Shapes and dtypes
    are exchanged and checked, so a mismatch raises the same error on every rank. A
    GlobalTensor is converted with ``x.to_global`` (``grad_sbp`` as there); a local array
    has no gradient to place, so it takes no ``grad_sbp``. Any DLPack array works.
    """
    if isinstance(local, GlobalTensor):
        return local.to_global(placement=placement, sbp=sbp, grad_sbp=grad_sbp)
    _check_arguments(local, placement, sbp, grad_sbp)
    assert placement is not None and sbp is not None
    from .runtime.assembly import assemble
    from .runtime.consistency import check_collective

    check_collective("sm.to_global", (placement, sbp))
    backend.check_device_available(placement)
    prepared = _prepared(local, placement) if get_rank() in placement else None
    mine = prepared.shard() if isinstance(prepared, _Prepared) else prepared
    plan = plan_assembly(placement, sbp, _exchanged_shards(mine, placement))
    if not isinstance(prepared, _Prepared):  # outside the placement
        return GlobalTensor(assemble(None, plan), plan.layout, plan.dtype)
    return GlobalTensor(assemble(prepared.array, plan, owned=prepared.owned), plan.layout,
                        plan.dtype)
