"""Basic indexing returns views as NumPy's does (issue 29, defect 14), at n = 1..4.

``x[key]`` with ints, slices, None and ``...`` that moves no data is a view: a write into
it (``v[k] = value``, ``v += y``, ``np.add(v, 1, out=v)``) reaches ``x``, and a write into
``x`` reaches it. Where the key crosses a split the result is a copy whose writes are
forwarded to ``x`` (``x[key]`` of the indexing door), or refused (``CopyWriteError``)
where they could not be; never lost. scikit-learn's GaussianMixture adds ``reg_covar``
through ``_add_to_diagonal(covariances[k, :, :])``: the same writes are checked here on
every layout (the estimator itself runs in tests/array_api/test_array_api_clients.py).

Every test replays the same writes on a NumPy array and compares on every rank.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import agree, errors_of
from mpi4py import MPI

import sbpmpi as sm
from sbpmpi import errors

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
ALL = list(range(size))
S, B, P = sm.sbp.split, sm.sbp.broadcast, sm.sbp.partial_sum


def layouts_3d():
    """(name, placement, sbp) of a (k, d, d) tensor: split or broadcast on dims the key
    ``[k, :, :]`` keeps (views), split on dim 0 (copies), partial, a sub-placement."""
    pl = sm.placement("cpu", ALL)
    out = [("B", pl, (B,)), ("S1", pl, (S(1),)), ("S2", pl, (S(2),)), ("S0", pl, (S(0),)),
           ("P", pl, (P,))]
    if size > 1:
        out.append(("sub S1", sm.placement("cpu", ALL[1:]), (S(1),)))
    if size == 4:
        out.append(("mesh S1 S2", sm.placement("cpu", [[0, 1], [2, 3]]), (S(1), S(2))))
        out.append(("mesh S0 S1", sm.placement("cpu", [[0, 1], [2, 3]]), (S(0), S(1))))
    return out


def value(shape=(3, 5, 5)):
    return np.arange(np.prod(shape), dtype=np.float64).reshape(shape) / 7.0


LAYOUTS = layouts_3d()
IDS = [n for n, _, _ in LAYOUTS]


def add_to_diagonal(array, v, xp):
    """scikit-learn's ``_add_to_diagonal`` (utils/_array_api.py) on a non-NumPy namespace:
    writes into ``array`` in place, which the caller passed as ``covariances[k, :, :]``."""
    v = xp.linalg.diagonal(array) + v
    for i in range(min(array.shape)):
        array[i, i] = v[i]


@pytest.mark.mpi(min_size=1)
@pytest.mark.timeout(120)
@pytest.mark.parametrize("name,pl,sbp", LAYOUTS, ids=IDS)
def test_writes_into_an_indexed_block_reach_the_tensor(name, pl, sbp):
    """The GaussianMixture pattern: ``covariances[k, :, :] = ...`` then
    ``_add_to_diagonal(covariances[k, :, :], reg_covar)``; and ``+=``, ``out=``."""
    ref = value()
    x = sm.tensor(ref, placement=pl, sbp=sbp)
    want = ref.copy()
    xp = sm.array_api
    for k in range(ref.shape[0]):
        x[k, :, :] = x[k, :, :] * 2.0
        want[k, :, :] = want[k, :, :] * 2.0
        add_to_diagonal(x[k, :, :], 1e-6 * (k + 1), xp)
        np.fill_diagonal(want[k], np.diagonal(want[k]) + 1e-6 * (k + 1))
        v = x[k]
        v += 1.0
        want[k] += 1.0
        w = x[k, 1:4, ::2]
        np.multiply(w, 3.0, out=w)
        want[k, 1:4, ::2] *= 3.0
        got = x.numpy()
        agree(lambda got=got: np.testing.assert_allclose(got, want, rtol=1e-15, atol=0))


@pytest.mark.mpi(min_size=1)
@pytest.mark.timeout(120)
@pytest.mark.parametrize("name,pl,sbp", LAYOUTS, ids=IDS)
def test_a_view_sees_later_writes_into_its_tensor(name, pl, sbp):
    ref = value()
    x = sm.tensor(ref, placement=pl, sbp=sbp)
    v = x[:, 1, :]
    want = ref.copy()
    wv = want[:, 1, :]
    x[0, 1, 2] = -5.0
    want[0, 1, 2] = -5.0
    x += 1.0
    want += 1.0
    got_v, got_x = v.numpy(), x.numpy()
    agree(lambda: np.testing.assert_array_equal(got_x, want))
    if any(isinstance(s, sm.sbp.Split) and s.dim == 1 for s in sbp):
        assert v.is_view_copy  # the key crosses the split: a copy, which does not follow x
        return
    assert v.base is x and not v.is_view_copy
    agree(lambda: np.testing.assert_array_equal(got_v, wv))


@pytest.mark.mpi(min_size=1)
@pytest.mark.timeout(120)
def test_which_results_are_views_and_which_copies():
    """Views where the layout keeps the indexed dims whole on every rank; copies (forwarded
    writes) where the key crosses a split: a fact of the layouts, the same on every rank."""
    pl = sm.placement("cpu", ALL)
    ref = value((4, 6))
    kinds = {}
    for sbp in ((B,), (S(0),), (S(1),), (P,)):
        x = sm.tensor(ref, placement=pl, sbp=sbp)
        for key in ((1,), (slice(None), 2), (slice(1, 3),), (None, Ellipsis, 0), (Ellipsis,)):
            r = x[key]
            kinds[(repr(sbp[0]), repr(key))] = (
                "view" if r.base is x else "copy" if r.is_view_copy else "other")
    crosses = {("split(0)", repr((1,))), ("split(0)", repr((slice(1, 3),))),
               ("split(1)", repr((slice(None), 2))), ("split(1)", repr((None, Ellipsis, 0)))}
    for (s, key), kind in kinds.items():
        assert kind == ("copy" if (s, key) in crosses else "view"), (s, key, kind)


@pytest.mark.mpi(min_size=1)
@pytest.mark.timeout(120)
def test_a_view_of_a_forwarded_copy_refuses_writes():
    """``x[0][None]`` of ``x`` split on dim 0: the inner view would write into the copy
    ``x[0]`` only; it raises (the same error on every rank), and nothing changes. (A copy
    of the copy, ``x[0][1:3]`` where ``x[0]`` is split, forwards its writes to ``x[0]``,
    which forwards them to ``x``.)"""
    ref = value((4, 6))
    x = sm.tensor(ref, placement=sm.placement("cpu", ALL), sbp=S(0))
    row = x[0]
    assert row.is_view_copy
    inner = row[None]
    assert inner.base is row

    def write():
        inner[0] = 9.0

    def add():
        v = inner
        v += 1.0

    for f in (write, add):
        kind, msg = errors_of(f)
        assert kind == "CopyWriteError" and ".copy()" in msg, (kind, msg)
    assert issubclass(errors.CopyWriteError, ValueError)
    agree(lambda: np.testing.assert_array_equal(x.numpy(), ref))
    mine = row.copy()  # an explicit copy: writable, and independent of x
    mine[1] = -1.0
    assert not mine.is_view_copy
    agree(lambda: np.testing.assert_array_equal(x.numpy(), ref))


@pytest.mark.mpi(min_size=1)
@pytest.mark.timeout(120)
def test_views_of_tensors_that_require_grad():
    """The gradient of a view flows to its base; writing into a view of a leaf that
    requires grad raises (as torch), also when the view was made under no_grad."""
    pl = sm.placement("cpu", ALL)
    ref = value((4, 6))
    w = sm.tensor(ref, placement=pl, sbp=S(1), requires_grad=True)
    (w[1, :] * 3.0).sum().backward()
    want = np.zeros_like(ref)
    want[1, :] = 3.0
    agree(lambda: np.testing.assert_array_equal(w.grad.numpy(), want))
    with sm.no_grad():
        v = w[2, :]

    def write():
        v[0] = 1.0

    kind, msg = errors_of(write)
    assert kind == "RuntimeError" and "requires grad" in msg, (kind, msg)
    agree(lambda: np.testing.assert_array_equal(w.detach().numpy(), ref))


@pytest.mark.mpi(min_size=1)
@pytest.mark.timeout(120)
@pytest.mark.parametrize("sbp", [(B,), (S(0),), (S(1),)], ids=["B", "S0", "S1"])
def test_iteration_as_numpy(sbp):
    """``iter(x)`` yields ``x[0]``, ``x[1]``, ...; writes into the items reach ``x``."""
    ref = value((5, 3))
    x = sm.tensor(ref, placement=sm.placement("cpu", ALL), sbp=sbp)
    assert hasattr(x, "__iter__")
    rows = list(x)
    got = [r.numpy() for r in rows]
    agree(lambda: np.testing.assert_array_equal(np.stack(got), ref))
    want = ref.copy()
    for i, (r, wr) in enumerate(zip(x, want)):
        r[1] = -float(i)
        wr[1] = -float(i)
    agree(lambda: np.testing.assert_array_equal(x.numpy(), want))
    zero_d = sm.tensor(np.float64(1.0), placement=sm.placement("cpu", ALL), sbp=B)
    kind, _ = errors_of(lambda: iter(zero_d))
    assert kind == "TypeError"


@pytest.mark.mpi(min_size=1)
@pytest.mark.timeout(120)
def test_conversions_never_share_a_shard_with_their_source():
    """``y = x.to_global(...)`` owns its memory: a write into ``y`` never reaches ``x`` (a
    block of a broadcast, the root's share of a partial would otherwise be kept)."""
    pl = sm.placement("cpu", ALL)
    ref = value((4, 6))
    for dst in ((S(0),), (S(1),), (P,)):
        x = sm.tensor(ref, placement=pl, sbp=B)
        y = x.to_global(sbp=dst)
        y[...] = 0.0
        agree(lambda x=x: np.testing.assert_array_equal(x.numpy(), ref))
        agree(lambda y=y: np.testing.assert_array_equal(y.numpy(), np.zeros_like(ref)))
