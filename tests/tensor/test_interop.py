"""DLPack interop: shards go to other array libraries without copies, and sm.to_global
takes any DLPack array (NumPy's own, PyTorch's, JAX's where installed).

Each test compares with the same global value built by plain NumPy. Read-only and
memory-mapped arrays are valid sources too, and ``sm.to_global`` never writes into the
caller's array.
"""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import sbpmpi as sm
from sbpmpi import backend

pytestmark = pytest.mark.mpi(min_size=1)


def world():
    from mpi4py import MPI

    return MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()


class DLPackOnly:
    """An array that offers nothing but the DLPack protocol (no __array__)."""

    def __init__(self, a):
        self._a = a

    def __dlpack__(self, **kw):
        return self._a.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


def local_block(r, dtype=np.float32):
    """The (2, 3) array rank r starts with."""
    return (np.arange(6, dtype=dtype).reshape(2, 3) + 10 * r).astype(dtype)


def test_to_local_shard_is_shared_with_numpy_dlpack():
    rank, p = world()
    pl = sm.placement("cpu", ranks=list(range(p)))
    ref = np.arange(5 * 4, dtype=np.float64).reshape(5, 4)
    x = sm.tensor(ref.copy(), placement=pl, sbp=sm.sbp.split(0))
    view = np.from_dlpack(x.to_local())
    assert np.shares_memory(view, x.to_local())
    view += 1  # written through the DLPack view: the global tensor changes
    np.testing.assert_array_equal(x.numpy(), ref + 1)


@pytest.mark.parametrize("sbp", [sm.sbp.split(0), sm.sbp.split(1), sm.sbp.partial_sum,
                                 sm.sbp.broadcast])
def test_to_global_takes_a_dlpack_only_array(sbp):
    rank, p = world()
    pl = sm.placement("cpu", ranks=list(range(p)))
    locals_ = [local_block(r) for r in range(p)]
    x = sm.to_global(DLPackOnly(locals_[rank]), placement=pl, sbp=sbp)
    if isinstance(sbp, sm.sbp.Split):
        expected = np.concatenate(locals_, axis=sbp.dim)
    elif isinstance(sbp, sm.sbp.Partial):
        expected = np.sum(locals_, axis=0)
    else:
        expected = locals_[0]
    assert x.dtype == np.float32
    np.testing.assert_array_equal(x.numpy(), expected)


def _torch():
    return pytest.importorskip("torch", reason="PyTorch is not installed")


def _torch_device(torch, device_type):
    if device_type == "cuda" and not torch.cuda.is_available():
        pytest.skip("PyTorch has no CUDA here")
    return "cuda" if device_type == "cuda" else "cpu"


def test_torch_from_dlpack_shares_the_shard(device_type):
    torch = _torch()
    dev = _torch_device(torch, device_type)
    rank, p = world()
    pl = sm.placement(device_type, ranks=list(range(p)))
    ref = np.arange(7 * 3, dtype=np.float32).reshape(7, 3)
    x = sm.tensor(ref.copy(), placement=pl, sbp=sm.sbp.split(0))
    t = torch.from_dlpack(x.to_local())
    assert t.device.type == dev
    assert tuple(t.shape) == tuple(x.to_local().shape)
    t.mul_(2)  # in place in PyTorch: the shard is the same memory
    if dev == "cuda":
        torch.cuda.synchronize()
    np.testing.assert_array_equal(x.numpy(), ref * 2)


@pytest.mark.parametrize("dtype", ["float32", "int64"])
@pytest.mark.parametrize("sbp", [sm.sbp.split(0), sm.sbp.partial_sum])
def test_to_global_from_torch_tensors(device_type, dtype, sbp):
    torch = _torch()
    dev = _torch_device(torch, device_type)
    rank, p = world()
    pl = sm.placement(device_type, ranks=list(range(p)))
    locals_ = [local_block(r, np.dtype(dtype)) for r in range(p)]
    t = torch.from_numpy(locals_[rank].copy()).to(dev)
    x = sm.to_global(t, placement=pl, sbp=sbp)
    assert x.dtype == np.dtype(dtype)
    assert backend.device_type_of(x.to_local()) == device_type
    expected = (np.concatenate(locals_, axis=0) if isinstance(sbp, sm.sbp.Split)
                else np.sum(locals_, axis=0))
    np.testing.assert_array_equal(x.numpy(), expected)
    # and back: the result's shard goes to PyTorch again
    back = torch.from_dlpack(x.to_local())
    np.testing.assert_array_equal(back.cpu().numpy(), backend.asnumpy(x.to_local()))


def test_jax_dlpack_round_trip():
    jax = pytest.importorskip("jax", reason="JAX is not installed")
    jnp = pytest.importorskip("jax.numpy")
    rank, p = world()
    pl = sm.placement("cpu", ranks=list(range(p)))
    ref = np.arange(4 * p * 2, dtype=np.float32).reshape(4 * p, 2)
    x = sm.tensor(ref, placement=pl, sbp=sm.sbp.split(0))
    j = jax.dlpack.from_dlpack(x.to_local())
    np.testing.assert_array_equal(np.asarray(j), x.to_local())
    y = sm.to_global(jnp.asarray(j) * 3, placement=pl, sbp=sm.sbp.split(0))
    np.testing.assert_array_equal(y.numpy(), ref * 3)


# -- read-only, memory-mapped and foreign inputs ----------------------------------------------

rank, size = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()


def _meshes():
    out = [sm.placement("cpu", list(range(size)))]
    if size == 4:
        out.append(sm.placement("cpu", [[0, 1], [2, 3]]))
    return out


@pytest.mark.mpi(min_size=1)
def test_read_only_array_is_a_valid_broadcast_source_and_split_shard():
    ref = np.arange(6.0).reshape(2, 3)
    for pl in _meshes():
        sbps = [(sm.sbp.broadcast,) * pl.ndim]
        if pl.ndim == 2:
            sbps.append((sm.sbp.broadcast, sm.sbp.split(0)))
        for sbp in sbps:
            a = ref.copy()
            a.setflags(write=False)
            local = a if sbp[-1] == sm.sbp.broadcast else a[rank % 2:rank % 2 + 1]
            x = sm.to_global(local, placement=pl, sbp=sbp)
            np.testing.assert_array_equal(x.numpy(), ref)
            np.testing.assert_array_equal(a, ref)
        a = np.arange(3.0) + 3 * rank
        a.setflags(write=False)
        x = sm.to_global(a, placement=pl, sbp=(sm.sbp.split(0),) * pl.ndim) if pl.ndim == 1 \
            else None
        if x is not None:
            np.testing.assert_array_equal(x.numpy(), np.arange(3.0 * size))
            y = x * 2  # the shard is usable by ops
            np.testing.assert_array_equal(y.numpy(), 2 * np.arange(3.0 * size))


@pytest.mark.mpi(min_size=1)
def test_memory_mapped_weights_are_a_valid_broadcast_source(tmp_path_factory):
    d = tmp_path_factory.mktemp(f"mmap{rank}")
    ref = np.arange(12.0).reshape(3, 4)
    np.save(d / "w.npy", ref)
    w = np.load(d / "w.npy", mmap_mode="r")
    pl = sm.placement("cpu", list(range(size)))
    x = sm.to_global(w, placement=pl, sbp=sm.sbp.broadcast)
    np.testing.assert_array_equal(x.numpy(), ref)
    np.testing.assert_array_equal(np.load(d / "w.npy"), ref)


class _Foreign:
    """A non-NumPy array type seen only through DLPack (as a torch tensor would be)."""

    def __init__(self, a: np.ndarray) -> None:
        self._a = a

    def __dlpack__(self, **kw):
        return self._a.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


@pytest.mark.mpi(min_size=1)
def test_to_global_never_writes_into_the_callers_dlpack_array():
    for pl in _meshes():
        mine = np.full((2, 3), float(rank))
        obj = _Foreign(mine)
        x = sm.to_global(obj, placement=pl, sbp=(sm.sbp.broadcast,) * pl.ndim)
        np.testing.assert_array_equal(mine, np.full((2, 3), float(rank)))  # unchanged
        first = pl.rank_list[0]
        np.testing.assert_array_equal(x.numpy(), np.full((2, 3), float(first)))
        mine2 = np.full((2, 3), float(rank))
        x = sm.to_global(mine2, placement=pl, sbp=(sm.sbp.broadcast,) * pl.ndim)
        np.testing.assert_array_equal(mine2, np.full((2, 3), float(rank)))
