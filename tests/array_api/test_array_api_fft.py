"""The ``fft`` extension of ``sbpmpi.array_api`` against ``numpy.fft``, at n = 1..4.

Cases are drawn with Hypothesis (derandomized, no database: every rank draws the same);
inputs are split on an axis the transform moves (uneven at 3 and 4 ranks), broadcast, on a
sub-placement, or on a 2 x 2 mesh at 4 ranks. Every rank compares the gathered result
with NumPy on the whole array, and the layout with the one the docs promise.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import agree
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mpi4py import MPI

import sbpmpi as sm
from sbpmpi import array_api as xp
from sbpmpi.core.sbp import broadcast, split

world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()

SETTINGS = dict(derandomize=True, database=None, deadline=None, print_blob=False,
                suppress_health_check=list(HealthCheck))
SOME = settings(max_examples=25, **SETTINGS)
NORMS = ["backward", "ortho", "forward"]
ONE_AXIS = ["fft", "ifft", "rfft", "irfft", "hfft", "ihfft"]
REAL_INPUT = {"rfft", "ihfft", "rfftn"}


def layouts():
    """(placement, sbp maker) pairs: split on a given dim, broadcast, sub-placement, 2-D."""
    out = ["split", "broadcast"]
    if size > 1:
        out.append("sub")
    if size == 4:
        out.append("mesh")
    return out


def place(value: np.ndarray, how: str, dim: int):
    """``value`` as a global array laid out by ``how``, split along ``dim``."""
    if how == "broadcast":
        return sm.tensor(value, placement=sm.placement("cpu", list(range(size))),
                         sbp=broadcast)
    if how == "sub":
        return sm.tensor(value, placement=sm.placement("cpu", list(range(1, size))),
                         sbp=split(dim))
    if how == "mesh":
        other = (dim + 1) % value.ndim
        sbp = (split(dim), split(other) if other != dim else broadcast)
        return sm.tensor(value, placement=sm.placement("cpu", [[0, 1], [2, 3]]), sbp=sbp)
    return sm.tensor(value, placement=sm.placement("cpu", list(range(size))),
                     sbp=split(dim))


@st.composite
def arrays(draw, real: bool, min_dims: int = 1, max_dims: int = 3):
    shape = tuple(draw(st.lists(st.integers(1, 6), min_size=min_dims, max_size=max_dims)))
    single = draw(st.booleans())
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    value = rng.normal(size=shape)
    if real:
        value = value.astype(np.float32 if single else np.float64)
    else:
        value = (value + 1j * rng.normal(size=shape)).astype(
            np.complex64 if single else np.complex128)
    how = draw(st.sampled_from(layouts()))
    dim = draw(st.integers(0, len(shape) - 1))
    return value, place(value, how, dim)


def close(got, want) -> None:
    """``got`` (a global array) equals NumPy's ``want``: dtype, shape, values."""
    g = got.numpy()
    want = np.asarray(want)

    def check():
        assert g.dtype == want.dtype, f"dtype {g.dtype} != NumPy's {want.dtype}"
        assert g.shape == want.shape, f"shape {g.shape} != NumPy's {want.shape}"
        single = want.dtype in (np.float32, np.complex64)
        scale = max(1.0, float(np.max(np.abs(want), initial=0.0)))
        np.testing.assert_allclose(g, want, rtol=1e-4 if single else 1e-10,
                                   atol=(1e-4 if single else 1e-10) * scale)

    agree(check)


def outcome(fn):
    """("value", result) or the error's type name, on every rank."""
    try:
        return ("value", fn())
    except (TypeError, ValueError, IndexError) as e:
        return (type(e).__name__,)


@pytest.mark.mpi(min_size=1)
def test_the_fft_extension_is_a_submodule_with_every_function():
    names = ["fft", "ifft", "fftn", "ifftn", "rfft", "irfft", "rfftn", "irfftn", "hfft",
             "ihfft", "fftfreq", "rfftfreq", "fftshift", "ifftshift"]
    assert all(callable(getattr(xp.fft, n)) for n in names)
    assert xp.ones(3).__array_namespace__().fft is xp.fft


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("name", ONE_AXIS)
@given(data=st.data())
@SOME
def test_one_axis_transforms_match_numpy(name, data):
    value, x = data.draw(arrays(real=name in REAL_INPUT))
    axis = data.draw(st.integers(-value.ndim, value.ndim - 1))
    n = data.draw(st.one_of(st.none(), st.integers(1, 9)))
    norm = data.draw(st.sampled_from(NORMS))
    want = outcome(lambda: getattr(np.fft, name)(value, n=n, axis=axis, norm=norm))
    got = outcome(lambda: getattr(xp.fft, name)(x, n=n, axis=axis, norm=norm))
    if want[0] != "value":  # irfft/hfft of one point: no default length
        assert got == want
        return
    assert got[0] == "value", got
    close(got[1], want[1])


@st.composite
def axes_and_sizes(draw, ndim: int):
    axes = draw(st.one_of(st.none(), st.lists(st.integers(-ndim, ndim - 1), min_size=1,
                                              max_size=ndim,
                                              unique_by=lambda a: a % ndim)))
    s = None if axes is None else draw(st.one_of(
        st.none(), st.lists(st.integers(1, 8), min_size=len(axes), max_size=len(axes))))
    return axes, s


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("name", ["fftn", "ifftn", "rfftn", "irfftn"])
@given(data=st.data())
@SOME
def test_n_axis_transforms_match_numpy(name, data):
    value, x = data.draw(arrays(real=name in REAL_INPUT))
    axes, s = data.draw(axes_and_sizes(value.ndim))
    norm = data.draw(st.sampled_from(NORMS))
    want = outcome(lambda: getattr(np.fft, name)(value, s=s, axes=axes, norm=norm))
    got = outcome(lambda: getattr(xp.fft, name)(x, s=s, axes=axes, norm=norm))
    if want[0] != "value":
        assert got == want
        return
    assert got[0] == "value", got
    close(got[1], want[1])


@pytest.mark.mpi(min_size=1)
def test_a_split_transformed_axis_moves_to_another_axis():
    """The pencil layout: fft2 of an array split on axis 0 comes back split on axis 1; a
    1-D array is gathered and split again like the input."""
    value = np.arange(30.0).reshape(6, 5) + 1j
    x = sm.tensor(value, placement=sm.placement("cpu", list(range(size))), sbp=split(0))
    out = xp.fft.fftn(x)
    assert out.sbp == (split(1),)
    close(out, np.fft.fftn(value))
    along_1 = xp.fft.fft(x, axis=1)
    assert along_1.sbp == (split(0),)  # nothing to move: the split axis is kept
    close(along_1, np.fft.fft(value, axis=1))
    flat = sm.tensor(value[:, 0], placement=x.placement, sbp=split(0))
    one = xp.fft.ifft(flat)
    assert one.sbp == (split(0),)
    close(one, np.fft.ifft(value[:, 0]))


@pytest.mark.mpi(min_size=1)
def test_inverse_transforms_give_the_input_back():
    rng = np.random.default_rng(3)
    value = rng.normal(size=(5, 3, 4))
    x = sm.tensor(value, placement=sm.placement("cpu", list(range(size))), sbp=split(0))
    close(xp.fft.irfftn(xp.fft.rfftn(x), s=(5, 3, 4), axes=(0, 1, 2)), value)
    close(xp.real(xp.fft.ifftn(xp.fft.fftn(x, norm="ortho"), norm="ortho")), value)


@pytest.mark.mpi(min_size=1)
@given(n=st.integers(1, 20), d=st.floats(0.1, 5), dtype=st.sampled_from([None, "float32"]),
       layout=st.sampled_from(["split", "broadcast"]))
@SOME
def test_fftfreq_and_rfftfreq_match_numpy(n, d, dtype, layout):
    dt = None if dtype is None else getattr(xp, dtype)
    want_dt = np.float64 if dtype is None else np.float32
    with sm.config.override(array_api_sbp=layout):
        f = xp.fft.fftfreq(n, d=d, dtype=dt)
        r = xp.fft.rfftfreq(n, d=d, dtype=dt, device=xp.__array_namespace_info__()
                            .default_device())
    assert f.sbp == ((split(0),) if layout == "split" else (broadcast,))
    close(f, np.fft.fftfreq(n, d).astype(want_dt))
    close(r, np.fft.rfftfreq(n, d).astype(want_dt))


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("name", ["fftshift", "ifftshift"])
@given(data=st.data())
@SOME
def test_shifts_match_numpy(name, data):
    value, x = data.draw(arrays(real=True))
    axes = data.draw(st.one_of(st.none(), st.integers(0, value.ndim - 1),
                               st.lists(st.integers(0, value.ndim - 1), min_size=1,
                                        unique=True)))
    close(getattr(xp.fft, name)(x, axes=axes), getattr(np.fft, name)(value, axes=axes))


@pytest.mark.mpi(min_size=1)
def test_bad_arguments_raise_on_every_rank_before_any_communication():
    x = sm.tensor(np.ones((4, 3), np.complex128), placement=sm.placement(
        "cpu", list(range(size))), sbp=split(0))
    real = xp.asarray(np.ones((4, 3)))
    ints = xp.asarray(np.ones((4, 3), np.int64))
    with pytest.raises(ValueError, match="norm"):
        xp.fft.fft(x, norm="sideways")
    with pytest.raises(ValueError, match="n=0"):
        xp.fft.fft(x, n=0, axis=0)
    with pytest.raises(IndexError, match="axis 2"):
        xp.fft.fft(x, axis=2)
    with pytest.raises(TypeError, match="real floating-point"):
        xp.fft.rfft(x)
    with pytest.raises(TypeError, match="floating-point"):
        xp.fft.fft(ints)
    with pytest.raises(ValueError, match="needs axes"):
        xp.fft.fftn(x, s=(2, 2))
    with pytest.raises(ValueError, match="same length"):
        xp.fft.fftn(x, s=(2,), axes=(0, 1))
    with pytest.raises(ValueError, match="more than once"):
        xp.fft.fftn(x, axes=(0, -2))
    with pytest.raises(ValueError, match="at least one dim"):
        xp.fft.fft(xp.asarray(1.0 + 0j))
    with pytest.raises(ValueError, match="real floating-point"):
        xp.fft.fftfreq(4, dtype=xp.int32)
    with pytest.raises(ValueError, match="n=0"):
        xp.fft.rfftfreq(0)
    close(xp.fft.fft(real), np.fft.fft(np.ones((4, 3))))  # real input: promoted as NumPy does
