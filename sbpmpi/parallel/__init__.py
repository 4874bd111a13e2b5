"""The parallel wing: data parallelism and ZeRO, built on ``sm.nn`` modules and hooked
into the backward engine from outside (the engine knows nothing of them).

- :mod:`.data_parallel`: ``DataParallel`` (torch's DDP: gradient buckets whose
  all-reduces overlap backward) and ``no_sync``;
- :mod:`.reducer`: the ``Reducer`` a ``DataParallel`` owns, which registers the engine's
  leaf-gradient, poll and end-of-backward hooks (:mod:`sbpmpi.autograd.hooks`);
- :mod:`.buckets`: which parameters share a bucket, and a bucket's reduction plan;
- :mod:`.zero`: ZeRO stages 1-3 (``shard``), one module class per stage.

The public names are ``sm.nn.DataParallel``, ``sm.nn.no_sync`` and ``sm.nn.shard``.
No module here keeps mutable state at module level: each ``DataParallel`` and each ZeRO
module owns its own.
"""

from __future__ import annotations

from .data_parallel import DataParallel, no_sync
from .reducer import Reducer
from .zero import shard

__all__ = ["DataParallel", "no_sync", "shard", "Reducer"]
