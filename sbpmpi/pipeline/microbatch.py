"""Splitting a global batch into micro-batches along dim 0, as ``np.array_split`` does."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..tensor import GlobalTensor

__all__ = ["microbatch_bounds", "split_microbatches", "batch_size"]


def microbatch_bounds(batch: int, n: int) -> list[tuple[int, int]]:
    """The ``(start, stop)`` rows of each of ``n`` micro-batches of ``batch`` rows: the
    first ``batch % n`` have one row more (``np.array_split``'s sizes)."""
    if n < 1:
        raise ValueError(f"n_microbatches must be at least 1, got {n}")
    if batch < n:
        raise ValueError(f"a batch of {batch} rows cannot be split into {n} micro-batches "
                         f"(each needs at least one row)")
    sizes = [batch // n + (1 if i < batch % n else 0) for i in range(n)]
    edges = np.cumsum([0] + sizes)
    return [(int(a), int(b)) for a, b in zip(edges[:-1], edges[1:])]


def batch_size(x: Any, what: str) -> int:
    """The rows of ``x`` (a GlobalTensor or a NumPy array) along dim 0."""
    shape = getattr(x, "shape", None)
    if not isinstance(x, (GlobalTensor, np.ndarray)) or not shape:
        raise TypeError(f"{what} must be a GlobalTensor or NumPy array of at least one "
                        f"dim (the batch), got {type(x).__name__} of shape {shape}")
    return int(shape[0])


def split_microbatches(x: Any, bounds: list[tuple[int, int]]) -> list[Any]:
    """``x`` cut at ``bounds`` along dim 0: global slices of a GlobalTensor (collective,
    in the same order on every rank), views of a NumPy array, ``None`` for ``None``."""
    if x is None:
        return [None] * len(bounds)
    return [x[a:b] for a, b in bounds]
