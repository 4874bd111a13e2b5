"""Lists of per-rank arrays (the torch.distributed list forms) packed into one flat buffer.

The list forms cost one copy per entry; pass one array of group size x block
elements instead to avoid it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ...backend import device_copy
from ..buffers import ArrayMeta, array_meta, check_output, check_same_dtype

__all__ = ["list_metas", "scatter_list_out", "gather_list_in"]


def list_metas(lst: Sequence[Any], p: int, m: ArrayMeta, arg: str, ref: str, op: str,
               output: bool) -> list[ArrayMeta]:
    """Check a list of ``p`` arrays of ``m``'s dtype and size; return their metadata."""
    if len(lst) != p:
        raise ValueError(f"{op}: {arg} has {len(lst)} arrays, expected one per rank of the "
                         f"group ({p})")
    metas = []
    for i, a in enumerate(lst):
        name = f"{arg}[{i}]"
        mi = array_meta(a, name, op)
        if output:
            check_output(a, mi, name, op)
        check_same_dtype(mi, m, name, ref, op)
        if mi.size != m.size:
            raise ValueError(f"{op}: {name} has {mi.size} elements but {ref} has {m.size}; "
                             "every block must have the same size")
        metas.append(mi)
    return metas


def scatter_list_out(flat: np.ndarray, lst: Sequence[Any], metas: list[ArrayMeta]) -> None:
    """Copy block i of the host array ``flat`` into ``lst[i]``."""
    n = metas[0].size if metas else 0
    for i, (a, mi) in enumerate(zip(lst, metas)):
        chunk = flat[i * n:(i + 1) * n]
        if mi.on_gpu:
            device_copy.sync_for_transfer(a)
            device_copy.copy_host_to_device(chunk, a)
        else:
            a.reshape(-1)[...] = chunk


def gather_list_in(lst: Sequence[Any], metas: list[ArrayMeta], dtype: np.dtype) -> np.ndarray:
    """The arrays of ``lst`` concatenated into one new flat host array."""
    n = metas[0].size if metas else 0
    flat = np.empty(len(lst) * n, dtype=dtype)
    for i, (a, mi) in enumerate(zip(lst, metas)):
        chunk = flat[i * n:(i + 1) * n]
        if mi.on_gpu:
            if not mi.contiguous:
                a = device_copy.ascontiguous_device(a)
            device_copy.sync_for_transfer(a)
            device_copy.copy_device_to_host(a, chunk)
        else:
            chunk[...] = a.reshape(-1)
    return flat
