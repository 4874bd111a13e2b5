"""``sm.explain``: why an op call or a conversion does what it does (no communication).

    print(sm.explain(sm.matmul, x, w))          # candidate signatures, costs, the choice
    print(sm.explain(x, sbp=sm.sbp.broadcast))  # the boxing plan of a conversion
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .core.placement import Placement
from .core.sbp import SBP
from .tensor import GlobalTensor

__all__ = ["explain"]


def explain(op: Any, *args: Any, placement: Placement | None = None,
            sbp: SBP | Sequence[SBP] | None = None, **kwargs: Any) -> Any:
    """Explain an op call or a tensor conversion, without running it.

    Parameters
    ----------
    op : GlobalOp, str, linalg function or GlobalTensor
        An op (``sm.matmul``) or its name (``"matmul"``), followed by the op's
        arguments; a linear-algebra function with a layout rule (``xp.linalg.qr``,
        ``sm.linalg.lstsq``, ...) and its arguments; or a GlobalTensor to explain its
        conversion to ``placement`` and ``sbp`` (either may be left out to keep the
        tensor's own).

    Returns
    -------
    Inference or Explanation
        An object that prints as a table: for an op, :class:`sbpmpi.ops.Inference`
        (every candidate signature with its boxing costs and partial-output charge, the
        chosen one marked); for a linalg function, :class:`sbpmpi.linalg.LinalgPath` (the
        path its call takes: local, gathered, tall, wide or refused, and why); for a
        conversion, the boxing plan of ``boxing.explain_conversion``.
    """
    from .capture import Graph, GraphFunction

    if isinstance(op, (GraphFunction, Graph)):  # a captured step: signatures and breaks
        return op.explain()
    if isinstance(op, GlobalTensor):
        if args or kwargs:
            raise TypeError("explain(x, placement=..., sbp=...) takes no other arguments for a "
                            "tensor conversion")
        return _conversion(op, placement, sbp)
    from .linalg.paths import explainer_of

    path = explainer_of(op)
    if path is not None:  # a linalg function: the path it takes at this layout
        if placement is not None or sbp is not None:
            raise TypeError("explain: placement= and sbp= are for explaining a tensor "
                            "conversion, explain(x, placement=..., sbp=...)")
        return path(*args, **kwargs)
    from . import ops

    if isinstance(op, str):
        if op not in ops.OPS:
            raise ValueError(f"explain: unknown op {op!r}; known ops: {sorted(ops.OPS)}")
        op = ops.OPS[op]
    if not isinstance(op, ops.GlobalOp):
        raise TypeError(f"explain: op must be an sbpmpi op such as sm.matmul, its name, or a "
                        f"GlobalTensor; got {type(op).__name__} {op!r}")
    if placement is not None or sbp is not None:
        raise TypeError("explain: placement= and sbp= are for explaining a tensor conversion, "
                        "explain(x, placement=..., sbp=...)")
    return ops.infer(op.build(*args, **kwargs))


def _conversion(x: GlobalTensor, placement: Placement | None,
                sbp: SBP | Sequence[SBP] | None) -> Any:
    from .conversion import explain_conversion

    return explain_conversion(x, placement=placement, sbp=sbp)
