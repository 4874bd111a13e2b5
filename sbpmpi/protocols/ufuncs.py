"""NumPy ufuncs on GlobalTensors (NEP 13): each runs as the op the registry names for it,
into ``out=`` a GlobalTensor when given."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..ops.registry import REGISTRY
from ..tensor import GlobalTensor

__all__ = ["UFUNCS", "array_ufunc", "write_into", "unsupported"]


#: NumPy ufunc -> the sbpmpi op answering it (from the op registry's entries).
UFUNCS: dict[np.ufunc, Any] = {getattr(np, name): entry.op for entry in REGISTRY.values()
                               for name in entry.ufuncs}


def unsupported(what: str) -> TypeError:
    return TypeError(f"{what} is not supported on sbpmpi GlobalTensors; gather the value with "
                     f"x.numpy() (collective, every rank gets the whole array) and use NumPy, "
                     f"or use the sbpmpi ops (sm.ops)")


def _out_tensor(name: str, out: Any) -> GlobalTensor | None:
    """The GlobalTensor of ``out=`` (NEP 13 passes a tuple), None when none is given."""
    if isinstance(out, tuple):
        if len(out) != 1:
            raise TypeError(f"{name}(..., out=...): one output array expected, got {len(out)}")
        out = out[0]
    if out is None:
        return None
    if not isinstance(out, GlobalTensor):
        raise TypeError(f"{name}(..., out=...): out must be a GlobalTensor (the result is "
                        f"written into it, in its layout), got {type(out).__name__}; a NumPy "
                        f"array cannot hold a global value: write y = {name}(x) and, for "
                        f"the whole array on every rank, y.numpy()")
    return out


def write_into(name: str, out: GlobalTensor, value: GlobalTensor) -> GlobalTensor:
    """``value`` written into ``out`` as ``np.<ufunc>(..., out=out)`` does: NumPy's
    ``same_kind`` casting, ``value`` broadcast to out's shape, ``out`` keeping its layout
    (collective when the value's layout differs). Returns ``out`` (the same object)."""
    if out.requires_grad:
        raise RuntimeError(f"{name}(..., out=x): x requires grad; writes into a tensor are "
                           f"not recorded by autograd")
    if out._copy_of is None:
        out._check_writable(f"{name}(..., out=x)")
    if not np.can_cast(value.dtype, out.dtype, casting="same_kind"):
        raise TypeError(f"{name}(..., out=...): cannot cast the result of dtype {value.dtype} "
                        f"to out's dtype {out.dtype} with casting rule 'same_kind'")
    try:
        shape = np.broadcast_shapes(value.shape, out.shape)
    except ValueError:
        shape = None
    if shape != out.shape:
        raise ValueError(f"{name}(..., out=...): the result of shape {value.shape} does not "
                         f"broadcast to out's shape {out.shape}")
    from .. import ops

    if value.dtype != out.dtype:
        value = ops.astype(value, out.dtype)
    if value.shape != out.shape:
        from ..array_api import broadcast_to

        value = broadcast_to(value, out.shape)
    if out._copy_of is not None:  # out is the copy x[key]: the values go to x too
        from ..ops.operators import write_through

        write_through(out, f"{name}(..., out=x)", lambda current: value)
        return out
    if value.layout != out.layout:
        value = value.to_global(placement=out.placement, sbp=out.sbp)
    out._write_data(value.to_local())  # into out's buffer: its views see the values
    out._set_node(None)
    return out


def array_ufunc(ufunc: np.ufunc, method: str, *inputs: Any, **kwargs: Any) -> Any:
    """Run ``ufunc(*inputs)`` as the matching sbpmpi op (into ``out=``, a GlobalTensor, when
    given); TypeError for what has none."""
    name = f"np.{ufunc.__name__}"
    if method != "__call__":
        raise unsupported(f"{name}.{method}")
    extra = sorted(k for k, v in kwargs.items() if k != "out" and not (k == "where" and v is True))
    if extra:
        raise TypeError(f"{name}: keyword argument{'s' if len(extra) > 1 else ''} "
                        f"{', '.join(extra)} {'are' if len(extra) > 1 else 'is'} not supported "
                        f"on GlobalTensors; cast with x.astype(dtype) before or after")
    out = _out_tensor(name, kwargs.get("out"))
    op = UFUNCS.get(ufunc)
    if op is None:
        raise unsupported(name)
    value = op(*inputs)
    return value if out is None else write_into(name, out, value)
