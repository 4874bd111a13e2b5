"""Special functions on shards: ``erf`` for NumPy (which has none) and CuPy.

CuPy arrays go to ``cupyx.scipy.special.erf``; NumPy arrays to ``scipy.special.erf``
where SciPy is installed (imported at the first call; a compiled kernel, an order of magnitude faster than the
expansions below; SciPy is not a dependency). Without SciPy they are computed in float64
by two expansions without cancellation, within a few units in the last place of
``math.erf``: below ``|x| = 2.5`` the series
``erf(x) = 2/sqrt(pi) exp(-x^2) sum_n 2^n x^(2n+1) / (1*3*...*(2n+1))`` (every term
positive; as many terms as the largest argument needs), and above it Laplace's
continued fraction of ``erfc``, evaluated from its tail; ``erf(x)`` is 1 in float64
beyond ``|x| = 6``.
"""

from __future__ import annotations

import functools
import importlib
import math
from typing import Any

import numpy as np

from ..core.dtypes import is_bfloat16

__all__ = ["erf"]

_SERIES_BELOW = 2.5
_MAX_TERMS = 60  # enough at |x| = 2.5; smaller arguments stop earlier
_FRACTION_DEPTH = 36  # converged to float64 for x >= 2.5
_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)


def _terms(top: float) -> int:
    """How many terms of the series reach float64 precision for ``|x| <= top``."""
    step, term, total, n = 2.0 * top * top, 1.0, 1.0, 0
    while term > 1e-17 * total and n < _MAX_TERMS:
        n += 1
        term *= step / (2 * n + 1)
        total += term
    return n


def _series(s: np.ndarray) -> np.ndarray:
    x2 = s * s
    step = 2.0 * x2
    # Horner from the last term: every partial value is >= 1, so nothing underflows
    # into subnormals (which are slow)
    p = np.ones_like(s)
    for n in range(_terms(float(s.max(initial=0.0))), 0, -1):
        p *= step
        p *= 1.0 / (2 * n + 1)
        p += 1.0
    p *= s
    p *= np.exp(-x2)
    p *= _TWO_OVER_SQRT_PI
    return p


def _fraction(b: np.ndarray) -> np.ndarray:
    b = np.minimum(b, 6.0)
    frac = b.copy()
    for k in range(_FRACTION_DEPTH, 0, -1):
        frac = b + (k / 2.0) / frac
    return 1.0 - np.exp(-b * b) / (math.sqrt(math.pi) * frac)


def _erf_numpy(x: np.ndarray) -> np.ndarray:
    a = np.abs(x.astype(np.float64))
    small = a < _SERIES_BELOW
    if small.all():
        out = _series(a)
    else:
        out = np.where(np.isnan(a), a, 1.0)
        out[small] = _series(a[small])
        big = a >= _SERIES_BELOW
        out[big] = _fraction(a[big])
    # bfloat16 has no promotion with float16: it keeps its own width
    dt = x.dtype if is_bfloat16(x.dtype) else np.result_type(x.dtype, np.float16)
    return np.copysign(out, x.astype(np.float64)).astype(dt, copy=False)


@functools.cache
def _scipy() -> Any:
    """``scipy.special.erf``, or None without SciPy (imported at the first call, not at
    import: SciPy reads SCIPY_ARRAY_API once, at its own first import, so importing it
    here would fix that choice before a program that imports sbpmpi has had a chance to
    set the variable)."""
    try:
        return importlib.import_module("scipy.special").erf
    except ImportError:
        return None


def erf(x: Any, out: Any = None) -> Any:
    """The error function of a NumPy or CuPy array, elementwise, in its floating dtype
    (``out``: an array of x's shape and dtype written with it, which may be ``x``; SciPy's
    and CuPy's ufuncs write into it directly, the expansions through a new array)."""
    if isinstance(x, np.ndarray) or np.isscalar(x):
        x = np.asarray(x)
        if x.dtype in (np.float32, np.float64):
            scipy_erf = _scipy()
            if scipy_erf is not None:
                return scipy_erf(x) if out is None else scipy_erf(x, out=out)
        if out is None:
            return _erf_numpy(x)
        out[...] = _erf_numpy(x)
        return out
    special = importlib.import_module("cupyx.scipy.special")
    return special.erf(x) if out is None else special.erf(x, out=out)
