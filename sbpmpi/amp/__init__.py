"""Mixed precision: ``sm.amp.autocast`` (also ``sm.autocast``) and ``sm.amp.GradScaler``.

As ``torch.amp``: compute in bfloat16 or float16 under :class:`autocast` with float32
weights, and scale a float16 loss so that its small gradients do not flush to zero
(:class:`GradScaler`). The dtypes are ``sm.float16`` and ``sm.bfloat16``.
"""

from __future__ import annotations

from ..ops.autocast import autocast
from .grad_scaler import GradScaler

__all__ = ["autocast", "GradScaler"]
