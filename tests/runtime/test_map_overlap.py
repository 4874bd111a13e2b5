"""``sm.map_overlap`` and ``x.halo`` under MPI, compared with NumPy on the whole array.

Every rank builds the same whole array from a seed, lays it out (1-D and 2-D splits,
meshes 1xN, Nx1, 2x2, uneven and empty blocks, broadcast mesh axes), and compares:
``x.halo(...).wait()`` with the window of ``np.pad`` of the whole array around its
block, and ``sm.map_overlap(fn, ...)`` with ``fn`` of ``np.pad`` of the whole array,
trimmed, for every boundary and depths 1 and 3 (larger than some blocks).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from conftest import agree, errors_of
from mpi4py import MPI

import sbpmpi as sm

world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()

MODES = {"periodic": "wrap", "reflect": "symmetric", "nearest": "edge", "constant": "constant"}
BOUNDARIES = ["none", "periodic", "reflect", "nearest", "constant"]
VALUE = -2.5


def np_pad(whole, depth, boundary):
    """NumPy's padding of the whole array ('none' pads nothing)."""
    if boundary == "none":
        return whole
    kw = {"constant_values": VALUE} if boundary == "constant" else {}
    return np.pad(whole, depth, mode=MODES[boundary], **kw)


def window(whole, x, depth, boundary):
    """This rank's padded shard, cut from np.pad of the whole array."""
    key = []
    for (a, b), n in zip(x.layout.local_ranges(rank), whole.shape):
        key.append(slice(max(a - depth, 0), min(b + depth, n)) if boundary == "none"
                   else slice(a, b + 2 * depth))
    return np_pad(whole, depth, boundary)[tuple(key)]


def agree_close(got, expected, msg="", exact=False):
    """Compare on every rank; fail on every rank if one differs."""
    check = np.testing.assert_array_equal if exact else np.testing.assert_allclose
    agree(lambda: check(got, expected, err_msg=msg))


def layouts(ndim):
    """(placement, sbp) of the layouts this world size allows."""
    out = [(sm.placement("cpu", list(range(size))), [sm.sbp.split(d)]) for d in range(ndim)]
    out.append((sm.placement("cpu", list(range(size))), [sm.sbp.broadcast]))
    if ndim == 2:
        meshes = {(1, size), (size, 1)} | ({(2, size // 2)} if size % 2 == 0 else set())
        for mesh in sorted(meshes):
            pl = sm.placement("cpu", np.arange(size).reshape(mesh))
            out += [(pl, [sm.sbp.split(0), sm.sbp.split(1)]),
                    (pl, [sm.sbp.split(1), sm.sbp.split(0)]),
                    (pl, [sm.sbp.split(0), sm.sbp.broadcast])]
    return out


def laplacian(u):
    """A 5-point (or 3-point) stencil that keeps the padded shape (np.roll on the block:
    wrong only in the padding, which is trimmed)."""
    out = -2.0 * u.ndim * u
    for d in range(u.ndim):
        out = out + np.roll(u, 1, axis=d) + np.roll(u, -1, axis=d)
    return out


def smooth3(u):
    """A reach-3 stencil along axis 0: the mean of rows i-3 and i+3."""
    return 0.5 * (np.roll(u, 3, axis=0) + np.roll(u, -3, axis=0))


SHAPES = [(7,), (3,), (6, 5), (2, 3)]  # (3,) and (2, 3): empty blocks at 4 ranks


def cases():
    for shape in SHAPES:
        for (pl, sbp), boundary in itertools.product(layouts(len(shape)), BOUNDARIES):
            yield shape, pl, sbp, boundary


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("depth", [1, 3])
def test_halo_wait_is_the_np_pad_window(depth):
    rng = np.random.default_rng(7)
    for shape, pl, sbp, boundary in cases():
        whole = rng.standard_normal(shape)
        x = sm.tensor(whole, placement=pl, sbp=sbp)
        h = x.halo(depth, boundary=boundary, value=VALUE)
        got = h.wait()
        agree_close(got, window(whole, x, depth, boundary),
                    f"{shape} {pl} {sbp} {boundary} depth {depth}", exact=True)
        assert h.test() and h.wait() is got


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("depth", [1, 3])
def test_map_overlap_is_fn_of_the_padded_whole_array(depth):
    rng = np.random.default_rng(8)
    for shape, pl, sbp, boundary in cases():
        whole = rng.standard_normal(shape)
        x = sm.tensor(whole, placement=pl, sbp=sbp)
        fn = laplacian if depth == 1 else smooth3
        got = sm.map_overlap(fn, x, depth=depth, boundary=boundary, value=VALUE)
        if boundary == "none":
            # the edges see no padding: fn of the whole array as it is
            expected = fn(whole)
            inner = tuple(slice(depth, n - depth) for n in shape)
            agree_close(got.numpy()[inner], expected[inner], f"{shape} {pl} {sbp} none")
        else:
            trim = tuple(slice(depth, depth + n) for n in shape)
            expected = fn(np_pad(whole, depth, boundary))[trim]
            agree_close(got.numpy(), expected, f"{shape} {pl} {sbp} {boundary}")
        assert got.layout == x.layout


@pytest.mark.mpi(min_size=1)
def test_none_boundary_trims_only_the_padding_added():
    # fn sees the true global edge: with 'none' the edge rows keep fn's own values
    whole = np.arange(20.0).reshape(10, 2)
    x = sm.tensor(whole, placement=sm.placement("cpu", list(range(size))), sbp=sm.sbp.split(0))

    def diff(u):  # a forward difference, 0 on the last row of the block it sees
        out = np.zeros_like(u)
        out[:-1] = u[1:] - u[:-1]
        return out

    got = sm.map_overlap(diff, x, depth=1, boundary="none")
    agree(lambda: np.testing.assert_array_equal(got.numpy(), diff(whole)))


@pytest.mark.mpi(min_size=1)
def test_depth_and_boundary_per_axis_and_several_tensors():
    mesh = (2, size // 2) if size % 2 == 0 else (1, size)
    pl = sm.placement("cpu", np.arange(size).reshape(mesh))
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((7, 5)), rng.standard_normal((7, 5))
    x = sm.tensor(a, placement=pl, sbp=[sm.sbp.split(0), sm.sbp.split(1)])
    y = sm.tensor(b, placement=pl, sbp=[sm.sbp.split(0), sm.sbp.split(1)])
    got = sm.map_overlap(lambda u, v: u * np.roll(v, 2, axis=0) + np.roll(u, -1, axis=1),
                         x, y, depth={0: 2, 1: 1}, boundary=("periodic", "reflect"))
    pa = np.pad(np.pad(a, [(2, 2), (0, 0)], mode="wrap"), [(0, 0), (1, 1)], mode="symmetric")
    pb = np.pad(np.pad(b, [(2, 2), (0, 0)], mode="wrap"), [(0, 0), (1, 1)], mode="symmetric")
    expected = (pa * np.roll(pb, 2, axis=0) + np.roll(pa, -1, axis=1))[2:9, 1:6]
    agree(lambda: np.testing.assert_allclose(got.numpy(), expected))
    # the result's shard (a view of fn's padded result) works with ops and conversions
    agree_close((got * 2 + x).numpy(), 2 * expected + a)
    agree_close(got.to_global(sbp=[sm.sbp.broadcast, sm.sbp.split(0)]).numpy(), expected)
    # fn may return the shard's shape instead of the padded one
    same = sm.map_overlap(lambda u: u[2:-2, 1:-1] * 2, x, depth=(2, 1), boundary="nearest")
    agree(lambda: np.testing.assert_array_equal(same.numpy(), 2 * a))


@pytest.mark.mpi(min_size=1)
def test_interior_computed_while_the_halo_travels():
    pl = sm.placement("cpu", list(range(size)))
    whole = np.arange(24.0).reshape(12, 2)
    x = sm.tensor(whole, placement=pl, sbp=sm.sbp.split(0))
    h = x.halo(1, boundary="periodic")
    interior = x.to_local()[1:-1] * 2  # work on the shard before waiting (every axis is padded)
    padded = h.wait()
    agree(lambda: np.testing.assert_array_equal(padded[2:-2, 1:-1] * 2, interior[:, :]))
    agree(lambda: np.testing.assert_array_equal(padded, window(whole, x, 1, "periodic")))


@pytest.mark.mpi(min_size=1)
def test_subset_placement_and_integer_dtype():
    pl = sm.placement("cpu", [0])
    whole = np.arange(6, dtype=np.int32)
    x = sm.tensor(whole, placement=pl, sbp=sm.sbp.split(0))
    got = sm.map_overlap(lambda u: np.roll(u, 1) + u, x, depth=1, boundary="periodic")
    assert got.dtype == np.int32
    expected = (np.roll(np.pad(whole, 1, mode="wrap"), 1) + np.pad(whole, 1, mode="wrap"))[1:-1]
    if rank == 0:
        np.testing.assert_array_equal(got.to_local(), expected)
    else:
        assert got.to_local().size == 0


@pytest.mark.mpi(min_size=1)
def test_bad_arguments_raise_the_same_error_on_every_rank():
    pl = sm.placement("cpu", list(range(size)))
    x = sm.tensor(np.ones((4, 3)), placement=pl, sbp=sm.sbp.split(0))
    y = sm.tensor(np.ones((4, 3)), placement=pl, sbp=sm.sbp.split(1))
    p = sm.tensor(np.ones(4), placement=pl, sbp=sm.sbp.partial_sum)
    e = sm.tensor(np.ones((0, 3)), placement=pl, sbp=sm.sbp.split(0))
    g = sm.tensor(np.ones((4, 3)), placement=pl, sbp=sm.sbp.split(0)).requires_grad_()
    bad = [
        (lambda: sm.map_overlap(np.sin, x, y, depth=1), "ValueError", "argument 2"),
        (lambda: sm.map_overlap(np.sin, x, depth=-1), "ValueError", "depth must be >= 0"),
        (lambda: sm.map_overlap(np.sin, x, depth=(1, 2, 3)), "ValueError", "3 entries"),
        (lambda: sm.map_overlap(np.sin, x, depth=1.5), "TypeError", "non-negative int"),
        (lambda: sm.map_overlap(np.sin, x, depth=1, boundary="wrap"), "ValueError", "boundary"),
        (lambda: x.halo(1, boundary="mirror"), "ValueError", "one of none, periodic"),
        (lambda: p.halo(1), "ValueError", "partial"),
        (lambda: sm.map_overlap(np.sin, e, depth=1, boundary="periodic"), "ValueError",
         "length 0"),
        (lambda: sm.map_overlap(np.sin, g, depth=1), "RuntimeError", "autograd"),
        (lambda: sm.map_overlap(np.sin, np.ones(3), depth=1), "TypeError", "GlobalTensor"),
    ]
    for fn, kind, words in bad:
        got = errors_of(fn)
        assert got[0] == kind and words in got[1], got
    with sm.no_grad():  # no gradient wanted: allowed
        out = sm.map_overlap(np.sin, g, depth=1)
    agree(lambda: np.testing.assert_allclose(out.numpy(), np.sin(np.ones((4, 3)))))
