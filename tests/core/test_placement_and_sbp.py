"""Placements and SBPs refuse bad arguments with the same error on every rank, at n = 1..4:
the rows of the bad input matrix (tests/bad_input.py) for ``sm.placement`` and ``sm.sbp``.
"""

from __future__ import annotations

import pytest
from bad_input import Row, check_row
from mpi4py import MPI

import sbpmpi as sm

size = MPI.COMM_WORLD.Get_size()
S = sm.sbp.split

BAD_INPUTS = [
    Row("placement-type", lambda c: sm.placement("tpu", [0]), ValueError,
        "placement type 'tpu' is not supported"),
    Row("placement-empty", lambda c: sm.placement("cpu", []), ValueError,
        "must name at least one rank"),
    Row("placement-out-of-range", lambda c: sm.placement("cpu", [0, size]), ValueError,
        f"placement ranks [{size}] are out of range for a world of {size}"),
    Row("placement-negative-rank", lambda c: sm.placement("cpu", [-1]), ValueError,
        "out of range"),
    Row("placement-duplicate", lambda c: sm.placement("cpu", [0, 0]), ValueError,
        "must be distinct"),
    Row("placement-float-rank", lambda c: sm.placement("cpu", [0.5]), TypeError,
        "placement ranks must be integers, got float 0.5"),
    Row("placement-ragged", lambda c: sm.placement("cpu", [[0], [0, 0]]), (ValueError, TypeError),
        "[[0], [0, 0]]"),
    Row("split-float-dim", lambda c: S(1.5), TypeError, "split dim must be an int, got float 1.5"),
    Row("split-str-dim", lambda c: S("0"), TypeError, "split dim must be an int, got str '0'"),
    Row("partial-op", lambda c: sm.sbp.Partial("avg"), ValueError,
        "partial op 'avg' is not one of 'sum', 'max', 'min'"),
]


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("row", BAD_INPUTS, ids=[r.id for r in BAD_INPUTS])
def test_bad_placement_or_sbp_raises_the_same_error_on_every_rank(bad_input_ctx, row, request):
    check_row(row, bad_input_ctx, request)
