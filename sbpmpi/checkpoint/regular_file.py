"""Reading only regular files, without blocking: a FIFO (or a device, a socket) at a
checkpoint's path raises instead of hanging the rank that opens it, and with it the job.

The path is checked with ``stat`` before it is opened, and opened with ``O_NONBLOCK``
and checked again (``fstat``), in case something else was put there in between. No MPI
here: one rank reads, and the caller shares the verdict.
"""

from __future__ import annotations

import os
import stat
from typing import BinaryIO

from ..errors import CheckpointError

__all__ = ["check_regular", "open_regular"]

_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def _refuse(path: str, mode: int) -> None:
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(f"{path!r} is a directory, not a file")
    if not stat.S_ISREG(mode):
        kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
        raise CheckpointError(f"{path!r} is {kind}, not a regular file: checkpoints are read "
                              f"from regular files only")


def check_regular(path: str) -> os.stat_result:
    """``os.stat(path)`` when ``path`` is a regular file (links followed).

    Raises FileNotFoundError (``"no such file"``), IsADirectoryError, or CheckpointError
    naming what else it is.
    """
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise FileNotFoundError(f"no such file {path!r}") from None
    _refuse(path, st.st_mode)
    return st


def open_regular(path: str) -> BinaryIO:
    """``path`` opened for binary reading, once :func:`check_regular` passes; never blocks."""
    check_regular(path)
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        _refuse(path, os.fstat(fd).st_mode)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
