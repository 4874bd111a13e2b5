"""A rank raising inside a replay of a captured step ends the job in seconds with the
cause (fault program under its own mpiexec: tests/fault_programs/graph_raise.py): a
replay runs no op's error agreement, so the raising rank's abort (or, with aborts off,
the exit watch) is what ends the others' wait in their next collective."""

from __future__ import annotations

import pytest
from fault_programs.runner import mpiexec, run_mpi

needs_mpiexec = pytest.mark.skipif(mpiexec() is None, reason="no mpiexec on PATH")
CAUSE = "IndexError: embedding: index 99 is out of range for a weight of 7 rows"


@needs_mpiexec
def test_a_rank_raising_in_a_replay_ends_the_job():
    res = run_mpi(3, "graph_raise.py", timeout=60)
    assert res.rc != 0 and res.seconds < 30, res
    assert f"sbpmpi: rank 2: uncaught {CAUSE}" in res.out, res
    assert "rank 2: aborting all 3 ranks" in res.out, res
    assert "rank 0: call 3: loss" in res.out, res  # two replays ran before
    assert "should not happen" not in res.out, res


@needs_mpiexec
def test_every_rank_prints_the_cause():
    """The other ranks wait in a blocking collective of the replay, which cannot poll:
    the exit watch's thread sees the raising rank's abort notice and prints its cause."""
    res = run_mpi(3, "graph_raise.py", timeout=60)
    assert res.rc != 0 and res.seconds < 30, res
    for r in (0, 1):
        assert f"sbpmpi: rank {r}: PeerAbortedError: rank 2 is aborting the job: " \
               f"uncaught {CAUSE}" in res.out, (r, res)


@needs_mpiexec
def test_with_abort_off_every_rank_learns_that_the_failed_rank_ended():
    res = run_mpi(3, "graph_raise.py", env={"SBPMPI_ABORT_ON_ERROR": "0"}, timeout=60)
    assert res.rc != 0 and res.seconds < 30, res
    assert CAUSE in res.out, res
    assert res.out.count("rank 2: reached the end of the program") >= 2, res
    assert "should not happen" not in res.out, res
