"""Measure the cost table's alpha and beta on the running machine (``sm.boxing.calibrate()``).

Measured tables are kept in a cache file (``$SBPMPI_COST_CACHE``, else
``$XDG_CACHE_HOME/sbpmpi/cost-tables.json`` or ``~/.cache/sbpmpi/cost-tables.json``;
``SBPMPI_COST_CACHE=off`` disables it), one entry per :func:`cache_key`: host, MPI
library, GPU, GPU transport and number of ranks. ``calibrate(reuse=True)`` installs the
entry of this job instead of measuring; without a table installed, a single-node job with
a GPU uses the cached device row at start (:func:`cached_device_row`);
``python -m sbpmpi info --calibrate`` measures and refreshes the entry.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any

import numpy as np

from .. import backend, comm
from ..boxing.cost import (
    PRIMITIVES,
    AlphaBeta,
    CostTable,
    DeviceCosts,
    factor,
    rounds,
)
from .cost_table import get_cost_table, set_cost_table

__all__ = ["calibrate", "cache_path", "cache_key", "cached_device_row", "read_cache",
           "write_cache_entry"]

CACHE_ENV = "SBPMPI_COST_CACHE"


def cache_path() -> str | None:
    """The cache file, or None when ``SBPMPI_COST_CACHE=off``."""
    v = os.environ.get(CACHE_ENV, "").strip()
    if v.lower() in ("off", "0", "none", "no"):
        return None
    if v:
        return v
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(root, "sbpmpi", "cost-tables.json")


def _gpu_name() -> str:
    if not backend.cupy_available():
        return "no GPU"
    try:
        import cupy as cp

        dev = backend.device_to_bind()  # named, not bound: no CUDA context for a key
        name = cp.cuda.runtime.getDeviceProperties(dev)["name"]
        return name.decode() if isinstance(name, bytes) else str(name)
    except Exception as e:  # a key, not a diagnosis
        return f"GPU ({type(e).__name__})"


def cache_key(world_size: int | None = None) -> str:
    """``host | MPI library | GPU | GPU transport | N ranks`` of this process."""
    from ..comm.cuda_aware import library_name
    from ..comm.gpu import gpu_transport

    p = comm.WORLD.size if world_size is None else world_size
    return " | ".join([socket.gethostname(), library_name(), _gpu_name(),
                       f"transport {gpu_transport().name}", f"{p} ranks"])


def read_cache(path: str | None = None) -> dict[str, Any]:
    """All entries of the cache file ({} when absent or unreadable)."""
    path = path or cache_path()
    if not path:
        return {}
    try:
        with open(path) as f:
            doc = json.load(f)
        return doc if isinstance(doc, dict) else {}
    except (OSError, ValueError):
        return {}


def _costs(d: dict[str, Any]) -> DeviceCosts:
    return DeviceCosts(**{k: AlphaBeta(**v) for k, v in d.items() if k != "step"},
                       step=float(d["step"]))


def _table_from(entry: dict[str, Any], key: str) -> CostTable:
    return CostTable(_costs(entry["cpu"]), _costs(entry["cuda"]),
                     source=f"cached {entry.get('measured', '')}: {entry.get('source', key)}")


def write_cache_entry(key: str, table: CostTable, path: str | None = None) -> str | None:
    """Store ``table`` under ``key`` (atomically: write, then rename); returns the path."""
    path = path or cache_path()
    if not path:
        return None
    doc = read_cache(path)
    doc[key] = {"cpu": asdict(table.host), "cuda": asdict(table.device),
                "source": table.source,
                "measured": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
    os.replace(tmp, path)
    return path


def cached_device_row(transport: str) -> tuple[DeviceCosts, str] | None:
    """The cached device row for this machine and ``transport``, for a single-node job
    with a GPU (every rank reads the same file on the same host, so all agree without
    communicating); None otherwise.

    The GPU is named (for the key) only when the file holds an entry of this host, MPI
    library, transport and size, and never bound: CPU-only work creates no CUDA context.
    """
    from .. import env
    from ..comm.cuda_aware import library_name

    if not backend.cupy_available() or env.get_local_world_size() != env.get_world_size():
        return None
    path = cache_path()
    if not path:
        return None
    doc = read_cache(path)
    head = f"{socket.gethostname()} | {library_name()} | "
    tail = f" | transport {transport} | {comm.WORLD.size} ranks"
    if not any(k.startswith(head) and k.endswith(tail) for k in doc):
        return None
    key = cache_key()
    if not key.endswith(tail):  # the transport in use is another one
        return None
    entry = doc.get(key)
    if not entry:
        return None
    try:
        return _costs(entry["cuda"]), f"cached {entry.get('measured', '')} ({key})"
    except (KeyError, TypeError, ValueError):
        return None


_FLOOR_ALPHA = 1e-7
_FLOOR_BETA = 1e-13


def _timer(fn: Callable[[], None], repeats: int, sync: Callable[[], None]) -> float:
    fn()  # warm up (buffers, communicators, protocol switch)
    sync()
    ts = []
    for _ in range(repeats):
        comm.barrier()
        t0 = time.perf_counter()
        fn()
        sync()
        ts.append(time.perf_counter() - t0)
    return float(min(ts))  # the best repeat: scheduling noise only ever adds time


def _measure(primitive: str, nbytes: int, xp: Any, repeats: int, sync: Callable[[], None],
             ) -> tuple[float, float]:
    """(seconds, modelled bytes n) of one primitive on WORLD with about ``nbytes``."""
    p = comm.WORLD.size
    me = comm.WORLD.rank
    blk = max(1, nbytes // 8 // p)
    n = blk * p
    x = xp.ones(n, dtype=np.float64)
    y = xp.empty(n, dtype=np.float64)
    if primitive == "all_gather":
        return _timer(lambda: comm.all_gather(y, x[:blk]), repeats, sync), n * 8
    if primitive == "reduce_scatter":
        return _timer(lambda: comm.reduce_scatter(y[:blk], x), repeats, sync), n * 8
    if primitive == "all_reduce":
        return _timer(lambda: comm.all_reduce(y), repeats, sync), n * 8
    if primitive == "all_to_all":
        return _timer(lambda: comm.all_to_all(y, x), repeats, sync), n * 8 * p
    if primitive == "broadcast":
        return _timer(lambda: comm.broadcast(y, 0), repeats, sync), n * 8
    if primitive == "copy":
        def copy() -> None:
            y[...] = x
        return _timer(copy, repeats, sync), n * 8
    assert primitive == "p2p"
    peer = me ^ 1

    def exchange() -> None:
        if peer < p:
            w = [comm.irecv(y, peer, 7), comm.isend(x, peer, 7)]
            for r in w:
                r.wait()
    return _timer(exchange, repeats, sync), n * 8


def _fit(primitive: str, p: int, small: tuple[float, float], large: tuple[float, float],
         old: AlphaBeta) -> AlphaBeta:
    if primitive == "p2p":  # one exchange: a send and a receive per rank
        r, f = (2.0 if p > 1 else 0.0), 1.0
    elif primitive == "copy":
        r, f = 1.0, 1.0
    else:
        r, f = rounds(primitive, p), factor(primitive, p)
    if r == 0 or f == 0:
        return old  # a single rank moves nothing: keep the previous parameters
    (ts, bs), (tl, bl) = small, large
    beta = max((tl - ts) / (f * max(bl - bs, 1.0)), _FLOOR_BETA)
    alpha = max((ts - beta * f * bs) / r, _FLOOR_ALPHA)
    return AlphaBeta(alpha, beta)


def calibrate(device_types: Sequence[str] | None = None, *, small_bytes: int = 64,
              large_bytes: int = 16 << 20, repeats: int = 3, install: bool = True,
              reuse: bool = False, store: bool = True) -> CostTable:
    """Measure alpha and beta of every primitive on the running machine (collective).

    Runs each collective on WORLD at two sizes (best of ``repeats``), takes the
    slowest rank's time, and fits ``alpha * rounds + beta * factor * bytes``. The
    result is the same on every rank. ``device_types``: ``"cpu"`` and, where every
    rank has a GPU, ``"cuda"`` by default; parameters not measured are kept from the
    current table. With ``install`` the table is used by boxing from now on. Device
    buffers are measured on the GPU transport in use (``sm.comm.gpu_transport()``).

    ``reuse``: install rank 0's cached entry for this job (:func:`cache_key`) instead of
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
                    found = _table_from(entry, key)
                except (KeyError, TypeError, ValueError):
                    found = None
        found = comm.broadcast_object(found, 0)
        if found is not None:
            if install:
                set_cost_table(found)
            return found  # type: ignore[no-any-return]
    old = get_cost_table()
    p = comm.WORLD.size
    params = {"cpu": old.host, "cuda": old.device}
    for dt in device_types:
        xp = backend.get_xp(dt)

        def sync(xp: Any = xp) -> None:
            if xp is not np:
                backend.synchronize()

        times = np.zeros((len(PRIMITIVES), 2, 2), dtype=np.float64)
        for k, prim in enumerate(PRIMITIVES):
            for s, nb in enumerate((small_bytes, large_bytes)):
                times[k, s] = _measure(prim, nb, xp, repeats * (4 if s == 0 else 1), sync)
        comm.all_reduce(times, comm.ReduceOp.MAX)  # slowest rank; identical everywhere
        cur = params[dt]
        new = {prim: _fit(prim, p, (times[k, 0, 0], times[k, 0, 1]),
                          (times[k, 1, 0], times[k, 1, 1]), cur.get(prim))
               for k, prim in enumerate(PRIMITIVES)}
        params[dt] = DeviceCosts(**new, step=cur.step)
    from ..comm.gpu import gpu_transport

    gpu = f", GPU transport {gpu_transport().name}" if "cuda" in device_types else ""
    table = CostTable(params["cpu"], params["cuda"],
                      source=f"calibrated on {p} rank{'s' if p != 1 else ''} "
                             f"({', '.join(device_types)}{gpu})")
    if install:
        set_cost_table(table)
    if store and comm.WORLD.rank == 0:
        try:
            write_cache_entry(cache_key(), table)
        except OSError:
            pass  # a read-only home: the table is still installed
    return table
