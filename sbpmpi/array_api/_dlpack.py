"""DLPack for global arrays: ``x.__dlpack__`` and ``x.__dlpack_device__``.

A DLPack capsule describes one buffer on one device. A global array is one buffer only
where every rank of the world holds it whole: the placement has every rank and every mesh
axis broadcasts, or the world is one rank. Then ``__dlpack__`` exports this rank's shard
itself (no copy).
Otherwise the whole value is gathered on every rank (collective, like ``x.numpy()``) and
the gathered copy is exported, on the placement's device type; with ``copy=False`` that
copy is refused with a ``BufferError`` naming the reason. ``__dlpack_device__`` is the
device of this rank's shard (``(1, 0)``, CPU, for a placement of type ``"cpu"``).
"""

from __future__ import annotations

from typing import Any

from .. import backend
from ..core.sbp import Broadcast
from ..env import get_world_size
from ..tensor import GlobalTensor

__all__ = ["holds_whole", "array_dlpack", "array_dlpack_device"]


def holds_whole(x: GlobalTensor) -> bool:
    """True when every rank of the world holds the whole array (metadata only: the same
    answer on every rank, so all take the same path)."""
    if x.placement.size != get_world_size():
        return False
    return all(isinstance(s, Broadcast) for s in x.sbp) or x.placement.size == 1


def array_dlpack(x: GlobalTensor, *, stream: Any = None, max_version: Any = None,
                 dl_device: Any = None, copy: Any = None) -> Any:
    """The DLPack capsule of ``x`` (see the module): the shard itself where it is the whole
    array, else a gathered copy (collective; ``BufferError`` with ``copy=False``)."""
    if holds_whole(x):
        buf = x.to_local()
    elif copy is False:
        raise BufferError(f"__dlpack__: copy=False, but the ranks do not each hold the whole "
                          f"array (sbp {x.sbp} on {x.placement.size} of {get_world_size()} "
                          f"ranks): exporting it needs a gathered copy")
    else:
        buf = backend.to_device(x.numpy(), x.placement.type)
        copy = None  # the gathered buffer is already a copy of its own
    kw: dict[str, Any] = {}
    if max_version is not None:
        kw["max_version"] = max_version
    if dl_device is not None:
        kw["dl_device"] = dl_device
    if copy is not None:
        kw["copy"] = copy
    if stream is not None:
        kw["stream"] = stream
    return buf.__dlpack__(**kw)


def array_dlpack_device(x: GlobalTensor) -> tuple[Any, int]:
    """``(device type, device id)`` of the buffer :func:`array_dlpack` exports."""
    local = x.to_local()
    if hasattr(local, "__dlpack_device__"):
        kind, dev = local.__dlpack_device__()
        return kind, int(dev)
    return 1, 0  # kDLCPU
