"""A rank raising inside a pipeline stage's forward or backward, with transfers between
stages in flight, ends the job in seconds with the cause on every rank; a step that
raises on every rank and is caught leaves nothing posted behind (fault programs under
their own mpiexec: tests/fault_programs/pipeline_raise.py, pipeline_failed_step.py)."""

from __future__ import annotations

import pytest
from fault_programs.runner import mpiexec, run_mpi

needs_mpiexec = pytest.mark.skipif(mpiexec() is None, reason="no mpiexec on PATH")


@needs_mpiexec
@pytest.mark.parametrize("where, schedule", [("forward", "1f1b"), ("backward", "1f1b"),
                                             ("forward", "gpipe"), ("backward", "interleaved")])
def test_a_rank_raising_in_a_stage_ends_the_job(where, schedule):
    res = run_mpi(3, "pipeline_raise.py", where, schedule, timeout=60)
    failed = 2 if where == "forward" else 0
    assert res.rc != 0 and res.seconds < 30, res
    assert f"sbpmpi: rank {failed}: uncaught RuntimeError: stage {where} failed on rank " \
           f"{failed}" in res.out, res
    assert f"rank {failed}: aborting all 3 ranks" in res.out, res
    started = [line for line in res.out.splitlines() if "messages started before" in line]
    assert started and int(started[0].split(": ")[1].split()[0]) > 0, res
    assert "should not happen" not in res.out, res


@needs_mpiexec
@pytest.mark.parametrize("where", ["forward", "backward"])
def test_with_abort_off_every_rank_reports_the_failed_rank(where):
    res = run_mpi(3, "pipeline_raise.py", where, env={"SBPMPI_ABORT_ON_ERROR": "0"},
                  timeout=60)
    failed = 2 if where == "forward" else 0
    assert res.rc != 0 and res.seconds < 30, res
    assert f"RuntimeError: stage {where} failed on rank {failed}" in res.out, res
    assert res.out.count(f"rank {failed}: reached the end of the program") == 3, res
    assert "should not happen" not in res.out, res


@needs_mpiexec
@pytest.mark.parametrize("n, where, check", [(2, "forward", "1"), (2, "forward", "0"),
                                             (3, "backward", "1"), (3, "backward", "0"),
                                             (4, "forward", "0")])
def test_every_rank_prints_the_failed_ranks_cause(n, where, check):
    """The raising rank's abort tells the others its cause before ``MPI_Abort``: a rank
    waiting for a transfer (point-to-point, ``SBPMPI_CHECK=0``) or in a check's exchange
    raises ``PeerAbortedError`` with it, so every rank's output says why the job ended."""
    res = run_mpi(n, "pipeline_raise.py", where, env={"SBPMPI_CHECK": check}, timeout=60)
    failed = n - 1 if where == "forward" else 0
    cause = f"RuntimeError: stage {where} failed on rank {failed}"
    assert res.rc != 0 and res.seconds < 30, res
    lines = res.out.splitlines()
    for r in range(n):
        assert any(line.startswith(f"sbpmpi: rank {r}: ") and cause in line
                   for line in lines), (r, res)
    for r in set(range(n)) - {failed}:  # raised where it waits (or said by the exit watch)
        assert any(line.startswith(f"sbpmpi: rank {r}: ") and
                   f"PeerAbortedError: rank {failed} is aborting the job: uncaught {cause}"
                   in line for line in lines), (r, res)
    assert "should not happen" not in res.out, res


@needs_mpiexec
@pytest.mark.parametrize("n, schedule", [(2, "1f1b"), (3, "gpipe"), (4, "1f1b"),
                                         (2, "interleaved")])
def test_steps_after_a_caught_failed_step_are_correct(n, schedule):
    """A step that raises partway (a mis-shaped target), caught, with transfers in
    flight, twenty times over: each later step runs, with NumPy's loss (the transfers
    the failed step left posted on freed buffers used to crash the job)."""
    res = run_mpi(n, "pipeline_failed_step.py", schedule, timeout=120)
    assert res.rc == 0, res
    for r in range(n):
        assert f"rank {r}: 20 correct steps after caught failures, losses as NumPy's" \
            in res.out, res
