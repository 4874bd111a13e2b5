"""examples/train_gpt.py --layout pp|3d: the GPT in pipeline stages trains with the
losses of the one-process NumPy reference (float64, dropout 0, relative 1e-10) at every
step, for each schedule, stages on one rank, on tensor-parallel rows and on data-parallel
columns of a dp x pp x tp mesh, and uneven blocks per stage.

Small sizes keep it quick; 50 steps per configuration, the issue's count (the example's own
command runs 50 too: docs/pipelines.md).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import train_gpt  # noqa: E402

comm = MPI.COMM_WORLD
size = comm.Get_size()
STEPS = 50
SMALL = ["--heads", "2", "--dim", "8", "--seq", "4", "--batch", "8", "--sample", "4",
         "--check", "--steps", str(STEPS)]

#: (world size, arguments): the Done-when configurations of issue 33
CASES = [
    (2, "--layout pp --pp 2 --microbatches 4 --schedule gpipe --layers 2"),
    (2, "--layout pp --pp 2 --microbatches 4 --schedule 1f1b --layers 2"),
    (2, "--layout pp --pp 2 --microbatches 4 --schedule interleaved --layers 4"),
    (2, "--layout pp --pp 2 --microbatches 4 --schedule 1f1b --layers 3"),  # 2 + 1 blocks
    (4, "--layout pp --pp 4 --microbatches 8 --schedule 1f1b --layers 4"),
    (4, "--layout pp --pp 4 --microbatches 8 --schedule interleaved --layers 2"),
    (4, "--layout 3d --pp 2 --tp 2 --microbatches 4 --schedule 1f1b --layers 2"),
    (4, "--layout pp --pp 2 --microbatches 4 --schedule gpipe --layers 3"),  # dp 2 x pp 2
]


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("n, argv", CASES, ids=[f"n{n}-{a.split('--schedule ')[1]}-"
                                                  f"{a.split()[1]}-pp{a.split()[3]}"
                                                  f"-{a.split()[-1]}blocks" for n, a in CASES])
def test_pipelined_gpt_matches_the_reference(n, argv):
    if size != n:
        pytest.skip(f"runs at n={n}")
    args = train_gpt.parse(argv.split() + SMALL)
    run = train_gpt.train(args)
    assert len(run.losses) == STEPS
    assert run.worst <= 1e-10, f"relative difference {run.worst:.3e} from the reference"
    assert comm.allgather(run.losses) == [run.losses] * size
    assert run.losses[-1] < run.losses[0]


@pytest.mark.mpi(min_size=2)
def test_check_needs_equal_micro_batches():
    args = train_gpt.parse("--layout pp --pp 2 --microbatches 3 --batch 8 --check".split())
    with pytest.raises(SystemExit, match="does not divide"):
        train_gpt.train(args)
