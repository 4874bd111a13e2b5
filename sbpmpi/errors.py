"""Exceptions raised by sbpmpi's reliability checks.

Each is raised identically on every rank that takes part in the failing step, so an
SPMD program either handles it everywhere or aborts everywhere.
"""

from __future__ import annotations

__all__ = ["SbpmpiError", "CollectiveMismatchError", "PeerAbortedError", "CheckpointError",
           "CopyWriteError"]


class SbpmpiError(RuntimeError):
    """Base class of sbpmpi's own errors."""


class CollectiveMismatchError(SbpmpiError):
    """Ranks disagree on a collective step: different op, shape, SBP, dtype or placement.

    Also raised in debug mode (``SBPMPI_DEBUG=1``) when the shards of a broadcast
    mesh axis are not identical.
    """


class PeerAbortedError(SbpmpiError):
    """Another rank is aborting the job (an uncaught exception there): raised on a rank
    that waits for a message or a check while the abort is under way, with the other
    rank's cause, so that every rank's output says why the job ended."""


class CheckpointError(SbpmpiError, ValueError):
    """A checkpoint file or index is missing parts, truncated, or not what it claims to be."""


class CopyWriteError(SbpmpiError, ValueError):
    """A write into a tensor that is a copy where NumPy would give a view (basic indexing
    that had to move data): it would not reach the tensor the copy was taken from, so it
    is refused instead of diverging from NumPy silently. ``.copy()`` gives a writable one."""
