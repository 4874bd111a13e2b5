"""Exit codes that tell the truth, and an exit path that works on every network layer.

Each program runs under its own mpiexec with a time limit and the default settings:

- once a rank has decided to abort, the job cannot exit 0: an uncaught exception in a
  thread while the program ends (inside the abort's quarter-second pause before
  MPI_Abort) printed "aborting all 2 ranks" and the job exited 0;
- the exit-time agreement names the source of every receive: a receive from
  MPI_ANY_SOURCE posted after its message had arrived never completes under MPICH's UCX
  network layer, which the mpich wheel uses across hosts and, with
  ``MPIR_CVAR_NOLOCAL=1``, on one host, so every program hung at exit.
"""

from __future__ import annotations

import pytest
from fault_programs.runner import mpiexec, run_mpi
from mpi4py import MPI

needs_mpiexec = pytest.mark.skipif(mpiexec() is None, reason="no mpiexec on PATH")
needs_mpich = pytest.mark.skipif("MPICH" not in MPI.Get_library_version(),
                                 reason="MPIR_CVAR_NOLOCAL is MPICH's")
NOLOCAL = {"MPIR_CVAR_NOLOCAL": "1"}  # no shared memory: every message over the netmod


@needs_mpiexec
@pytest.mark.parametrize("n", [2, 3])
def test_an_abort_decided_while_the_program_ends_never_exits_0(n):
    for _ in range(2):  # a race: the failure comes while rank 0 waits at exit
        res = run_mpi(n, "uncaught.py", "late_thread", timeout=60)
        assert "sbpmpi: rank 0: uncaught in thread 'late': RuntimeError: late failure" \
            in res.out, res
        assert f"aborting all {n} ranks" in res.out, res
        assert res.rc != 0 and res.seconds < 30, res


@needs_mpiexec
@needs_mpich
@pytest.mark.parametrize("n", [2, 3, 4])
def test_a_correct_program_exits_cleanly_without_shared_memory(n):
    """Rank 0 reaches the end last: every other rank's notice has arrived before it looks."""
    res = run_mpi(n, "exit_early.py", "ok_late", env=NOLOCAL, timeout=60)
    assert res.rc == 0 and res.seconds < 30, res
    assert all(f"rank {r}: ok" in res.out for r in range(n)), res
    assert "CollectiveMismatchError" not in res.out, res


@needs_mpiexec
@needs_mpich
@pytest.mark.parametrize("n", [2, 3])
def test_a_collective_on_one_rank_ends_with_the_cause_without_shared_memory(n):
    """The notices of the failing exit path (stuck, verdict) travel the same way."""
    res = run_mpi(n, "exit_early.py", "numpy_late", env=NOLOCAL, timeout=60)
    assert res.rc != 0 and res.seconds < 30, res
    assert "sbpmpi: rank 0: uncaught CollectiveMismatchError" in res.out, res
    finished = "rank 1" if n == 2 else "ranks 1, 2"
    assert f"  {finished}: reached the end of the program" in res.out, res
    for r in range(1, n):
        assert f"sbpmpi: rank {r}: CollectiveMismatchError: ranks disagree on a collective " \
               f"step" in res.out, res
    assert "should not happen" not in res.out, res
