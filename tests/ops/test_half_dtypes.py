"""Every registered op in float16 and bfloat16, against NumPy in float32, at n = 1..4.

For every op's examples (tests/ops/op_examples.py) the float arrays are rounded to the half
dtype (the examples' values, multiples of 1/8 in small ranges, are exact in both), the op
runs through its full path for split, broadcast and partial operands on every mesh of
tests/ops/test_op_table.py, and its result equals NumPy's on the float32 arrays within a
tolerance from the dtype's epsilon; its dtype is the half dtype (float32 for sum_exp). An op NumPy refuses in
float32 (the bitwise ops) must refuse the half dtype with a TypeError naming the op and
the dtype.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import agree
from mpi4py import MPI
from op_examples import EXAMPLES
from test_op_table import CASES, meshes

import sbpmpi as sm
from sbpmpi.core.dtypes import eps
from sbpmpi.ops.registry import REGISTRY
from sbpmpi.testing import make_input

comm = MPI.COMM_WORLD
B = sm.sbp.broadcast
HALVES = [np.dtype(sm.float16), np.dtype(sm.bfloat16)]
#: The number of roundings to the half dtype an op's result may carry: its output's, and
#: those of the steps a split softmax or cross-entropy runs as (each step's result is
#: rounded to the dtype before the next reads it).
ROUNDINGS = 4
#: Ops whose result stays float32 for half-width operands: softmax's partial normaliser
#: on a split dim (summed across ranks in float32, rounded once by softmax_finish).
FLOAT32_RESULTS = {"sum_exp": np.dtype(np.float32)}


def _halved(arrays, dt):
    """The float arrays rounded to ``dt`` (all of them, if none is float: the ops of ints
    and bools are asked about the half dtype too)."""
    arrays = [np.asarray(a) for a in arrays]
    if not any(a.dtype.kind == "f" for a in arrays):
        return [a.astype(dt) if a.ndim else a for a in arrays]
    return [a.astype(dt) if a.dtype.kind == "f" else a for a in arrays]


def _float32(arrays):
    return [a.astype(np.float32) if a.dtype in HALVES else a for a in arrays]


def _tensors(arrays, pl, sbps, rng):
    return [make_input(a, pl, s if s is not None else (B,) * pl.ndim, rng)
            for a, s in zip(arrays, sbps)]


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dt", HALVES, ids=["float16", "bfloat16"])
@pytest.mark.parametrize("name, k", CASES, ids=[f"{n}-{k}" for n, k in CASES])
def test_every_op_in_half_precision_equals_numpy_in_float32(name, k, dt):
    ex = EXAMPLES[name][k]
    arrays = _halved(ex.arrays, dt)
    try:
        with np.errstate(all="ignore"):
            want = np.asarray(ex.reference(*_float32(arrays)))
    except TypeError:
        want = None  # NumPy refuses these dtypes: so must the op
    op = REGISTRY[name].op
    rng = np.random.default_rng(9)
    tol = ROUNDINGS * eps(dt)
    for pl in meshes():
        kinds = (B,) if want is None else (B, sm.sbp.split(0), sm.sbp.partial_sum)
        for kind in kinds:
            sbps = [None if a.ndim == 0 or (kind == sm.sbp.partial_sum
                                            and a.dtype not in HALVES)
                    else (kind,) * pl.ndim for a in arrays]
            args, kwargs = ex.call(*_tensors(arrays, pl, sbps, rng))
            if want is None:
                with pytest.raises(TypeError) as info:
                    op(*args, **kwargs)
                msg = str(info.value)
                assert name in msg and dt.name in msg, msg
                continue
            with np.errstate(all="ignore"):
                got = op(*args, **kwargs).numpy()

            def check(got=got, kind=kind, pl=pl):
                what = (name, k, dt.name, pl, kind)
                if want.dtype.kind == "f" and name != "astype":
                    assert got.dtype == FLOAT32_RESULTS.get(name, dt), (what, got.dtype)
                g = got.astype(np.float32) if got.dtype in HALVES else got
                assert g.shape == want.shape, (what, g.shape, want.shape)
                if want.dtype.kind == "f":
                    scale = max(1.0, float(np.nanmax(np.abs(want), initial=0.0)))
                    np.testing.assert_allclose(g, want, rtol=tol, atol=tol * scale,
                                               equal_nan=True, err_msg=str(what))
                else:
                    np.testing.assert_array_equal(g, want, err_msg=str(what))

            agree(check)
