"""``DataParallel``: a module whose gradient all-reduces overlap backward (torch's DDP),
and ``no_sync`` for every such module."""

from __future__ import annotations

import math
import weakref
from typing import Any

import numpy as np

from ..nn.mixed_precision import MixedPrecision
from ..nn.module import Module
from .reducer import MIB, Reducer, no_sync

__all__ = ["DataParallel", "no_sync"]


class DataParallel(Module):
    """Data parallelism whose gradient all-reduces overlap backward (as torch's DDP).

    ``DataParallel(model)`` wraps a module whose parameters are broadcast along the
    data-parallel mesh axis ``axis`` (the axis the batch is split along): their gradients
    arrive ``partial_sum`` there and are reduced in flat buckets, each started as soon as
    backward has produced all its gradients, while backward computes the earlier layers
    (see :mod:`sbpmpi.parallel.reducer`: the wrapper's :class:`~.reducer.Reducer` hooks
    into the backward engine; the model and the engine are unchanged). Parameters split
    along ``axis`` keep the unbucketed path. ``.grad`` is set, in the parameter's layout,
    before ``backward`` returns; its local shard is a view into its bucket. The results
    equal the unbucketed ones (bit for bit, as each gradient all-reduced on its own).

    Use :meth:`no_sync` (or :func:`sbpmpi.nn.no_sync` for every DataParallel) to
    accumulate gradients over several backwards and reduce the sum once. :meth:`close`
    (or dropping the wrapper) removes the hooks: the parameters go back to the
    unbucketed path.

    Parameters
    ----------
    module : Module
        The model; ``forward`` calls it, ``parameters()`` are its parameters (named
        ``"module.<name>"``, as torch's DDP names them).
    axis : int
        The data-parallel mesh axis of the parameters' placement (default 0).
    bucket_cap_mb, first_bucket_mb : float
        Bucket sizes in MiB, counted over whole gradients in reverse parameter order:
        PyTorch DDP's 25 and 1 by default (the first bucket small, to start early).
    mixed_precision : MixedPrecision or None
        Its ``param_dtype`` runs the forward under ``sm.autocast``; its ``reduce_dtype``
        bfloat16 or float16 reduces the float32 buckets in that half width (float32
        sums inside, see :mod:`sbpmpi.parallel.reducer`: half the bytes).
    """

    def __init__(self, module: Module, *, axis: int = 0, bucket_cap_mb: float = 25.0,
                 first_bucket_mb: float = 1.0, mixed_precision: MixedPrecision | None = None
                 ) -> None:
        if mixed_precision is not None and not isinstance(mixed_precision, MixedPrecision):
            raise TypeError(f"DataParallel: mixed_precision must be an sm.nn.MixedPrecision "
                            f"or None, got {type(mixed_precision).__name__}")
        if not isinstance(module, Module):
            raise TypeError(f"DataParallel: module must be an sm.nn.Module, got "
                            f"{type(module).__name__}")
        caps = []
        for name, v in (("bucket_cap_mb", bucket_cap_mb), ("first_bucket_mb", first_bucket_mb)):
            if isinstance(v, (bool, np.bool_)) or not isinstance(
                    v, (int, float, np.integer, np.floating)) or not v >= 0 or math.isinf(v):
                raise ValueError(f"DataParallel: {name} must be a non-negative number of MiB, "
                                 f"got {v!r}")
            caps.append(int(v * MIB))
        self.module = module
        self.reducer = Reducer(module.parameters(), axis, caps[0], caps[1],
                               None if mixed_precision is None else mixed_precision.reduce_dtype)
        # the engine's hook table holds the reducer, not the wrapper: dropping the
        # wrapper removes the hooks
        weakref.finalize(self, self.reducer.close)
        self.mixed_precision = mixed_precision
        if mixed_precision is not None:  # float32 masters, half-width compute copies
            mixed_precision.attach(self)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    def no_sync(self) -> Any:
        """``with model.no_sync():`` backward accumulates this model's gradients without
        reducing them; the next backward outside reduces the sum."""
        return self.reducer.no_sync()

    def close(self) -> None:
        """Remove the reducer's hooks: the parameters' gradients take the unbucketed path
        from the next backward on."""
        self.reducer.close()

    def __repr__(self) -> str:
        return f"DataParallel({self.module!r}, buckets={self.reducer.layout()})"
