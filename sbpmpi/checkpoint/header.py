"""The ``.npy`` header: build one for a global array, read and check one from a file.

Writing uses ``numpy.lib.format`` as it is. Reading uses its ``read_magic`` and
``descr_to_dtype``; the rest is our own code, for the reasons given at
:func:`read_header`. No MPI here: one rank reads, and the caller shares the verdict.
"""

from __future__ import annotations

import ast
import io
import os
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
from numpy.lib import format as npy_format

from ..core.dtypes import descr_to_dtype, is_bfloat16
from ..errors import CheckpointError
from .regular_file import open_regular

__all__ = ["npy_header", "read_header", "native", "element_count", "shape_problem",
           "dtype_problem"]

#: The largest number of elements (and of bytes) an array may have: NumPy's own limit.
MAX_SIZE = int(np.iinfo(np.intp).max)

_MAX_HEADER = 1 << 20  # bytes; real headers are a few hundred
# Width of the header-length field and the header's text encoding per format version.
# numpy.lib.format keeps this table private (_header_size_info) and has no public reader
# for version 3.0, so it is written out here.
_HEADER_FIELD = {(1, 0): (2, "latin1"), (2, 0): (4, "latin1"), (3, 0): (4, "utf8")}
_KEYS = {"descr", "fortran_order", "shape"}


def npy_header(dtype: np.dtype, shape: Sequence[int], fortran_order: bool = False) -> bytes:
    """The ``.npy`` header bytes (format 1.0, or 2.0 when it does not fit) for an array."""
    # The header dict is written out rather than taken from header_data_from_array_1_0,
    # which needs the whole array: no rank holds it (each writes its own block).
    d = {"descr": dtype_descr(dtype), "fortran_order": bool(fortran_order),
         "shape": tuple(int(n) for n in shape)}
    buf = io.BytesIO()
    try:
        npy_format.write_array_header_1_0(buf, d)
    except ValueError:
        buf = io.BytesIO()
        npy_format.write_array_header_2_0(buf, d)
    return buf.getvalue()


def dtype_descr(dtype: np.dtype) -> Any:
    """The ``.npy`` descr of ``dtype``: NumPy's, except bfloat16's, which NumPy writes as
    ``'<V2'`` (raw bytes): ``'bfloat16'``, the name ``ml_dtypes`` registers, so that
    ``numpy.load`` after ``import ml_dtypes`` reads it back as bfloat16."""
    if is_bfloat16(np.dtype(dtype)):
        return "bfloat16"
    return npy_format.dtype_to_descr(dtype)


def element_count(shape: Iterable[int]) -> int:
    """The number of elements of ``shape``, in Python integers (no int64 wrap)."""
    n = 1
    for d in shape:
        n *= int(d)
    return n


def shape_problem(shape: object, itemsize: int = 1) -> str | None:
    """Why ``shape`` is not the shape of an array NumPy can hold (None when it is one): a
    tuple or list of Python ints (not bools) >= 0, whose elements, counted in Python
    integers, and bytes (at ``itemsize``) stay within NumPy's limit."""
    if not isinstance(shape, (tuple, list)) or not all(
            isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape):
        return f"shape {shape!r} is not a sequence of non-negative ints"
    if len(shape) > 64:  # NumPy's NPY_MAXDIMS
        return f"shape {tuple(shape)} has {len(shape)} dimensions; NumPy allows 64"
    nonzero = element_count(n for n in shape if n)  # NumPy bounds them even when one is 0
    if any(n > MAX_SIZE for n in shape) or nonzero * max(itemsize, 1) > MAX_SIZE:
        return (f"shape {_short(shape)} has more elements than an array can hold "
                f"({MAX_SIZE} bytes at most)")
    return None


def _short(shape: Sequence[int]) -> str:
    text = str(tuple(shape))
    return text if len(text) <= 120 else text[:117] + "..."


def dtype_problem(dtype: np.dtype) -> str | None:
    """Why ``dtype`` cannot be read into a global tensor (None when it can)."""
    if dtype.hasobject:
        return (f"dtype {dtype} holds pickled Python objects; sm.load reads numeric arrays "
                f"only")
    if dtype.itemsize == 0:
        return (f"dtype {dtype} has zero-size elements, which cannot be laid out in a "
                f"file or across ranks")
    return None


def native(dtype: np.dtype) -> np.dtype:
    """``dtype`` in native byte order (a big-endian file's dtype as it is held in memory)."""
    return dtype.newbyteorder("=") if dtype.byteorder not in ("=", "|") else dtype


def read_header(path: str) -> tuple[tuple[int, ...], np.dtype, bool, int]:
    """Parse and check the header of the ``.npy`` file ``path`` (no MPI, one rank).

    Returns ``(shape, dtype, fortran_order, data_offset)``.

    ``numpy.lib.format.read_magic`` reads the magic bytes and the version. The header
    length and dict are read here rather than by ``read_array_header_1_0/2_0`` because
    those do not return the header's length (which tells a truncated file from a corrupt
    one, and which the messages name), accept negative and bool dimensions, word their
    errors without the value expected, and have no public counterpart for version 3.0.

    Raises
    ------
    FileNotFoundError, IsADirectoryError, PermissionError
        The file cannot be opened.
    CheckpointError
        Not a regular file (a FIFO would block), not a ``.npy`` file, an unknown version,
        a malformed header (a shape NumPy cannot hold, object or zero-size elements), or
        a file size that does not match the header (truncated or with trailing bytes).
    """
    with open_regular(path) as f:
        size = os.fstat(f.fileno()).st_size
        try:
            version: tuple[int, int] | None = npy_format.read_magic(f)
        except ValueError:  # wrong magic bytes, or fewer than 8 bytes
            version = None
        if version is None or size < 10:  # not even a 1.0 header-length field after it
            f.seek(0)
            raise CheckpointError(
                f"{path!r} is not a .npy file: it does not start with the magic bytes "
                f"\\x93NUMPY ({size} bytes, starts with {f.read(8)!r})")
        field = _HEADER_FIELD.get(version)
        if field is None:
            raise CheckpointError(f"{path!r} has .npy format version {version[0]}.{version[1]}; "
                                  f"supported are 1.0, 2.0 and 3.0")
        width, encoding = field
        raw_len = f.read(width)
        if len(raw_len) < width:
            raise CheckpointError(f"{path!r} is truncated inside its .npy header")
        hlen, start = int.from_bytes(raw_len, "little"), 8 + width
        if hlen > _MAX_HEADER:
            raise CheckpointError(f"{path!r} has an implausible .npy header length of {hlen} "
                                  f"bytes: the file is corrupt")
        raw = f.read(hlen)
    if len(raw) < hlen:
        raise CheckpointError(f"{path!r} is truncated inside its .npy header ({size} bytes, "
                              f"the header alone needs {start + hlen})")
    shape, dtype, fortran = _header_dict(path, raw, encoding)
    offset = start + hlen
    nbytes = element_count(shape) * dtype.itemsize
    if size != offset + nbytes:
        what = "is truncated" if size < offset + nbytes else "is corrupt (longer than its header says)"
        raise CheckpointError(
            f"{path!r} {what}: the header says shape {shape} {dtype} = {nbytes} data bytes "
            f"after a {offset}-byte header, {offset + nbytes} bytes in all, but the file has "
            f"{size} bytes")
    return shape, dtype, fortran, offset


def _header_dict(path: str, raw: bytes, encoding: str) -> tuple[tuple[int, ...], np.dtype, bool]:
    """(shape, dtype, fortran_order) from the header text, each entry checked."""
    try:
        text = raw.decode(encoding)
        d = ast.literal_eval(text)
    except (ValueError, SyntaxError, UnicodeDecodeError, MemoryError, RecursionError) as e:
        raise CheckpointError(f"{path!r} has a malformed .npy header {raw[:80]!r}: {e}") from None
    if not isinstance(d, dict) or set(d) != _KEYS:
        raise CheckpointError(f"{path!r} has a malformed .npy header: expected a dict with keys "
                              f"'descr', 'fortran_order', 'shape', got {text.strip()[:120]!r}")
    shape, fortran, descr = d["shape"], d["fortran_order"], d["descr"]
    if not isinstance(shape, tuple) or not all(
            isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape):
        raise CheckpointError(f"{path!r} has a malformed .npy header: shape {shape!r} is not a "
                              f"tuple of non-negative ints")
    problem = shape_problem(shape)
    if problem is not None:
        raise CheckpointError(f"{path!r} has a malformed .npy header: {problem}")
    if not isinstance(fortran, bool):
        raise CheckpointError(f"{path!r} has a malformed .npy header: fortran_order "
                              f"{fortran!r} is not a bool")
    try:
        dtype = descr_to_dtype(descr)
    except Exception as e:
        raise CheckpointError(f"{path!r} has a malformed .npy header: descr {descr!r} is not "
                              f"a dtype ({e})") from None
    problem = dtype_problem(dtype)
    if problem is None:
        problem = shape_problem(shape, dtype.itemsize)
    if problem is not None:
        raise CheckpointError(f"{path!r}: {problem}")
    return tuple(shape), dtype, fortran
