"""The cache file of measured cost tables: where it is, its key, reading and writing it.

Measured tables (:func:`sbpmpi.runtime.calibrate.calibrate`) are kept in a cache file (the
setting :data:`sbpmpi.config.cost_cache`, ``$SBPMPI_COST_CACHE``; else
``$XDG_CACHE_HOME/sbpmpi/cost-tables.json`` or ``~/.cache/sbpmpi/cost-tables.json``;
``off`` disables it), one entry per :func:`cache_key`: host, MPI library, GPU, GPU
transport and number of ranks (and of hosts, for a job that spans several). An entry
holds a row per kind of link: ``cpu`` and ``cuda`` (inside a host) and, measured on a
job across hosts, ``network`` (between hosts). The cost table in use (:mod:`.cost_table`) reads the
cached device row at start (:func:`cached_device_row`); calibration writes entries.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
import time
from dataclasses import asdict
from typing import Any, NamedTuple

from .. import backend, comm, config
from ..boxing.cost import AlphaBeta, CostTable, DeviceCosts
from ..comm.gpu import gpu_transport
from ..comm.info import library_name
from ..comm.lifecycle import world

__all__ = ["cache_path", "cache_key", "CachedRow", "cached_device_row", "read_cache", "write_cache_entry",
           "table_from", "costs_from"]


def cache_path() -> str | None:
    """The cache file, or None when the setting ``cost_cache`` is ``off``."""
    v = config.cost_cache.value
    if v == "off":
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
    """``host | MPI library | GPU | GPU transport | N ranks`` of this process
    (``N ranks on K hosts`` for a job that spans hosts)."""
    p = comm.WORLD.size if world_size is None else world_size
    k = world.get_node_count() if world_size is None else 1
    ranks = f"{p} ranks" + (f" on {k} hosts" if k > 1 else "")
    return " | ".join([socket.gethostname(), library_name(), _gpu_name(),
                       f"transport {gpu_transport().name}", ranks])


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


def costs_from(d: dict[str, Any]) -> DeviceCosts:
    """The :class:`DeviceCosts` of one row of an entry (``entry["cpu"]``, ``entry["cuda"]``)."""
    return DeviceCosts(**{k: AlphaBeta(**v) for k, v in d.items() if k != "step"},
                       step=float(d["step"]))


def table_from(entry: dict[str, Any], key: str) -> CostTable:
    """The :class:`CostTable` of the cache entry ``entry`` stored under ``key``."""
    net = entry.get("network")
    return CostTable(costs_from(entry["cpu"]), costs_from(entry["cuda"]),
                     source=f"cached {entry.get('measured', '')}: {entry.get('source', key)}",
                     network=costs_from(net) if net else None)


def write_cache_entry(key: str, table: CostTable, path: str | None = None) -> str | None:
    """Store ``table`` under ``key`` (atomically: write, then rename); returns the path."""
    path = path or cache_path()
    if not path:
        return None
    doc = read_cache(path)
    doc[key] = {"cpu": asdict(table.host), "cuda": asdict(table.device),
                "source": table.source,
                "measured": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    if table.network is not None:
        doc[key]["network"] = asdict(table.network)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
    os.replace(tmp, path)
    return path


class CachedRow(NamedTuple):
    """A device row read from the cache file and where it came from (for the table's source)."""

    costs: DeviceCosts
    source: str


def cached_device_row(transport: str) -> CachedRow | None:
    """The cached device row for this machine and ``transport``, for a single-node job
    with a GPU (every rank reads the same file on the same host, so all agree without
    communicating); None otherwise.

    The GPU is named (for the key) only when the file holds an entry of this host, MPI
    library, transport and size, and never bound: CPU-only work creates no CUDA context.
    """
    from .. import env

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
        return CachedRow(costs_from(entry["cuda"]), f"cached {entry.get('measured', '')} ({key})")
    except (KeyError, TypeError, ValueError):
        return None
