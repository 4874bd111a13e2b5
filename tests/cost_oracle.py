"""Independent recomputation of an op-inference candidate's cost (test oracle)."""

from __future__ import annotations

from sbpmpi import boxing
from sbpmpi.core.layout import Layout
from sbpmpi.core.sbp import Partial, broadcast
from sbpmpi.tensor import GlobalTensor


def independent_total(call, cand):
    """The candidate's cost recomputed from boxing.conversion_cost directly: boxing of the
    operands, plus the all-reduce a partial output will need less those its unmoved
    partial operands already owed (never below 0)."""
    def reduce_cost(lay, itemsize):
        if not any(isinstance(s, Partial) for s in lay.sbp):
            return 0.0
        red = Layout(lay.shape, lay.placement,
                     tuple(broadcast if isinstance(s, Partial) else s for s in lay.sbp))
        return boxing.conversion_cost(lay, red, itemsize)

    t = 0.0
    owed = 0.0
    for o, need in zip(call.operands, cand.inputs):
        if not isinstance(o, GlobalTensor):
            continue
        if need != o.layout:
            t += boxing.conversion_cost(o.layout, need, o.dtype.itemsize)
        else:
            owed += reduce_cost(o.layout, o.dtype.itemsize)
    charge = reduce_cost(cand.output, call.out_dtype.itemsize)
    return t + (max(0.0, charge - owed) if charge else 0.0)
