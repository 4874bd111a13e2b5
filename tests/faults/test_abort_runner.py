"""The abort runner: python -m sbpmpi.abort runs a script, ``-m module`` or ``-c code`` (as python -m mpi4py),
and a failure on one rank, an exception or sys.exit(n), ends the whole job."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from mpirun import job_env, mpiexec

TIMEOUT = 90

FAIL = ("from mpi4py import MPI; import sys; w = MPI.COMM_WORLD\n"
        "if w.Get_rank() == w.Get_size() - 1: {action}\n"
        "w.Barrier()\n"
        "open(f'out-{{w.Get_rank()}}', 'w').write(repr(sys.argv[1:]))\n")


def run(n, program, cwd, extra_env=None):
    t0 = time.monotonic()
    r = subprocess.run([*mpiexec(n), sys.executable, "-m", "sbpmpi.abort", *program], cwd=cwd,
                       env=job_env(n, TIMEOUT, extra_env), capture_output=True, text=True,
                       timeout=TIMEOUT)
    return r, time.monotonic() - t0


@pytest.mark.parametrize("how", ["script", "-m", "-c"])
def test_abort_runner_runs_each_kind_of_program(tmp_path, how):
    src = FAIL.format(action="pass")
    (tmp_path / "prog_mod.py").write_text(src)
    program = {"script": [str(tmp_path / "prog_mod.py")], "-m": ["-m", "prog_mod"],
               "-c": ["-c", src]}[how]
    r, _ = run(2, [*program, "a", "--b"], tmp_path, {"PYTHONPATH": str(tmp_path)} if how == "-m"
               else None)
    assert r.returncode == 0, r.stderr[-3000:]
    for rank in (0, 1):
        assert (tmp_path / f"out-{rank}").read_text() == "['a', '--b']"


@pytest.mark.parametrize("action,says", [("raise KeyError('planted')", "KeyError: 'planted'"),
                                         ("sys.exit(5)", "sys.exit(5)")])
def test_abort_runner_ends_the_job_when_one_rank_fails(tmp_path, action, says):
    r, took = run(2, ["-c", FAIL.format(action=action)], tmp_path)
    assert r.returncode != 0
    assert took < 60, f"the job took {took:.0f} s: the other rank was left waiting"
    assert "sbpmpi: rank 1:" in r.stderr and says in r.stderr, r.stderr[-3000:]


def test_abort_runner_usage():
    r = subprocess.run([sys.executable, "-m", "sbpmpi.abort", "-c"], capture_output=True,
                       text=True, timeout=TIMEOUT, env=job_env(1, TIMEOUT))
    assert r.returncode == 2 and "-c code" in r.stderr
