"""The collectives of sbpmpi.comm: every rank of a group takes part in one call.

:mod:`.regular` (torch.distributed's collectives on buffers: barrier, broadcast, reduce,
all-reduce, gather, all-gather, scatter, reduce-scatter, all-to-all), :mod:`.vector`
(their forms with a block size per rank), :mod:`.listbufs` (the list arguments of
gather/scatter), :mod:`.work` (the handle of a non-blocking collective), :mod:`.objects`
(pickled Python objects: metadata only).
"""

from .objects import all_agree, all_gather_object, broadcast_object
from .regular import (
    all_gather,
    all_reduce,
    all_to_all,
    barrier,
    broadcast,
    gather,
    reduce,
    reduce_scatter,
    scatter,
)
from .vector import all_gather_v, all_to_all_v, gather_v, reduce_scatter_v, scatter_v
from .work import CollectiveWork, all_done

__all__ = [
    "barrier", "broadcast", "reduce", "all_reduce", "gather", "all_gather", "scatter",
    "reduce_scatter", "all_to_all",
    "all_gather_v", "gather_v", "scatter_v", "reduce_scatter_v", "all_to_all_v",
    "all_gather_object", "broadcast_object", "all_agree",
    "CollectiveWork", "all_done",
]
