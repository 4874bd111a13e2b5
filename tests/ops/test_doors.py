"""Every door of an op gives the same value and layout, at n = 1..4 with uneven splits.

``x + y``, ``np.add(x, y)``, ``xp.add(x, y)`` and ``sm.add(x, y)`` are one registered op
(likewise ``//``, ``%``, ``**``, the bitwise operators, comparisons, unary operators and
``np.sin``); in-place operators and ``np.<ufunc>(..., out=z)`` write into their target
in its layout; ``A @ w`` takes 1-D operands as NumPy does. Each result is compared with
NumPy on the whole array, on every rank.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from conftest import agree, assert_same_on_all_ranks, errors_of, op_placements
from mpi4py import MPI

import sbpmpi as sm
from sbpmpi import array_api as xp
from sbpmpi.testing import Input, check_grad, check_op

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
S, B, P = sm.sbp.split, sm.sbp.broadcast, sm.sbp.partial_sum


def placements():
    return op_placements(size)


def layouts(pl, ndim, partial=True):
    one = [B] + [S(d) for d in range(ndim)] + ([P] if partial else [])
    if pl.ndim == 1:
        return [(s,) for s in one]
    return [(a, b) for a, b in itertools.product(one, repeat=2)][:8]


def pairs(pl, ndim_a, ndim_b, most=12):
    """Layout pairs of two operands: all on a 1-D mesh, ``most`` of them (seeded) on 2-D."""
    every = list(itertools.product(layouts(pl, ndim_a), layouts(pl, ndim_b)))
    if pl.ndim == 1 or len(every) <= most:
        return every
    pick = np.random.default_rng(ndim_a * 10 + ndim_b).choice(len(every), most, replace=False)
    return [every[i] for i in sorted(pick)]


def same(got, want, what):
    """``got`` equals NumPy's ``want`` exactly (dtype, shape, values, NaN) on every rank."""
    g = got.numpy()

    def check():
        assert g.dtype == want.dtype, (what, g.dtype, want.dtype)
        np.testing.assert_array_equal(g, want, err_msg=str(what))

    agree(check)


def close(got, want, what):
    g = got.numpy()

    def check():
        assert g.dtype == want.dtype, (what, g.dtype, want.dtype)
        np.testing.assert_allclose(g, want, rtol=1e-12, atol=1e-12, err_msg=str(what))

    agree(check)


def identical(results, what):
    """Results of the same expression by several doors: same layout, same shard values."""
    first = results[0]
    for r in results[1:]:
        assert r.layout == first.layout, (what, r.layout, first.layout)
        assert r.dtype == first.dtype, (what, r.dtype, first.dtype)
        np.testing.assert_array_equal(r.to_local(), first.to_local(), err_msg=str(what))


# (operator, sm name, np ufunc, array API name, operand kind)
BINARY = [
    (lambda a, b: a + b, "add", np.add, "add", "f"),
    (lambda a, b: a - b, "sub", np.subtract, "subtract", "f"),
    (lambda a, b: a * b, "mul", np.multiply, "multiply", "f"),
    (lambda a, b: a / b, "div", np.divide, "divide", "f"),
    (lambda a, b: a // b, "floor_divide", np.floor_divide, "floor_divide", "f"),
    (lambda a, b: a % b, "remainder", np.remainder, "remainder", "f"),
    (lambda a, b: a ** b, "pow", np.power, "pow", "f"),
    (lambda a, b: a < b, "lt", np.less, "less", "f"),
    (lambda a, b: a >= b, "ge", np.greater_equal, "greater_equal", "f"),
    (lambda a, b: a == b, "eq", np.equal, "equal", "f"),
    (lambda a, b: a & b, "bitwise_and", np.bitwise_and, "bitwise_and", "i"),
    (lambda a, b: a | b, "bitwise_or", np.bitwise_or, "bitwise_or", "i"),
    (lambda a, b: a ^ b, "bitwise_xor", np.bitwise_xor, "bitwise_xor", "i"),
    (lambda a, b: a << b, "bitwise_left_shift", np.left_shift, "bitwise_left_shift", "i"),
    (lambda a, b: a >> b, "bitwise_right_shift", np.right_shift, "bitwise_right_shift", "i"),
    (lambda a, b: a // b, "floor_divide", np.floor_divide, "floor_divide", "i"),
    (lambda a, b: a % b, "remainder", np.remainder, "remainder", "i"),
]


def values(kind, shape, seed):
    rng = np.random.default_rng(seed)
    if kind == "f":
        return rng.uniform(0.5, 3.0, size=shape)  # positive: pow, division
    return rng.integers(1, 7, size=shape).astype(np.int64)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("case", range(len(BINARY)), ids=[f"{c[1]}-{c[4]}" for c in BINARY])
def test_binary_operators_equal_every_other_door(case):
    expr, name, ufunc, api, kind = BINARY[case]
    a, b = values(kind, (5, 3), 1), values(kind, (3,), 2)
    want = ufunc(a, b)
    for pl in placements():
        for sa, sb in pairs(pl, 2, 1, most=8):
            x = sm.tensor(a, placement=pl, sbp=sa)
            y = sm.tensor(b, placement=pl, sbp=sb)
            what = (name, pl, sa, sb)
            got = [expr(x, y), ufunc(x, y), getattr(xp, api)(x, y), getattr(sm, name)(x, y)]
            identical(got, what)
            same(got[0], want, what)
        x = sm.tensor(a, placement=pl, sbp=layouts(pl, 2)[1])
        s = 2 if kind == "i" else 1.5  # a Python scalar operand, reflected too
        identical([expr(x, s), ufunc(x, s), getattr(xp, api)(x, s), getattr(sm, name)(x, s)],
                  (name, "scalar"))
        same(expr(x, s), ufunc(a, s), (name, "scalar"))
        identical([expr(s, x), ufunc(s, x), getattr(xp, api)(s, x), getattr(sm, name)(s, x)],
                  (name, "reflected"))
        same(expr(s, x), ufunc(s, a), (name, "reflected"))


UNARY = [
    (lambda a: -a, "neg", np.negative, "negative", "f"),
    (lambda a: +a, "positive", np.positive, "positive", "f"),
    (lambda a: abs(a), "abs", np.absolute, "abs", "f"),
    (lambda a: ~a, "bitwise_invert", np.invert, "bitwise_invert", "i"),
    (None, "sin", np.sin, "sin", "f"),
    (None, "floor", np.floor, "floor", "f"),
    (None, "expm1", np.expm1, "expm1", "f"),
]


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("case", range(len(UNARY)), ids=[c[1] for c in UNARY])
def test_unary_operators_and_ufuncs_equal_every_other_door(case):
    expr, name, ufunc, api, kind = UNARY[case]
    a = values(kind, (5, 3), 3) - (2 if kind == "i" else 1.7)
    want = ufunc(a)
    for pl in placements():
        for sa in layouts(pl, 2):
            x = sm.tensor(a, placement=pl, sbp=sa)
            got = ([expr(x)] if expr else []) + [ufunc(x), getattr(xp, api)(x),
                                                  getattr(sm, name)(x)]
            identical(got, (name, pl, sa))
            close(got[0], want, (name, pl, sa))


INPLACE = [
    ("+", lambda x, y: x.__iadd__(y), np.add),
    ("-", lambda x, y: x.__isub__(y), np.subtract),
    ("*", lambda x, y: x.__imul__(y), np.multiply),
    ("/", lambda x, y: x.__itruediv__(y), np.divide),
    ("//", lambda x, y: x.__ifloordiv__(y), np.floor_divide),
    ("%", lambda x, y: x.__imod__(y), np.remainder),
    ("**", lambda x, y: x.__ipow__(y), np.power),
]


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("case", range(len(INPLACE)), ids=[c[0] for c in INPLACE])
def test_inplace_operators_keep_the_object_its_layout_dtype_and_shape(case):
    sym, inplace, ufunc = INPLACE[case]
    a, b = values("f", (5, 3), 4), values("f", (3,), 5)
    for pl in placements():
        for sa, sb in pairs(pl, 2, 1, most=6):
            x = sm.tensor(a, placement=pl, sbp=sa)
            y = sm.tensor(b, placement=pl, sbp=sb)
            before = x.layout
            out = inplace(x, y)
            assert out is x and x.layout == before, (sym, sa, sb, x.layout)
            close(x, ufunc(a, b), (sym, pl, sa, sb))
            x2 = sm.tensor(a, placement=pl, sbp=sa)
            assert inplace(x2, 2.0) is x2 and x2.layout == before  # a scalar operand
            close(x2, ufunc(a, 2.0), (sym, "scalar"))
    pl = placements()[0]
    xi = sm.tensor(np.arange(6).reshape(2, 3), placement=pl, sbp=S(0))
    kind, msg = errors_of(lambda: inplace(xi, 1.5))
    assert kind == "TypeError" and "keep the dtype of x" in msg
    xs = sm.tensor(np.ones(3), placement=pl, sbp=B)
    kind, msg = errors_of(lambda: inplace(xs, sm.tensor(np.ones((2, 3)), placement=pl, sbp=B)))
    assert kind == "ValueError" and "keep the shape of x" in msg
    xg = sm.tensor(np.ones(3), placement=pl, sbp=B, requires_grad=True)
    kind, msg = errors_of(lambda: inplace(xg, 1.0))
    assert kind == "RuntimeError" and "autograd" in msg


@pytest.mark.mpi(min_size=1)
def test_ufunc_out_writes_into_a_global_tensor_in_its_layout():
    a, b = values("f", (5, 3), 6), values("f", (5, 3), 7)
    for pl in placements():
        for sz in layouts(pl, 2):
            x = sm.tensor(a, placement=pl, sbp=layouts(pl, 2)[1])
            y = sm.tensor(b, placement=pl, sbp=B if pl.ndim == 1 else (B, B))
            z = sm.zeros((5, 3), placement=pl, sbp=sz, dtype=np.float64)
            r = np.add(x, y, out=z)
            assert r is z and z.layout.sbp == tuple(sz)
            same(z, a + b, ("add out", sz))
            z32 = sm.zeros((5, 3), placement=pl, sbp=sz, dtype=np.float32)
            np.multiply(x, y, out=(z32,))  # NEP 13 form: a tuple; same_kind float64 -> float32
            same(z32, np.multiply(a, b).astype(np.float32), ("mul out f32", sz))
            zb = sm.zeros((2, 5, 3), placement=pl, sbp=B if pl.ndim == 1 else (B, B),
                          dtype=np.float64)
            np.sin(x, out=zb)  # the result broadcast to out's shape, as NumPy
            want = np.empty((2, 5, 3))
            np.sin(a, out=want)
            close(zb, want, ("sin out broadcast", sz))
            np.add(x, y, out=x)  # out= an input
            same(x, a + b, ("add out=x", sz))
    pl = placements()[0]
    x = sm.tensor(a, placement=pl, sbp=S(0))
    zi = sm.zeros((5, 3), placement=pl, sbp=S(0), dtype=np.int64)
    kind, msg = errors_of(lambda: np.add(x, 1.0, out=zi))
    assert kind == "TypeError" and "same_kind" in msg
    kind, msg = errors_of(lambda: np.add(x, 1.0, out=np.empty((5, 3))))
    assert kind == "TypeError" and "out must be a GlobalTensor" in msg
    small = sm.zeros((3,), placement=pl, sbp=B, dtype=np.float64)
    kind, msg = errors_of(lambda: np.add(x, 1.0, out=small))
    assert kind == "ValueError" and "does not broadcast" in msg


# ---- A @ w with 1-D operands, as NumPy ---------------------------------------------------------

MATMUL_SHAPES = [((5, 3), (3,)), ((3,), (3, 4)), ((3,), (3,)), ((2, 5, 3), (3,)),
                 ((3,), (2, 3, 4))]


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("shapes", MATMUL_SHAPES, ids=[f"{a}@{b}" for a, b in MATMUL_SHAPES])
def test_matmul_of_vectors_equals_numpy_and_the_array_api_for_every_sbp(shapes):
    sa, sb = shapes
    rng = np.random.default_rng(8)
    a, b = rng.standard_normal(sa), rng.standard_normal(sb)
    want = a @ b
    for pl in placements():
        for la, lb in pairs(pl, len(sa), len(sb)):
            x = sm.tensor(a, placement=pl, sbp=la)
            w = sm.tensor(b, placement=pl, sbp=lb)
            got = [x @ w, xp.matmul(x, w), np.matmul(x, w), sm.matmul(x, w)]
            identical(got, (shapes, la, lb))
            close(got[0], want, (shapes, pl, la, lb))
            assert got[0].shape == want.shape
    x = sm.tensor(a, placement=placements()[0], sbp=B)
    assert str(sm.explain("matmul", x, sm.tensor(b, placement=x.placement, sbp=B)))


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("shapes", MATMUL_SHAPES, ids=[f"{a}@{b}" for a, b in MATMUL_SHAPES])
def test_gradients_of_matmul_with_vectors(shapes):
    sa, sb = shapes
    check_grad(lambda x, w: x @ w, lambda a, b: a @ b, [Input(sa), Input(sb)], max_combos=6,
               name=f"matmul {sa} @ {sb}")


@pytest.mark.mpi(min_size=1)
def test_matmul_of_vectors_via_check_op():
    check_op(sm.matmul, np.matmul, [Input((7, 5)), Input((5,))], max_combos=10)
    check_op(sm.matmul, np.matmul, [Input((5,)), Input((5,))], max_combos=10)


@pytest.mark.mpi(min_size=1)
def test_np_sin_and_var_by_every_door():
    a = np.linspace(-2.0, 3.0, 15).reshape(5, 3)
    for pl in placements():
        for sa in layouts(pl, 2):
            x = sm.tensor(a, placement=pl, sbp=sa)
            identical([np.sin(x), xp.sin(x), sm.sin(x), sm.ops.sin(x)], ("sin", sa))
            close(np.sin(x), np.sin(a), ("sin", sa))
            close(np.var(x, axis=0, ddof=1), np.var(a, axis=0, ddof=1), ("var", sa))
            close(sm.var(x, 0, correction=1), np.var(a, axis=0, ddof=1), ("sm.var", sa))
    assert_same_on_all_ranks(True)
