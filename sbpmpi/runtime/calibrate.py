"""Measure the cost table's alpha and beta on the running machine (``sm.boxing.calibrate()``).

Measured tables are kept in the cache file of :mod:`.cost_cache`, one entry per
:func:`~.cost_cache.cache_key` (host, MPI library, GPU, GPU transport, number of ranks).
``calibrate(reuse=True)`` installs the entry of this job instead of measuring; without a
table installed, a single-node job with a GPU uses the cached device row at start
(:func:`~.cost_cache.cached_device_row`); ``python -m sbpmpi info --calibrate`` measures
and refreshes the entry.

On a job that spans hosts the two kinds of link are measured apart: the row of the
buffers (``cpu``, ``cuda``) on the ranks of the first host alone (the link inside a
host), and the ``network`` row on one rank per host (the lowest of each: pairs and groups
chosen across hosts), each with the other ranks idle. The table then carries the job's
topology, and the cache file keeps both rows.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, NamedTuple

import numpy as np

from .. import backend, comm
from ..boxing.cost import (
    PRIMITIVES,
    AlphaBeta,
    CostTable,
    DeviceCosts,
    Topology,
    factor,
    rounds,
)
from .cost_cache import cache_key, read_cache, table_from, write_cache_entry
from .cost_table import get_cost_table, job_topology, set_cost_table

__all__ = ["calibrate"]

_FLOOR_ALPHA = 1e-7
_FLOOR_BETA = 1e-13


def _timer(fn: Callable[[], None], repeats: int, sync: Callable[[], None],
           group: comm.Group) -> float:
    fn()  # warm up (buffers, communicators, protocol switch)
    sync()
    ts = []
    for _ in range(repeats):
        comm.barrier(group)
        t0 = time.perf_counter()
        fn()
        sync()
        ts.append(time.perf_counter() - t0)
    return float(min(ts))  # the best repeat: scheduling noise only ever adds time


class Sample(NamedTuple):
    """One measurement: the best seconds of a primitive and the bytes the model charges."""

    seconds: float
    nbytes: float


def _measure(primitive: str, nbytes: int, xp: Any, repeats: int, sync: Callable[[], None],
             group: comm.Group) -> Sample:
    """The :class:`Sample` of one primitive on ``group`` (a member calls) with about
    ``nbytes``; point-to-point between group ranks ``2i`` and ``2i + 1``."""
    p = group.size
    me = group.rank
    blk = max(1, nbytes // 8 // p)
    n = blk * p
    x = xp.ones(n, dtype=np.float64)
    y = xp.empty(n, dtype=np.float64)
    g = group

    def timed(fn: Callable[[], None]) -> float:
        return _timer(fn, repeats, sync, g)

    if primitive == "all_gather":
        return Sample(timed(lambda: comm.all_gather(y, x[:blk], g)), n * 8)
    if primitive == "reduce_scatter":
        return Sample(timed(lambda: comm.reduce_scatter(y[:blk], x, group=g)), n * 8)
    if primitive == "all_reduce":
        return Sample(timed(lambda: comm.all_reduce(y, group=g)), n * 8)
    if primitive == "all_to_all":
        return Sample(timed(lambda: comm.all_to_all(y, x, g)), n * 8 * p)
    if primitive == "broadcast":
        return Sample(timed(lambda: comm.broadcast(y, g.ranks[0], g)), n * 8)
    if primitive == "copy":
        def copy() -> None:
            y[...] = x
        return Sample(timed(copy), n * 8)
    assert primitive == "p2p"
    peer = me ^ 1

    def exchange() -> None:
        if peer < p:
            w = [comm.irecv(y, g.ranks[peer], 7), comm.isend(x, g.ranks[peer], 7)]
            for r in w:
                r.wait()
    return Sample(timed(exchange), n * 8)


def _fitted(group: comm.Group | None, primitives: Sequence[str], xp: Any,
            sync: Callable[[], None], sizes: tuple[int, int], repeats: int,
            old: DeviceCosts) -> DeviceCosts:
    """``old`` with the ``primitives`` measured on ``group`` (collective over WORLD: the
    members measure, every rank takes the slowest member's times)."""
    times = np.zeros((len(primitives), 2, 2), dtype=np.float64)
    if group is not None and group.is_member():
        for k, prim in enumerate(primitives):
            for s, nb in enumerate(sizes):
                times[k, s] = _measure(prim, nb, xp, repeats * (4 if s == 0 else 1), sync,
                                       group)
    comm.all_reduce(times, comm.ReduceOp.MAX)  # slowest rank; identical everywhere
    if group is None:
        return old
    new = {prim: _fit(prim, group.size, Sample(*times[k, 0]), Sample(*times[k, 1]),
                      old.get(prim))
           for k, prim in enumerate(primitives)}
    return replace(old, **new)  # type: ignore[arg-type]


def _fit(primitive: str, p: int, small: Sample, large: Sample, old: AlphaBeta) -> AlphaBeta:
    """The alpha and beta of ``primitive`` on ``p`` ranks through a small and a large
    measurement (``old`` when one rank moves nothing), floored at the smallest values."""
    if primitive == "p2p":  # one exchange: a send and a receive per rank
        r, f = (2.0 if p > 1 else 0.0), 1.0
    elif primitive == "copy":
        r, f = 1.0, 1.0
    else:
        r, f = rounds(primitive, p), factor(primitive, p)
    if r == 0 or f == 0:
        return old  # a single rank moves nothing: keep the previous parameters
    dt, db = large.seconds - small.seconds, large.nbytes - small.nbytes
    beta = max(dt / (f * max(db, 1.0)), _FLOOR_BETA)
    alpha = max((small.seconds - beta * f * small.nbytes) / r, _FLOOR_ALPHA)
    return AlphaBeta(alpha, beta)


def _measured_groups(topo: Topology | None) -> tuple[comm.Group | None, comm.Group | None]:
    """(the group measured for the link inside a host, the group across hosts): WORLD and
    None on one host; else the first host's ranks (None when it has one rank: nothing to
    measure) and the lowest rank of every host."""
    if topo is None:
        return comm.WORLD, None
    first = tuple(r for r, k in enumerate(topo.nodes) if k == 0)
    leaders = tuple(sorted({k: r for r, k in reversed(list(enumerate(topo.nodes)))}.values()))
    inside = comm.get_group(first) if len(first) > 1 else None
    return inside, comm.get_group(leaders)


def calibrate(device_types: Sequence[str] | None = None, *, small_bytes: int = 64,
              large_bytes: int = 16 << 20, repeats: int = 3, install: bool = True,
              reuse: bool = False, store: bool = True) -> CostTable:
    """Measure alpha and beta of every primitive on the running machine (collective).

    Runs each collective on WORLD at two sizes (best of ``repeats``), takes the
    slowest rank's time, and fits ``alpha * rounds + beta * factor * bytes``; on a job
    that spans hosts, inside the first host and across hosts apart (module docstring). The
    result is the same on every rank. ``device_types``: ``"cpu"`` and, where every
    rank has a GPU, ``"cuda"`` by default; parameters not measured are kept from the
    current table. With ``install`` the table is used by boxing from now on. Device
    buffers are measured on the GPU transport in use (``sm.comm.gpu_transport()``).

    ``reuse``: install rank 0's cached entry for this job (:func:`.cost_cache.cache_key`) instead of
    measuring, when there is one. ``store``: rank 0 writes the measured table to the
    cache file (see the module docstring).
    """
    have_gpu = comm.all_agree(backend.cupy_available())
    if device_types is None:
        device_types = ("cpu", "cuda") if have_gpu else ("cpu",)
    for dt in device_types:
        if dt not in ("cpu", "cuda"):
            raise ValueError(f"device type {dt!r} is not one of ('cpu', 'cuda')")
        if dt == "cuda" and not have_gpu:
            raise RuntimeError("calibrate('cuda') needs CuPy and a GPU on every rank")
    if not (isinstance(small_bytes, int) and isinstance(large_bytes, int)
            and 0 < small_bytes < large_bytes):
        raise ValueError(f"need 0 < small_bytes < large_bytes, got {small_bytes}, {large_bytes}")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be a positive int, got {repeats!r}")
    if isinstance(reuse, bool) and reuse:
        found = None
        if comm.WORLD.rank == 0:
            key = cache_key()
            entry = read_cache().get(key)
            if entry:
                try:
                    found = table_from(entry, key)
                except (KeyError, TypeError, ValueError):
                    found = None
        found = comm.broadcast_object(found, 0)
        if found is not None:
            if install:
                set_cost_table(found)
            return found  # type: ignore[no-any-return]
    old = get_cost_table()
    p = comm.WORLD.size
    topo = job_topology()
    inside, across = _measured_groups(topo)
    params = {"cpu": old.host, "cuda": old.device}
    network = old.network
    sizes = (small_bytes, large_bytes)
    for dt in device_types:
        xp = backend.get_xp(dt)

        def sync(xp: Any = xp) -> None:
            if xp is not np:
                backend.synchronize()

        params[dt] = _fitted(inside, PRIMITIVES, xp, sync, sizes, repeats, params[dt])
        if topo is not None and dt == "cpu":
            network = _fitted(across, [q for q in PRIMITIVES if q != "copy"], xp, sync,
                              sizes, repeats, old.network_costs)
    from ..comm.gpu import gpu_transport

    gpu = f", GPU transport {gpu_transport().name}" if "cuda" in device_types else ""
    where = f" on {topo.count} hosts" if topo is not None else ""
    table = CostTable(params["cpu"], params["cuda"],
                      source=f"calibrated on {p} rank{'s' if p != 1 else ''}{where} "
                             f"({', '.join(device_types)}{gpu})",
                      network=network, topology=topo)
    if install:
        set_cost_table(table)
    if store and comm.WORLD.rank == 0:
        try:
            write_cache_entry(cache_key(), table)
        except OSError:
            pass  # a read-only home: the table is still installed
    return table
