"""A state directory: ``sm.save_state`` / ``sm.load_state`` of a dict of global tensors.

Each tensor goes to its own ``.npy`` file (``<name>.<token>.npy``, the token fresh for
each save) through :mod:`.tensor_file`; ``index.json`` (:mod:`.state_index`), replaced
atomically last, names them, so a directory always describes one complete state.
The arguments are agreed on across ranks once per call, not once per tensor.
"""

from __future__ import annotations

import os
import re
import time
import uuid
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..comm import agreement
from ..core.placement import Placement
from ..env import get_world_size
from ..errors import CheckpointError
from ..runtime import consistency
from ..tensor import GlobalTensor
from .arguments import path_arg, placement_arg, tensor_arg, verbose_arg
from .progress import Progress
from .state_index import (
    INDEX_NAME,
    descr_json,
    entry,
    index_bytes,
    new_index,
    read_index,
    sbp_from_json,
    write_index,
)
from .tensor_file import read_tensor, write_tensor

__all__ = ["save_state", "load_state"]


def save_state(tensors: Mapping[str, GlobalTensor], directory: str | os.PathLike[str], *,
               verbose: bool = False) -> None:
    """Save a dict of global tensors into ``directory`` with an ``index.json`` (collective).

    Each tensor goes to its own ``.npy`` file (``<name>.<token>.npy``, readable by
    ``numpy.load``); the index, which records each tensor's file, shape, dtype, SBP
    and placement, is replaced atomically last. A save that dies half-way leaves the
    previous state loadable. ``verbose=True``: rank 0 reports each tensor on stderr
    (a tqdm bar when stderr is a terminal and tqdm is installed).
    """
    items = _state_arg(tensors)
    d = path_arg(directory, "directory")
    verbose_arg(verbose, "sm.save_state")
    # one check for the whole state: each file's name follows from d, the tensor's name
    # and rank 0's token, so the tensors' own saves need none
    consistency.check_collective("sm.save_state", (d, tuple(items.items())))
    token, old = agreement.decide_on_root(lambda: _prepare_state_dir(d), "sm.save_state")
    used: set[str] = set()
    entries: dict[str, Any] = {}
    progress = Progress(f"sm.save_state {d}",
                        sum(int(np.prod(x.shape, dtype=np.int64)) * x.dtype.itemsize
                            for x in items.values()), len(items), verbose)
    for name, x in items.items():
        stem = _safe_name(name)
        base, i = stem, 1
        while base.lower() in used:
            i += 1
            base = f"{stem}-{i}"
        used.add(base.lower())
        fname = f"{base}.{token}.npy"
        t0 = time.perf_counter()
        write_tensor(x, os.path.join(d, fname))
        progress.tensor(name, x.shape, x.dtype, time.perf_counter() - t0)
        entries[name] = entry(x, fname)
    index = new_index(entries)
    agreement.decide_on_root(lambda: write_index(d, index, old), "sm.save_state")
    progress.close()


def load_state(directory: str | os.PathLike[str], *,
               placement: Placement | Mapping[str, Placement] | None = None,
               sbp: Any = None, verbose: bool = False) -> dict[str, GlobalTensor]:
    """Load every tensor of a ``sm.save_state`` directory (collective).

    Parameters
    ----------
    directory : str or PathLike
    placement : Placement or dict name -> Placement, optional
        Where to put the tensors; by default each one's placement as saved (which must
        fit the current world).
    sbp : SBP, sequence of SBP, or dict name -> either, optional
        By default each one's SBP as saved, when the placement has as many mesh axes
        as when saved.
    verbose : bool
        Rank 0 reports each tensor as it is read on stderr (a tqdm bar when stderr is a
        terminal and tqdm is installed).

    Returns
    -------
    dict
        Name -> GlobalTensor, in the order they were saved.
    """
    d = path_arg(directory, "directory")
    verbose_arg(verbose, "sm.load_state")
    if placement is not None and not isinstance(placement, (Placement, Mapping)):
        raise TypeError(f"sm.load_state: placement must be an sm.placement or a dict of them, "
                        f"got {type(placement).__name__} {placement!r}")
    # one check for the whole state: each tensor's file, placement and SBP follow from
    # these arguments and rank 0's index, so the tensors' own loads need none
    consistency.check_collective("sm.load_state", (d, placement, sbp))
    index = agreement.decide_on_root(lambda: read_index(d), "sm.load_state")
    tensors: dict[str, Any] = index["tensors"]
    for arg, what in ((placement, "placement"), (sbp, "sbp")):
        if isinstance(arg, Mapping):
            unknown = [k for k in arg if k not in tensors]
            if unknown:
                raise KeyError(f"sm.load_state: {what} names {unknown} that are not in the "
                               f"checkpoint; it holds {list(tensors)}")
    out: dict[str, GlobalTensor] = {}
    progress = Progress(f"sm.load_state {d}", index_bytes(tensors), len(tensors), verbose)
    for name, e in tensors.items():
        where = f"sm.load_state: tensor {name!r}"
        pl = _placement_of(_per_name(placement, name), e["placement"], where)
        nd = _per_name(sbp, name)
        if nd is None:
            saved = sbp_from_json(e["sbp"], where)
            if len(saved) != pl.ndim:
                raise ValueError(f"{where} was saved with sbp {saved} on a {len(saved)}-d mesh; "
                                 f"pass sbp= for the {pl.ndim}-d placement {pl!r}")
            nd = saved
        t0 = time.perf_counter()
        x = read_tensor(os.path.join(d, e["file"]), pl, nd)
        progress.tensor(name, x.shape, x.dtype, time.perf_counter() - t0)
        if list(x.shape) != list(e["shape"]) or descr_json(x.dtype) != e["dtype"]:
            raise CheckpointError(f"{where}: file {e['file']!r} holds {x.shape} {x.dtype} but "
                                  f"the index says {tuple(e['shape'])} {e['dtype']}")
        out[name] = x
    progress.close()
    return out


def _state_arg(tensors: Any) -> dict[str, GlobalTensor]:
    if not isinstance(tensors, Mapping):
        raise TypeError(f"sm.save_state needs a dict of name -> GlobalTensor, got "
                        f"{type(tensors).__name__}")
    out: dict[str, GlobalTensor] = {}
    for k, v in tensors.items():
        if not isinstance(k, str) or not k:
            raise TypeError(f"sm.save_state: tensor names must be non-empty str, got {k!r}")
        if "\0" in k:
            raise ValueError(f"sm.save_state: tensor name {k!r} contains a NUL character")
        out[k] = tensor_arg(v, f"sm.save_state: tensor {k!r}")
    return out


def _safe_name(name: str) -> str:
    s = re.sub(r"[^A-Za-z0-9_.-]", "_", name).strip(".") or "tensor"
    return s[:100]


def _prepare_state_dir(directory: str) -> tuple[str, dict[str, Any] | None]:
    """Rank 0: create the directory if needed; return a fresh token and the current index."""
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise NotADirectoryError(f"{directory!r} exists and is not a directory")
    os.makedirs(directory, exist_ok=True)
    old = None
    if os.path.exists(os.path.join(directory, INDEX_NAME)):
        try:
            old = read_index(directory)
        except (CheckpointError, OSError):
            old = None  # replaced below; its files are left alone
    return uuid.uuid4().hex[:8], old


def _per_name(arg: Any, name: str) -> Any:
    return arg.get(name) if isinstance(arg, Mapping) else arg


def _placement_of(pl: Any, saved: dict[str, Any], where: str) -> Placement:
    """The placement given for a tensor, or by default the one it was saved on."""
    if pl is None:
        try:
            pl = Placement(saved["type"], saved["ranks"])
        except ValueError as err:
            raise ValueError(
                f"{where} was saved on placement {saved['type']!r} ranks "
                f"{saved['ranks']}, which does not fit this world of "
                f"{get_world_size()}: pass placement=") from err
    return placement_arg(pl, where)
