"""The ops a transformer needs: erf, gelu, var, tril/triu, softmax on a split dim, batched
matmul over split heads, reshapes that keep heads split, vocab-parallel cross-entropy.

Every op is compared with NumPy on the whole arrays at every world size (uneven splits:
dims of 3, 5 and 7), gradients with ``sbpmpi.testing.check_grad`` on every input SBP
kind of the 1-D placements and a sample of the 2x2 mesh's combinations, and the
communication of the split-dim paths is counted with ``sm.trace``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from mpi4py import MPI

import sbpmpi as sm
from sbpmpi.core.sbp import broadcast, partial_sum, split
from sbpmpi.testing import Input, check_grad, check_op, make_input

world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
mpi = pytest.mark.mpi(min_size=1)
SAMPLE = 10  # SBP combinations per placement where the product is larger


def _placements() -> list:
    """Every rank in a row, a reversed subset (blocks land on other ranks), the 2x2 mesh."""
    out = [sm.placement("cpu", list(range(size)))]
    if size > 2:
        out.append(sm.placement("cpu", list(range(size - 1, 0, -1))))
    if size >= 4:
        out.append(sm.placement("cpu", [[0, 1], [2, 3]]))
    return out


PLACES = _placements()
CASES = {"max_combos": SAMPLE, "placements": PLACES}


def np_erf(x):
    return np.vectorize(math.erf, otypes=[np.float64])(x)


def np_gelu(x, approximate="none"):
    if approximate == "tanh":
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    return 0.5 * x * (1 + np_erf(x / math.sqrt(2)))


def np_softmax(x, dim):
    z = np.exp(x - x.max(dim, keepdims=True))
    return z / z.sum(dim, keepdims=True)


def np_cross_entropy(z, labels, ignore_index=-100):
    logp = np.log(np_softmax(z, 1))
    keep = labels != ignore_index
    rows = np.arange(len(labels))[keep]
    return -logp[rows, labels[keep]].sum() / keep.sum()


# ---- erf and gelu ---------------------------------------------------------------------------

@pytest.mark.parametrize("kernel", ["scipy", "expansions"])
def test_erf_of_numpy_arrays_matches_math_erf(kernel, monkeypatch):
    """Both kernels of NumPy arrays: SciPy's where it is installed, and the expansions
    used without it."""
    from sbpmpi.backend import special
    from sbpmpi.backend.special import erf

    if kernel == "scipy":
        pytest.importorskip("scipy.special")
    else:
        monkeypatch.setattr(special, "_scipy", lambda: None)
    x = np.concatenate([np.linspace(-7, 7, 4001), [0.0, 2.5, -2.5, 6.5, np.inf, -np.inf]])
    np.testing.assert_allclose(erf(x), np_erf(x), rtol=4e-15, atol=1e-300)
    assert np.isnan(erf(np.array([np.nan])))[0]
    assert erf(np.ones(2, np.float32)).dtype == np.float32
    assert erf(np.ones(2, np.float16)).dtype == np.float16


@mpi
def test_erf_matches_numpy():
    check_op(sm.erf, np_erf, [Input((5, 3))], **CASES)
    check_op(sm.erf, lambda v: np_erf(v.astype(np.float64)), [Input((7,), np.int64)],
             placements=PLACES)


@mpi
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_matches_numpy(approximate):
    check_op(sm.nn.gelu, np_gelu, [Input((5, 3))], kwargs={"approximate": approximate},
             **CASES)


@mpi
@pytest.mark.parametrize("op, ref, kwargs", [
    (sm.erf, np_erf, {}),
    (sm.nn.gelu, np_gelu, {"approximate": "none"}),
    (sm.nn.gelu, np_gelu, {"approximate": "tanh"}),
], ids=["erf", "gelu", "gelu_tanh"])
def test_erf_and_gelu_gradients(op, ref, kwargs):
    check_grad(op, ref, [Input((5, 3))], kwargs=kwargs, **CASES)


def test_gelu_rejects_an_unknown_approximation():
    x = sm.testing.metadata_tensor((2, 2), broadcast, [0], world_size=1)
    with pytest.raises(ValueError, match="approximate must be 'none' or 'tanh', got 'erf'"):
        sm.ops.gelu.build(x, approximate="erf")


# ---- var --------------------------------------------------------------------------------------

@mpi
@pytest.mark.parametrize("dim, keepdim, correction", [
    (None, False, 0), (0, False, 1), (1, True, 0), ((0, 1), True, 1)])
def test_var_matches_numpy(dim, keepdim, correction):
    def ref(v, dim, keepdim, correction):
        return np.var(v, axis=dim, keepdims=keepdim, ddof=correction)

    kw = {"dim": dim, "keepdim": keepdim, "correction": correction}
    check_op(sm.var, ref, [Input((5, 3))], kwargs=kw, **CASES)
    check_grad(sm.var, ref, [Input((5, 3))], kwargs=kw, **CASES)


# ---- tril and triu -------------------------------------------------------------------------

@mpi
@pytest.mark.parametrize("op, ref, diagonal", [
    (sm.tril, lambda v, diagonal: np.tril(v, diagonal), 0),
    (sm.tril, lambda v, diagonal: np.tril(v, diagonal), -1),
    (sm.triu, lambda v, diagonal: np.triu(v, diagonal), 0),
    (sm.triu, lambda v, diagonal: np.triu(v, diagonal), 2),
], ids=["tril0", "tril-1", "triu0", "triu2"])
def test_tril_triu_match_numpy(op, ref, diagonal):
    kw = {"diagonal": diagonal}
    check_op(op, ref, [Input((5, 7))], kwargs=kw, **CASES)
    check_op(op, ref, [Input((3, 5, 4))], kwargs=kw, **CASES)
    check_op(op, ref, [Input((5, 3), np.int32)], kwargs=kw, **CASES)
    check_grad(op, ref, [Input((5, 3))], kwargs=kw, **CASES)


@mpi
def test_tril_keeps_split_rows_and_columns_without_communication():
    for d in (0, 1):
        x = sm.randn(7, 5, placement=sm.placement("cpu", list(range(size))), sbp=split(d))
        with sm.trace() as t:
            y = sm.tril(x, -1)
        assert y.sbp == (split(d),) and len(t) == 0, str(t)
        np.testing.assert_array_equal(y.numpy(), np.tril(x.numpy(), -1))


# ---- softmax and log_softmax on a split dim --------------------------------------------------

@mpi
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_softmax_on_every_layout_matches_numpy(log):
    op = sm.log_softmax if log else sm.softmax

    def ref(v, dim):
        return np.log(np_softmax(v, dim)) if log else np_softmax(v, dim)

    for dim in (0, 1):
        check_op(op, ref, [Input((5, 7)), dim], **CASES)
        check_grad(op, ref, [Input((5, 3)), dim], **CASES)


@mpi
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_softmax_on_a_split_dim_reduces_two_small_tensors(log):
    """A max all-reduce and a sum all-reduce of the reduced shape; nothing gathered."""
    op = sm.log_softmax if log else sm.softmax
    pl = sm.placement("cpu", list(range(size)))
    v = np.random.default_rng(0).standard_normal((6, 11))
    x = sm.tensor(v, placement=pl, sbp=split(1))
    op(x, 1)  # first call plans
    with sm.trace() as t:
        y = op(x, 1)
    assert y.sbp == (split(1),)
    want = np.log(np_softmax(v, 1)) if log else np_softmax(v, 1)
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-13, atol=1e-15)
    if size > 1:
        assert t.ops() == ["all_reduce", "all_reduce"], str(t)
        assert [r.nbytes for r in t] == [6 * 8, 6 * 8], str(t)
    else:
        assert len(t) == 0


# ---- batched matmul, attention over split heads, reshapes that keep heads split ---------------

@mpi
def test_batched_matmul_with_broadcast_batch_dims_matches_numpy():
    check_op(sm.matmul, np.matmul, [Input((2, 3, 5, 4)), Input((3, 4, 2))], **CASES)
    check_op(sm.matmul, np.matmul, [Input((3, 1, 5, 4)), Input((1, 2, 4, 3))],
             max_combos=SAMPLE, placements=PLACES[:2])
    check_grad(sm.matmul, np.matmul, [Input((3, 2, 3)), Input((1, 3, 2))], max_combos=6,
               placements=PLACES)


def np_attention(q, k, v):
    t = q.shape[-2]
    s = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    s = np.where(np.tril(np.ones((t, t))) > 0, s, -1e9)
    return np_softmax(s, -1) @ v


def attention(q, k, v):
    t = q.shape[-2]
    s = sm.matmul(q, sm.transpose(k, 0, 1, 3, 2)) / math.sqrt(q.shape[-1])
    s = s + sm.triu(sm.full((t, t), -1e9, placement=q.placement,
                            sbp=(broadcast,) * q.placement.ndim), 1)
    return sm.matmul(sm.softmax(s, -1), v)


@mpi
def test_causal_attention_over_split_heads_moves_nothing():
    """q, k, v split on heads: scores, mask, softmax and output stay split(head)."""
    pl = sm.placement("cpu", list(range(size)))
    rng = np.random.default_rng(1)
    b, h, t, d = 2, 5, 4, 3  # 5 heads: uneven over 2, 3 and 4 ranks
    vals = [rng.standard_normal((b, h, t, d)) for _ in range(3)]
    q, k, v = (sm.tensor(a, placement=pl, sbp=split(1)) for a in vals)
    attention(q, k, v)
    with sm.trace() as tr:
        y = attention(q, k, v)
    assert y.sbp == (split(1),) and len(tr) == 0, str(tr)
    np.testing.assert_allclose(y.numpy(), np_attention(*vals), rtol=1e-12, atol=1e-14)


@mpi
def test_attention_gradients_over_split_heads():
    shape = (1, 5, 3, 2)
    check_grad(attention, np_attention, [Input(shape), Input(shape), Input(shape)],
               sbps=[[(split(1),)], [(split(1),)], [(split(1),)]],
               placements=[sm.placement("cpu", list(range(k))) for k in range(1, size + 1)])


@mpi
def test_reshape_and_transpose_keep_split_heads():
    pl = sm.placement("cpu", list(range(size)))
    t, h, d = 5, 12, 2  # 12 heads divide by 1, 2, 3 and 4
    v = np.arange(t * h * d, dtype=np.float64).reshape(t, h * d)
    x = sm.tensor(v, placement=pl, sbp=split(1))
    with sm.trace() as tr:
        heads = sm.reshape(x, (t, h, d))
        ht = sm.transpose(heads, 1, 0, 2)
        back = sm.reshape(sm.transpose(ht, 1, 0, 2), (t, h * d))
    assert heads.sbp == (split(1),) and ht.sbp == (split(0),) and back.sbp == (split(1),)
    assert len(tr) == 0, str(tr)
    np.testing.assert_array_equal(back.numpy(), v)
    np.testing.assert_array_equal(ht.numpy(), v.reshape(t, h, d).transpose(1, 0, 2))


def test_reshape_keeps_a_split_only_when_the_leading_dim_divides():
    from sbpmpi.ops.shape import reshape_matches

    assert [(m.inputs, m.output) for m in reshape_matches((5, 24), (5, 12, 2), 4)] == \
        [((0,), 0), ((1,), 1)]
    assert [(m.inputs, m.output) for m in reshape_matches((5, 12, 2), (5, 24), 3)] == \
        [((0,), 0), ((1,), 1)]
    assert [(m.inputs, m.output) for m in reshape_matches((5, 10), (5, 5, 2), 2)] == \
        [((0,), 0)]  # 5 heads over 2 ranks: blocks of 3 and 2 heads are not 5 and 5 columns
    assert [(m.inputs, m.output) for m in reshape_matches((5, 24), (5, 12, 2))] == \
        [((0,), 0)]  # without the mesh size: only dims kept whole


# ---- cross-entropy: ignore_index and vocab parallel ------------------------------------------

LABELS = np.array([2, -100, 0, 6, 3])  # 7 classes; one row ignored


@mpi
def test_cross_entropy_on_every_layout_matches_numpy():
    def op(z):
        return sm.nn.cross_entropy(z, LABELS)

    def ref(z):
        return np_cross_entropy(z, LABELS)

    check_op(op, ref, [Input((5, 7))], name="cross_entropy", **CASES)
    check_grad(op, ref, [Input((5, 7))], name="cross_entropy", **CASES)


@mpi
def test_cross_entropy_with_global_labels_matches_numpy():
    pl = sm.placement("cpu", list(range(size)))
    rng = np.random.default_rng(2)
    z = rng.standard_normal((5, 7))
    for zs, ys in ((split(1), broadcast), (split(0), split(0)), (broadcast, split(0))):
        logits = sm.tensor(z, placement=pl, sbp=zs).requires_grad_()
        labels = sm.tensor(LABELS, placement=pl, sbp=ys)
        loss = sm.nn.cross_entropy(logits, labels)
        loss.backward()
        np.testing.assert_allclose(loss.numpy(), np_cross_entropy(z, LABELS), rtol=1e-13)
        p = np_softmax(z, 1)
        keep = LABELS != -100
        p[np.arange(5)[keep], LABELS[keep]] -= 1
        want = p * keep[:, None] / keep.sum()
        assert logits.grad.sbp == (zs,)
        np.testing.assert_allclose(logits.grad.numpy(), want, rtol=1e-12, atol=1e-15)


@mpi
@pytest.mark.parametrize("ignore_index", [-100, 3, 0])
@pytest.mark.parametrize("ldtype", ["int64", "int32", "int8", "uint8"])
def test_cross_entropy_ignored_and_out_of_range_labels_match_numpy(ignore_index, ldtype):
    """Labels of every integer width, an ignored label inside ``[0, C)`` and outside it,
    labels outside ``[0, C)`` (they add 0 and count in the mean): the loss and its
    gradient as NumPy's, classes whole (rows split) and split (vocab parallel)."""
    pl = sm.placement("cpu", list(range(size)))
    rng = np.random.default_rng(5)
    n, c = 9, 7
    z = rng.standard_normal((n, c))
    lab = np.array([2, 3, 0, 6, 3, 9, -1, 0, 5])
    if ldtype == "uint8":
        lab = np.where(lab < 0, 200, lab)  # no negatives: a large label instead
    lab = lab.astype(ldtype)
    ign = ignore_index if not (ldtype == "uint8" and ignore_index < 0) else 250
    keep = lab.astype(np.int64) != ign
    inside = (lab.astype(np.int64) >= 0) & (lab.astype(np.int64) < c)
    zc = z - z.max(1, keepdims=True)
    logp = zc - np.log(np.exp(zc).sum(1, keepdims=True))
    counted = keep & inside
    want = -logp[np.arange(n)[counted], lab[counted].astype(np.int64)].sum() / keep.sum()
    p = np.exp(logp)
    p[np.arange(n)[counted], lab[counted].astype(np.int64)] -= 1
    want_grad = p * counted[:, None] / keep.sum()
    for zs, ys in ((split(0), split(0)), (split(1), broadcast), (broadcast, broadcast)):
        logits = sm.tensor(z, placement=pl, sbp=zs).requires_grad_()
        labels = sm.tensor(lab, placement=pl, sbp=ys)
        loss = sm.nn.cross_entropy(logits, labels, ignore_index=ign)
        loss.backward()
        np.testing.assert_allclose(loss.numpy(), want, rtol=1e-13)
        np.testing.assert_allclose(logits.grad.numpy(), want_grad, rtol=1e-12, atol=1e-15)


@mpi
def test_cross_entropy_when_every_row_is_ignored_is_nan():
    z = sm.zeros(3, 4, placement=sm.placement("cpu", list(range(size))), sbp=split(1))
    assert np.isnan(sm.nn.cross_entropy(z, np.full(3, -100)).numpy())


@mpi
def test_vocab_parallel_cross_entropy_communication():
    """Forward: the row max (N, 1) and the sums with the target logit (N, 2), one
    all-reduce each; no gather of the logits; backward: nothing."""
    pl = sm.placement("cpu", list(range(size)))
    n, c = 6, 11
    rng = np.random.default_rng(3)
    z = rng.standard_normal((n, c))
    labels = rng.integers(0, c, size=n)
    labels[1] = -100
    logits = sm.tensor(z, placement=pl, sbp=split(1)).requires_grad_()
    sm.nn.cross_entropy(logits, labels).backward()  # first call plans
    logits.grad = None
    with sm.trace() as fwd:
        loss = sm.nn.cross_entropy(logits, labels)
    with sm.trace() as bwd:
        loss.backward()
    np.testing.assert_allclose(loss.numpy(), np_cross_entropy(z, labels), rtol=1e-13)
    assert logits.grad.sbp == (split(1),)
    if size > 1:
        assert fwd.ops() == ["all_reduce", "all_reduce"], str(fwd)
        assert [r.nbytes for r in fwd] == [n * 8, 2 * n * 8], str(fwd)
    assert len(bwd) == 0, str(bwd)


@mpi
def test_vocab_parallel_cross_entropy_on_a_2d_mesh():
    """Batch split on one mesh axis and classes on the other: loss and gradient exact."""
    if size < 4:
        pytest.skip("needs 4 ranks")
    mesh = sm.placement("cpu", [[0, 1], [2, 3]])
    rng = np.random.default_rng(4)
    z = rng.standard_normal((5, 7))
    for sbp in ((split(0), split(1)), (split(1), split(0)), (split(1), split(1))):
        logits = make_input(z, mesh, sbp, rng).requires_grad_()
        loss = sm.nn.cross_entropy(logits, LABELS)
        loss.backward()
        np.testing.assert_allclose(loss.numpy(), np_cross_entropy(z, LABELS), rtol=1e-13)
        assert logits.grad.sbp == logits.sbp
    assert partial_sum not in logits.grad.sbp
