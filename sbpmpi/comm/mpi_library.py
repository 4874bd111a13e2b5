"""The MPI library's own facts: its name and version line, and the largest message.

This module imports nothing of sbpmpi, so every other module may use it (the whole setup
is gathered by :func:`sbpmpi.comm.info`).
"""

from __future__ import annotations

from mpi4py import MPI

__all__ = ["library_version", "library_line", "library_name", "max_count"]


def library_version() -> str:
    """``MPI.Get_library_version()`` without NUL characters: Open MPI's string ends with
    the C string's terminating NUL, which would reach messages, ``sbpmpi info`` and the
    cost cache's keys."""
    return MPI.Get_library_version().replace("\0", "")


def library_line() -> str:
    """First line of :func:`library_version`, stripped, e.g.
    ``"MPICH Version:      4.2.0"`` (``"unknown MPI"`` if the library says nothing)."""
    lines = library_version().strip().splitlines()
    return lines[0].strip() if lines else "unknown MPI"


def library_name() -> str:
    """:func:`library_line` with runs of white space as one space, e.g.
    ``"MPICH Version: 4.2.0"`` (for messages and keys)."""
    return " ".join(library_line().split())


def max_count() -> int | None:
    """Elements one message may hold: None where MPI-4 large counts are available,
    else ``2**31 - 1``."""
    return None if MPI.Get_version() >= (4, 0) else (1 << 31) - 1
