"""The namespace's device: a placement; its default (all ranks of the world) and default SBP.

Arrays the namespace creates without ``device=`` live on every rank of the world with
the SBP of the ``array_api_sbp`` setting (``sm.config``): ``"split"`` splits the first
axis (shards may be uneven; a 0-d array is broadcast), ``"broadcast"`` replicates.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core.placement import Placement, placement
from ..creation import tensor
from ..env import get_world_size
from ..ops.local import default_sbp
from ..tensor import GlobalTensor

__all__ = ["default_device", "device_arg", "default_sbp", "from_value", "to_device"]


def default_device() -> Placement:
    """Every rank of the world, on CPU."""
    return placement("cpu", ranks=list(range(get_world_size())))


def device_arg(device: Any, what: str = "device") -> Placement:
    """``device`` checked: a Placement, or None for :func:`default_device`."""
    if device is None:
        return default_device()
    if not isinstance(device, Placement):
        raise TypeError(f"{what} must be an sm.placement (the namespace's device) or None, "
                        f"got {type(device).__name__} {device!r}")
    return device


def from_value(value: np.ndarray, device: Placement | None = None) -> GlobalTensor:
    """A global array of ``value`` (the same on every rank; nothing is communicated)."""
    dev = device_arg(device)
    value = np.asarray(value)
    return tensor(value, placement=dev, sbp=default_sbp(value.ndim, dev), dtype=value.dtype)


def to_device(x: GlobalTensor, device: Any, stream: Any = None) -> GlobalTensor:
    """``x`` on ``device`` (collective when it moves): its SBP is kept where the mesh has
    the same number of axes, else the namespace default."""
    if stream is not None:
        raise ValueError(f"to_device: stream={stream!r} is not supported (None only)")
    dev = device_arg(device)
    if dev == x.placement:
        return x
    sbp = x.sbp if dev.ndim == x.placement.ndim else default_sbp(x.ndim, dev)
    return x.to_global(placement=dev, sbp=sbp)
