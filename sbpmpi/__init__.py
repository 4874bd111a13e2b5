"""sbpmpi: SPMD global tensors (placement + SBP) on MPI, for NumPy and CuPy.

``import sbpmpi as sm``; every rank runs the same program and holds one shard of
each global tensor.
"""

from __future__ import annotations

import importlib
from typing import Any

from . import autograd as _autograd
from . import comm, config, env, ops, protocols
from . import conversion as _conversion
from . import einops_backend as _einops_backend
from . import names_from_above as _names_from_above
from . import tape as _tape
from . import tensor as _tensor
from ._version import __version__
from .backend import node as _node
from .comm.agreement import settings as _settings_agreement
from .comm.lifecycle import abort as _abort
from .comm.lifecycle import exit_agreement as _exit_agreement
from .comm.lifecycle import world as _world
from .comm.trace import trace
from .core import dtypes as _dtypes
from .core import placement as _placement
from .core import sbp
from .core.layout import Layout
from .core.placement import Placement, placement
from .core.random import manual_seed
from .creation import arange, full, ones, rand, randn, tensor, to_global, zeros
from .grad_mode import enable_grad, is_grad_enabled, no_grad, set_grad_enabled
from .ops import operators as _operators
from .ops.autocast import autocast
from .tensor import GlobalTensor
from .visualize import visualize  # a submodule import would otherwise shadow the function

# The floating scalar types, as NumPy's (np.float32): any dtype argument takes them, and
# a dtype compares equal to its type (x.dtype == sm.bfloat16). bfloat16 is ml_dtypes',
# imported on first use of the name (__getattr__): it takes seconds to load.
float16 = _dtypes.float16.type
float32, float64 = _dtypes.float32.type, _dtypes.float64.type

# Wiring of the layers (this package is the composition root):
_placement.set_world_size_source(_world.get_world_size)  # core.placement makes no MPI call
_placement.set_topology_source(_world.topology)  # placements by node: {node: [local ranks]}
_tensor.bind_layers_above(ops, _autograd, protocols, _conversion, _tape)  # GlobalTensor's methods
_operators.install(GlobalTensor)  # its operators, from the op registry
_tensor.bind_array_api(lambda: importlib.import_module("sbpmpi.array_api"))  # on first use
_abort.install()  # an uncaught exception on any rank aborts the job (SBPMPI_ABORT_ON_ERROR=0: off)
_settings_agreement.check()  # collective: the SBPMPI_* settings agree (raises on every rank)
_exit_agreement.init()  # collective: the communicator that meets ranks at exit
_world.init()  # the node split is collective: every rank takes part now, not in a later call
_node.set_local_ranks(_world.get_local_rank(), _world.get_local_world_size())  # GPU, pool
_einops_backend.register()  # einops' own front end on GlobalTensors, where einops is installed
# sm.nn shows the parallel wing's names, as torch.nn does; the wing builds on nn, so they
# are installed from here, above both, and imported on first use
_names_from_above.install("sbpmpi.nn", dict.fromkeys(("DataParallel", "no_sync", "shard"),
                                                     "sbpmpi.parallel"))
# sm.boxing shows the functions that act on tensors or on this rank's cost table, defined
# in the layers above the pure planner
_names_from_above.install("sbpmpi.boxing", {
    **dict.fromkeys(("box", "gather_global", "plan_for", "explain_conversion"),
                    "sbpmpi.conversion"),
    **dict.fromkeys(("conversion_cost", "calibrate", "get_cost_table", "set_cost_table"),
                    "sbpmpi.runtime"),
})

# Public names that live in larger modules, imported on first use.
_LAZY: dict[str, str] = {
    **{name: "sbpmpi.ops" for name in ops.PUBLIC},  # the public ops of the registry
    "explain": "sbpmpi.explain",
    "einsum": "sbpmpi.contraction",
    "map_overlap": "sbpmpi.stencil",  # a function of each shard and its neighbours' borders
    "graph": "sbpmpi.capture",  # a training step captured and replayed
    "GraphBreak": "sbpmpi.capture",
    "save": "sbpmpi.checkpoint",
    "load": "sbpmpi.checkpoint",
    "save_state": "sbpmpi.checkpoint",
    "load_state": "sbpmpi.checkpoint",
}
# Public submodules, imported on first use: sm.<name> -> module.
_SUBMODULES: dict[str, str] = {
    "boxing": "sbpmpi.boxing", "testing": "sbpmpi.testing", "backend": "sbpmpi.backend",
    "checkpoint": "sbpmpi.checkpoint", "optim": "sbpmpi.optim", "nn": "sbpmpi.nn",
    "runtime": "sbpmpi.runtime", "layout": "sbpmpi.core.layout",
    "array_api": "sbpmpi.array_api",  # the Array API namespace (x.__array_namespace__())
    "linalg": "sbpmpi.linalg",  # linear algebra at the size of the data (lstsq, cg, ...)
    "pipeline": "sbpmpi.pipeline",  # pipeline stages on placements and their schedules
    "amp": "sbpmpi.amp",  # mixed precision: autocast, GradScaler
    "launch": "sbpmpi.launch",  # the launcher (a tool), for sm.launch.expect_world & co
}

__all__ = [
    "__version__", "comm", "config", "env", "sbp", "placement", "Placement", "Layout", "GlobalTensor",
    "randn", "rand", "zeros", "ones", "full", "arange", "tensor", "to_global", "manual_seed", "trace", "visualize",
    "float16", "bfloat16", "float32", "float64", "autocast", "amp",
    "no_grad", "enable_grad", "is_grad_enabled", "set_grad_enabled",
    *_LAZY, *_SUBMODULES,
]


def __getattr__(name: str) -> Any:
    if name == "bfloat16":
        value = _dtypes.bfloat16.type  # imports ml_dtypes
        globals()[name] = value
        return value
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    if name in _SUBMODULES:
        return importlib.import_module(_SUBMODULES[name])
    raise AttributeError(f"module 'sbpmpi' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
