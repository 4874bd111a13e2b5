"""Global ops: computed on local shards, with SBP signature inference and automatic boxing.

Each op declares its valid signatures in a table next to it (``sm.ops.matmul.table``);
:mod:`sbpmpi.ops.inference` picks the cheapest for the operands' layouts (pure);
:mod:`sbpmpi.ops.op` boxes the operands, runs the op on the local shards and labels the
result, and :mod:`sbpmpi.ops.dispatch` short-cuts calls seen before. ``sm.explain(op,
*args)`` shows the candidates and their costs.
"""

from __future__ import annotations

from .activation import gelu, gelu_backward
from .array_index import getitem_arrays
from .call import OpCall
from .elementwise import (
    abs,
    add,
    div,
    eq,
    erf,
    exp,
    ge,
    gt,
    le,
    log,
    lt,
    maximum,
    minimum,
    mul,
    ne,
    neg,
    pow,
    relu,
    sigmoid,
    sqrt,
    sub,
    tanh,
    where,
)
from .embedding import embedding, embedding_backward
from .inference import Candidate, Inference, infer
from .linalg import matmul
from .normalization import normalize, normalize_backward
from .op import GlobalOp, execute
from .reduction import log_softmax, mean, softmax, softmax_finish, sum_exp, var
from .reduction import max_ as max
from .reduction import min_ as min
from .reduction import sum_ as sum
from .setitem import setitem
from .shape import astype, cat, getitem, reshape, transpose
from .signature import AnySplit, DimMatch, Resolved, Signature
from .triangle import tril, triu

__all__ = [
    "matmul", "add", "sub", "mul", "div", "pow", "maximum", "minimum",
    "eq", "ne", "lt", "le", "gt", "ge", "where",
    "neg", "abs", "exp", "log", "sqrt", "tanh", "relu", "sigmoid",
    "sum", "mean", "max", "min", "softmax", "log_softmax",
    "transpose", "reshape", "getitem", "getitem_arrays", "setitem", "astype", "cat", "embedding", "embedding_backward",
    "erf", "gelu", "gelu_backward", "normalize", "normalize_backward", "var", "tril", "triu", "sum_exp", "softmax_finish",
    "OPS", "GlobalOp", "OpCall", "Signature", "AnySplit", "DimMatch", "Resolved",
    "Candidate", "Inference", "infer", "execute",
]

#: Every op by name.
OPS: dict[str, GlobalOp] = {op.name: op for op in (
    matmul, add, sub, mul, div, pow, maximum, minimum, eq, ne, lt, le, gt, ge, where,
    neg, abs, exp, log, sqrt, tanh, relu, sigmoid, sum, mean, max, min, softmax, log_softmax,
    transpose, reshape, getitem, astype, cat, erf, tril, triu,
)}
