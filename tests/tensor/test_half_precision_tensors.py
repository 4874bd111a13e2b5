"""float16 and bfloat16 tensors: creation, astype, the RNG, conversions and checkpoints,
at n = 1..4 with uneven splits, against NumPy."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from conftest import agree
from mpi4py import MPI

import sbpmpi as sm

comm = MPI.COMM_WORLD
size = comm.Get_size()
HALVES = [sm.float16, sm.bfloat16]
IDS = ["float16", "bfloat16"]


def _pl():
    return sm.placement("cpu", list(range(size)))


def test_the_dtype_names():
    assert sm.bfloat16 == np.dtype(ml_dtypes.bfloat16)
    assert sm.float16 == np.float16 and sm.float32 == np.float32 and sm.float64 == np.float64


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dt", HALVES, ids=IDS)
def test_creation_and_astype(dt):
    pl = _pl()
    for t, want in [(sm.zeros(7, 3, placement=pl, sbp=sm.sbp.split(0), dtype=dt), np.zeros((7, 3))),
                    (sm.ones(7, placement=pl, sbp=sm.sbp.split(0), dtype=dt), np.ones(7)),
                    (sm.full((5, 2), 1.5, placement=pl, sbp=sm.sbp.split(1), dtype=dt),
                     np.full((5, 2), 1.5)),
                    (sm.arange(0, 9, placement=pl, sbp=sm.sbp.split(0), dtype=dt),
                     np.arange(9.0))]:
        got = t.numpy()
        agree(lambda got=got, want=want: (np.testing.assert_array_equal(
            got.astype(np.float32), want), got.dtype == dt) and None)
        assert got.dtype == dt
    v = (np.arange(35).reshape(7, 5) / 8).astype(np.float32)
    x = sm.tensor(v, placement=pl, sbp=sm.sbp.split(0))
    h = x.astype(dt)
    assert h.dtype == dt
    back = h.astype(np.float32).numpy()
    np.testing.assert_array_equal(back, v.astype(dt).astype(np.float32))


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dt", HALVES, ids=IDS)
@pytest.mark.parametrize("draw", ["randn", "rand"])
def test_rng_gives_float32_values_rounded(dt, draw):
    pl = _pl()
    sm.manual_seed(5)
    a = getattr(sm, draw)(9, 4, placement=pl, sbp=sm.sbp.split(0), dtype=np.float32).numpy()
    sm.manual_seed(5)
    b = getattr(sm, draw)(9, 4, placement=pl, sbp=sm.sbp.split(1), dtype=dt).numpy()
    assert b.dtype == dt
    np.testing.assert_array_equal(b, a.astype(dt))


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dt", HALVES, ids=IDS)
def test_conversions_between_every_sbp(dt):
    pl = _pl()
    v = (np.arange(-30, 40).reshape(7, 10) / 8).astype(dt)  # exact in both dtypes
    sbps = [sm.sbp.split(0), sm.sbp.split(1), sm.sbp.broadcast, sm.sbp.partial_sum]
    for src in sbps:
        for dst in sbps:
            x = sm.tensor(v, placement=pl, sbp=src)
            y = x.to_global(sbp=dst)
            assert y.dtype == dt
            got = y.numpy()
            agree(lambda got=got: np.testing.assert_array_equal(got, v))


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dt", HALVES, ids=IDS)
def test_checkpoint_keeps_the_dtype_and_loads_into_float32(dt, shared_dir):
    pl = _pl()
    sm.manual_seed(11)
    x = sm.randn(7, 3, placement=pl, sbp=sm.sbp.split(0), dtype=dt)
    path = f"{shared_dir}/x.npy"
    sm.save(x, path)
    comm.Barrier()
    import numpy.lib.format as npy_format
    with open(path, "rb") as f:
        npy_format.read_magic(f)
        descr = npy_format.read_array_header_1_0(f)[2]
    assert np.dtype(descr) == dt, descr  # the file names its dtype: bfloat16 is not raw bytes
    np.testing.assert_array_equal(np.load(path), x.numpy())
    y = sm.load(path, placement=pl, sbp=sm.sbp.split(1))
    assert y.dtype == dt
    np.testing.assert_array_equal(y.numpy(), x.numpy())
    z = sm.load(path, placement=pl, sbp=sm.sbp.split(0), dtype=np.float32)
    assert z.dtype == np.float32
    np.testing.assert_array_equal(z.numpy(), x.numpy().astype(np.float32))


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dt", HALVES, ids=IDS)
def test_half_tensors_carry_gradients(dt):
    pl = _pl()
    v = (np.arange(15).reshape(5, 3) / 8).astype(dt)
    x = sm.tensor(v, placement=pl, sbp=sm.sbp.split(0), requires_grad=True)
    (x * x).sum().backward()
    assert x.grad.dtype == dt
    np.testing.assert_array_equal(x.grad.numpy(), (2 * v.astype(np.float32)).astype(dt))
