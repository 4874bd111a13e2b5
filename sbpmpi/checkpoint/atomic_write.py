"""Atomic writes: a file appears under its final name complete, or not at all.

Every file is written under a temporary name in the same directory
(``.<name>.sbpmpi-tmp-<random>``) and renamed into place (``os.replace``, then an
fsync of the directory). :func:`write_collectively` does this for a file that all
ranks write together: rank 0 creates the temporary file, every rank writes its part,
and the rename happens only once every rank has succeeded; otherwise rank 0 removes
the temporary file and every rank raises the same error. :func:`write_text` does it
for a small file one rank writes alone (a state directory's index).

A file that replaces another keeps its permission bits (a checkpoint made ``chmod 600``
stays so): the temporary file is created with them (and writable by its owner while it
is written: a read-only checkpoint can still be replaced), before any data is in it, and
is given them exactly just before the rename.
"""

from __future__ import annotations

import os
import stat
import uuid
from collections.abc import Callable
from typing import NamedTuple

from ..comm import agreement, file_io
from ..env import get_rank

__all__ = ["TMP_TAG", "temp_name", "mode_of", "write_collectively", "write_text", "commit",
           "discard", "named"]

TMP_TAG = ".sbpmpi-tmp-"


def temp_name(path: str) -> str:
    """A fresh temporary name beside ``path``: ``.<name>.sbpmpi-tmp-<12 hex digits>``."""
    directory, base = os.path.split(path)
    return os.path.join(directory, f".{base}{TMP_TAG}{uuid.uuid4().hex[:12]}")


def mode_of(path: str) -> int | None:
    """The permission bits of the regular file ``path``, or None when there is none."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return stat.S_IMODE(st.st_mode) if stat.S_ISREG(st.st_mode) else None


def named(e: BaseException, text: str) -> BaseException:
    """An ``OSError`` ``e`` again, its message ``"<text>: <cause>"`` (the same subclass
    through its errno); any other error as it is."""
    if not isinstance(e, OSError):
        return e
    if e.errno is None:
        return type(e)(f"{text}: {e}")
    return OSError(e.errno, f"{text}: {e.strerror}")


def _create(tmp: str, mode: int | None) -> None:
    """Create the empty file ``tmp`` (never an existing one), with ``mode`` if given (and
    writable by its owner: it is about to be written)."""
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        if mode is not None:
            os.fchmod(fd, mode | stat.S_IWUSR)
    except BaseException:
        os.close(fd)
        discard(tmp)
        raise
    os.close(fd)


class _Target(NamedTuple):
    """Rank 0's verdict before a collective write: the temporary file and its final mode."""

    tmp: str
    mode: int | None  # None: the umask's, as for any new file


def _prepare_target(path: str, mode: int | None) -> _Target:
    """Rank 0: check the target's directory; create a fresh temporary file beside it with
    ``mode`` (by default that of the file it replaces)."""
    directory = os.path.dirname(path) or "."
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"directory {directory!r} of {path!r} does not exist")
    if os.path.isdir(path):
        raise IsADirectoryError(f"{path!r} is a directory")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise PermissionError(f"directory {directory!r} is not writable")
    tmp = temp_name(path)
    mode = mode_of(path) if mode is None else mode
    _create(tmp, mode)
    return _Target(tmp, mode)


def write_collectively(path: str, what: str, write: Callable[[str], None],
                       mode: int | None = None) -> None:
    """Collective: ``write(tmp)`` on every rank, then rename ``tmp`` to ``path`` on rank 0.

    Rank 0 checks the directory and creates ``tmp`` with the permission bits ``mode``
    (by default those of the file ``path`` replaces; the umask's for a new one). An
    error there raises ``"<what> '<path>': <message>"`` on every rank before anything is
    written. If ``write`` fails on any rank, rank 0 removes ``tmp`` and every rank raises
    the same error ``"<what> '<path>': rank R: <message>"``: an error that ``write``
    already raised on every rank alike (its steps agree, as :mod:`sbpmpi.comm.file_io`'s
    do) as it is, any other after one exchange (:func:`sbpmpi.comm.agreement.raise_if_any`).
    The file under ``path`` is untouched. The rename's error names rank 0, which does it.
    """
    label = f"{what} {path!r}"
    tmp, final_mode = agreement.decide_on_root(lambda: _prepare_target(path, mode), label)
    error: Exception | None = None
    try:
        write(tmp)
    except Exception as e:
        error = e
    try:
        # an error raised on every rank alike is on every rank: nothing to agree on
        if error is not None and agreement.raised_on_every_rank(error):
            raise error
        agreement.raise_if_any(error, label)
    except Exception:
        if get_rank() == 0:
            discard(tmp)
        raise
    # looked up at call time, so that a test can make rank 0 die just before the rename
    agreement.decide_on_root(lambda: commit(tmp, path, final_mode), f"{label}: rank 0")


def write_text(path: str, text: str, mode: int | None = None) -> None:
    """One rank: write ``text`` (UTF-8) to ``path`` atomically, fsynced before the rename,
    with the permission bits ``mode`` (by default those of the file it replaces).

    On failure the temporary file is removed and the ``OSError`` names ``path``.
    """
    tmp = temp_name(path)
    if mode is None:
        mode = mode_of(path)
    try:
        _create(tmp, mode)
        with open(tmp, "w", encoding="utf8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        file_io.fault_point("index", path)
    except BaseException as e:
        discard(tmp)
        error = named(e, f"cannot write {path!r}")
        if error is e:
            raise
        raise error from e
    commit(tmp, path, mode)


def commit(tmp: str, path: str, mode: int | None = None) -> None:
    """Give ``tmp`` the permission bits ``mode`` (if not None), rename it to ``path`` and
    fsync the directory; on failure remove ``tmp`` and raise the ``OSError`` naming both."""
    try:
        file_io.fault_point("rename", path)
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except OSError as e:
        discard(tmp)
        raise named(e, f"cannot rename {tmp!r} to {path!r}") from e
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
