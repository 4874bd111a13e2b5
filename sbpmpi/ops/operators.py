"""``GlobalTensor``'s Python operators, made from the op registry and installed on the class
from above (as JAX's ``array_methods`` installs the array's operators).

Each entry of :data:`.registry.REGISTRY` names the operator methods it implements; this
module makes one method per name by its form (:data:`.registry.OPERATOR_METHODS`):

- forward ``x + y`` and reflected ``2 + x``: the op itself, ``op(x, y)`` / ``op(y, x)``;
- in place ``x += y``: ``x`` takes the value of ``x + y`` (the array API standard's rule:
  its dtype and shape must be those of ``x``, refused when ``x`` or ``y`` requires grad)
  and keeps its layout; the same object is returned;
- unary ``-x``, ``+x``, ``~x``, ``abs(x)``;
- ``x[key]`` (basic keys: ``getitem``; a key holding global arrays: ``getitem_arrays``)
  and ``x[key] = value`` (``setitem``: ``x`` keeps its layout and gets a new shard).

So ``x + y``, ``np.add(x, y)``, ``xp.add(x, y)`` and ``sm.add(x, y)`` run the same op.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

from ..tensor import GlobalTensor
from .op import GlobalOp, run_call
from .registry import OPERATOR_METHODS, REGISTRY, OperatorMethod

__all__ = ["METHODS", "install", "inplace_result"]


def inplace_result(symbol: str, op: GlobalOp, x: GlobalTensor, y: Any) -> GlobalTensor:
    """The value ``x <symbol>= y`` gives ``x``: ``op(x, y)`` of x's dtype and shape.

    Raises
    ------
    RuntimeError
        When ``x`` or ``y`` requires grad (in-place writes are not recorded).
    TypeError, ValueError
        When the result's dtype or shape differs from that of ``x``.
    """
    if x.requires_grad or getattr(y, "requires_grad", False):
        raise RuntimeError(f"x {symbol}= y: in-place operators are not recorded by autograd; "
                           f"write x = x {symbol} y for a tensor that requires grad")
    call = op.build(x, y)  # the result's dtype and shape, before any communication
    if call.out_dtype != x.dtype:
        raise TypeError(f"x {symbol}= y: the result dtype {call.out_dtype} differs from x's "
                        f"dtype {x.dtype} (in-place operators keep the dtype of x)")
    if call.out_shape != x.shape:
        raise ValueError(f"x {symbol}= y: y broadcasts x of shape {x.shape} to "
                         f"{call.out_shape} (in-place operators keep the shape of x)")
    out = run_call(call)
    if out.layout != x.layout:  # the value in x's layout: x keeps it
        out = out.to_global(placement=x.placement, sbp=x.sbp)
    return out


def _integer_scalars(key: Any) -> Any:
    """``key`` with each 0-d integer GlobalTensor (an index or a slice bound, as the Array
    API allows) read as a Python int (collective, like the getitem that follows)."""
    def one(k: Any) -> Any:
        if isinstance(k, GlobalTensor) and k.ndim == 0 and k.dtype.kind in "iu":
            return operator.index(k)
        if isinstance(k, slice) and any(isinstance(b, GlobalTensor)
                                        for b in (k.start, k.stop, k.step)):
            return slice(one(k.start), one(k.stop), one(k.step))
        return k

    return tuple(map(one, key)) if isinstance(key, tuple) else one(key)


def _method(name: str, how: OperatorMethod, op: GlobalOp) -> Callable[..., Any]:
    """The operator method ``name`` of ``op``."""
    method: Callable[..., Any]
    if how.form == "forward":
        def forward(self: GlobalTensor, other: Any) -> Any:
            return op(self, other)
        method = forward
    elif how.form == "reflected":
        def reflected(self: GlobalTensor, other: Any) -> Any:
            return op(other, self)
        method = reflected
    elif how.form == "inplace":
        symbol = how.symbol

        def inplace(self: GlobalTensor, other: Any) -> GlobalTensor:
            out = inplace_result(symbol, op, self, other)
            self._set_data(out.to_local(), out.layout)
            self._set_node(None)
            return self
        method = inplace
    elif how.form == "unary":
        def unary(self: GlobalTensor) -> Any:
            return op(self)
        method = unary
    elif how.form == "getitem":
        arrays = REGISTRY["getitem_arrays"].op

        def getitem(self: GlobalTensor, key: Any) -> Any:
            key = _integer_scalars(key)
            if any(isinstance(k, GlobalTensor)
                   for k in (key if isinstance(key, tuple) else (key,))):
                return arrays(self, key)  # a mask or integer arrays
            return op(self, key)
        method = getitem
    else:
        def setitem(self: GlobalTensor, key: Any, value: Any) -> None:
            """``x[key] = value`` (collective): ints, slices, None, ``...`` or one boolean
            array; ``value`` a scalar or an array broadcast to the selection. ``x`` keeps its
            layout (a partial ``x`` is reduced first) and gets a new shard buffer; it must
            not require grad (see :func:`sbpmpi.ops.setitem`)."""
            out = op(self, _integer_scalars(key), value)
            self._set_data(out.to_local(), out.layout)
        method = setitem
    method.__name__ = method.__qualname__ = name
    if method.__doc__ is None:
        method.__doc__ = f"``{how.symbol}``: :func:`sbpmpi.ops.{op.name}`."
    return method


#: Every operator method of ``GlobalTensor``, made from the registry.
METHODS: dict[str, Callable[..., Any]] = {
    name: _method(name, OPERATOR_METHODS[name], entry.op)
    for entry in REGISTRY.values() for name in entry.dunders}


def install(cls: type) -> None:
    """Set every operator method of :data:`METHODS` on ``cls`` (``GlobalTensor``)."""
    for name, method in METHODS.items():
        setattr(cls, name, method)
