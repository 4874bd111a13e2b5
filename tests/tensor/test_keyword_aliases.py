"""NumPy's keywords on torch's: every method and op that takes ``dim=``/``keepdim=`` also
takes ``axis=``/``keepdims=`` (``x.mean(axis=0)``), and ``x.argmax``/``x.argmin``, whose
parameters are NumPy's, take torch's, as PyTorch's argument parser does; a name and its
alias together raise TypeError on every rank. At n = 1..4, split unevenly, against NumPy.
"""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import sbpmpi as sm

size = MPI.COMM_WORLD.Get_size()
A = np.arange(35, dtype=np.float64).reshape(7, 5) % 11 - 4.5  # 7 rows: uneven at 2..4


def _softmax(a, axis):
    e = np.exp(a - a.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _x(sbp):
    return sm.tensor(A, placement=sm.placement("cpu", list(range(size))), sbp=sbp)


SBPS = [sm.sbp.split(0), sm.sbp.split(1), sm.sbp.broadcast]
SBP_IDS = ["split0", "split1", "bcast"]


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("sbp", SBPS, ids=SBP_IDS)
def test_methods_take_axis_and_keepdims(sbp):
    x = _x(sbp)
    cases = [
        (x.mean(axis=0), A.mean(axis=0)),
        (x.sum(axis=1, keepdims=True), A.sum(axis=1, keepdims=True)),
        (x.sum(axis=(0, 1)), A.sum()),
        (x.max(axis=0, keepdim=True), A.max(axis=0, keepdims=True)),
        (x.min(1, keepdims=True), A.min(axis=1, keepdims=True)),
        (x.softmax(axis=0), _softmax(A, 0)),
        (x.log_softmax(axis=1), np.log(_softmax(A, 1))),
        (x.argmax(dim=1), A.argmax(axis=1)),
        (x.argmin(dim=0, keepdim=True), A.argmin(axis=0, keepdims=True)),
        (x.argmax(axis=0, keepdims=True), A.argmax(axis=0, keepdims=True)),
    ]
    for got, want in cases:
        assert got.shape == want.shape
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-12, atol=1e-12)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("sbp", SBPS, ids=SBP_IDS)
def test_ops_take_axis_and_keepdims(sbp):
    x = _x(sbp)
    cases = [
        (sm.sum(x, axis=0), A.sum(axis=0)),
        (sm.mean(x, axis=1, keepdims=True), A.mean(axis=1, keepdims=True)),
        (sm.var(x, axis=0, correction=1), A.var(axis=0, ddof=1)),
        (sm.softmax(x, axis=1), _softmax(A, 1)),
        (sm.cat([x, x], axis=1), np.concatenate([A, A], axis=1)),
    ]
    for got, want in cases:
        assert got.shape == want.shape
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-12, atol=1e-12)


@pytest.mark.mpi(min_size=1)
def test_the_gradient_through_an_aliased_keyword():
    x = sm.tensor(A, placement=sm.placement("cpu", list(range(size))), sbp=sm.sbp.split(0),
                  requires_grad=True)
    x.mean(axis=0, keepdims=True).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), np.full(A.shape, 1 / 7), rtol=1e-15)


@pytest.mark.mpi(min_size=1)
def test_a_name_and_its_alias_together_raise_on_every_rank():
    x = _x(sm.sbp.split(0))
    calls = [lambda: x.sum(dim=0, axis=0), lambda: x.mean(0, keepdim=True, keepdims=True),
             lambda: x.argmax(axis=0, dim=0), lambda: sm.sum(x, dim=1, axis=1),
             lambda: sm.cat([x, x], dim=0, axis=0)]
    for call in calls:
        with pytest.raises(TypeError, match="and its alias"):
            call()
    with pytest.raises(TypeError, match="multiple values for argument 'dim'"):
        x.sum(0, axis=1)  # positional dim and axis=, as Python says for dim=
    # the tensor is still usable on every rank: nothing communicated before the errors
    np.testing.assert_allclose(x.sum(axis=0).numpy(), A.sum(axis=0))


def test_aliases_are_found_from_the_signature():
    from sbpmpi.core.keywords import KeywordAliases, accepting_aliases

    def f(x, dim=None, keepdim=False):
        return dim, keepdim

    def g(x, axis=None, dim=None):  # both spellings its own: nothing renamed
        return axis, dim

    assert KeywordAliases.of(f, "f").renames == {"axis": "dim", "keepdims": "keepdim"}
    assert KeywordAliases.of(g, "g").renames == {}
    assert accepting_aliases(f)(0, axis=1, keepdims=True) == (1, True)
    assert accepting_aliases(g)(0, axis=1, dim=2) == (1, 2)
    kw = {"dim": 0}
    assert KeywordAliases.of(f, "f").canonical(kw) is kw  # no copy without an alias
