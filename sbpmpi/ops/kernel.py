"""The local result of an op's kernel, as its output layout expects it.

Both ways of running an op (the full path of :func:`sbpmpi.ops.op.run_call` and the
dispatch fast path of :class:`sbpmpi.ops.dispatch.Fast`) hand the kernel's result to
:func:`local_result`: an array of the op's dtype, C-contiguous, of this rank's shard
shape, or an internal error naming the op.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

import numpy as np

from ..core.layout import Layout
from ..env import get_rank
from ..runtime.recording import RECORDERS

__all__ = ["Kernel", "local_result"]

#: An op's local computation, the one type of every kernel: ``kernel(xp, operands,
#: out_local_shape) -> array-like``, tensor operands given as this rank's shards.
Kernel = Callable[[ModuleType, Sequence[Any], tuple[int, ...]], Any]


def local_result(name: str, kernel: Kernel, xp: ModuleType, args: Any,
                 shape: tuple[int, ...], dtype: np.dtype, layout: Layout) -> Any:
    """``kernel(xp, args, shape)`` as a C-contiguous ``xp`` array of ``dtype`` and ``shape``.

    Raises
    ------
    RuntimeError
        When the kernel's result has another shape than ``layout`` gives this rank (an
        internal error of op ``name``).
    """
    res = xp.asarray(kernel(xp, args, shape))
    if res.dtype != dtype:
        res = res.astype(dtype)
    if not res.flags.c_contiguous:
        res = res.copy()
    if res.shape != shape and tuple(res.shape) != shape:
        raise RuntimeError(f"{name}: internal error: local result has shape "
                           f"{tuple(res.shape)}, layout {layout} expects {shape} on rank "
                           f"{get_rank()}")
    if RECORDERS:  # a step being captured as a graph (sm.graph): replayed as this call
        RECORDERS[0].kernel(name, (name, kernel, shape, dtype, layout),
                            lambda a: local_result(name, kernel, xp, a, shape, dtype, layout),
                            args, res)
    return res
