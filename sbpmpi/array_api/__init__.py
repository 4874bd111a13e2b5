"""The Python Array API standard (2024.12) on global tensors: ``sbpmpi.array_api``.

``x.__array_namespace__()`` returns this module for any :class:`~sbpmpi.GlobalTensor`,
so array-API code (``xp = array_namespace(x)``; SciPy, scikit-learn with
``array_api_dispatch=True``) runs across MPI ranks: every rank calls the same functions
and holds its shard of each result.

The device is the placement: ``x.device`` is ``x.placement``, ``x.to_device(placement)``
moves it, and creation functions take ``device=placement``. Without one, arrays live on
every rank of the world, split along their first axis (``sm.config.array_api_sbp``:
``"split"`` or ``"broadcast"``). Results equal NumPy's on every rank; the docs page
"Array API" lists what each function communicates and what is not implemented yet.
"""

from __future__ import annotations

from typing import Any

from ..linalg.products import matmul, matrix_transpose, tensordot, vecdot
from . import fft, linalg  # the extensions (xp.fft, xp.linalg)
from ._creation import (
    arange,
    asarray,
    empty,
    empty_like,
    eye,
    from_dlpack,
    full,
    full_like,
    linspace,
    meshgrid,
    ones,
    ones_like,
    tril,
    triu,
    zeros,
    zeros_like,
)
from ._device import default_device, to_device
from ._dlpack import array_dlpack as array_dlpack  # the array object's __dlpack__
from ._dlpack import array_dlpack_device as array_dlpack_device
from ._dtypes import (
    astype,
    bool,
    can_cast,
    complex64,
    complex128,
    finfo,
    float32,
    float64,
    iinfo,
    int8,
    int16,
    int32,
    int64,
    isdtype,
    result_type,
    uint8,
    uint16,
    uint32,
    uint64,
)
from ._elementwise import (
    abs,
    acos,
    acosh,
    add,
    asin,
    asinh,
    atan,
    atan2,
    atanh,
    bitwise_and,
    bitwise_invert,
    bitwise_left_shift,
    bitwise_or,
    bitwise_right_shift,
    bitwise_xor,
    ceil,
    clip,
    conj,
    copysign,
    cos,
    cosh,
    divide,
    equal,
    exp,
    expm1,
    floor,
    floor_divide,
    greater,
    greater_equal,
    hypot,
    imag,
    isfinite,
    isinf,
    isnan,
    less,
    less_equal,
    log,
    log1p,
    log2,
    log10,
    logaddexp,
    logical_and,
    logical_not,
    logical_or,
    logical_xor,
    maximum,
    minimum,
    multiply,
    negative,
    nextafter,
    not_equal,
    positive,
    pow,
    real,
    reciprocal,
    remainder,
    round,
    sign,
    signbit,
    sin,
    sinh,
    sqrt,
    square,
    subtract,
    tan,
    tanh,
    trunc,
    where,
)
from ._info import __array_namespace_info__
from ._manipulation import (
    broadcast_arrays,
    broadcast_to,
    concat,
    diff,
    expand_dims,
    flip,
    moveaxis,
    permute_dims,
    repeat,
    reshape,
    roll,
    squeeze,
    stack,
    take,
    take_along_axis,
    tile,
    unstack,
)
from ._searching import (
    argmax,
    argmin,
    argsort,
    nonzero,
    searchsorted,
    sort,
    unique_all,
    unique_counts,
    unique_inverse,
    unique_values,
)
from ._statistical import (
    all,
    any,
    count_nonzero,
    cumulative_prod,
    cumulative_sum,
    max,
    mean,
    min,
    prod,
    std,
    sum,
    var,
)

__array_api_version__ = "2024.12"

#: The revisions of the standard this namespace implements.
API_VERSIONS = ("2024.12",)

e = 2.718281828459045
inf = float("inf")
nan = float("nan")
newaxis = None
pi = 3.141592653589793

__all__ = [
    "__array_api_version__", "__array_namespace_info__", "e", "inf", "nan", "newaxis", "pi",
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float32", "float64", "complex64", "complex128", "astype", "can_cast", "finfo", "iinfo",
    "isdtype", "result_type", "asarray", "zeros", "ones", "empty", "full", "zeros_like",
    "ones_like", "empty_like", "full_like", "arange", "linspace", "eye", "tril", "triu",
    "meshgrid", "from_dlpack", "abs", "acos", "acosh", "asin", "asinh", "atan", "atanh",
    "bitwise_invert", "conj", "cos", "cosh", "exp", "expm1", "imag", "isfinite", "isinf",
    "isnan", "log", "log1p", "log2", "log10", "logical_not", "negative", "positive", "real",
    "reciprocal", "sign", "signbit", "sin", "sinh", "square", "sqrt", "tan", "tanh", "ceil",
    "floor", "trunc", "round", "add", "atan2", "bitwise_and", "bitwise_left_shift",
    "bitwise_or", "bitwise_right_shift", "bitwise_xor", "copysign", "divide", "equal",
    "floor_divide", "greater", "greater_equal", "hypot", "less", "less_equal", "logaddexp",
    "logical_and", "logical_or", "logical_xor", "maximum", "minimum", "multiply", "nextafter",
    "not_equal", "pow", "remainder", "subtract", "clip", "where", "sum", "prod", "mean", "var",
    "std", "max", "min", "cumulative_sum", "cumulative_prod", "all", "any", "count_nonzero",
    "take", "take_along_axis", "diff", "reshape", "permute_dims", "expand_dims", "squeeze", "concat", "stack",
    "flip", "roll",
    "broadcast_to", "broadcast_arrays", "moveaxis", "repeat", "tile", "unstack", "matmul",
    "matrix_transpose", "tensordot", "vecdot", "argmax", "argmin", "nonzero", "searchsorted",
    "sort", "argsort", "unique_all", "unique_counts", "unique_inverse", "unique_values",
    "to_device", "default_device", "namespace_for", "fft", "linalg",
]


def namespace_for(api_version: Any = None) -> Any:
    """This module, for ``api_version`` None or ``"2024.12"`` (ValueError otherwise):
    what ``GlobalTensor.__array_namespace__`` returns."""
    import sys

    if api_version is not None and api_version not in API_VERSIONS:
        raise ValueError(f"__array_namespace__: api_version {api_version!r} is not supported; "
                         f"this namespace implements {', '.join(API_VERSIONS)}")
    return sys.modules[__name__]
