"""A rank raising inside a pipeline stage's forward or backward, with transfers between
stages in flight, ends the job in seconds with the cause (fault programs under their own
mpiexec: tests/fault_programs/pipeline_raise.py)."""

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
