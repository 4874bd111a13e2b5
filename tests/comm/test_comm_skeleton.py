"""The one call skeleton of sbpmpi.comm (comm/call.py) and the facts of comm.info.

Every call, collective or point to point, must run its MPI call inside the watchdog and
note itself in the active traces; the even reduce_scatter (boxing's P->S) once ran
unwatched.
"""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import sbpmpi as sm
from sbpmpi import comm as C
from sbpmpi.comm import call as call_mod
from sbpmpi.comm import nan_reduction, p2p
from sbpmpi.comm.collectives import objects, regular, vector
from sbpmpi.comm.lifecycle import watchdog

world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()


def _calls():
    """(name, function) for every public sbpmpi.comm call, valid at any world size."""
    p, n = size, 2
    x = np.arange(n, dtype=np.float64) + rank
    big = np.arange(p * n, dtype=np.float64) + rank
    counts = [n] * p

    def isend_irecv():
        r = C.irecv(np.empty(n), src=rank, tag=3)
        C.isend(x, dst=rank, tag=3).wait()
        r.wait()

    return [
        ("barrier", lambda: C.barrier()),
        ("broadcast", lambda: C.broadcast(x.copy(), src=0)),
        ("reduce", lambda: C.reduce(x.copy(), dst=p - 1)),
        ("all_reduce", lambda: C.all_reduce(x.copy())),
        ("gather", lambda: C.gather(x, np.empty(p * n) if rank == 0 else None, dst=0)),
        ("all_gather", lambda: C.all_gather(np.empty(p * n), x)),
        ("scatter", lambda: C.scatter(np.empty(n), big if rank == 0 else None, src=0)),
        ("reduce_scatter", lambda: C.reduce_scatter(np.empty(n), big)),
        ("all_to_all", lambda: C.all_to_all(np.empty(p * n), big)),
        ("all_gather_v", lambda: C.all_gather_v(np.empty(p * n), x, counts)),
        ("gather_v", lambda: C.gather_v(x, np.empty(p * n) if rank == 0 else None, counts)),
        ("scatter_v", lambda: C.scatter_v(np.empty(n), big if rank == 0 else None, counts)),
        ("reduce_scatter_v", lambda: C.reduce_scatter_v(np.empty(n), big, counts)),
        ("all_to_all_v", lambda: C.all_to_all_v(np.empty(p * n), counts, big, counts)),
        ("all_gather_object", lambda: C.all_gather_object(rank)),
        ("broadcast_object", lambda: C.broadcast_object(rank, src=0)),
        ("all_agree", lambda: C.all_agree(True)),
        ("wait", isend_irecv),
    ]


@pytest.fixture
def watched(monkeypatch):
    """The ops every comm call passes to the watchdog, in order: the skeleton's
    ``Call.mpi_call``, ``Work.wait`` and the NaN flag exchange of a float max/min
    (``nan_reduction``) are the only places that watch."""
    seen: list[str] = []
    real = watchdog.watch

    def spy(op, peers=None, seconds=None):
        seen.append(op)
        return real(op, peers, seconds)

    for mod in (p2p, call_mod, nan_reduction):
        monkeypatch.setattr(mod, "watch", spy)
    for mod in (regular, vector, objects):  # no module but call.py watches
        assert not hasattr(mod, "watch"), mod
    return seen


@pytest.mark.mpi(min_size=1)
def test_every_call_is_watched(watched):
    for name, fn in _calls():
        watched.clear()
        fn()
        assert name in watched, (name, watched)
    watched.clear()
    C.reduce_scatter(np.empty(1), np.ones(size))  # the even P->S path boxing uses
    assert watched == ["reduce_scatter"]
    watched.clear()
    C.all_reduce(np.ones(3), op=C.ReduceOp.MAX)  # the NaN flag of a float max is watched too
    assert watched == ["NaN flag of a max/min reduction", "all_reduce"]
    if size > 1:
        watched.clear()
        y = np.empty(1)
        if rank == 0:
            C.send(np.ones(1), dst=1)
        elif rank == 1:
            C.recv(y, src=0)
        assert watched == (["send"] if rank == 0 else ["recv"] if rank == 1 else [])


@pytest.mark.mpi(min_size=1)
def test_every_call_is_traced():
    for name, fn in _calls():
        with sm.trace() as t:
            fn()
        ops = [r.op for r in t]
        want = ["irecv", "isend"] if name == "wait" else [name]
        assert ops == want, (name, ops)
    with sm.trace() as t:
        C.reduce_scatter(np.empty(2), np.ones(2 * size))
    assert t[0].nbytes == 2 * size * 8 and t[0].group_size == size


@pytest.mark.mpi(min_size=1)
def test_calls_are_cached_per_group():
    c = call_mod.call("all_reduce", None)
    assert call_mod.call("all_reduce", None) is c and c.g is C.WORLD
    g = C.new_group([0])  # collective over rank 0 only
    if rank == 0:
        assert call_mod.call("all_reduce", g) is call_mod.call("all_reduce", g)
    else:
        for _ in range(2):  # a refused call is not cached: asked again, it is refused again
            with pytest.raises(ValueError, match="not a member"):
                call_mod.call("all_reduce", g)
    with pytest.raises(TypeError, match="group must be an sbpmpi.comm.Group or None"):
        C.all_reduce(np.ones(1), group=[0])  # an unhashable group is refused as before


def test_info_is_the_one_place_for_library_facts():
    from sbpmpi.comm import cuda_aware
    from sbpmpi.comm.mpi_library import library_line, library_name, max_count
    from sbpmpi.runtime import execute

    first = MPI.Get_library_version().replace("\0", "").strip().splitlines()[0].strip()
    assert library_line() == first
    assert library_name() == " ".join(first.split())
    assert cuda_aware.library_name is library_name
    assert C.info()["mpi_library"] == library_name()
    assert max_count() == (None if MPI.Get_version() >= (4, 0) else 2**31 - 1)
    assert execute.MAX_COUNT == max_count()
