"""``index.json``: the table of contents of a state directory.

One JSON object ``{"format": "sbpmpi.state", "version": 1, "tensors": {name: entry}}``,
each entry naming the tensor's ``.npy`` file (a plain name in the same directory), its
shape, dtype (the ``.npy`` descr), SBP and placement. Rank 0 reads and writes it; the
callers share its verdict with the other ranks.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from typing import Any

import numpy as np
from numpy.lib import format as npy_format

from ..core.sbp import SBP, Broadcast, NdSbp, Partial, Split
from ..errors import CheckpointError
from ..tensor import GlobalTensor
from . import atomic_write
from .header import native

__all__ = ["INDEX_NAME", "entry", "new_index", "read_index", "write_index", "sbp_from_json",
           "descr_json", "index_bytes"]

INDEX_NAME = "index.json"
_INDEX_FORMAT = "sbpmpi.state"
_INDEX_VERSION = 1
_SBP_RE = re.compile(r"^(split\((-?\d+)\)|broadcast|partial_(sum|max|min))$")


def entry(x: GlobalTensor, fname: str) -> dict[str, Any]:
    """The index entry of tensor ``x`` saved as ``fname``."""
    return {
        "file": fname, "shape": list(x.shape), "dtype": descr_json(native(x.dtype)),
        "sbp": [repr(s) for s in x.sbp],
        "placement": {"type": x.placement.type, "ranks": x.placement.ranks.tolist()},
    }


def new_index(entries: dict[str, Any]) -> dict[str, Any]:
    """An index holding ``entries`` (name -> :func:`entry`), in this order."""
    return {"format": _INDEX_FORMAT, "version": _INDEX_VERSION, "tensors": entries}


def descr_json(dtype: np.dtype) -> Any:
    """The dtype's .npy descr as it reads back from JSON (lists, not tuples)."""
    return json.loads(json.dumps(npy_format.dtype_to_descr(dtype)))


def sbp_from_json(items: Any, where: str) -> NdSbp:
    """The SBP tuple an entry's ``"sbp"`` list names; CheckpointError if it is not one."""
    if not isinstance(items, list):
        raise CheckpointError(f"{where}: sbp {items!r} is not a list")
    out: list[SBP] = []
    for it in items:
        m = _SBP_RE.match(it) if isinstance(it, str) else None
        if m is None:
            raise CheckpointError(f"{where}: sbp entry {it!r} is not split(d), broadcast or "
                                  f"partial_sum/max/min")
        if m.group(2) is not None:
            out.append(Split(int(m.group(2))))
        elif m.group(3) is not None:
            out.append(Partial(m.group(3)))
        else:
            out.append(Broadcast())
    return tuple(out)


def read_index(directory: str) -> dict[str, Any]:
    """Rank 0: the parsed and checked index of a state directory."""
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"no such state directory {directory!r}")
    path = os.path.join(directory, INDEX_NAME)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{directory!r} has no {INDEX_NAME}: it is not a directory "
                                f"written by sm.save_state, or the first save did not finish")
    try:
        with open(path, encoding="utf8") as f:
            index = json.load(f)
    except (ValueError, UnicodeDecodeError) as err:
        raise CheckpointError(f"{path!r} is not valid JSON: {err}") from None
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
        where = f"{path!r}, tensor {name!r}"
        if not isinstance(e, dict) or not {"file", "shape", "dtype", "sbp", "placement"} <= set(e):
            raise CheckpointError(f"{where}: entry must have file, shape, dtype, sbp, placement")
        f = e["file"]
        if not isinstance(f, str) or os.path.basename(f) != f or f.startswith("."):
            raise CheckpointError(f"{where}: file {f!r} is not a plain file name")
        if not os.path.isfile(os.path.join(directory, f)):
            raise CheckpointError(f"{where}: its file {f!r} is missing")
        sbp_from_json(e["sbp"], where)
    return index


def write_index(directory: str, index: dict[str, Any], old: dict[str, Any] | None) -> None:
    """Rank 0: replace the index atomically, then remove the files only the old one named."""
    atomic_write.write_text(os.path.join(directory, INDEX_NAME),
                            json.dumps(index, indent=1) + "\n")
    if old:
        keep = {e["file"] for e in index["tensors"].values()}
        for e in old.get("tensors", {}).values():
            if isinstance(e, dict) and e.get("file") not in keep:
                atomic_write.discard(os.path.join(directory, str(e.get("file"))))


def index_bytes(tensors: Mapping[str, Any]) -> int:
    """Total bytes the index's tensors hold (0 for an entry it cannot size)."""
    total = 0
    for e in tensors.values():
        try:
            descr = e["dtype"]
            fields: Any = descr if isinstance(descr, str) else [tuple(f) for f in descr]
            dt = npy_format.descr_to_dtype(fields)
            total += int(np.prod(e["shape"], dtype=np.int64)) * dt.itemsize
        except Exception:
            pass
    return total
