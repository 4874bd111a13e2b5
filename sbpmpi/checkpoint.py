"""Checkpoints: global tensors as standard ``.npy`` files, written and read with MPI-IO.

``sm.save(x, path)`` writes the global value of ``x`` as one ``.npy`` file that
``numpy.load`` reads: rank 0 writes the header, every rank holding a block writes
it in one collective call, and no rank gathers the whole tensor. Partial tensors
are reduced first; along broadcast mesh axes only the first rank writes. The file
is written under a temporary name in the same directory and renamed into place
once every rank has succeeded, so a crash never leaves a partial file under the
final name.

``sm.load(path, placement=, sbp=)`` reads any ``.npy`` file (from ``sm.save``,
``numpy.save`` or else) into any placement and SBP: each rank reads only its own
slice. The header and the file size are checked first; a truncated or corrupt
file raises :class:`~sbpmpi.errors.CheckpointError` on every rank.

``sm.save_state(tensors, directory)`` / ``sm.load_state(directory)`` handle a dict
of tensors with a small JSON index (``index.json``) that is replaced atomically
last, so a directory always describes one complete state. With ``verbose=True`` rank 0
reports each tensor as it is written or read (name, shape, dtype, size, time, rate) on
stderr, as a progress bar when stderr is a terminal and tqdm is installed (the
``progress`` extra).

All four are collective over the world: every rank calls them with the same
arguments.
"""

from __future__ import annotations

import ast
import io
import json
import os
import re
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from . import backend
from .comm import file_io
from .core.layout import Layout
from .core.placement import Placement
from .core.reduction import identity_value
from .core.sbp import SBP, Broadcast, NdSbp, Partial, Split
from .env import get_rank
from .errors import CheckpointError
from .safety import consistency
from .tensor import GlobalTensor

__all__ = ["save", "load", "save_state", "load_state", "read_header", "INDEX_NAME"]

INDEX_NAME = "index.json"
_INDEX_FORMAT = "sbpmpi.state"
_INDEX_VERSION = 1
_MAGIC = b"\x93NUMPY"
_MAX_HEADER = 1 << 20  # bytes; real headers are a few hundred
_TMP_TAG = ".sbpmpi-tmp-"


# -- argument checks (pure, identical on every rank) -------------------------------------------

def _path_arg(path: Any, name: str = "path") -> str:
    if isinstance(path, bytes) or not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{name} must be a str or os.PathLike, got {type(path).__name__} "
                        f"{path!r}")
    p = os.fspath(path)
    if not isinstance(p, str) or not p:
        raise ValueError(f"{name} must be a non-empty file name, got {path!r}")
    return p


def _tensor_arg(x: Any, what: str) -> GlobalTensor:
    if not isinstance(x, GlobalTensor):
        raise TypeError(f"{what} needs a GlobalTensor, got {type(x).__name__}; to save a local "
                        f"array use numpy.save, or make it global with sm.to_global first")
    _dtype_ok(x.dtype, what)
    return x


def _dtype_ok(dt: np.dtype, what: str) -> None:
    if dt.hasobject:
        raise TypeError(f"{what}: dtype {dt} holds Python objects and cannot be stored in a "
                        f".npy file without pickling; convert to a numeric dtype first")
    if dt.itemsize == 0:
        raise TypeError(f"{what}: dtype {dt} has zero-size elements")


def _placement_arg(placement: Any, what: str) -> Placement:
    if placement is None:
        raise TypeError(f"{what}: placement= is required, e.g. sm.placement('cpu', [0, 1])")
    if not isinstance(placement, Placement):
        raise TypeError(f"{what}: placement must be an sm.placement, got "
                        f"{type(placement).__name__} {placement!r}")
    return placement


def _sbp_arg(sbp: Any, what: str) -> Any:
    if sbp is None:
        raise TypeError(f"{what}: sbp= is required, e.g. sm.sbp.split(0) or sm.sbp.broadcast")
    return sbp


# -- .npy header ---------------------------------------------------------------------------------

def npy_header(dtype: np.dtype, shape: Sequence[int], fortran_order: bool = False) -> bytes:
    """The ``.npy`` header bytes (format 1.0, or 2.0 when it does not fit) for an array."""
    d = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": bool(fortran_order),
         "shape": tuple(int(n) for n in shape)}
    buf = io.BytesIO()
    try:
        np.lib.format.write_array_header_1_0(buf, d)
    except ValueError:
        buf = io.BytesIO()
        np.lib.format.write_array_header_2_0(buf, d)
    return buf.getvalue()


def read_header(path: str) -> tuple[tuple[int, ...], np.dtype, bool, int]:
    """Parse and check the header of the ``.npy`` file ``path`` (no MPI, one rank).

    Returns ``(shape, dtype, fortran_order, data_offset)``.

    Raises
    ------
    FileNotFoundError, IsADirectoryError, PermissionError
        The file cannot be opened.
    CheckpointError
        Not a ``.npy`` file, an unknown version, a malformed header, or a file size
        that does not match the header (truncated or with trailing bytes).
    """
    if not os.path.exists(path):
        raise FileNotFoundError(f"no such file {path!r}")
    if os.path.isdir(path):
        raise IsADirectoryError(f"{path!r} is a directory, not a .npy file")
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(12)
        if len(head) < 10 or head[:6] != _MAGIC:
            raise CheckpointError(
                f"{path!r} is not a .npy file: it does not start with the magic bytes "
                f"\\x93NUMPY ({size} bytes, starts with {head[:8]!r})")
        major, minor = head[6], head[7]
        if (major, minor) == (1, 0):
            hlen, start = int.from_bytes(head[8:10], "little"), 10
        elif (major, minor) in ((2, 0), (3, 0)):
            if len(head) < 12:
                raise CheckpointError(f"{path!r} is truncated inside its .npy header")
            hlen, start = int.from_bytes(head[8:12], "little"), 12
        else:
            raise CheckpointError(f"{path!r} has .npy format version {major}.{minor}; "
                                  f"supported are 1.0, 2.0 and 3.0")
        if hlen > _MAX_HEADER:
            raise CheckpointError(f"{path!r} has an implausible .npy header length of {hlen} "
                                  f"bytes: the file is corrupt")
        f.seek(start)
        raw = f.read(hlen)
    if len(raw) < hlen:
        raise CheckpointError(f"{path!r} is truncated inside its .npy header ({size} bytes, "
                              f"the header alone needs {start + hlen})")
    try:
        text = raw.decode("utf8" if major == 3 else "latin1")
        d = ast.literal_eval(text)
    except (ValueError, SyntaxError, UnicodeDecodeError, MemoryError, RecursionError) as e:
        raise CheckpointError(f"{path!r} has a malformed .npy header {raw[:80]!r}: {e}") from None
    if not isinstance(d, dict) or set(d) != {"descr", "fortran_order", "shape"}:
        raise CheckpointError(f"{path!r} has a malformed .npy header: expected a dict with keys "
                              f"'descr', 'fortran_order', 'shape', got {text.strip()[:120]!r}")
    shape, fortran, descr = d["shape"], d["fortran_order"], d["descr"]
    if not isinstance(shape, tuple) or not all(
            isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape):
        raise CheckpointError(f"{path!r} has a malformed .npy header: shape {shape!r} is not a "
                              f"tuple of non-negative ints")
    if not isinstance(fortran, bool):
        raise CheckpointError(f"{path!r} has a malformed .npy header: fortran_order "
                              f"{fortran!r} is not a bool")
    try:
        dtype = np.lib.format.descr_to_dtype(descr)
    except Exception as e:
        raise CheckpointError(f"{path!r} has a malformed .npy header: descr {descr!r} is not "
                              f"a dtype ({e})") from None
    if dtype.hasobject:
        raise CheckpointError(f"{path!r} holds pickled Python objects (dtype {dtype}); sm.load "
                              f"reads numeric arrays only")
    offset = start + hlen
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if size != offset + nbytes:
        what = "is truncated" if size < offset + nbytes else "is corrupt (longer than its header says)"
        raise CheckpointError(
            f"{path!r} {what}: the header says shape {shape} {dtype} = {nbytes} data bytes "
            f"after a {offset}-byte header, {offset + nbytes} bytes in all, but the file has "
            f"{size} bytes")
    return tuple(shape), dtype, fortran, offset


# -- save / load -----------------------------------------------------------------------------

def _reduced(x: GlobalTensor) -> GlobalTensor:
    """``x`` without partial mesh axes: each becomes a split of the largest dim (or broadcast)."""
    if not any(isinstance(s, Partial) for s in x.sbp):
        return x
    repl: SBP = Split(int(np.argmax(x.shape))) if x.ndim else Broadcast()
    return x.to_global(sbp=tuple(repl if isinstance(s, Partial) else s for s in x.sbp))


def _writes(layout: Layout, rank: int) -> bool:
    """True when ``rank`` writes its shard: in the placement, at index 0 of broadcast axes."""
    c = layout.placement.coord_of(rank)
    return c is not None and all(c[a] == 0 for a, s in enumerate(layout.sbp)
                                 if isinstance(s, Broadcast))


def _fsync_dir(directory: str) -> None:
    try:
        fd = os.open(directory or ".", os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _prepare_target(path: str) -> str:
    """Rank 0: check the target's directory; return a fresh temporary name beside it."""
    directory = os.path.dirname(path) or "."
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"directory {directory!r} of {path!r} does not exist")
    if os.path.isdir(path):
        raise IsADirectoryError(f"{path!r} is a directory")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise PermissionError(f"directory {directory!r} is not writable")
    base = os.path.basename(path)
    return os.path.join(directory, f".{base}{_TMP_TAG}{uuid.uuid4().hex[:12]}")


def _commit(tmp: str, path: str) -> None:
    try:
        os.replace(tmp, path)
    except OSError:
        _discard(tmp)
        raise
    _fsync_dir(os.path.dirname(path))


def _discard(tmp: str) -> None:
    try:
        os.remove(tmp)
    except OSError:
        pass


def save(x: GlobalTensor, path: str | os.PathLike[str]) -> None:
    """Write the global value of ``x`` to ``path`` as a ``.npy`` file (collective).

    Each rank writes its own block with MPI-IO in one collective call; the file appears
    under ``path`` only once every rank has written its part (atomic rename).

    Parameters
    ----------
    x : GlobalTensor
        Any placement and SBP; partial tensors are reduced first.
    path : str or PathLike
        The file to create or replace; ``numpy.load(path)`` returns ``x.numpy()``.
    """
    x = _tensor_arg(x, "sm.save")
    p = _path_arg(path)
    consistency.check_collective("sm.save", (p, x))
    y = _reduced(x)
    tmp = consistency.decide_on_root(lambda: _prepare_target(p), "sm.save")
    me = get_rank()
    layout = y.layout
    error: BaseException | None = None
    try:
        header = npy_header(y.dtype, y.shape)
        local = None
        starts: Sequence[int] = ()
        if _writes(layout, me):
            ranges = layout.local_ranges(me)
            assert ranges is not None
            starts = [a for a, _ in ranges]
            local = np.asarray(backend.asnumpy(y.to_local()))
        file_io.write_blocks(tmp, header, local, y.shape, starts, y.dtype)
    except Exception as e:
        error = e
    if not consistency.all_ok(error is None):
        if me == 0:
            _discard(tmp)
        consistency.raise_if_any(error, f"sm.save {p!r}")
    consistency.decide_on_root(lambda: _commit(tmp, p), "sm.save")


def _check_identities(layout: Layout, dtype: np.dtype, what: str) -> None:
    for a in layout.partial_axes():
        s = layout.sbp[a]
        assert isinstance(s, Partial)
        try:
            identity_value(s.op, dtype)
        except TypeError as e:
            raise TypeError(f"{what}: cannot lay out dtype {dtype} as {s!r}: {e}") from None


def load(path: str | os.PathLike[str], *, placement: Placement | None = None,
         sbp: SBP | Sequence[SBP] | None = None) -> GlobalTensor:
    """Read a ``.npy`` file into a global tensor with ``placement`` and ``sbp`` (collective).

    Any world size, mesh or SBP works, whatever wrote the file. Each rank reads only its
    own slice; under a partial SBP the first rank of each partial axis holds the value
    and the others the reduction's identity. Big-endian files are converted to native
    byte order.

    Raises
    ------
    FileNotFoundError
        On every rank, when ``path`` does not exist.
    CheckpointError
        On every rank, when the file is not a valid ``.npy`` file or is truncated.
    """
    p = _path_arg(path)
    pl = _placement_arg(placement, "sm.load")
    sbp = _sbp_arg(sbp, "sm.load")
    consistency.check_collective("sm.load", (p, pl, sbp))
    shape, dtype, fortran, offset = consistency.decide_on_root(lambda: read_header(p), "sm.load")
    layout = Layout.make(shape, pl, sbp)
    native = _native(dtype)
    _check_identities(layout, native, "sm.load")
    me = get_rank()
    member = me in pl
    op = layout.identity_op(me) if member else None
    reads = member and op is None
    ranges = layout.local_ranges(me) if reads else None
    lshape = layout.local_shape(me)
    error: BaseException | None = None
    local: Any = None
    try:
        buf = file_io.read_blocks(p, offset, dtype, shape,
                                  None if ranges is None else [a for a, _ in ranges],
                                  lshape if reads else (0,), fortran)
        if not member:
            local = np.empty(lshape, dtype=native)
        elif op is not None:
            xp = backend.get_xp(pl.type)
            local = xp.full(lshape, identity_value(op, native), dtype=native)
        else:
            if buf.dtype != native:
                buf = buf.astype(native)
            local = backend.to_device(buf, pl.type)
    except Exception as e:
        error = e
    consistency.raise_if_any(error, f"sm.load {p!r}")
    return GlobalTensor(local, layout, native)


# -- many tensors ----------------------------------------------------------------------------

_SBP_RE = re.compile(r"^(split\((-?\d+)\)|broadcast|partial_(sum|max|min))$")


def _sbp_to_json(nd: NdSbp) -> list[str]:
    return [repr(s) for s in nd]


def _sbp_from_json(items: Any, where: str) -> NdSbp:
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


def _native(dtype: np.dtype) -> np.dtype:
    return dtype.newbyteorder("=") if dtype.byteorder not in ("=", "|") else dtype


def _descr_json(dtype: np.dtype) -> Any:
    """The dtype's .npy descr as it reads back from JSON (lists, not tuples)."""
    return json.loads(json.dumps(np.lib.format.dtype_to_descr(dtype)))


def _safe_name(name: str) -> str:
    s = re.sub(r"[^A-Za-z0-9_.-]", "_", name).strip(".") or "tensor"
    return s[:100]


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
        out[k] = _tensor_arg(v, f"sm.save_state: tensor {k!r}")
    return out


def _read_index(directory: str) -> dict[str, Any]:
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
        _sbp_from_json(e["sbp"], where)
    return index


def _write_index(directory: str, index: dict[str, Any], old: dict[str, Any] | None) -> None:
    """Rank 0: replace the index atomically, then remove the files only the old one named."""
    path = os.path.join(directory, INDEX_NAME)
    tmp = os.path.join(directory, f".{INDEX_NAME}{_TMP_TAG}{uuid.uuid4().hex[:12]}")
    with open(tmp, "w", encoding="utf8") as f:
        json.dump(index, f, indent=1)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    _commit(tmp, path)
    if old:
        keep = {e["file"] for e in index["tensors"].values()}
        for e in old.get("tensors", {}).values():
            if isinstance(e, dict) and e.get("file") not in keep:
                _discard(os.path.join(directory, str(e.get("file"))))


def _prepare_state_dir(directory: str) -> tuple[str, dict[str, Any] | None]:
    """Rank 0: create the directory if needed; return a fresh token and the current index."""
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise NotADirectoryError(f"{directory!r} exists and is not a directory")
    os.makedirs(directory, exist_ok=True)
    old = None
    if os.path.exists(os.path.join(directory, INDEX_NAME)):
        try:
            old = _read_index(directory)
        except (CheckpointError, OSError):
            old = None  # replaced below; its files are left alone
    return uuid.uuid4().hex[:8], old


def _size_text(n: float) -> str:
    for unit, k in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= k:
            return f"{n / k:.1f} {unit}"
    return f"{int(n)} B"


class _Progress:
    """Rank 0's per-tensor report for ``verbose=True``: a line per tensor on stderr, or a
    tqdm bar (by bytes) when stderr is a terminal and tqdm is installed."""

    def __init__(self, what: str, total_bytes: int, count: int, on: bool) -> None:
        self.what, self.count, self.done = what, count, 0
        self.on = on and get_rank() == 0
        self.bar: Any = None
        self.t0 = time.perf_counter()
        if not self.on:
            return
        if sys.stderr.isatty():
            try:
                from tqdm import tqdm

                self.bar = tqdm(total=total_bytes, unit="B", unit_scale=True,
                                unit_divisor=1024, desc=what, file=sys.stderr)
            except ImportError:
                self.bar = None
        if self.bar is None:
            print(f"{what}: {count} tensor(s), {_size_text(total_bytes)}", file=sys.stderr,
                  flush=True)

    def tensor(self, name: str, shape: Sequence[int], dtype: np.dtype, seconds: float) -> None:
        if not self.on:
            return
        self.done += 1
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if self.bar is not None:
            self.bar.set_postfix_str(name, refresh=False)
            self.bar.update(nbytes)
            return
        rate = f", {nbytes / seconds / 1e6:.0f} MB/s" if seconds > 0 and nbytes else ""
        print(f"{self.what}: [{self.done}/{self.count}] {name!r} {tuple(shape)} {dtype} "
              f"{_size_text(nbytes)} in {seconds:.2f} s{rate}", file=sys.stderr, flush=True)

    def close(self) -> None:
        if not self.on:
            return
        if self.bar is not None:
            self.bar.close()
        else:
            print(f"{self.what}: done in {time.perf_counter() - self.t0:.2f} s", file=sys.stderr,
                  flush=True)


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
    d = _path_arg(directory, "directory")
    if not isinstance(verbose, bool):
        raise TypeError(f"sm.save_state: verbose must be True or False, got {verbose!r}")
    consistency.check_collective("sm.save_state", (d, tuple(items.items())))
    token, old = consistency.decide_on_root(lambda: _prepare_state_dir(d), "sm.save_state")
    used: set[str] = set()
    entries: dict[str, Any] = {}
    progress = _Progress(f"sm.save_state {d}",
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
        save(x, os.path.join(d, fname))
        progress.tensor(name, x.shape, x.dtype, time.perf_counter() - t0)
        entries[name] = {
            "file": fname, "shape": list(x.shape), "dtype": _descr_json(_native(x.dtype)),
            "sbp": _sbp_to_json(x.sbp),
            "placement": {"type": x.placement.type, "ranks": x.placement.ranks.tolist()},
        }
    index = {"format": _INDEX_FORMAT, "version": _INDEX_VERSION, "tensors": entries}
    consistency.decide_on_root(lambda: _write_index(d, index, old), "sm.save_state")
    progress.close()


def _per_name(arg: Any, name: str) -> Any:
    return arg.get(name) if isinstance(arg, Mapping) else arg


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
    dict of name -> GlobalTensor, in the order they were saved.
    """
    d = _path_arg(directory, "directory")
    if not isinstance(verbose, bool):
        raise TypeError(f"sm.load_state: verbose must be True or False, got {verbose!r}")
    if placement is not None and not isinstance(placement, (Placement, Mapping)):
        raise TypeError(f"sm.load_state: placement must be an sm.placement or a dict of them, "
                        f"got {type(placement).__name__} {placement!r}")
    consistency.check_collective("sm.load_state", (d, placement, sbp))
    index = consistency.decide_on_root(lambda: _read_index(d), "sm.load_state")
    tensors: dict[str, Any] = index["tensors"]
    for arg, what in ((placement, "placement"), (sbp, "sbp")):
        if isinstance(arg, Mapping):
            unknown = [k for k in arg if k not in tensors]
            if unknown:
                raise KeyError(f"sm.load_state: {what} names {unknown} that are not in the "
                               f"checkpoint; it holds {list(tensors)}")
    from .env import get_world_size

    out: dict[str, GlobalTensor] = {}
    progress = _Progress(f"sm.load_state {d}", _index_bytes(tensors), len(tensors), verbose)
    for name, e in tensors.items():
        where = f"sm.load_state: tensor {name!r}"
        pl = _per_name(placement, name)
        saved_pl = e["placement"]
        if pl is None:
            try:
                pl = Placement(saved_pl["type"], saved_pl["ranks"])
            except ValueError as err:
                raise ValueError(
                    f"{where} was saved on placement {saved_pl['type']!r} ranks "
                    f"{saved_pl['ranks']}, which does not fit this world of "
                    f"{get_world_size()}: pass placement=") from err
        pl = _placement_arg(pl, where)
        nd = _per_name(sbp, name)
        if nd is None:
            saved = _sbp_from_json(e["sbp"], where)
            if len(saved) != pl.ndim:
                raise ValueError(f"{where} was saved with sbp {saved} on a {len(saved)}-d mesh; "
                                 f"pass sbp= for the {pl.ndim}-d placement {pl!r}")
            nd = saved
        t0 = time.perf_counter()
        x = load(os.path.join(d, e["file"]), placement=pl, sbp=nd)
        progress.tensor(name, x.shape, x.dtype, time.perf_counter() - t0)
        if list(x.shape) != list(e["shape"]) or _descr_json(x.dtype) != e["dtype"]:
            raise CheckpointError(f"{where}: file {e['file']!r} holds {x.shape} {x.dtype} but "
                                  f"the index says {tuple(e['shape'])} {e['dtype']}")
        out[name] = x
    progress.close()
    return out


def _index_bytes(tensors: Mapping[str, Any]) -> int:
    """Total bytes the index's tensors hold (0 for an entry it cannot size)."""
    total = 0
    for e in tensors.values():
        try:
            descr = e["dtype"]
            fields: Any = descr if isinstance(descr, str) else [tuple(f) for f in descr]
            dt = np.lib.format.descr_to_dtype(fields)
            total += int(np.prod(e["shape"], dtype=np.int64)) * dt.itemsize
        except Exception:
            pass
    return total
