"""``sm.einsum``: Einstein summation of global tensors, made of array API functions.

``einsum("nk,km->nm", a, b)`` as NumPy's ``np.einsum`` (explicit ``->`` or implicit
output, ``...`` for broadcast dims, a letter repeated in one operand for its diagonal).
The operands are contracted left to right, two at a time: each pair becomes one batched
``matmul`` (dims of both operands kept in the output: batch; of both and not kept:
contracted; of one: rows or columns), so the layouts and their communication are those
of ``matmul``, ``permute_dims`` and ``reshape`` (:mod:`sbpmpi.array_api`). A dim of one
operand that nothing else needs is summed first; a repeated letter takes its diagonal
by a mask of ``eye`` and a sum. ``np.einsum`` of a GlobalTensor (NEP 18) and einops'
``einsum`` come here.
"""

from __future__ import annotations

import math
import string
from typing import Any, NamedTuple

from .tensor import GlobalTensor

__all__ = ["einsum", "Subscripts", "parse_subscripts"]

_LETTERS = frozenset(string.ascii_letters)


class Subscripts(NamedTuple):
    """The parsed subscripts: one string of letters per operand and the output's."""

    inputs: tuple[str, ...]
    output: str


def parse_subscripts(subscripts: str, ndims: tuple[int, ...]) -> Subscripts:
    """``subscripts`` for operands of ``ndims`` dims, with ``...`` replaced by letters the
    subscripts do not use (right-aligned, as broadcasting aligns them).

    Raises
    ------
    ValueError
        For a character that is not a letter, a term whose letters do not match its
        operand's dims, an output letter no operand has, or an output letter twice.
    """
    if not isinstance(subscripts, str):
        raise TypeError(f"einsum: subscripts must be a str, got {type(subscripts).__name__}")
    text = subscripts.replace(" ", "")
    left, arrow, right = text.partition("->")
    terms = left.split(",")
    if len(terms) != len(ndims):
        raise ValueError(f"einsum: {subscripts!r} has {len(terms)} operand terms, got "
                         f"{len(ndims)} operands")
    used = set(text) & _LETTERS
    spare = [c for c in string.ascii_letters if c not in used]
    n_ell = max((nd - len(t.replace("...", "")) for t, nd in zip(terms, ndims)
                 if "..." in t), default=0)
    ell = "".join(spare[:n_ell])
    inputs = []
    for t, nd in zip(terms, ndims):
        if "..." in t:
            k = nd - len(t.replace("...", ""))
            if k < 0:
                raise ValueError(f"einsum: term {t!r} has more letters than its operand's "
                                 f"{nd} dims")
            t = t.replace("...", ell[n_ell - k:])
        bad = set(t) - _LETTERS
        if bad:
            raise ValueError(f"einsum: invalid subscript characters {sorted(bad)} in "
                             f"{subscripts!r}")
        if len(t) != nd:
            raise ValueError(f"einsum: term {t!r} has {len(t)} letters for an operand of "
                             f"{nd} dims")
        inputs.append(t)
    if arrow:
        out = right.replace("...", ell)
        bad = set(out) - _LETTERS
        if bad:
            raise ValueError(f"einsum: invalid output characters {sorted(bad)}")
        if len(set(out)) != len(out):
            raise ValueError(f"einsum: output {right!r} names a letter twice")
        missing = set(out) - set("".join(inputs))
        if missing:
            raise ValueError(f"einsum: output letters {sorted(missing)} are in no operand")
    else:  # NumPy's implicit output: the letters seen once, sorted, after the ellipsis
        counts = {c: "".join(inputs).count(c) for c in set("".join(inputs))}
        out = ell + "".join(sorted(c for c, n in counts.items() if n == 1 and c not in ell))
    return Subscripts(tuple(inputs), out)


def _xp() -> Any:
    from . import array_api

    return array_api


def _diagonals(x: GlobalTensor, term: str) -> tuple[GlobalTensor, str]:
    """``x`` with each repeated letter of ``term`` reduced to its diagonal (kept at its
    first place)."""
    xp = _xp()
    while len(set(term)) != len(term):
        c = next(c for c in term if term.count(c) > 1)
        i = term.index(c)
        j = term.index(c, i + 1)
        n = x.shape[i]
        if x.shape[j] != n:
            raise ValueError(f"einsum: letter {c!r} has sizes {n} and {x.shape[j]}")
        shape = [1] * x.ndim
        shape[i] = shape[j] = n
        mask = xp.reshape(xp.eye(n, dtype=x.dtype, device=x.device), tuple(shape))
        x = xp.sum(x * mask, axis=j)
        term = term[:j] + term[j + 1:]
    return x, term


def _summed(x: GlobalTensor, term: str, keep: set[str]) -> tuple[GlobalTensor, str]:
    """``x`` summed over the letters of ``term`` not in ``keep``."""
    drop = tuple(d for d, c in enumerate(term) if c not in keep)
    if not drop:
        return x, term
    return _xp().sum(x, axis=drop), "".join(c for c in term if c in keep)


def _contract(a: GlobalTensor, ta: str, b: GlobalTensor, tb: str, keep: set[str]
              ) -> tuple[GlobalTensor, str]:
    """``a`` and ``b`` contracted over their shared letters not in ``keep``: one batched
    matmul of ``(batch, rows, k) @ (batch, k, cols)``."""
    xp = _xp()
    size = {c: n for t, x in ((ta, a), (tb, b)) for c, n in zip(t, x.shape)}
    for c in set(ta) & set(tb):
        if a.shape[ta.index(c)] != b.shape[tb.index(c)]:
            raise ValueError(f"einsum: letter {c!r} has sizes {a.shape[ta.index(c)]} and "
                             f"{b.shape[tb.index(c)]}")
    batch = [c for c in ta if c in tb and c in keep]
    inner = [c for c in ta if c in tb and c not in keep]
    rows = [c for c in ta if c not in tb]
    cols = [c for c in tb if c not in ta]

    def grouped(x: GlobalTensor, t: str, order: list[str], shape: tuple[int, ...]) -> Any:
        perm = tuple(t.index(c) for c in order)
        if perm != tuple(range(len(t))):
            x = xp.permute_dims(x, perm)
        return xp.reshape(x, shape)

    nb, nr, nk, nc = (math.prod(size[c] for c in g) for g in (batch, rows, inner, cols))
    am = grouped(a, ta, batch + rows + inner, (nb, nr, nk))
    bm = grouped(b, tb, batch + inner + cols, (nb, nk, nc))
    out = xp.matmul(am, bm)
    letters = batch + rows + cols
    return xp.reshape(out, tuple(size[c] for c in letters)), "".join(letters)


def einsum(subscripts: str, *operands: Any) -> GlobalTensor:
    """NumPy's ``np.einsum(subscripts, *operands)`` of global tensors (collective where the
    matmuls and reshapes it makes communicate).

    Raises
    ------
    TypeError
        When an operand is not a GlobalTensor.
    ValueError
        For subscripts that do not fit the operands (see :func:`parse_subscripts`).
    """
    if not operands:
        raise ValueError("einsum: at least one operand is needed")
    for i, x in enumerate(operands):
        if not isinstance(x, GlobalTensor):
            raise TypeError(f"einsum: operand {i} must be a GlobalTensor, got "
                            f"{type(x).__name__}; make it one with sm.array_api.asarray")
    sub = parse_subscripts(subscripts, tuple(x.ndim for x in operands))
    terms = list(sub.inputs)
    xs = list(operands)
    for i, (x, t) in enumerate(zip(xs, terms)):
        xs[i], terms[i] = _diagonals(x, t)
    for i in range(len(xs)):  # a letter of one operand only, not in the output: summed now
        others = set(sub.output).union(*(set(t) for j, t in enumerate(terms) if j != i))
        xs[i], terms[i] = _summed(xs[i], terms[i], others)
    x, t = xs[0], terms[0]
    for k in range(1, len(xs)):
        keep = set(sub.output).union(*(set(u) for u in terms[k + 1:]))
        x, t = _contract(x, t, xs[k], terms[k], keep)
        x, t = _summed(x, t, keep)
    x, t = _summed(x, t, set(sub.output))
    if t != sub.output:
        x = _xp().permute_dims(x, tuple(t.index(c) for c in sub.output))
    return x
