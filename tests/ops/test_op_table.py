"""Table-wide tests over the whole op registry, no skip list, at n = 1..4 (uneven splits).

For every registered op (its examples in tests/ops/op_examples.py; an op without one fails):

- every row of its signature table, resolved for the example's operands, on a 1-D mesh of
  all ranks, one of all ranks but rank 0, and a 2x2 mesh (n = 4, rows combined over both
  axes): the operands are laid out as the row says (partial ones as random operands),
  the op's kernel runs on the local shards, and the result, read as the row's output
  layout, equals NumPy's on the whole array;
- ``sm.explain(name, ...)`` describes a call;
- the op through its full path (inference, boxing) equals NumPy's value and dtype for
  split, broadcast and partial operands;
- for pointwise ops, the result dtype for float32, int and bool operands is NumPy's (or
  both refuse the dtypes).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from conftest import agree, op_placements
from mpi4py import MPI
from op_examples import EXAMPLES

import sbpmpi as sm
from sbpmpi import backend
from sbpmpi.core.layout import Layout
from sbpmpi.ops.elementwise import POINTWISE
from sbpmpi.ops.exactness import exact
from sbpmpi.ops.kernel import local_result
from sbpmpi.ops.registry import REGISTRY
from sbpmpi.ops.signature import admissible, resolve
from sbpmpi.tensor import GlobalTensor
from sbpmpi.testing import make_input

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
B = sm.sbp.broadcast
NAMES = sorted(REGISTRY)
CASES = [(name, k) for name in NAMES for k in range(len(EXAMPLES.get(name, [None])))]


def meshes():
    return op_placements(size)


def example(name, k):
    assert name in EXAMPLES, f"op {name!r} has no example in tests/ops/op_examples.py"
    return EXAMPLES[name][k]


def tensors(ex, pl, sbps, rng):
    """The example's arrays as global tensors laid out by ``sbps`` (None: broadcast)."""
    return [make_input(np.asarray(a), pl, s if s is not None else (B,) * pl.ndim, rng)
            for a, s in zip(ex.arrays, sbps)]


def build(name, ex, ts):
    args, kwargs = ex.call(*ts)
    return REGISTRY[name].op.build(*args, **kwargs)


def close(got, want, rtol, what):
    want = np.asarray(want)

    def check():
        assert got.shape == want.shape, (what, got.shape, want.shape)
        if want.dtype.kind in "fc":
            np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol, equal_nan=True,
                                       err_msg=str(what))
        else:
            np.testing.assert_array_equal(got, want, err_msg=str(what))

    agree(check)


def combos(rows, ndim, seed):
    every = list(itertools.product(range(len(rows)), repeat=ndim))
    if len(every) <= 16:
        return every
    pick = np.random.default_rng(seed).choice(len(every), 16, replace=False)
    return [every[i] for i in sorted(pick)]


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("name, k", CASES, ids=[f"{n}-{k}" for n, k in CASES])
def test_every_row_of_every_table_gives_numpys_value(name, k):
    ex = example(name, k)
    want = ex.reference(*ex.arrays)
    rng = np.random.default_rng(7)
    me = comm.Get_rank()
    for pl in meshes():
        probe = tensors(ex, pl, [None] * len(ex.arrays), rng)
        call0 = build(name, ex, probe)
        ops0 = call0.operands
        is_t = [isinstance(o, GlobalTensor) for o in ops0]
        rows = resolve(call0.table, call0.dims, [o.ndim if t else 0 for o, t in zip(ops0, is_t)],
                       len(call0.out_shape), fixed=[not t for t in is_t])
        dts = [o.dtype if t else None for o, t in zip(ops0, is_t)]
        rows = [r for r in rows if admissible(r, dts, call0.out_dtype)
                and exact(r, name, ops0, call0.out_dtype)]
        assert rows, (name, "no row applies")
        # which example tensor each operand is (the others the builder made)
        source = {i: j for i, o in enumerate(ops0) for j, t in enumerate(probe) if o is t}
        for ks in combos(rows, pl.ndim, seed=len(name)):
            combo = [rows[i] for i in ks]
            need = {i: tuple(r.inputs[i] for r in combo) for i in range(len(ops0)) if is_t[i]}
            sbps = [None] * len(ex.arrays)
            for i, j in source.items():
                sbps[j] = need[i]
            call = build(name, ex, tensors(ex, pl, sbps, rng))
            local = []
            for i, o in enumerate(call.operands):
                if isinstance(o, GlobalTensor):
                    if o.sbp != need[i]:  # an operand the builder made: converted to the row
                        o = o.to_global(placement=pl, sbp=need[i])
                    local.append(o.to_local())
                else:
                    local.append(o)
            out = Layout(call.out_shape, pl, tuple(r.output for r in combo))
            shape = out.local_shape(me)
            if me in pl:
                xp = backend.get_xp(pl.type)
                res = local_result(name, call.kernel, xp, local, shape, call.out_dtype, out)
            else:
                res = np.empty(shape, dtype=call.out_dtype)
            got = GlobalTensor(res, out, call.out_dtype).numpy()
            close(got, want, ex.rtol, (name, k, pl, " x ".join(map(str, combo))))


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("name, k", CASES, ids=[f"{n}-{k}" for n, k in CASES])
def test_every_op_equals_numpy_through_its_full_path_and_explains(name, k):
    ex = example(name, k)
    want = np.asarray(ex.reference(*ex.arrays))
    rng = np.random.default_rng(8)
    op = REGISTRY[name].op
    for pl in meshes():
        for kind in (B, sm.sbp.split(0), sm.sbp.partial_sum):
            # every array of one kind; 0-d arrays broadcast, and only floats partial
            sbps = [None if np.ndim(a) == 0 or (kind == sm.sbp.partial_sum
                                                and np.asarray(a).dtype.kind != "f")
                    else (kind,) * pl.ndim for a in ex.arrays]
            args, kwargs = ex.call(*tensors(ex, pl, sbps, rng))
            got = op(*args, **kwargs)
            assert isinstance(got, GlobalTensor), name
            g = got.numpy()
            close(g, want, ex.rtol, (name, k, pl, kind))

            def check_dtype(g=g):
                assert g.dtype == want.dtype or REGISTRY[name].kind != "pointwise", \
                    (name, g.dtype, want.dtype)

            agree(check_dtype)
        args, kwargs = ex.call(*tensors(ex, pl, [None] * len(ex.arrays), rng))
        text = str(sm.explain(name, *args, **kwargs))
        assert text.startswith(f"{name}(") and "chosen: #" in text, text


POINTWISE_NAMES = sorted(POINTWISE)
#: The result dtype of the ops NumPy has no ufunc for: that of the NumPy function their
#: kernel follows (erf and sigmoid compute in exp's floating dtype).
DTYPE_REFERENCE = {"sigmoid": np.exp, "erf": np.exp, "relu": lambda a: np.maximum(a, 0)}
DTYPES = [np.float32, np.int32, np.uint8, np.bool_]


def _outcome(fn):
    try:
        return ("dtype", np.asarray(fn()).dtype)
    except TypeError:
        return ("TypeError",)
    except ValueError:
        return ("ValueError",)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("name", POINTWISE_NAMES)
def test_pointwise_dtypes_follow_numpy(name):
    ex = EXAMPLES[name][0]
    ref = DTYPE_REFERENCE.get(name, ex.reference)
    pl = meshes()[0]
    for dt in DTYPES:
        arrays = [np.asarray(a).astype(dt) if np.asarray(a).dtype.kind == "f" or
                  np.asarray(a).dtype.kind in "iu" else np.asarray(a) for a in ex.arrays]
        with np.errstate(all="ignore"):
            want = _outcome(lambda arrays=arrays: ref(*arrays))
        ts = [sm.tensor(a, placement=pl, sbp=sm.sbp.split(0) if a.ndim > 1 else B)
              for a in arrays]

        def run(ts=ts):
            args, kwargs = ex.call(*ts)
            with np.errstate(all="ignore"):
                return REGISTRY[name].op(*args, **kwargs).numpy()

        got = _outcome(run)
        assert got == want, (name, dt, got, want)
