"""Reductions of float16 and bfloat16 tensors accumulate in float32, on every layout, at
n = 1..4 (issue 41).

Each reduction (mean, var, std, vector_norm, softmax, log_softmax, layer_norm, prod,
cumulative_sum, matmul) runs on 1,001 and 70,000 values: 1-D arrays split along their
one dim or broadcast, and 2-D arrays reduced along their last dim, split along the kept
dim, along the reduced dim, or broadcast (matmul: its contraction dim of that length).
The result equals NumPy's computed on the float32 values and rounded to the half dtype
within one ulp of the half dtype (two half-ulps: both sides round float32 values that
differ in their last bits), and keeps the half dtype. A sum rounded to bfloat16 at every
step stops growing at 256 (bfloat16's 8 bits), so 1,001 values near 1 average 0.26.

The gradients of mean, var, softmax and layer_norm of half-width tensors equal NumPy's
analytic ones in float32 within a few ulps.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import agree
from mpi4py import MPI

import sbpmpi as sm
from sbpmpi import array_api as xp
from sbpmpi.core.dtypes import eps

comm = MPI.COMM_WORLD
S0, S1, B = sm.sbp.split(0), sm.sbp.split(1), sm.sbp.broadcast
HALVES = [np.dtype(sm.float16), np.dtype(sm.bfloat16)]
RNG = np.random.default_rng(41)
#: 1,001 and 70,000 values: 1-D, and 2-D reduced along their last dim.
VALUES = {shape: 1.0 + 0.5 * RNG.standard_normal(shape)
          for shape in [(1001,), (70_000,), (7, 143), (70, 1000)]}
#: The right operand of matmul for a left operand of K columns (halved: 70,000 products
#: near 1 would pass float16's largest value, 65,504).
RIGHT = {k: 0.5 + 0.25 * RNG.standard_normal((k, 2)) for k in (1001, 70_000, 143, 1000)}
LN_EPS = 1e-5


def _softmax(a, log):
    z = a - a.max(axis=-1, keepdims=True)
    s = np.exp(z).sum(axis=-1, keepdims=True)
    return z - np.log(s) if log else np.exp(z) / s


def _layer_norm(a):
    c = a - a.mean(axis=-1, keepdims=True)
    return c / np.sqrt((c * c).mean(axis=-1, keepdims=True) + LN_EPS)


#: name: (the op on a global tensor, NumPy's on float32 values); both reduce the last dim.
#: The values are those of VALUES, or PREPARED's of them (before rounding to the half dtype).
OPS = {
    "mean": (lambda t: sm.mean(t, -1), lambda a: a.mean(axis=-1)),
    "var": (lambda t: sm.var(t, -1), lambda a: a.var(axis=-1)),
    "std": (lambda t: xp.std(t, axis=-1), lambda a: a.std(axis=-1)),
    "vector_norm": (lambda t: xp.linalg.vector_norm(t, axis=-1),
                    lambda a: np.linalg.vector_norm(a, axis=-1)),
    "softmax": (lambda t: sm.softmax(t, -1), lambda a: _softmax(a, False)),
    "log_softmax": (lambda t: sm.log_softmax(t, -1), lambda a: _softmax(a, True)),
    "layer_norm": (lambda t: sm.nn.functional.layer_norm(t), _layer_norm),
    "prod": (lambda t: xp.prod(t, axis=-1), lambda a: np.prod(a, axis=-1)),
    "cumulative_sum": (lambda t: xp.cumulative_sum(t, axis=-1),
                       lambda a: np.cumsum(a, axis=-1)),
    "matmul": (lambda t: sm.matmul(t, _right(t)), lambda a: a @ RIGHT[a.shape[-1]].astype(
        a.dtype).astype(np.float32)),
}


PREPARED = {
    # values nearer 1, so that 70,000 of them multiply to a number the half dtypes hold
    "prod": lambda v: 1 + (v - 1) * 0.002,
    # halved: 70,000 values near 1 add up past float16's largest value
    "cumulative_sum": lambda v: v * 0.5,
}


def _right(t):
    """The right operand of matmul, broadcast, in ``t``'s dtype."""
    return sm.tensor(RIGHT[t.shape[-1]].astype(t.dtype), placement=t.placement,
                     sbp=(B,) * t.placement.ndim)


def _layouts(ndim):
    return [S0, B] if ndim == 1 else [S0, S1, B]


def _ulp(v, dt):
    """The spacing of half dtype ``dt`` at each of the values ``v`` (float32)."""
    tiny = np.float32(2.0 ** -14)  # float16's smallest normal; bfloat16's is smaller
    mag = np.maximum(np.abs(v), tiny)
    return np.float32(eps(dt)) * np.exp2(np.floor(np.log2(mag)))


def _close_in_ulps(got, want32, dt, what, ulps=1.0):
    """``got`` (half dtype) equals ``want32`` rounded to ``dt`` within ``ulps`` of its
    spacing (the spacing at 2**-8 of the largest value for results near zero)."""
    assert got.dtype == dt, (what, got.dtype)
    want = want32.astype(dt).astype(np.float32)
    g = got.astype(np.float32)
    assert g.shape == want.shape, (what, g.shape, want.shape)
    floor = _ulp(np.float32(2.0 ** -8) * np.max(np.abs(want), initial=0), dt)
    tol = ulps * np.maximum(_ulp(want, dt), floor)
    err = np.abs(g - want)
    bad = ~(err <= tol)
    assert not bad.any(), (f"{what}: {int(bad.sum())} of {bad.size} differ by more than "
                           f"{ulps} ulp; first at {np.argwhere(bad)[0]}: got "
                           f"{g[bad][0]}, NumPy in float32 {want32[bad][0]} -> {want[bad][0]}")


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dt", HALVES, ids=["float16", "bfloat16"])
@pytest.mark.parametrize("name", list(OPS))
def test_half_width_reduction_accumulates_in_float32(name, dt):
    op, reference = OPS[name]
    pl = sm.placement("cpu", list(range(comm.Get_size())))
    for shape, value in VALUES.items():
        half = PREPARED.get(name, lambda v: v)(value).astype(dt)
        want = np.asarray(reference(half.astype(np.float32)), dtype=np.float32)
        for sbp in _layouts(len(shape)):
            got = op(sm.tensor(half, placement=pl, sbp=sbp)).numpy()
            agree(lambda got=got, want=want, what=(name, dt.name, shape, sbp):
                  _close_in_ulps(got, want, dt, what))


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dt", HALVES, ids=["float16", "bfloat16"])
def test_the_issues_cases(dt):
    pl = sm.placement("cpu", list(range(comm.Get_size())))
    ones = sm.ones(1000, dtype=dt, placement=pl, sbp=S0)
    got = ones.mean().numpy()
    agree(lambda: _close_in_ulps(got, np.float32(1.0), dt, "ones(1000).mean()"))
    rows = sm.tensor(VALUES[(70, 1000)][:, :600].astype(dt), placement=pl, sbp=B)
    for f in (sm.softmax, lambda t, d: sm.exp(sm.log_softmax(t, d))):
        sums = f(rows, -1).astype(np.float32).sum(-1).numpy()
        agree(lambda sums=sums: np.testing.assert_allclose(sums, 1.0, atol=0.02))


# -- gradients --------------------------------------------------------------------------------

def _grad_cases(a, g):
    """name: (the op, NumPy's gradient of sum(g * op(x)) at ``a``), over the last dim."""
    n = a.shape[-1]
    c = a - a.mean(axis=-1, keepdims=True)
    y = _softmax(a, False)
    var = (c * c).mean(axis=-1, keepdims=True)
    rstd = 1 / np.sqrt(var + LN_EPS)
    xhat = c * rstd
    gk = g[..., :1]  # the gradient of a reduction: one value per row
    return {
        "mean": (lambda t: sm.mean(t, -1, keepdim=True), np.broadcast_to(gk / n, a.shape)),
        "var": (lambda t: sm.var(t, -1, keepdim=True), 2 * c * gk / n),
        "softmax": (lambda t: sm.softmax(t, -1), y * (g - (g * y).sum(-1, keepdims=True))),
        "layer_norm": (lambda t: sm.nn.functional.layer_norm(t),
                       rstd * (g - g.mean(-1, keepdims=True)
                               - xhat * (g * xhat).mean(-1, keepdims=True))),
    }


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dt", HALVES, ids=["float16", "bfloat16"])
@pytest.mark.parametrize("name", ["mean", "var", "softmax", "layer_norm"])
def test_gradients_of_half_width_reductions(name, dt):
    pl = sm.placement("cpu", list(range(comm.Get_size())))
    a = VALUES[(7, 143)].astype(dt)
    g = np.random.default_rng(3).standard_normal(a.shape).astype(dt)
    a32, g32 = a.astype(np.float32), g.astype(np.float32)
    op, want = _grad_cases(a32, g32)[name]
    for sbp in (S0, S1, B):
        x = sm.tensor(a, placement=pl, sbp=sbp, requires_grad=True)
        out = op(x)
        w = sm.tensor(g[..., :1] if name in ("mean", "var") else g, placement=pl, sbp=B)
        sm.sum(out * w).backward()
        got = x.grad.numpy()
        what = (name, dt.name, sbp)

        def check(got=got, what=what):
            assert got.dtype == dt, (what, got.dtype)
            # a few roundings of the half dtype along the way (the elementwise steps)
            scale = np.max(np.abs(want))
            np.testing.assert_allclose(got.astype(np.float32), want, rtol=4 * eps(dt),
                                       atol=4 * eps(dt) * scale, err_msg=str(what))

        agree(check)
