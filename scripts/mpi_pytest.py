"""Run pytest on one MPI rank: rank 0 prints, other ranks write to test-logs/.

Used by run_tests.py as ``mpiexec -n N python scripts/mpi_pytest.py PYTEST_ARGS``.
"""

from __future__ import annotations

import os
import sys

import pytest
from mpi4py import MPI

rank = MPI.COMM_WORLD.Get_rank()
size = MPI.COMM_WORLD.Get_size()
logdir = os.environ.get("SBPMPI_TEST_LOGDIR", "test-logs")
args = sys.argv[1:]
if rank != 0:
    os.makedirs(logdir, exist_ok=True)
    fd = os.open(os.path.join(logdir, f"n{size}-rank{rank}.log"),
                 os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    args = [a for a in args if not a.startswith("--junitxml")]
rc = pytest.main(args)
sys.stdout.flush()
sys.stderr.flush()
# a failure on any rank fails the whole run
worst = MPI.COMM_WORLD.allreduce(int(rc), op=MPI.MAX)
sys.exit(worst)
