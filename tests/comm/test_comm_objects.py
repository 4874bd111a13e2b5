"""sbpmpi.comm object calls and the namespace under MPI: barrier, all_gather_object,
broadcast_object, all_agree, ``sm.comm``.
"""

from __future__ import annotations

import pytest
from mpi4py import MPI

import sbpmpi as sm
from sbpmpi import comm as C

world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()


@pytest.mark.mpi(min_size=1)
def test_barrier_and_objects(chk):
    C.barrier()
    assert C.all_gather_object({"r": rank}) == [{"r": r} for r in range(size)]
    assert C.broadcast_object(("x", rank), src=size - 1) == ("x", size - 1)
    assert C.all_agree(True) is True
    assert C.all_agree(rank != size - 1) is False


@pytest.mark.mpi(min_size=1)
def test_sm_comm_namespace(chk):
    assert sm.comm is C
    for name in C.__all__:
        assert hasattr(C, name), name
