"""NumPy functions with array API equivalents (NEP 18), ``sm.einsum`` and einops' own front
end on global tensors (issue 29, defect 15), against NumPy at n = 1..4.

Every row of the op registry's ``COMPOSED`` table is called here as SciPy and scikit-learn
call it (``np.unique``, ``np.atleast_1d``, ...); ``einops.rearrange``, ``reduce``,
``repeat``, ``einsum``, ``pack`` and ``unpack`` find sbpmpi's einops backend. Arrays are
split on their first axis (uneven at 3 and 4 ranks), broadcast, or split on their last.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import agree, errors_of
from mpi4py import MPI

import sbpmpi as sm
from sbpmpi.ops import registry

comm = MPI.COMM_WORLD
size = comm.Get_size()
ALL = sm.placement("cpu", list(range(size)))
R = np.random.default_rng(5)
V = R.normal(size=(7, 3))
INTS = np.array([[3, 1, 2], [3, 0, 1], [4, 4, 0], [1, 1, 1], [0, 2, 2], [5, 0, 3], [2, 2, 9]])
NAN = np.array([2.0, np.nan, 1.0, np.nan, 2.0, 0.5, 1.0])
SBPS = {"S0": (sm.sbp.split(0),), "B": (sm.sbp.broadcast,), "S-1": None}


def glob(a: np.ndarray, how: str):
    sbp = SBPS[how] or (sm.sbp.split(a.ndim - 1),) if a.ndim else (sm.sbp.broadcast,)
    return sm.tensor(a, placement=ALL, sbp=sbp)


def plain(r):
    if isinstance(r, sm.GlobalTensor):
        return r.numpy()
    if isinstance(r, (tuple, list)):
        return [plain(e) for e in r]
    return np.asarray(r)


def same(got, want):
    got, want = plain(got), plain(want)
    if isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), (got, want)
        for g, w in zip(got, want):
            same(g, w)
        return
    assert np.shape(got) == np.shape(want), (np.shape(got), np.shape(want))
    assert np.asarray(got).dtype == np.asarray(want).dtype, (got.dtype, want.dtype)
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-15, equal_nan=True)


# (NumPy function name, calls): every row of the registry's COMPOSED table
CALLS = {
    "unique": [lambda a: np.unique(a), lambda a: np.unique(a, True, True, True),
               lambda a: np.sort(np.unique(a, sorted=False))],  # any order: sort to compare
    "atleast_1d": [lambda a: np.atleast_1d(a[0, 0]), lambda a: np.atleast_1d(a, a[0])],
    "atleast_2d": [lambda a: np.atleast_2d(a[0]), lambda a: np.atleast_2d(a[0, 0])],
    "atleast_3d": [lambda a: np.atleast_3d(a[0]), lambda a: np.atleast_3d(a)],
    "expand_dims": [lambda a: np.expand_dims(a, (0, 3))],
    "squeeze": [lambda a: np.squeeze(a[:, :1]), lambda a: np.squeeze(a[None], axis=0)],
    "stack": [lambda a: np.stack([a, a], axis=1)],
    "moveaxis": [lambda a: np.moveaxis(a, 0, 1)],
    "flip": [lambda a: np.flip(a), lambda a: np.flip(a, 1)],
    "roll": [lambda a: np.roll(a, 2, axis=0), lambda a: np.roll(a, -1)],
    "tile": [lambda a: np.tile(a, 2), lambda a: np.tile(a, (2, 1))],
    "repeat": [lambda a: np.repeat(a, 2, axis=1)],
    "broadcast_to": [lambda a: np.broadcast_to(a[0], (2, a.shape[1]))],
    "sort": [lambda a: np.sort(a, axis=0), lambda a: np.sort(a, axis=None)],
    "argsort": [lambda a: np.argsort(a, axis=1, stable=True)],
    "argmax": [lambda a: np.argmax(a, axis=0), lambda a: np.argmax(a)],
    "argmin": [lambda a: np.argmin(a, axis=1, keepdims=True)],
    "cumsum": [lambda a: np.cumsum(a), lambda a: np.cumsum(a, axis=0)],
    "cumprod": [lambda a: np.cumprod(a, axis=1)],
    "prod": [lambda a: np.prod(a, axis=0), lambda a: np.prod(a, keepdims=True)],
    "std": [lambda a: np.std(a, axis=0, ddof=1), lambda a: np.std(a)],
    "all": [lambda a: np.all(a > -2, axis=0)],
    "any": [lambda a: np.any(a > 1, axis=1, keepdims=True)],
    "count_nonzero": [lambda a: np.count_nonzero(a > 0, axis=0)],
    "diff": [lambda a: np.diff(a, 2, 0), lambda a: np.diff(a)],
    "take": [lambda a: np.take(a, [0, 2], axis=1), lambda a: np.take(a, [5, 1])],
    "take_along_axis": [lambda a: np.take_along_axis(a, np.argsort(a, axis=0), axis=0)],
    "searchsorted": [lambda a: np.searchsorted(np.sort(a[:, 0]), a[:, 1])],
    "nonzero": [lambda a: np.nonzero(a > 0.5)],
    "tensordot": [lambda a: np.tensordot(a, a, axes=([0], [0]))],
    "zeros_like": [lambda a: np.zeros_like(a)],
    "ones_like": [lambda a: np.ones_like(a, dtype=np.int64)],
    "empty_like": [lambda a: np.empty_like(a).shape],
    "full_like": [lambda a: np.full_like(a, 3.0)],
    "copy": [lambda a: np.copy(a)],
    "clip": [lambda a: np.clip(a, -0.5, 0.5), lambda a: np.clip(a, min=0.0)],
    "einsum": [lambda a: np.einsum("ij,ik->jk", a, a), lambda a: np.einsum("ij->j", a)],
}
FLOATS = {"sort", "argsort", "argmax", "argmin", "cumsum", "cumprod", "prod", "std", "all",
          "any", "count_nonzero", "diff", "searchsorted", "nonzero", "tensordot", "clip",
          "einsum", "take_along_axis", "zeros_like", "full_like", "empty_like"}


def test_every_row_of_the_table_is_tested_here():
    assert set(CALLS) == set(registry.COMPOSED)


@pytest.mark.mpi(min_size=1)
@pytest.mark.timeout(180)
@pytest.mark.parametrize("how", list(SBPS))
@pytest.mark.parametrize("name", sorted(CALLS))
def test_numpy_function_matches_numpy(name, how):
    data = V if name in FLOATS else INTS
    for call in CALLS[name]:
        want = call(data)
        g = glob(data, how)
        with np.errstate(all="ignore"):
            got = call(g)
        agree(lambda got=got, want=want: same(got, want))
    if name == "unique":  # NaN: one value, as NumPy's default equal_nan=True
        want = np.unique(NAN, return_index=True, return_inverse=True, return_counts=True)
        got = np.unique(glob(NAN, how), return_index=True, return_inverse=True,
                        return_counts=True)
        agree(lambda: same(got, want))


@pytest.mark.mpi(min_size=1)
@pytest.mark.timeout(60)
def test_numpy_arguments_without_an_equivalent_are_refused_on_every_rank():
    x = glob(V, "S0")
    for f in (lambda: np.unique(x, axis=0), lambda: np.sort(x, order="a"),
              lambda: np.cumsum(x, out=x), lambda: np.take(x, [0], mode="clip"),
              lambda: np.einsum("ij->j", x, out=x)):
        kind, msg = errors_of(f)
        assert kind == "TypeError" and "GlobalTensors" in msg, (kind, msg)


EINSUMS = [("nk,km->nm", (0, 1)), ("ij,jk", (0, 1)), ("bhw->b", (2,)), ("bhh->bh", (3,)),
           ("nk,nj->nkj", (0, 0)), ("...ij->...ji", (2,)), ("ii", (4,)), ("ij,ij->", (0, 0)),
           ("nk,km,mj->nj", (0, 1, 5)), ("bij,bjk->bik", (2, 6))]
OPERANDS = [V, R.normal(size=(3, 5)), R.normal(size=(7, 4, 6)), R.normal(size=(5, 4, 4)),
            R.normal(size=(4, 4)), R.normal(size=(5, 2)), R.normal(size=(7, 6, 2))]


@pytest.mark.mpi(min_size=1)
@pytest.mark.timeout(180)
@pytest.mark.parametrize("how", list(SBPS))
@pytest.mark.parametrize("subscripts,which", EINSUMS, ids=[e[0] for e in EINSUMS])
def test_einsum_matches_numpy(subscripts, which, how):
    ops = [OPERANDS[i] for i in which]
    want = np.einsum(subscripts, *ops)
    got = sm.einsum(subscripts, *(glob(a, how) for a in ops))
    agree(lambda: same(got, want))


@pytest.mark.mpi(min_size=1)
@pytest.mark.timeout(60)
def test_einsum_refuses_bad_subscripts_on_every_rank():
    x = glob(V, "S0")
    for f, kind in ((lambda: sm.einsum("ij,jk->ik", x), "ValueError"),
                    (lambda: sm.einsum("ijk->i", x), "ValueError"),
                    (lambda: sm.einsum("ij->q", x), "ValueError"),
                    (lambda: sm.einsum("i1->i", x), "ValueError"),
                    (lambda: sm.einsum("ij->i", V), "TypeError")):
        got, msg = errors_of(f)
        assert got == kind and "einsum" in msg, (got, msg)


einops = pytest.importorskip("einops")
T = R.normal(size=(7, 4, 6))
EINOPS = {
    "rearrange transpose": lambda t: einops.rearrange(t, "b h w -> b w h"),
    "rearrange merge": lambda t: einops.rearrange(t, "b h w -> b (h w)"),
    "rearrange split": lambda t: einops.rearrange(t, "b h (w c) -> b c h w", c=2),
    "rearrange merge dim 0": lambda t: einops.rearrange(t, "b h w -> (b h) w"),
    "rearrange list": lambda t: einops.rearrange([t, t], "n b h w -> b n h w"),
    "reduce sum": lambda t: einops.reduce(t, "b h w -> b h", "sum"),
    "reduce mean": lambda t: einops.reduce(t, "b h w -> h", "mean"),
    "reduce max pool": lambda t: einops.reduce(t, "b h (w 2) -> b h w", "max"),
    "reduce min": lambda t: einops.reduce(t, "b h w -> w", "min"),
    "reduce prod": lambda t: einops.reduce(t, "b h w -> b", "prod"),
    "repeat": lambda t: einops.repeat(t, "b h w -> b h w c", c=2),
    "repeat new dim": lambda t: einops.repeat(t[:, 0], "b w -> r b w", r=3),
    "einsum": lambda t: einops.einsum(t, t, "b h w, b g w -> b h g"),
    "einsum sum": lambda t: einops.einsum(t, "b h w -> w"),
    "pack": lambda t: einops.pack([t, t[:, :, 0]], "b *")[0],
    "unpack": lambda t: einops.unpack(t, [[2], [4]], "b h *")[1],
    "parse_shape": lambda t: list(einops.parse_shape(t, "b h w").values()),
}


@pytest.mark.mpi(min_size=1)
@pytest.mark.timeout(180)
@pytest.mark.parametrize("how", list(SBPS))
@pytest.mark.parametrize("name", list(EINOPS))
def test_einops_front_end_matches_numpy(name, how):
    want = EINOPS[name](T)
    got = EINOPS[name](glob(T, how))
    if name not in ("parse_shape", "unpack", "pack") and not isinstance(got, list):
        assert isinstance(got, sm.GlobalTensor), type(got)
    agree(lambda: same(got, want))
