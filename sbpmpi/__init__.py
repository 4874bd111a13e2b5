"""sbpmpi: SPMD global tensors (placement + SBP) on MPI, for NumPy and CuPy.

``import sbpmpi as sm``; every rank runs the same program and holds one shard of
each global tensor.
"""

from . import comm, env, sbp
from ._version import __version__
from .creation import arange, full, ones, rand, randn, tensor, to_global, zeros
from .layout import Layout
from .placement import Placement, placement
from .random import manual_seed
from .tensor import GlobalTensor

__all__ = [
    "__version__", "comm", "env", "sbp", "placement", "Placement", "Layout", "GlobalTensor",
    "randn", "rand", "zeros", "ones", "full", "arange", "tensor", "to_global", "manual_seed",
]
