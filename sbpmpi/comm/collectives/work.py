"""The handle of a non-blocking collective (``all_reduce(..., async_op=True)``).

MPI does not promise that a started collective advances while the caller computes, so
whoever waits for it calls :meth:`CollectiveWork.test` now and then (each call lets the
MPI library move the data along) and :meth:`CollectiveWork.wait` when the result is
needed. The wait runs inside the watchdog context made when the call started (so the
exit watch numbers the call where every rank starts it, as for a blocking call); a GPU
array staged through host memory is filled, and the staging buffers released, at
completion. :func:`all_done` polls many at once (one ``MPI_Testall``), for a caller that
drives several between computations.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from mpi4py import MPI

from ..buffers import HostStager

__all__ = ["CollectiveWork", "all_done"]


class CollectiveWork:
    """A started collective: ``wait()`` blocks until it is done, ``test()`` polls.

    The caller must not touch the array before completion (as with ``MPI_Iallreduce``).
    """

    __slots__ = ("_req", "_stager", "_keep", "_watch", "_after", "_done", "name")

    def __init__(self, name: str, req: MPI.Request | None, stager: HostStager, keep: Any,
                 watch: Any, after: Callable[[], None] | None = None) -> None:
        self.name = name
        self._req = req
        self._stager = stager
        self._keep = keep  # the buffer MPI works on, alive until completion
        self._watch = watch
        self._after = after
        self._done = req is None
        if self._done:
            self._stager.release()

    def _complete(self) -> None:
        self._done = True
        try:
            if self._after is not None:
                self._after()
            self._stager.finish()
        finally:
            self._stager.release()
            self._keep = self._after = self._watch = None

    def wait(self) -> bool:
        """Block until the collective is done; returns True."""
        if not self._done:
            req = self._req
            assert req is not None
            with self._watch:
                req.Wait()
            self._complete()
        return True

    def test(self) -> bool:
        """True when the collective is done (then the array holds the result)."""
        if not self._done:
            req = self._req
            assert req is not None
            if req.Test():
                self._complete()
        return self._done

    def is_completed(self) -> bool:
        """Same as :meth:`test` (torch.distributed's name)."""
        return self.test()

    def __repr__(self) -> str:
        return f"<CollectiveWork {self.name} {'done' if self._done else 'pending'}>"


def all_done(works: Sequence[CollectiveWork]) -> bool:
    """True when every one of ``works`` is done (then each is completed).

    One ``MPI_Testall`` over the requests still pending, however many they are: it lets
    the MPI library advance all of them, as a :meth:`CollectiveWork.test` of each would.
    """
    pending = [w for w in works if not w._done]
    if not pending:
        return True
    reqs = [w._req for w in pending]
    if not MPI.Request.Testall(reqs):  # type: ignore[arg-type]
        return False
    for w in pending:
        w._complete()
    return True
