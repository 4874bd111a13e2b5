"""Atomic writes: a file appears under its final name complete, or not at all.

Every file is written under a temporary name in the same directory
(``.<name>.sbpmpi-tmp-<random>``) and renamed into place (``os.replace``, then an
fsync of the directory). :func:`write_collectively` does this for a file that all
ranks write together: rank 0 picks the temporary name, every rank writes its part,
and the rename happens only once every rank has succeeded; otherwise rank 0 removes
the temporary file and every rank raises the same error. :func:`write_text` does it
for a small file one rank writes alone (a state directory's index).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable

from ..comm import agreement
from ..env import get_rank

__all__ = ["TMP_TAG", "temp_name", "write_collectively", "write_text", "commit", "discard"]

TMP_TAG = ".sbpmpi-tmp-"


def temp_name(path: str) -> str:
    """A fresh temporary name beside ``path``: ``.<name>.sbpmpi-tmp-<12 hex digits>``."""
    directory, base = os.path.split(path)
    return os.path.join(directory, f".{base}{TMP_TAG}{uuid.uuid4().hex[:12]}")


def _prepare_target(path: str) -> str:
    """Rank 0: check the target's directory; return a fresh temporary name beside it."""
    directory = os.path.dirname(path) or "."
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"directory {directory!r} of {path!r} does not exist")
    if os.path.isdir(path):
        raise IsADirectoryError(f"{path!r} is a directory")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise PermissionError(f"directory {directory!r} is not writable")
    return temp_name(path)


def write_collectively(path: str, what: str, write: Callable[[str], None]) -> None:
    """Collective: ``write(tmp)`` on every rank, then rename ``tmp`` to ``path`` on rank 0.

    Rank 0 checks the directory and picks ``tmp`` (an error there raises
    ``"<what>: <message>"`` on every rank before anything is written). If ``write``
    fails on any rank, rank 0 removes ``tmp`` and every rank raises the same error
    ``"<what> '<path>': rank R: <message>"``; the file under ``path`` is untouched.
    One exchange decides that: :func:`sbpmpi.comm.agreement.raise_if_any` alone.
    """
    tmp = agreement.decide_on_root(lambda: _prepare_target(path), what)
    error: Exception | None = None
    try:
        write(tmp)
    except Exception as e:
        error = e
    try:
        agreement.raise_if_any(error, f"{what} {path!r}")
    except Exception:
        if get_rank() == 0:
            discard(tmp)
        raise
    # looked up at call time, so that a test can make rank 0 die just before the rename
    agreement.decide_on_root(lambda: commit(tmp, path), what)


def write_text(path: str, text: str) -> None:
    """One rank: write ``text`` (UTF-8) to ``path`` atomically, fsynced before the rename."""
    tmp = temp_name(path)
    with open(tmp, "w", encoding="utf8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    commit(tmp, path)


def commit(tmp: str, path: str) -> None:
    """Rename ``tmp`` to ``path`` and fsync the directory; on failure remove ``tmp``."""
    try:
        os.replace(tmp, path)
    except OSError:
        discard(tmp)
        raise
    _fsync_dir(os.path.dirname(path))


def discard(tmp: str) -> None:
    """Remove ``tmp`` if it is there (errors ignored)."""
    try:
        os.remove(tmp)
    except OSError:
        pass


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
