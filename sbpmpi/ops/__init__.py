"""Global ops: computed on local shards, with SBP signature inference and automatic boxing.

Every op is registered once in :mod:`sbpmpi.ops.registry` (:data:`REGISTRY`: its
``GlobalOp``, kind, and the doors it answers by: NumPy ufuncs and functions, array API
names, ``GlobalTensor`` operators, ``sm.<name>``); :data:`OPS` and this module's names
are made from it. Each op declares its valid signatures in a table next to it
(``sm.ops.matmul.table``); :mod:`sbpmpi.ops.inference` picks the cheapest for the
operands' layouts (pure); :mod:`sbpmpi.ops.op` boxes the operands, runs the op on the
local shards and labels the result, and :mod:`sbpmpi.ops.dispatch` short-cuts calls seen
before. ``sm.explain(op, *args)`` shows the candidates and their costs.
"""

from __future__ import annotations

from .activation import gelu as gelu
from .activation import gelu_backward as gelu_backward
from .array_index import getitem_arrays as getitem_arrays
from .call import OpCall
from .elementwise import abs as abs
from .elementwise import add as add
from .elementwise import clip as clip
from .elementwise import div as div
from .elementwise import eq as eq
from .elementwise import exp as exp
from .elementwise import ge as ge
from .elementwise import gt as gt
from .elementwise import log as log
from .elementwise import lt as lt
from .elementwise import mul as mul
from .elementwise import ne as ne
from .elementwise import neg as neg
from .elementwise import pow as pow
from .elementwise import relu as relu
from .elementwise import sqrt as sqrt
from .elementwise import sub as sub
from .elementwise import where as where
from .embedding import embedding as embedding
from .inference import Candidate, Inference, infer
from .linalg import matmul as matmul
from .normalization import normalize as normalize
from .normalization import normalize_backward as normalize_backward
from .op import GlobalOp, run_call
from .reduction import log_softmax as log_softmax
from .reduction import max_ as max  # noqa: F401 - exported through __all__ (the registry)
from .reduction import mean as mean
from .reduction import min_ as min  # noqa: F401 - exported through __all__ (the registry)
from .reduction import softmax as softmax
from .reduction import sum_ as sum  # noqa: F401 - exported through __all__ (the registry)
from .reduction import var as var
from .registry import OPS, PUBLIC, REGISTRY, OpEntry
from .setitem import setitem as setitem
from .shape import astype as astype
from .shape import cat as cat
from .shape import getitem as getitem
from .shape import reshape as reshape
from .shape import transpose as transpose
from .signature import AnySplit, DimMatch, Resolved, Signature
from .triangle import tril as tril
from .triangle import triu as triu

# Every registered op as sm.ops.<name> (the imports above name the ones the library calls).
globals().update(OPS)

__all__ = [
    *REGISTRY,
    "OPS", "REGISTRY", "PUBLIC", "OpEntry", "GlobalOp", "OpCall", "Signature", "AnySplit",
    "DimMatch", "Resolved", "Candidate", "Inference", "infer", "run_call",
]
