"""A state directory: ``sm.save_state`` / ``sm.load_state`` of a dict of global tensors.

Each tensor goes to its own ``.npy`` file (``<name>.<token>.npy``, the token fresh for
each save) through :mod:`.tensor_file`; ``index.json`` (:mod:`.state_index`), replaced
atomically last, names them with their CRC-32, so a directory always describes one
complete state. The arguments are agreed on across ranks once per call, not once per
tensor.

A save that fails (on any rank, at any step, the index write included) removes the
tensor files it wrote, so the directory holds the previous state and nothing else. New
files take the permission bits of the files they replace (a tensor's previous file,
else the previous index). A load verifies each file's CRC-32 against the index
(``verify=False`` skips it, saving one read pass over the files).
"""

from __future__ import annotations

import os
import re
import time
import uuid
from collections.abc import Mapping
from typing import Any, NamedTuple

from ..comm import agreement
from ..core.placement import Placement
from ..env import get_rank, get_world_size
from ..errors import CheckpointError
from ..runtime import consistency
from ..tensor import GlobalTensor
from . import atomic_write, checksum
from .arguments import path_arg, placement_arg, tensor_arg, verbose_arg
from .header import element_count
from .progress import Progress
from .state_index import (
    INDEX_NAME,
    descr_json,
    entry,
    index_bytes,
    new_index,
    owned_files,
    previous_files,
    read_index,
    remove_files,
    sbp_from_json,
    write_index,
)
from .tensor_file import read_tensor_sized, write_tensor

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
    plan = agreement.decide_on_root(lambda: _prepare_state_dir(d), "sm.save_state")
    used: set[str] = set()
    entries: dict[str, Any] = {}
    written: list[str] = []
    progress = Progress(f"sm.save_state {d}",
                        sum(element_count(x.shape) * x.dtype.itemsize
                            for x in items.values()), len(items), verbose)
    try:
        for name, x in items.items():
            stem = _safe_name(name)
            base, i = stem, 1
            while base.lower() in used:
                i += 1
                base = f"{stem}-{i}"
            used.add(base.lower())
            fname = f"{base}.{plan.token}.npy"
            t0 = time.perf_counter()
            written.append(fname)
            crc = write_tensor(x, os.path.join(d, fname), "sm.save_state", crc32=True,
                               mode=plan.modes.get(name, plan.index_mode))
            progress.tensor(name, x.shape, x.dtype, time.perf_counter() - t0)
            assert crc is not None  # asked for
            entries[name] = entry(x, fname, crc)
        index = new_index(entries)
        agreement.decide_on_root(lambda: write_index(d, index, plan.owned, plan.index_mode),
                                 f"sm.save_state {d!r}: rank 0")
    except BaseException:
        # every rank raises the same error here (each step agreed): no exchange is needed
        # for rank 0 to remove what this save wrote, unless the new index names it
        if get_rank() == 0:
            _remove_unindexed(d, written)
        raise
    progress.close()


def load_state(directory: str | os.PathLike[str], *,
               placement: Placement | Mapping[str, Placement] | None = None,
               sbp: Any = None, verbose: bool = False, verify: bool = True
               ) -> dict[str, GlobalTensor]:
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
    verify : bool
        Check each file's CRC-32 against the index (one more read pass over the files,
        shared by the ranks); False skips it. Indexes written before the checksums
        existed have none to check.

    Returns
    -------
    dict
        Name -> GlobalTensor, in the order they were saved.

    Raises
    ------
    CheckpointError
        On every rank, naming the index or the tensor and its file: a damaged index, a
        damaged or truncated file, a file whose CRC-32 differs from the index's.
    """
    d = path_arg(directory, "directory")
    verbose_arg(verbose, "sm.load_state")
    verbose_arg(verify, "sm.load_state", "verify")
    if placement is not None and not isinstance(placement, (Placement, Mapping)):
        raise TypeError(f"sm.load_state: placement must be an sm.placement or a dict of them, "
                        f"got {type(placement).__name__} {placement!r}")
    # one check for the whole state: each tensor's file, placement and SBP follow from
    # these arguments and rank 0's index, so the tensors' own loads need none
    consistency.check_collective("sm.load_state", (d, placement, sbp, verify))
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
        path = os.path.join(d, e["file"])
        where = f"sm.load_state: tensor {name!r} (file {path!r})"
        pl = _placement_of(_per_name(placement, name), e["placement"], where)
        nd = _per_name(sbp, name)
        if nd is None:
            saved = sbp_from_json(e["sbp"], where)
            if len(saved) != pl.ndim:
                raise ValueError(f"{where} was saved with sbp {saved} on a {len(saved)}-d mesh; "
                                 f"pass sbp= for the {pl.ndim}-d placement {pl!r}")
            nd = saved
        t0 = time.perf_counter()
        x, size = read_tensor_sized(path, pl, nd, f"sm.load_state: tensor {name!r}")
        if list(x.shape) != list(e["shape"]) or descr_json(x.dtype) != e["dtype"]:
            raise CheckpointError(f"{where}: the file holds {x.shape} {x.dtype} but the "
                                  f"index says {tuple(e['shape'])} {e['dtype']}")
        if verify and e.get("crc32") is not None:
            crc = checksum.file_crc32(path, size, where)
            if crc != e["crc32"]:
                raise CheckpointError(
                    f"{where}: the file is damaged: its CRC-32 is {crc:#010x}, the index "
                    f"recorded {e['crc32']:#010x} when it was saved (sm.load_state(..., "
                    f"verify=False) reads it anyway)")
        progress.tensor(name, x.shape, x.dtype, time.perf_counter() - t0)
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


class _SavePlan(NamedTuple):
    """What rank 0 finds in a state directory before a save."""

    token: str  # fresh for this save: part of every file name it writes
    owned: set[str]  # the previous index's files with our naming: removed once replaced
    modes: dict[str, int]  # tensor name -> permission bits of its previous file
    index_mode: int | None  # the permission bits of the previous index


def _prepare_state_dir(directory: str) -> _SavePlan:
    """Rank 0: create the directory if needed; a fresh token, the files the current index
    owns and the permission bits of the files it names."""
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise NotADirectoryError(f"{directory!r} exists and is not a directory")
    os.makedirs(directory, exist_ok=True)
    previous = previous_files(directory)
    modes: dict[str, int] = {}
    for name, f in previous.items():
        mode = atomic_write.mode_of(os.path.join(directory, f))
        if mode is not None:
            modes[name] = mode
    return _SavePlan(uuid.uuid4().hex[:8], owned_files(previous.values()), modes,
                     atomic_write.mode_of(os.path.join(directory, INDEX_NAME)))


def _remove_unindexed(directory: str, files: list[str]) -> None:
    """Rank 0, after a failed save: remove ``files`` unless the index now in place names
    them (a failure after the new index was renamed into place keeps them)."""
    named = set(previous_files(directory).values())
    remove_files(directory, [f for f in files if f not in named])


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
                f"{saved['ranks']}, which cannot be used in this world of "
                f"{get_world_size()}: {err}; pass placement=") from err
    return placement_arg(pl, where)
