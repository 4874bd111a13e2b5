"""Global tensors under MPI: creation, local <-> global, global -> global, 2-D SBP, to_local.

Each test builds the expected global value with NumPy and compares. Bad arguments are
the bad input matrix's rows for creation and conversion (bad_input.py).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from bad_input import Row, check_row, no_cupy, rank_dependent
from conftest import assert_same_on_all_ranks, errors_of
from mpi4py import MPI

import sbpmpi as sm
from sbpmpi import backend
from sbpmpi.boxing.plan import why_meaningless
from sbpmpi.core.layout import Layout

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()


def placements(device_type):
    """1-D over all ranks, 1-D reversed, a strict subset, and a 2x2 mesh when size == 4."""
    out = [sm.placement(device_type, list(range(size)))]
    if size > 1:
        out.append(sm.placement(device_type, list(range(size))[::-1]))
        out.append(sm.placement(device_type, list(range(1, size))))
    if size == 4:
        out.append(sm.placement(device_type, [[0, 1], [2, 3]]))
        out.append(sm.placement(device_type, [[3, 1], [2, 0]]))
    return out


def all_sbps(pl, ndim):
    one = [sm.sbp.broadcast, sm.sbp.partial_sum, sm.sbp.partial_max, sm.sbp.partial_min]
    one += [sm.sbp.split(d) for d in range(ndim)]
    return list(itertools.product(one, repeat=pl.ndim))


def host(a):
    return backend.asnumpy(a)


@pytest.mark.mpi(min_size=2)
def test_create_split0(device_type):
    pl = sm.placement(device_type, ranks=[0, 1])
    sm.manual_seed(0)
    x = sm.randn(4, 5, placement=pl, sbp=sm.sbp.split(0))
    assert x.shape == (4, 5)
    full = x.numpy()
    assert full.shape == (4, 5)
    sm.manual_seed(0)
    ref = sm.randn(4, 5, placement=sm.placement("cpu", [0]), sbp=sm.sbp.broadcast).numpy()
    np.testing.assert_array_equal(full, ref)
    if rank in (0, 1):
        assert x.to_local().shape == (2, 5)
        np.testing.assert_array_equal(host(x.to_local()), ref[2 * rank:2 * rank + 2])
    else:
        assert x.to_local().size == 0


@pytest.mark.mpi(min_size=1)
def test_random_values_do_not_depend_on_layout(device_type):
    shape = (5, 7)
    sm.manual_seed(42)
    ref = sm.randn(*shape, placement=sm.placement("cpu", [0]), sbp=sm.sbp.broadcast).numpy()
    for pl in placements(device_type):
        for nd in all_sbps(pl, 2):
            sm.manual_seed(42)
            x = sm.randn(*shape, placement=pl, sbp=nd)
            np.testing.assert_array_equal(x.numpy(), ref, err_msg=f"{pl} {nd}")
    # successive calls differ; statistics look like a standard normal
    sm.manual_seed(1)
    a = sm.randn(200, 50, placement=placements(device_type)[0], sbp=sm.sbp.split(1)).numpy()
    b = sm.randn(200, 50, placement=placements(device_type)[0], sbp=sm.sbp.split(1)).numpy()
    assert not np.array_equal(a, b)
    assert abs(a.mean()) < 0.05 and abs(a.std() - 1) < 0.05
    u = sm.rand(10000, placement=placements(device_type)[0], sbp=sm.sbp.split(0)).numpy()
    assert 0 <= u.min() and u.max() < 1 and abs(u.mean() - 0.5) < 0.02


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("shape", [(4, 5), (3, 7), (2, 1), (0, 3), (5,), ()])
def test_tensor_every_sbp_every_placement(device_type, shape):
    rng = np.random.default_rng(7)
    value = (rng.standard_normal(shape) * 10).astype(np.float64)
    ivalue = rng.integers(-50, 50, size=shape).astype(np.int32)
    for pl in placements(device_type):
        for nd in all_sbps(pl, len(shape)):
            for v in (value, ivalue):
                x = sm.tensor(v, placement=pl, sbp=nd)
                assert x.shape == v.shape and x.dtype == v.dtype and x.sbp == Layout.make(
                    shape, pl, nd).sbp
                np.testing.assert_array_equal(x.numpy(), v, err_msg=f"{pl} {nd}")
                lay = x.layout
                if rank in pl:
                    assert tuple(x.to_local().shape) == lay.local_shape(rank)
                    if not any(isinstance(s, sm.sbp.Partial) for s in lay.sbp):
                        np.testing.assert_array_equal(host(x.to_local()), v[lay.local_slice(rank)])
                else:
                    assert x.to_local().size == 0


@pytest.mark.mpi(min_size=1)
def test_fill_creators(device_type):
    pl = placements(device_type)[-1]
    for nd in all_sbps(pl, 2):
        np.testing.assert_array_equal(sm.zeros(3, 5, placement=pl, sbp=nd).numpy(), np.zeros((3, 5)))
        np.testing.assert_array_equal(sm.ones((3, 5), placement=pl, sbp=nd).numpy(), np.ones((3, 5)))
        f = sm.full((2, 3), 7, placement=pl, sbp=nd)
        assert f.dtype == np.int64
        np.testing.assert_array_equal(f.numpy(), np.full((2, 3), 7))
    for nd in all_sbps(pl, 1):
        np.testing.assert_array_equal(sm.arange(11, placement=pl, sbp=nd).numpy(), np.arange(11))
        np.testing.assert_allclose(sm.arange(1, 3, 0.25, placement=pl, sbp=nd).numpy(),
                                   np.arange(1, 3, 0.25))
    assert sm.zeros(2, placement=pl, sbp=sm.sbp.broadcast * 1 if False else [sm.sbp.broadcast] * pl.ndim,
                    dtype=np.int16).dtype == np.int16


@pytest.mark.mpi(min_size=2)
def test_local_to_global_split(device_type):
    pl = sm.placement(device_type, ranks=[0, 1])
    xp = backend.get_xp(device_type)
    local = xp.asarray(np.arange(10, dtype=np.float32).reshape(2, 5) + 100 * rank)
    before = host(local).copy()
    x = sm.to_global(local if rank < 2 else None, placement=pl, sbp=sm.sbp.split(0))
    assert x.shape == (4, 5)
    ref = np.concatenate([np.arange(10, dtype=np.float32).reshape(2, 5) + 100 * r for r in (0, 1)])
    np.testing.assert_array_equal(x.numpy(), ref)
    np.testing.assert_array_equal(host(local), before)
    if rank < 2:
        assert x.to_local() is local  # global -> local: no copy


@pytest.mark.mpi(min_size=1)
def test_local_to_global_uneven_and_every_sbp():
    pl = sm.placement("cpu", list(range(size)))
    # uneven shards along dim 1: rank r has r + 1 columns
    local = np.full((3, rank + 1), rank, dtype=np.int64)
    x = sm.to_global(local, placement=pl, sbp=sm.sbp.split(1))
    ref = np.concatenate([np.full((3, r + 1), r) for r in range(size)], axis=1)
    np.testing.assert_array_equal(x.numpy(), ref)
    assert x.to_local().shape == x.layout.local_shape(rank)
    # broadcast: the first rank's value wins; local arrays are not modified
    local = np.full((2, 2), float(rank))
    x = sm.to_global(local, placement=pl, sbp=sm.sbp.broadcast)
    np.testing.assert_array_equal(x.numpy(), np.zeros((2, 2)))
    np.testing.assert_array_equal(x.to_local(), np.zeros((2, 2)))
    np.testing.assert_array_equal(local, np.full((2, 2), float(rank)))
    # a non-contiguous shard (a transposed view) is copied, on the root as well
    base = np.arange(6.0).reshape(2, 3) + 10 * rank
    x = sm.to_global(base.T, placement=pl, sbp=sm.sbp.broadcast)
    np.testing.assert_array_equal(x.numpy(), np.arange(6.0).reshape(2, 3).T)
    np.testing.assert_array_equal(base, np.arange(6.0).reshape(2, 3) + 10 * rank)
    # partial: reductions of the shards
    for op, f in (("sum", np.sum), ("max", np.max), ("min", np.min)):
        x = sm.to_global(np.array([rank, -rank, 3.0]), placement=pl, sbp=sm.sbp.Partial(op))
        np.testing.assert_array_equal(
            x.numpy(), f([np.array([r, -r, 3.0]) for r in range(size)], axis=0))


@pytest.mark.mpi(min_size=4)
def test_2d_sbp_tensor_and_local_to_global(device_type):
    pl = sm.placement(device_type, ranks=[[0, 1], [2, 3]])
    value = np.arange(24, dtype=np.float32).reshape(4, 6)
    x = sm.tensor(value, placement=pl, sbp=(sm.sbp.broadcast, sm.sbp.split(0)))
    if rank < 4:
        expect = value[0:2] if rank in (0, 2) else value[2:4]
        np.testing.assert_array_equal(host(x.to_local()), expect)
    np.testing.assert_array_equal(x.numpy(), value)
    # local -> global on the mesh: ranks 0, 2 pass rows 0-1, ranks 1, 3 rows 2-3;
    # the broadcast axis takes the first rank of each column
    local = value[0:2] if rank in (0, 2) else value[2:4]
    local = backend.get_xp(device_type).asarray(local + (1000 if rank >= 2 else 0))
    y = sm.to_global(local if rank < 4 else None, placement=pl,
                     sbp=(sm.sbp.broadcast, sm.sbp.split(0)))
    np.testing.assert_array_equal(y.numpy(), value)


@pytest.mark.mpi(min_size=1)
def test_global_to_global_matches_the_reference(device_type):
    rng = np.random.default_rng(3)
    value = rng.integers(-9, 9, size=(5, 3)).astype(np.float64)
    pls = placements(device_type)
    for src_pl, dst_pl in itertools.product(pls[:3], pls[:3]):
        for src in all_sbps(src_pl, 2):
            x = sm.tensor(value, placement=src_pl, sbp=src)
            for dst in all_sbps(dst_pl, 2):
                if why_meaningless(x.layout, Layout.make(value.shape, dst_pl, dst)) is not None:
                    with pytest.raises(ValueError, match="cannot convert partial_"):
                        x.to_global(placement=dst_pl, sbp=dst)
                    continue
                y = x.to_global(placement=dst_pl, sbp=dst)
                assert y.sbp == Layout.make(value.shape, dst_pl, dst).sbp
                np.testing.assert_array_equal(y.numpy(), value, err_msg=f"{src}->{dst}")
                if rank in dst_pl and all(isinstance(s, (sm.sbp.Split, sm.sbp.Broadcast)) for s in y.sbp):
                    np.testing.assert_array_equal(host(y.to_local()), value[y.layout.local_slice(rank)])


@pytest.mark.mpi(min_size=1)
def test_bad_inputs_raise_same_error_everywhere():
    with pytest.raises(ValueError, match="not supported"):
        sm.placement("tpu", [0])
    with pytest.raises(ValueError, match="out of range"):
        sm.placement("cpu", [0, size])
    with pytest.raises(ValueError, match="distinct"):
        sm.placement("cpu", [0, 0])
    pl = sm.placement("cpu", list(range(size)))
    with pytest.raises(ValueError, match="split dim 2 is out of range for a tensor of 2 dims"):
        sm.zeros(2, 3, placement=pl, sbp=sm.sbp.split(2))
    with pytest.raises(ValueError, match="one SBP per mesh axis"):
        sm.zeros(2, 3, placement=pl, sbp=(sm.sbp.split(0), sm.sbp.broadcast))
    with pytest.raises(ValueError, match="cannot form one global tensor"):
        sm.to_global(np.zeros((2, 3 + (rank == size - 1))), placement=pl, sbp=sm.sbp.split(0))
        if size == 1:
            raise ValueError("cannot form one global tensor (n=1 has nothing to mismatch)")
    with pytest.raises(TypeError, match="dtype"):
        sm.to_global(np.zeros(2, dtype=np.float32 if rank == size - 1 else np.float64),
                     placement=pl, sbp=sm.sbp.split(0))
        if size == 1:
            raise TypeError("dtype (n=1 has nothing to mismatch)")


# -- rand in [0, 1) ---------------------------------------------------------------------------

@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64, np.longdouble])
def test_rand_is_below_one_for_every_float_dtype(dtype):
    pl = sm.placement("cpu", list(range(size)))
    sm.manual_seed(0)
    x = sm.rand(100_000, placement=pl, sbp=sm.sbp.split(0), dtype=dtype)
    v = x.numpy()
    assert v.dtype == np.dtype(dtype)
    assert v.min() >= 0 and v.max() < 1, (dtype, int((v >= 1).sum()))
    assert_same_on_all_ranks(v.tobytes())
    # the same values whatever the layout, and as NumPy casts the float64 draw (but < 1);
    # a half-width dtype rounds float32's values (the same draw at every width: issue 32)
    sm.manual_seed(0)
    u = sm.rand(100_000, placement=pl, sbp=sm.sbp.broadcast, dtype=np.float64).numpy()
    if np.dtype(dtype).itemsize == 2:
        below32 = np.nextafter(np.float32(1), np.float32(0))
        u = np.minimum(u.astype(np.float32), below32)
    below = np.nextafter(np.ones((), dtype), np.zeros((), dtype))
    np.testing.assert_array_equal(v, np.minimum(u.astype(dtype), below))
    assert 0.49 < float(v.astype(np.float64).mean()) < 0.51


# -- creation-time dtype check ----------------------------------------------------------------

@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("kind", ["partial_max", "partial_min"])
def test_to_global_refuses_complex_partial_max_min_at_creation(kind):
    pl = sm.placement("cpu", list(range(size)))
    sbp = getattr(sm.sbp, kind)
    want = errors_of(lambda: sm.tensor(np.ones(3, dtype=np.complex128), placement=pl, sbp=sbp))
    got = errors_of(lambda: sm.to_global(np.ones(3, dtype=np.complex128), placement=pl, sbp=sbp))
    assert got[0] == want[0] == "TypeError", got
    assert "complex" in got[1] and kind in got[1]


# -- bad arguments: the rows of the bad input matrix (bad_input.py) ---------------------------

S, B = sm.sbp.split, sm.sbp.broadcast

BAD_INPUTS = [
    # -- creation -----------------------------------------------------------------------------
    Row("create-split-dim-out-of-range", lambda c: sm.zeros(2, 3, placement=c.pl, sbp=S(2)),
        ValueError, "split dim 2 is out of range for a tensor of 2 dims"),
    Row("create-too-many-sbps", lambda c: sm.zeros(2, 3, placement=c.pl, sbp=(S(0), B)),
        ValueError, "give one SBP per mesh axis"),
    Row("create-no-placement", lambda c: sm.zeros(2, 3, sbp=B), TypeError,
        "placement= is required"),
    Row("create-no-sbp", lambda c: sm.ones(2, 3, placement=c.pl), TypeError, "sbp= is required"),
    Row("create-placement-not-placement", lambda c: sm.zeros(2, placement="cpu", sbp=B),
        TypeError, "placement must be an sm.placement, got str"),
    Row("create-sbp-string", lambda c: sm.zeros(2, placement=c.pl, sbp="split"), TypeError,
        "sbp must be an SBP"),
    Row("create-sbp-entry-int", lambda c: sm.zeros(2, placement=c.pl, sbp=[0]), TypeError,
        "sbp entry 0 is not an SBP"),
    Row("create-negative-size", lambda c: sm.zeros(2, -1, placement=c.pl, sbp=B), ValueError,
        "has a negative size -1"),
    Row("create-float-size", lambda c: sm.randn(2.5, placement=c.pl, sbp=B), TypeError,
        "shape entries must be ints, got float 2.5"),
    Row("randn-int-dtype", lambda c: sm.randn(3, placement=c.pl, sbp=B, dtype=np.int32),
        TypeError, "randn needs a floating dtype, got int32"),
    Row("rand-bad-dtype", lambda c: sm.rand(3, placement=c.pl, sbp=B, dtype="nodtype"),
        TypeError, "dtype 'nodtype' is not a NumPy dtype"),
    Row("arange-zero-step", lambda c: sm.arange(0, 5, 0, placement=c.pl, sbp=B), ValueError,
        "arange step must not be zero"),
    Row("tensor-of-global", lambda c: sm.tensor(c.x, placement=c.pl, sbp=B), TypeError,
        "sm.tensor takes the whole global value"),
    Row("full-partial-max-complex",
        lambda c: sm.full((2,), 1j, placement=c.pl, sbp=sm.sbp.partial_max), TypeError,
        "partial_max is not defined for dtype complex64"),
    Row("full-value-shape",
        lambda c: sm.full((2,), [1.0, 2.0, 3.0], placement=c.pl0, sbp=B), TypeError, "(3,)"),
    Row("tensor-unconvertible-data",
        lambda c: sm.tensor(np.array(["a", "b"]), placement=c.pl0, sbp=B, dtype=np.float32),
        ValueError, "could not convert string to float"),
    Row("create-cuda-without-gpu",
        lambda c: no_cupy() or sm.zeros(3, placement=sm.placement("cuda", [0]), sbp=B),
        RuntimeError, "placement type 'cuda' needs CuPy and a GPU"),
    Row("arange-infinite", lambda c: sm.arange(0, float("inf"), placement=c.pl, sbp=B),
        ValueError, "arange"),
    Row("seed-str", lambda c: sm.manual_seed("1"), TypeError, "seed must be an int"),
    # -- local -> global ----------------------------------------------------------------------
    Row("to_global-no-placement", lambda c: sm.to_global(c.local, sbp=S(0)), TypeError,
        "placement= must be an sm.placement"),
    Row("to_global-no-sbp", lambda c: sm.to_global(c.local, placement=c.pl), TypeError,
        "sbp= is required"),
    Row("to_global-split-dim", lambda c: sm.to_global(c.local, placement=c.pl, sbp=S(2)),
        ValueError, "split dim 2 is out of range for a tensor of 2 dims"),
    Row("to_global-shapes-differ",
        lambda c: sm.to_global(np.zeros((2, rank_dependent(c, 3, 4))), placement=c.pl,
                               sbp=S(0)),
        ValueError, "cannot form one global tensor", min_size=2),
    Row("to_global-dtypes-differ",
        lambda c: sm.to_global(np.zeros(2, dtype=rank_dependent(c, np.float64, np.float32)),
                               placement=c.pl, sbp=S(0)),
        TypeError, "local arrays must share one dtype", min_size=2),
    Row("to_global-ndims-differ",
        lambda c: sm.to_global(np.zeros(rank_dependent(c, (2, 3), (6,))), placement=c.pl,
                               sbp=S(0)),
        ValueError, "must have the same number of dims", min_size=2),
    Row("to_global-missing-local",
        lambda c: sm.to_global(rank_dependent(c, c.local, None), placement=c.pl, sbp=S(0)),
        TypeError, "passed no local array", min_size=2),
    Row("to_global-unusable-local",
        lambda c: sm.to_global(rank_dependent(c, c.local, [[1], [1, 2]]), placement=c.pl,
                               sbp=S(0)),
        TypeError, f"to_global: rank {size - 1} could not use its local array", min_size=2),
    Row("to_global-string", lambda c: sm.to_global("abc", placement=c.pl, sbp=B), TypeError,
        "got str"),
    # -- global -> global ---------------------------------------------------------------------
    Row("x.to_global-cuda-without-gpu",
        lambda c: no_cupy() or c.x.to_global(placement=sm.placement("cuda", [0])),
        RuntimeError, "placement type 'cuda' needs CuPy and a GPU"),
    Row("x.to_global-placement-str", lambda c: c.x.to_global(placement="cpu"), TypeError,
        "placement must be an sm.placement, got str"),
    Row("x.to_global-split-dim", lambda c: c.x.to_global(sbp=S(5)), ValueError,
        "split dim 5 is out of range for a tensor of 2 dims"),
    Row("x.to_global-mesh-change-needs-sbp",
        lambda c: c.x.to_global(placement=sm.placement("cpu", [[r] for r in range(size)])),
        ValueError, "sbp is required when the mesh changes from 1-d to 2-d"),
    Row("x.to_global-partial-max-complex",
        lambda c: sm.tensor(np.ones(3, np.complex64), placement=c.pl, sbp=B).to_global(
            sbp=sm.sbp.partial_max),
        TypeError, "partial_max is not defined for dtype complex64"),
    Row("item-many-elements", lambda c: c.x.item(), ValueError,
        "item() needs a tensor of one element, got shape (4, 6)"),
    Row("len-0d", lambda c: len(sm.zeros((), placement=c.pl, sbp=B)), TypeError,
        "len() of a 0-d global tensor"),
]


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("row", BAD_INPUTS, ids=[r.id for r in BAD_INPUTS])
def test_bad_tensor_input_raises_the_same_error_on_every_rank(bad_input_ctx, row, request):
    check_row(row, bad_input_ctx, request)
