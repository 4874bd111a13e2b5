"""``sm.nn.MixedPrecision``: the mixed-precision policy of a parallel wrapper, as FSDP2's
``MixedPrecisionPolicy``.

``sm.nn.DataParallel(model, mixed_precision=sm.nn.MixedPrecision())`` and
``sm.nn.shard(model, opt, stage=..., mixed_precision=...)`` keep the parameters (and under
ZeRO their shards and the optimizer states) in float32, the master weights, and run each
forward of the wrapped model with half-width copies for compute: the forward runs under
``sm.autocast(param_dtype)`` (matmuls and linear layers on ``param_dtype`` copies of the
weights, made per call and recorded on the tape, whose gradients the engine casts back
to float32), and its floating outputs are cast to ``output_dtype`` when given.
Checkpoints save the float32 masters (the module's parameters are never replaced).

``reduce_dtype``: the dtype gradients are reduced in (as FSDP2's, and DDP's
``bf16_compress_hook``/``fp16_compress_hook``). float32 (the default): the gradients of
the float32 masters are reduced as they arrive, in float32. bfloat16 or float16, under
``DataParallel``: each float32 gradient bucket is cast to it, reduced with float32 sums
of the half-width pieces (:class:`sbpmpi.runtime.half_width.HalfWidthReduction`: half
the bytes of float32) and cast back into the masters' ``.grad``
(:mod:`sbpmpi.parallel.reducer`). ZeRO (``sm.nn.shard``) takes float32 only: its
reduce-scatters run in the float32 masters' dtype; a half ``reduce_dtype`` there is
refused with a ValueError naming it. Under ZeRO stage 3 a half ``param_dtype`` also sets
the dtype the layers gather their parameters in (every parameter, as FSDP2: half the
bytes of float32's all-gathers).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..core.dtypes import HALF, as_dtype, float32, is_floating
from ..ops.autocast import autocast
from ..tensor import GlobalTensor
from .module import Module

__all__ = ["MixedPrecision"]


def _dtype(name: str, value: Any, allowed: tuple[str, ...]) -> np.dtype:
    """``value`` as a dtype: float32 or a half width (``allowed`` names them in order)."""
    try:
        dt = as_dtype(value)
    except TypeError:
        raise TypeError(f"MixedPrecision: {name} must be a dtype, got {value!r}") from None
    if dt not in HALF and dt != float32:
        raise ValueError(f"MixedPrecision: {name} must be one of {list(allowed)}, got {dt.name}")
    return dt


@dataclass(frozen=True)
class MixedPrecision:
    """``MixedPrecision(param_dtype=sm.bfloat16, reduce_dtype=sm.float32, output_dtype=None)``.

    ``param_dtype``: the compute dtype of the forward (bfloat16, float16, or float32 for
    none); ``reduce_dtype``: the gradients' reduction dtype (float32, or bfloat16 or
    float16 under ``DataParallel``); ``output_dtype``:
    the dtype the wrapper's floating outputs are cast to (None: as computed).
    """

    param_dtype: Any = "bfloat16"  # a name: sm.bfloat16 would import ml_dtypes with sm.nn
    reduce_dtype: Any = float32
    output_dtype: Any = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "param_dtype", _dtype(
            "param_dtype", self.param_dtype, ("bfloat16", "float16", "float32")))
        object.__setattr__(self, "reduce_dtype", _dtype(
            "reduce_dtype", self.reduce_dtype, ("float32", "bfloat16", "float16")))
        if self.output_dtype is not None:
            od = as_dtype(self.output_dtype)
            if not is_floating(od):
                raise ValueError(f"MixedPrecision: output_dtype must be a floating dtype or "
                                 f"None, got {od}")
            object.__setattr__(self, "output_dtype", od)

    def attach(self, module: Module) -> None:
        """Run ``module``'s forward under this policy (forward hooks on it)."""
        ctx: list[autocast] = []
        low = self.param_dtype in HALF

        def before(m: Module, args: tuple[Any, ...]) -> None:
            if low:
                c = autocast(self.param_dtype)
                c.__enter__()
                ctx.append(c)

        def after(m: Module, args: tuple[Any, ...], out: Any) -> Any:
            if ctx:
                ctx.pop().__exit__(None, None, None)
            return None if out is None else self._cast_output(out)

        module.register_forward_pre_hook(before)
        module.register_forward_hook(after, always_call=True)

    def _cast_output(self, out: Any) -> Any:
        dt = self.output_dtype
        if dt is None:
            return out
        if isinstance(out, GlobalTensor):
            return out.astype(dt) if is_floating(out.dtype) and out.dtype != dt else out
        if isinstance(out, (tuple, list)):
            return type(out)(self._cast_output(o) for o in out)
        return out
