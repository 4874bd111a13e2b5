"""One or more example calls of every registered op, with NumPy references.

Used by the table-wide tests (tests/ops/test_registry.py, tests/ops/test_op_table.py): an op
without an example fails them, so a new op cannot be left out. Values are multiples of
1/8 in small ranges (sums of them are exact), shapes have 5 rows (uneven splits at
n = 2..4).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from sbpmpi.ops.elementwise import LINEARITY, POINTWISE
from sbpmpi.testing import Input


@dataclass(frozen=True)
class Example:
    """``op(*call(*tensors))`` against ``reference(*arrays)``.

    ``arrays``: the values of the tensor arguments; ``call(*tensors)`` -> (args, kwargs)
    of the op (NumPy arrays given to it become global tensors); ``reference(*arrays)``:
    NumPy's value; ``rtol``: the comparison's tolerance.
    """

    arrays: tuple[np.ndarray, ...]
    call: Callable[..., tuple[tuple[Any, ...], dict[str, Any]]]
    reference: Callable[..., Any]
    rtol: float = 1e-9


_RNG = np.random.default_rng(2024)


def F(*shape: int, low: float = -2.0, high: float = 2.0) -> np.ndarray:  # noqa: N802
    """Floats, multiples of 1/8 in [low, high]."""
    return Input(shape, np.float64, low, high).make(_RNG)


def I(*shape: int, low: int = 0, high: int = 6) -> np.ndarray:  # noqa: N802, E743
    return Input(shape, np.int64, low, high).make(_RNG)


def Bo(*shape: int) -> np.ndarray:  # noqa: N802
    return Input(shape, np.bool_).make(_RNG)


def plain(*arrays: np.ndarray, ref: Callable[..., Any], rtol: float = 1e-9,
          **kw: Any) -> Example:
    """The op called with the tensors positionally, then ``kw``."""
    return Example(arrays, lambda *t: (t, dict(kw)), lambda *a: ref(*a, **kw), rtol)


# ---- pointwise: the domain of each op's operands -------------------------------------------

_POSITIVE = ("log", "log2", "log10", "sqrt", "reciprocal")
_UNIT = ("asin", "acos", "atanh")
_INTS = ("bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_left_shift",
         "bitwise_right_shift", "bitwise_invert")
_BOOLS = ("logical_and", "logical_or", "logical_xor", "logical_not")


def _unary_value(name: str) -> np.ndarray:
    if name in _POSITIVE:
        return F(5, 3, low=0.25, high=3.0)
    if name in _UNIT:
        return F(5, 3, low=-0.875, high=0.875)
    if name == "acosh":
        return F(5, 3, low=1.125, high=3.0)
    if name == "log1p":
        return F(5, 3, low=-0.5, high=2.0)
    if name in _INTS:
        return I(5, 3, low=-6, high=6)
    if name in _BOOLS:
        return Bo(5, 3)
    return F(5, 3)


def _binary_values(name: str) -> tuple[np.ndarray, np.ndarray]:
    if name in _INTS:
        return I(5, 3, low=0, high=12), I(3, low=0, high=3)
    if name in _BOOLS:
        return Bo(5, 3), Bo(3)
    if name in ("pow", "div", "floor_divide", "remainder"):
        return F(5, 3, low=0.25, high=3.0), F(3, low=0.5, high=2.0)
    return F(5, 3), F(3)


_NUMPY_OF = {"relu": lambda a: np.maximum(a, 0), "sigmoid": lambda a: 1 / (1 + np.exp(-a)),
             "erf": np.vectorize(math.erf), "where": np.where}


def _numpy_fn(name: str) -> Callable[..., Any]:
    if name in _NUMPY_OF:
        return _NUMPY_OF[name]  # type: ignore[no-any-return]
    row = POINTWISE[name]
    assert row.numpy is not None, name
    return getattr(np, row.numpy)  # type: ignore[no-any-return]


def _pointwise(name: str) -> list[Example]:
    arity = LINEARITY[POINTWISE[name].family].arity
    ref = _numpy_fn(name)
    if arity == 1:
        return [plain(_unary_value(name), ref=ref)]
    if arity == 3:  # where
        return [plain(Bo(5, 3), F(5, 3), F(3), ref=ref)]
    a, b = _binary_values(name)
    return [plain(a, b, ref=ref), plain(b, a, ref=ref)]


# ---- the others --------------------------------------------------------------------------------

def _gelu(a: np.ndarray, approximate: str = "none") -> np.ndarray:
    if approximate == "tanh":
        return 0.5 * a * (1 + np.tanh(math.sqrt(2 / math.pi) * (a + 0.044715 * a ** 3)))
    return 0.5 * a * (1 + np.vectorize(math.erf)(a / math.sqrt(2)))


def _gelu_grad(g: np.ndarray, a: np.ndarray, approximate: str = "none") -> np.ndarray:
    cdf = 0.5 * (1 + np.vectorize(math.erf)(a / math.sqrt(2)))
    return g * (cdf + a * np.exp(-a * a / 2) / math.sqrt(2 * math.pi))


def _normalize(a: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    m = a.mean(-1, keepdims=True)
    return (a - m) / np.sqrt(a.var(-1, keepdims=True) + eps)


def _normalize_grad(g: np.ndarray, a: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    xhat = _normalize(a, eps)
    rstd = 1 / np.sqrt(a.var(-1, keepdims=True) + eps)
    return rstd * (g - g.mean(-1, keepdims=True) - xhat * (g * xhat).mean(-1, keepdims=True))


def _log_softmax(a: np.ndarray, axis: int) -> np.ndarray:
    z = a - a.max(axis, keepdims=True)
    return z - np.log(np.exp(z).sum(axis, keepdims=True))


def _embedding_grad(ids: np.ndarray, g: np.ndarray, rows: np.ndarray) -> np.ndarray:
    out = np.zeros((len(rows), g.shape[-1]))
    np.add.at(out, ids.reshape(-1), g.reshape(-1, g.shape[-1]))
    return out


def _cross_entropy(logits: np.ndarray, labels: np.ndarray, ignore: int, scale: float | None
                   ) -> np.ndarray:
    k = 1 / len(labels) if scale is None else scale
    logp = _log_softmax(logits, 1)
    valid = labels != ignore
    return np.asarray(-k * np.sum(logp[np.arange(len(labels)), np.where(valid, labels, 0)]
                                  * valid))


def _cross_entropy_grad(logits: np.ndarray, labels: np.ndarray, g: np.ndarray, ignore: int,
                        scale: float | None) -> np.ndarray:
    k = 1 / len(labels) if scale is None else scale
    p = np.exp(_log_softmax(logits, 1))
    valid = labels != ignore
    p[np.arange(len(labels)), np.where(valid, labels, 0)] -= 1
    return p * valid[:, None] * g * k


def _vocab(logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The row max and the class numbers of vocab-parallel cross-entropy's steps."""
    return logits.max(1, keepdims=True), np.arange(logits.shape[1]).reshape(1, -1)


def _vocab_stats(logits: np.ndarray, labels: np.ndarray, m: np.ndarray, cols: np.ndarray,
                 ignore: int) -> np.ndarray:
    valid = labels != ignore
    target = logits[np.arange(len(labels)), np.where(valid, labels, 0)] * valid
    return np.stack([np.exp(logits - m).sum(1), target], axis=1)


def _others() -> dict[str, list[Example]]:
    x, y = F(5, 3), F(2, 3)
    logits, labels = F(5, 4), np.array([0, 3, 1, -100, 2])
    m, cols = _vocab(logits)
    stats = _vocab_stats(logits, labels, m, cols, -100)
    ids, weight, rows = np.array([[0, 6], [3, 3], [5, 1], [2, 0], [4, 6]]), F(7, 3), np.arange(7)
    sm_m = x.max(1, keepdims=True)
    sm_s = np.exp(x - sm_m).sum(1, keepdims=True)
    g0 = np.asarray(0.75)
    return {
        "clip": [Example((F(5, 3), F(3, low=-1.0, high=0.0)), lambda t, lo: ((t, lo, 1.0), {}),
                         lambda a, lo: np.clip(a, lo, 1.0))],
        "sum": [Example((x,), lambda t: ((t, 0), {}), lambda a: a.sum(0)),
                Example((x,), lambda t: ((t, (0, 1)), {"keepdim": True}),
                        lambda a: a.sum((0, 1), keepdims=True))],
        "mean": [Example((x,), lambda t: ((t, 1), {}), lambda a: a.mean(1)),
                 Example((x,), lambda t: ((t, 0), {}), lambda a: a.mean(0))],
        "max": [Example((x,), lambda t: ((t, 0), {}), lambda a: a.max(0)),
                Example((x,), lambda t: ((t, 1), {}), lambda a: a.max(1))],
        "min": [Example((x,), lambda t: ((t, 1), {"keepdim": True}),
                        lambda a: a.min(1, keepdims=True))],
        "var": [Example((x,), lambda t: ((t, 0), {"correction": 1}),
                        lambda a: a.var(0, ddof=1)),
                Example((x,), lambda t: ((t, 1), {}), lambda a: a.var(1))],
        "softmax": [Example((x,), lambda t: ((t, 1), {}),
                            lambda a: np.exp(_log_softmax(a, 1)))],
        "log_softmax": [Example((x,), lambda t: ((t, 0), {}), lambda a: _log_softmax(a, 0))],
        "sum_exp": [Example((x, sm_m), lambda t, mm: ((t, mm, 1), {}),
                            lambda a, mm: np.exp(a - mm).sum(1, keepdims=True))],
        "softmax_finish": [Example((x, sm_m, sm_s), lambda t, mm, s: ((t, mm, s, False), {}),
                                   lambda a, mm, s: np.exp(a - mm) / s),
                           Example((x, sm_m, sm_s), lambda t, mm, s: ((t, mm, s, True), {}),
                                   lambda a, mm, s: a - mm - np.log(s))],
        "matmul": [plain(F(5, 3), F(3, 4), ref=np.matmul), plain(F(5, 3), F(3), ref=np.matmul),
                   plain(F(3), F(3, 4), ref=np.matmul), plain(F(3), F(3), ref=np.matmul),
                   plain(F(2, 5, 3), F(2, 3, 4), ref=np.matmul)],
        "matmul_tn": [plain(F(3, 5), F(3, 4), ref=lambda a, b: a.T @ b)],
        "matmul_nt": [plain(F(5, 3), F(4, 3), ref=lambda a, b: a @ b.T)],
        "transpose": [plain(x, ref=np.transpose),
                      Example((F(5, 3, 2),), lambda t: ((t, 2, 0, 1), {}),
                              lambda a: np.transpose(a, (2, 0, 1)))],
        "reshape": [Example((F(5, 4),), lambda t: ((t, 5, 2, 2), {}),
                            lambda a: a.reshape(5, 2, 2)),
                    Example((F(5, 2, 2),), lambda t: ((t, 5, 4), {}), lambda a: a.reshape(5, 4))],
        "astype": [Example((x,), lambda t: ((t, np.float32), {}), lambda a: a.astype(np.float32),
                           rtol=1e-6)],
        "cat": [Example((x, y), lambda a, b: (([a, b], 0), {}),
                        lambda a, b: np.concatenate([a, b], 0)),
                Example((x, F(5, 2)), lambda a, b: (([a, b], 1), {}),
                        lambda a, b: np.concatenate([a, b], 1))],
        "tril": [Example((F(5, 4),), lambda t: ((t, 0), {}), lambda a: np.tril(a, 0))],
        "triu": [Example((F(5, 4),), lambda t: ((t, 1), {}), lambda a: np.triu(a, 1))],
        "getitem": [Example((x,), lambda t: ((t, (slice(None), 1)), {}), lambda a: a[:, 1]),
                    Example((x,), lambda t: ((t, slice(1, 4)), {}), lambda a: a[1:4]),
                    Example((F(5, 3, 2),), lambda t: ((t, (Ellipsis, None, 0)), {}),
                            lambda a: a[..., None, 0])],
        "getitem_arrays": [Example((x, x[:, 0] > 0), lambda t, mk: ((t, mk), {}),
                                   lambda a, mk: a[mk]),
                           Example((x, np.array([4, 0, -1])), lambda t, k: ((t, k), {}),
                                   lambda a, k: a[k])],
        "setitem": [Example((x, F(3)), lambda t, v: ((t, (slice(1, 3),), v), {}),
                            lambda a, v: _set(a, (slice(1, 3),), v)),
                    Example((x, x[:, 0] > 0), lambda t, mk: ((t, mk, 2.5), {}),
                            lambda a, mk: _set(a, mk, 2.5))],
        "scatter": [Example((y,), lambda g: ((g, (5, 3), slice(1, 3)), {}),
                            lambda g: _set(np.zeros((5, 3)), slice(1, 3), g))],
        "gelu": [plain(x, ref=_gelu), Example((x,), lambda t: ((t, "tanh"), {}),
                                              lambda a: _gelu(a, "tanh"))],
        "gelu_backward": [plain(F(5, 3), x, ref=_gelu_grad)],
        "normalize": [Example((F(5, 4),), lambda t: ((t, 0.125), {}),
                              lambda a: _normalize(a, 0.125))],
        "normalize_backward": [Example((F(5, 4), F(5, 4)), lambda g, t: ((g, t, 0.125), {}),
                                       lambda g, a: _normalize_grad(g, a, 0.125))],
        "embedding": [plain(ids, weight, rows, ref=lambda i, w, r: w[i])],
        "embedding_backward": [plain(ids, F(5, 2, 3), rows, ref=_embedding_grad)],
        "cross_entropy": [Example((logits, labels), lambda a, b: ((a, b, -100, None), {}),
                                  lambda a, b: _cross_entropy(a, b, -100, None))],
        "cross_entropy_grad": [Example(
            (logits, labels, g0), lambda a, b, g: ((a, b, g, -100, 0.5), {}),
            lambda a, b, g: _cross_entropy_grad(a, b, g, -100, 0.5))],
        "vocab_stats": [Example((logits, labels, m, cols),
                                lambda a, b, mm, c: ((a, b, mm, c, -100), {}),
                                lambda a, b, mm, c: _vocab_stats(a, b, mm, c, -100))],
        "vocab_loss": [Example(
            (stats, m, labels), lambda s, mm, b: ((s, mm, b, 4, -100, 0.5), {}),
            lambda s, mm, b: np.asarray(0.5 * np.sum((mm[:, 0] + np.log(s[:, 0]) - s[:, 1])
                                                     * (b != -100))))],
        "vocab_grad": [Example(
            (logits, labels, m, stats, cols, g0),
            lambda a, b, mm, s, c, g: ((a, b, mm, s, c, g), {"ignore_index": -100, "scale": 0.5}),
            lambda a, b, mm, s, c, g: _cross_entropy_grad(a, b, g, -100, 0.5))],
    }


def _set(a: np.ndarray, key: Any, value: Any) -> np.ndarray:
    out = np.array(a, dtype=float)
    out[key] = value
    return out


def examples() -> dict[str, list[Example]]:
    """Every registered op's examples, by name."""
    out = {name: _pointwise(name) for name in POINTWISE}
    out.update(_others())
    return out


EXAMPLES = examples()
