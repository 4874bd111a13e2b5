"""Every NumPy data allocation a block of code makes, with its size: a NumPy memory
handler (NEP 49, ``PyDataMem_SetHandler``) installed through ctypes that counts each
``malloc``/``calloc``/``realloc`` and hands it to libc.

``tracemalloc`` sees NumPy's allocations too (domain ``np.lib.tracemalloc_domain``), but
only those still alive when a snapshot is taken (and its peak mixes them with Python's
own): an array made and dropped inside a kernel is invisible to it. This handler sees
every one. It applies to the current thread's context, to arrays made while it is set;
arrays free themselves with the handler that made them.
"""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Iterator

import numpy as np

try:
    from numpy._core import _multiarray_umath as _mu
except ImportError:  # NumPy 1.x
    from numpy.core import _multiarray_umath as _mu  # type: ignore[no-redef]

_SET_HANDLER_INDEX = 304  # PyDataMem_SetHandler in NumPy's C-API table (NumPy >= 1.22)

_py = ctypes.pythonapi
_py.PyCapsule_GetPointer.restype = ctypes.c_void_p
_py.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_py.PyCapsule_New.restype = ctypes.py_object
_py.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_api = ctypes.cast(_py.PyCapsule_GetPointer(_mu._ARRAY_API, None),
                   ctypes.POINTER(ctypes.c_void_p))
_set_handler = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.py_object)(_api[_SET_HANDLER_INDEX])

_MALLOC = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)
_CALLOC = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t)
_REALLOC = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)
_FREE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)


class _Allocator(ctypes.Structure):  # PyDataMemAllocator
    _fields_ = [("ctx", ctypes.c_void_p), ("malloc", _MALLOC), ("calloc", _CALLOC),
                ("realloc", _REALLOC), ("free", _FREE)]


class _Handler(ctypes.Structure):  # PyDataMem_Handler, version 1
    _fields_ = [("name", ctypes.c_char * 127), ("version", ctypes.c_uint8),
                ("allocator", _Allocator)]


_libc = ctypes.CDLL(None)
_libc.malloc.restype = ctypes.c_void_p
_libc.malloc.argtypes = [ctypes.c_size_t]
_libc.calloc.restype = ctypes.c_void_p
_libc.calloc.argtypes = [ctypes.c_size_t, ctypes.c_size_t]
_libc.realloc.restype = ctypes.c_void_p
_libc.realloc.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.free.argtypes = [ctypes.c_void_p]

#: Sizes of the allocations made while the handler is set, in order.
LOG: list[int] = []


def _malloc(ctx: int, n: int) -> int:
    LOG.append(n)
    return _libc.malloc(n)  # type: ignore[no-any-return]


def _calloc(ctx: int, n: int, size: int) -> int:
    LOG.append(n * size)
    return _libc.calloc(n, size)  # type: ignore[no-any-return]


def _realloc(ctx: int, p: int, n: int) -> int:
    LOG.append(n)
    return _libc.realloc(p, n)  # type: ignore[no-any-return]


def _free(ctx: int, p: int, n: int) -> None:
    _libc.free(p)


_CALLBACKS = (_MALLOC(_malloc), _CALLOC(_calloc), _REALLOC(_realloc), _FREE(_free))
_HANDLER = _Handler(b"sbpmpi_test_counting", 1, _Allocator(None, *_CALLBACKS))
_NAME = ctypes.create_string_buffer(b"mem_handler")  # the capsule keeps this pointer
_CAPSULE = _py.PyCapsule_New(ctypes.addressof(_HANDLER), ctypes.cast(_NAME, ctypes.c_char_p),
                             None)


@contextlib.contextmanager
def counting() -> Iterator[list[int]]:
    """The sizes of the NumPy data allocations made in the block (filled at its end)."""
    start = len(LOG)
    old = _set_handler(_CAPSULE)
    sizes: list[int] = []
    try:
        yield sizes
    finally:
        _set_handler(old)
        sizes.extend(LOG[start:])
        del LOG[start:]


def handler_works() -> bool:
    """Whether the handler sees an allocation (a check of the C-API index)."""
    with counting() as sizes:
        np.empty(3, dtype=np.float64)
    return sizes == [24]
