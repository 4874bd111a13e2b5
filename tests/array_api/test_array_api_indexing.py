"""Indexing of global arrays against NumPy, at n = 1..4: ``x[key] = value`` (ints, slices,
None, ``...``, boolean masks), ``x[mask]`` and ``x[integer arrays]``, and DLPack.

Cases are drawn with Hypothesis (derandomized, no database: every rank draws the same);
arrays are split on a drawn dim (uneven at 3 and 4 ranks), broadcast, on a sub-placement,
partial, or on a 2 x 2 mesh at 4 ranks. Every rank compares the gathered result with
NumPy on the whole array.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import agree
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from mpi4py import MPI

import sbpmpi as sm
from sbpmpi import array_api as xp
from sbpmpi.core.sbp import broadcast, partial_sum, split

world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()

SETTINGS = dict(derandomize=True, database=None, deadline=None, print_blob=False,
                suppress_health_check=list(HealthCheck))
SOME = settings(max_examples=30, **SETTINGS)
ALL = list(range(size))


def layouts():
    out = ["split", "broadcast", "partial"]
    if size > 1:
        out.append("sub")
    if size == 4:
        out.append("mesh")
    return out


def place(value: np.ndarray, how: str, dim: int):
    """``value`` as a global array laid out by ``how`` (split along ``dim``)."""
    if how == "partial" and value.dtype.kind not in "iuf":
        how = "split"
    if value.ndim == 0 and how in ("split", "sub", "mesh"):
        how = "broadcast"
    if how == "broadcast":
        return sm.tensor(value, placement=sm.placement("cpu", ALL), sbp=broadcast)
    if how == "partial":
        return sm.tensor(value, placement=sm.placement("cpu", ALL), sbp=partial_sum)
    if how == "sub":
        return sm.tensor(value, placement=sm.placement("cpu", ALL[1:]), sbp=split(dim))
    if how == "mesh":
        other = (dim + 1) % value.ndim
        sbp = (split(dim), split(other) if other != dim else broadcast)
        return sm.tensor(value, placement=sm.placement("cpu", [[0, 1], [2, 3]]), sbp=sbp)
    return sm.tensor(value, placement=sm.placement("cpu", ALL), sbp=split(dim))


@st.composite
def arrays(draw, min_dims=1, max_dims=3, dtypes=("float64", "int32")):
    shape = tuple(draw(st.lists(st.integers(1, 6), min_size=min_dims, max_size=max_dims)))
    dtype = np.dtype(draw(st.sampled_from(list(dtypes))))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    value = rng.integers(-50, 50, size=shape).astype(dtype)
    how = draw(st.sampled_from(layouts()))
    dim = draw(st.integers(0, max(len(shape) - 1, 0)))
    return value, place(value, how, dim)


def same(got, want) -> None:
    g = got.numpy()
    want = np.asarray(want)

    def check():
        assert g.dtype == want.dtype, f"dtype {g.dtype} != NumPy's {want.dtype}"
        assert g.shape == want.shape, f"shape {g.shape} != NumPy's {want.shape}"
        np.testing.assert_array_equal(g, want)

    agree(check)


# -- x[key] = value ------------------------------------------------------------------------

@pytest.mark.mpi(min_size=1)
@given(data=st.data())
@SOME
def test_setitem_with_basic_keys_matches_numpy(data):
    value, x = data.draw(arrays())
    key = data.draw(hnp.basic_indices(value.shape, allow_newaxis=True))
    selected = value[key].shape
    vshape = data.draw(st.sampled_from([(), selected, selected[1:],
                                        (1,) * len(selected)]))
    rng = np.random.default_rng(len(selected))
    v = rng.integers(100, 200, size=vshape).astype(value.dtype)
    layout_before = x.layout if not any(s == partial_sum for s in x.sbp) else None
    want = value.copy()
    want[key] = v
    if vshape == ():
        x[key] = v.item()
    else:
        x[key] = place(v, data.draw(st.sampled_from(["split", "broadcast"])), 0)
    if layout_before is not None:
        assert x.layout == layout_before  # x keeps its layout
    same(x, want)


@pytest.mark.mpi(min_size=1)
@given(data=st.data())
@SOME
def test_setitem_with_a_boolean_mask_matches_numpy(data):
    value, x = data.draw(arrays())
    k = data.draw(st.integers(0, value.ndim))
    rng = np.random.default_rng(data.draw(st.integers(0, 99)))
    mask = rng.random(value.shape[:k]) < 0.5
    rows = data.draw(st.booleans())
    count = int(mask.sum())
    want = value.copy()
    if rows:  # one row per True
        v = rng.integers(100, 200, size=(count,) + value.shape[k:]).astype(value.dtype)
        want[mask] = v
        x[place(mask, "split", 0)] = place(v, "split", 0)
    else:
        want[mask] = 7
        x[place(mask, data.draw(st.sampled_from(layouts())), 0)] = 7
    same(x, want)


@pytest.mark.mpi(min_size=1)
def test_setitem_writes_into_the_buffer_of_x_and_its_views_see_it():
    """As NumPy: ``x[key] = value`` writes into the memory of ``x`` (the same buffer), so a
    view of ``x`` (basic indexing that moved nothing) shows the new values."""
    value = np.arange(12.0).reshape(4, 3)
    x = xp.asarray(value)  # split along the rows
    cols = x[:, 1:]  # a view: the rows stay split
    assert cols.base is x
    old = x.to_local()
    x[1:3, 1] = -1.0
    want = value.copy()
    want[1:3, 1] = -1
    assert x.to_local() is old
    same(x, want)
    same(cols, want[:, 1:])
    cols[0] = 7.0  # and the other way
    want[0, 1:] = 7.0
    same(x, want)


@pytest.mark.mpi(min_size=1)
def test_setitem_refuses_bad_keys_values_and_grad_on_every_rank():
    x = xp.asarray(np.zeros((4, 3)))
    with pytest.raises(ValueError, match="cannot be broadcast"):
        x[:, 0] = xp.asarray(np.ones(3))
    with pytest.raises(IndexError, match="out of bounds"):
        x[4] = 1.0
    with pytest.raises(IndexError, match="does not match"):
        x[xp.asarray(np.ones(3, bool))] = 1.0
    with pytest.raises(IndexError, match="only index"):
        x[xp.asarray(np.ones(4, bool)), 0] = 1.0
    with pytest.raises(ValueError, match="cannot be broadcast"):
        x[xp.asarray(np.array([True, False, True, True]))] = xp.asarray(np.ones((2, 3)))
    with pytest.raises(TypeError, match="complex"):
        x[0] = 1j
    ints = xp.asarray(np.zeros(3, np.int8))
    with pytest.raises(OverflowError, match="out of bounds for int8"):
        ints[0] = 300
    w = sm.tensor(np.zeros(3), placement=sm.placement("cpu", ALL), sbp=broadcast,
                  requires_grad=True)
    with pytest.raises(RuntimeError, match="requires grad"):
        w[0] = 1.0
    same(x, np.zeros((4, 3)))  # nothing was written


# -- x[mask], x[integer arrays] ---------------------------------------------------------------

@pytest.mark.mpi(min_size=1)
@given(data=st.data())
@SOME
def test_getitem_with_a_boolean_mask_matches_numpy(data):
    value, x = data.draw(arrays(min_dims=0))
    k = data.draw(st.integers(0, value.ndim))
    rng = np.random.default_rng(data.draw(st.integers(0, 99)))
    mask = rng.random(value.shape[:k]) < 0.5
    out = x[place(mask, data.draw(st.sampled_from(["split", "broadcast"])), 0)]
    same(out, value[mask])


@pytest.mark.mpi(min_size=1)
@given(data=st.data())
@SOME
def test_getitem_with_integer_arrays_matches_numpy(data):
    value, x = data.draw(arrays())
    k = data.draw(st.integers(1, value.ndim))
    shapes = data.draw(hnp.mutually_broadcastable_shapes(num_shapes=k, min_dims=0,
                                                         max_dims=2, min_side=1))
    rng = np.random.default_rng(data.draw(st.integers(0, 99)))
    key, want_key = [], []
    for d, shape in enumerate(shapes.input_shapes):
        n = value.shape[d]
        idx = rng.integers(-n, n, size=shape)
        if shape == () and data.draw(st.booleans()):
            key.append(int(idx))
            want_key.append(int(idx))
        else:
            key.append(place(idx, data.draw(st.sampled_from(["split", "broadcast"])), 0))
            want_key.append(idx)
    if not any(isinstance(k_, sm.GlobalTensor) and k_.ndim for k_ in key):
        key[0] = place(np.atleast_1d(want_key[0]), "broadcast", 0)
        want_key[0] = np.atleast_1d(want_key[0])
    same(x[tuple(key)], value[tuple(want_key)])


@pytest.mark.mpi(min_size=1)
def test_array_index_results_are_split_on_the_selection():
    value = np.arange(40).reshape(8, 5)
    x = sm.tensor(value, placement=sm.placement("cpu", ALL), sbp=split(0))
    mask = value % 3 == 0
    out = x[xp.asarray(mask)]
    assert out.sbp == (split(0),)  # balanced: a local slice of the selection
    same(out, value[mask])
    picked = x[xp.asarray(np.array([7, 0, -1]))]
    assert picked.sbp in ((split(0),), (split(1),))  # rows held whole, the result split
    same(picked, value[[7, 0, -1]])


@pytest.mark.mpi(min_size=1)
def test_array_indices_out_of_range_or_mixed_raise_on_every_rank():
    x = xp.asarray(np.zeros((4, 3)))
    with pytest.raises(IndexError, match="out of bounds"):
        x[xp.asarray(np.array([0, 4]))]
    with pytest.raises(IndexError, match="only index"):
        x[xp.asarray(np.ones(4, bool)), 1]
    with pytest.raises(IndexError, match="does not match"):
        x[xp.asarray(np.ones((4, 2), bool))]
    with pytest.raises(IndexError, match="int or an integer array"):
        x[xp.asarray(np.array([0, 1])), 0:2]
    with pytest.raises(IndexError, match="broadcast"):
        x[xp.asarray(np.array([0, 1])), xp.asarray(np.array([0, 1, 2]))]


# -- DLPack -------------------------------------------------------------------------------------

@pytest.mark.mpi(min_size=1)
@given(case=arrays(dtypes=("float32", "int64", "bool", "complex64")))
@SOME
def test_dlpack_exports_the_whole_array(case):
    value, x = case
    got = np.from_dlpack(x)
    agree(lambda: np.testing.assert_array_equal(got, value.astype(x.dtype)))
    assert x.__dlpack_device__() == (1, 0)


@pytest.mark.mpi(min_size=1)
def test_dlpack_shares_a_whole_shard_and_refuses_a_copy_it_would_need():
    value = np.arange(6.0)
    b = sm.tensor(value, placement=sm.placement("cpu", ALL), sbp=broadcast)
    assert np.shares_memory(np.from_dlpack(b), b.to_local())
    s = sm.tensor(value, placement=sm.placement("cpu", ALL), sbp=split(0))
    if size > 1:
        with pytest.raises(BufferError, match="needs a gathered copy"):
            s.__dlpack__(copy=False)
    got = xp.from_dlpack(s)
    assert got.device == s.device
    same(got, value)
