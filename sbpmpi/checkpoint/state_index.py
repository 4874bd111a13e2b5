"""``index.json``: the table of contents of a state directory.

One JSON object ``{"format": "sbpmpi.state", "version": 1, "tensors": {name: entry}}``,
each entry naming the tensor's ``.npy`` file (a plain name in the same directory), its
shape, dtype (the ``.npy`` descr), SBP, placement and the file's CRC-32 (``"crc32"``,
:mod:`.checksum`; absent in indexes written before it). Rank 0 reads and writes it; the
callers share its verdict with the other ranks.

Every entry is checked when the index is read, each error naming the index and the
tensor: the file must be a plain name inside the directory, not the index itself; the
shape a list of ints NumPy can hold; the dtype one a tensor can have; the SBP one entry
per mesh axis, each split within the shape; the placement a rectangular mesh of
distinct ranks. A save removes only files that the index it replaces owned and that
carry our naming (``<name>.<8 hex digits>.npy``), never a file the new index names.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from ..core.dtypes import descr_to_dtype
from ..core.sbp import SBP, Broadcast, NdSbp, Partial, Split
from ..errors import CheckpointError
from ..tensor import GlobalTensor
from . import atomic_write
from .header import dtype_descr, dtype_problem, element_count, native, shape_problem
from .regular_file import open_regular

__all__ = ["INDEX_NAME", "entry", "new_index", "read_index", "write_index", "sbp_from_json",
           "descr_json", "dtype_from_json", "index_bytes", "owned_files", "previous_files",
           "remove_files",
           "file_name_problem", "OUR_FILE"]

INDEX_NAME = "index.json"
_INDEX_FORMAT = "sbpmpi.state"
_INDEX_VERSION = 1
_SBP_RE = re.compile(r"^(split\((-?\d+)\)|broadcast|partial_(sum|max|min))$")
#: The name of a tensor file sm.save_state writes: ``<safe name>.<token>.npy``. Only such
#: files are ever removed.
OUR_FILE = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9_.-]*\.[0-9a-f]{8}\.npy$")
_MAX_RANK = 1 << 31


def entry(x: GlobalTensor, fname: str, crc32: int) -> dict[str, Any]:
    """The index entry of tensor ``x`` saved as ``fname``, whose CRC-32 is ``crc32``."""
    return {
        "file": fname, "shape": list(x.shape), "dtype": descr_json(native(x.dtype)),
        "sbp": [repr(s) for s in x.sbp],
        "placement": {"type": x.placement.type, "ranks": x.placement.ranks.tolist()},
        "crc32": crc32,
    }


def new_index(entries: dict[str, Any]) -> dict[str, Any]:
    """An index holding ``entries`` (name -> :func:`entry`), in this order."""
    return {"format": _INDEX_FORMAT, "version": _INDEX_VERSION, "tensors": entries}


def descr_json(dtype: np.dtype) -> Any:
    """The dtype's .npy descr as it reads back from JSON (lists, not tuples)."""
    return json.loads(json.dumps(dtype_descr(dtype)))


def dtype_from_json(descr: Any) -> np.dtype:
    """The dtype an entry's ``"dtype"`` (a ``.npy`` descr read from JSON) names."""
    fields: Any = descr if isinstance(descr, str) else [tuple(f) for f in descr]
    return descr_to_dtype(fields)


def sbp_from_json(items: Any, where: str, ndim: int | None = None) -> NdSbp:
    """The SBP tuple an entry's ``"sbp"`` list names; CheckpointError if it is not one
    (with ``ndim``, the tensor's number of dimensions: also a split outside it)."""
    if not isinstance(items, list):
        raise CheckpointError(f"{where}: sbp {items!r} is not a list")
    out: list[SBP] = []
    for it in items:
        m = _SBP_RE.match(it) if isinstance(it, str) and len(it) < 40 else None
        if m is None:
            raise CheckpointError(f"{where}: sbp entry {str(it)[:60]!r} is not split(d), "
                                  f"broadcast or partial_sum/max/min")
        if m.group(2) is not None:
            d = int(m.group(2))
            if ndim is not None and not 0 <= d < ndim:
                raise CheckpointError(f"{where}: sbp entry {it!r} splits a dimension the "
                                      f"{ndim}-d tensor does not have")
            out.append(Split(d))
        elif m.group(3) is not None:
            out.append(Partial(m.group(3)))
        else:
            out.append(Broadcast())
    return tuple(out)


def read_index(directory: str, files_present: bool = True) -> dict[str, Any]:
    """Rank 0: the parsed and checked index of a state directory (``files_present``:
    also check that every file it names is there)."""
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"no such state directory {directory!r}")
    path = os.path.join(directory, INDEX_NAME)
    if not os.path.lexists(path):
        raise FileNotFoundError(f"{directory!r} has no {INDEX_NAME}: it is not a directory "
                                f"written by sm.save_state, or the first save did not finish")
    with open_regular(path) as f:
        raw = f.read()
    try:
        index = json.loads(raw.decode("utf8"))
    except (ValueError, UnicodeDecodeError) as err:
        raise CheckpointError(f"{path!r} is not valid JSON: {err}") from None
    except RecursionError:
        raise CheckpointError(f"{path!r} is not an sbpmpi state index: its JSON is nested "
                              f"too deeply to read") from None
    if not isinstance(index, dict) or index.get("format") != _INDEX_FORMAT:
        raise CheckpointError(f"{path!r} is not an sbpmpi state index (format "
                              f"{_INDEX_FORMAT!r} expected)")
    if index.get("version") != _INDEX_VERSION:
        raise CheckpointError(f"{path!r} has index version {index.get('version')!r}; this "
                              f"sbpmpi reads version {_INDEX_VERSION}")
    tensors = index.get("tensors")
    if not isinstance(tensors, dict):
        raise CheckpointError(f"{path!r} has no 'tensors' table")
    for name, e in tensors.items():
        _check_entry(directory, f"{path!r}, tensor {name!r}", e, files_present)
    return index


def _check_entry(directory: str, where: str, e: Any, files_present: bool) -> None:
    """CheckpointError naming ``where`` unless ``e`` is a well-formed entry."""
    if not isinstance(e, dict) or not {"file", "shape", "dtype", "sbp", "placement"} <= set(e):
        raise CheckpointError(f"{where}: entry must have file, shape, dtype, sbp, placement")
    f = e["file"]
    problem = file_name_problem(f)
    if problem is not None:
        raise CheckpointError(f"{where}: file {str(f)[:120]!r} {problem}")
    try:
        dt = dtype_from_json(e["dtype"])
    except Exception as err:
        raise CheckpointError(f"{where}: dtype {str(e['dtype'])[:120]} is not a dtype "
                              f"({err})") from None
    problem = dtype_problem(dt) or shape_problem(e["shape"], dt.itemsize)
    if problem is not None:
        raise CheckpointError(f"{where}: {problem}")
    pl = e["placement"]
    if not isinstance(pl, dict) or not isinstance(pl.get("type"), str):
        raise CheckpointError(f"{where}: placement {str(pl)[:120]} is not "
                              f"{{'type': ..., 'ranks': [...]}}")
    mesh_ndim = _check_ranks(pl.get("ranks"), where)
    sbp = sbp_from_json(e["sbp"], where, len(e["shape"]))
    if len(sbp) != mesh_ndim:
        raise CheckpointError(f"{where}: sbp {e['sbp']} has {len(sbp)} entries for a "
                              f"{mesh_ndim}-d placement")
    crc = e.get("crc32")
    if crc is not None and (isinstance(crc, bool) or not isinstance(crc, int)
                            or not 0 <= crc < 1 << 32):
        raise CheckpointError(f"{where}: crc32 {str(crc)[:40]} is not a CRC-32 value")
    if files_present and not os.path.isfile(os.path.join(directory, f)):
        raise CheckpointError(f"{where}: its file {f!r} is missing")


def file_name_problem(f: Any) -> str | None:
    """Why ``f`` cannot name a tensor file of a state directory (None when it can): it must
    be a plain name inside the directory (no separator, not hidden), not the index."""
    if not isinstance(f, str) or not f or "\0" in f:
        return "is not a file name"
    if os.path.basename(f) != f or "/" in f or (os.altsep and os.altsep in f) \
            or f.startswith(".") or f != os.path.normpath(f):
        return "is not a plain file name inside the state directory"
    if f == INDEX_NAME:
        return f"is the index {INDEX_NAME} itself"
    return None


def _check_ranks(ranks: Any, where: str) -> int:
    """The number of mesh axes of a placement's ``"ranks"`` (distinct ints >= 0 forming a
    rectangular mesh); CheckpointError naming ``where`` otherwise."""
    bad = CheckpointError(f"{where}: placement ranks {str(ranks)[:120]} are not a "
                          f"rectangular mesh of ranks (ints >= 0)")
    if not isinstance(ranks, (list, int)) or isinstance(ranks, bool):
        raise bad
    try:
        arr = np.array(ranks)
    except (ValueError, TypeError, RecursionError, OverflowError):
        raise bad from None
    if arr.dtype.kind not in "iu" or arr.size == 0 or arr.ndim > 8 or \
            not ((arr >= 0) & (arr < _MAX_RANK)).all():
        raise bad
    values, counts = np.unique(arr, return_counts=True)
    if (counts > 1).any():
        raise CheckpointError(f"{where}: placement ranks {arr.tolist()} hold duplicate ranks "
                              f"{values[counts > 1].tolist()}: each rank may appear once")
    return max(arr.ndim, 1)


def previous_files(directory: str) -> dict[str, str]:
    """Rank 0, before a save: tensor name -> file, for each entry of the sbpmpi index now
    in ``directory`` whose file is a valid name (:func:`file_name_problem`), however
    damaged the rest of the index is; empty when there is no index of ours to read."""
    try:
        with open_regular(os.path.join(directory, INDEX_NAME)) as f:
            index = json.loads(f.read().decode("utf8"))
    except (OSError, ValueError, UnicodeDecodeError, RecursionError):
        return {}
    if not isinstance(index, dict) or index.get("format") != _INDEX_FORMAT or \
            not isinstance(index.get("tensors"), dict):
        return {}
    return {name: e["file"] for name, e in index["tensors"].items()
            if isinstance(e, dict) and isinstance(e.get("file"), str)
            and file_name_problem(e["file"]) is None}


def owned_files(files: Iterable[str]) -> set[str]:
    """Those of ``files`` (an index's) that a save may remove: the ones with our naming."""
    return {f for f in files if OUR_FILE.match(f)}


def write_index(directory: str, index: dict[str, Any], owned: set[str],
                mode: int | None = None) -> None:
    """Rank 0: replace the index atomically (with the permission bits ``mode``, by
    default those of the index it replaces), then remove the ``owned`` files (the
    previous index's, :func:`owned_files`) that the new one does not name.

    A failed write removes its temporary file and raises the ``OSError`` naming the
    index; the old index stays in place.
    """
    atomic_write.write_text(os.path.join(directory, INDEX_NAME),
                            json.dumps(index, indent=1) + "\n", mode)
    keep = {e["file"] for e in index["tensors"].values()}
    remove_files(directory, sorted(owned - keep))


def remove_files(directory: str, files: Iterable[str]) -> None:
    """Rank 0: remove ``files`` of ``directory`` (errors ignored)."""
    for f in files:
        atomic_write.discard(os.path.join(directory, f))


def index_bytes(tensors: Mapping[str, Any]) -> int:
    """Total bytes the index's tensors hold (0 for an entry it cannot size)."""
    total = 0
    for e in tensors.values():
        try:
            total += element_count(e["shape"]) * dtype_from_json(e["dtype"]).itemsize
        except Exception:
            pass
    return total
