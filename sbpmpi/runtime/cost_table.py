"""The cost table in use on this rank, and its version.

Until a table is installed (:func:`set_cost_table`, or :func:`sbpmpi.runtime.calibrate`),
:func:`get_cost_table` returns, where CuPy sees a GPU, the defaults with the device row of
the GPU transport in use (:data:`sbpmpi.boxing.cost.GPU_TRANSPORT_COSTS`), or, on a
single-node job, the device row cached by an earlier calibration on this machine. The
transport is decided from the environment and the MPI library only, so every rank gets
the same table. Where the job spans hosts, a table without a topology is used with the
job's (:func:`sbpmpi.env.topology`, the same on every rank) and, unless it has one, the
default network row: the planner then costs the links between hosts and considers
hierarchical plans. :func:`version` changes whenever the table in use may have changed (a
table installed; the settings ``gpu_transport``, ``cuda_aware`` or ``cost_cache``
changed): plan caches key on it.
"""

from __future__ import annotations

from .. import backend, config
from ..boxing.cost import DEFAULT_TABLE, CostTable, Topology, table_for_transport
from ..comm.gpu import gpu_transport
from ..comm.lifecycle import world
from .cost_cache import cached_device_row

__all__ = ["get_cost_table", "set_cost_table", "version", "job_topology"]

class _Installed:
    """The table :func:`set_cost_table` installed, whether one is (else the defaults), and
    a number that changes whenever the table in use may have (plan caches key on it)."""

    __slots__ = ("current", "installed", "version")

    def __init__(self) -> None:
        self.current: CostTable = DEFAULT_TABLE
        self.installed = False
        self.version = 0


_TABLE = _Installed()


def version() -> int:
    """A number that changes whenever :func:`set_cost_table` runs (plan caches key on it)."""
    return _TABLE.version


_auto: dict[str, CostTable] = {}


def _default_table() -> CostTable:
    """The defaults for the GPU transport in use (or its cached calibration), cached.

    Without a GPU (no "cuda" placement can run) the plain defaults, with no detection.
    """
    if not backend.cupy_available():
        return DEFAULT_TABLE
    name = gpu_transport().name
    hit = _auto.get(name)
    if hit is None:
        row = cached_device_row(name)
        if row is not None:
            hit = CostTable(DEFAULT_TABLE.host, row.costs,
                            source=f"defaults; device row: {row.source}")
        else:
            hit = table_for_transport(name)
        _auto[name] = hit
    return hit


def job_topology() -> Topology | None:
    """The hosts of this job's ranks, or None when it runs on one host."""
    nodes = world.topology()
    return Topology(nodes) if max(nodes) > 0 else None


_placed: dict[CostTable, CostTable] = {}


def _on_job_hosts(table: CostTable) -> CostTable:
    """``table`` with this job's topology where it spans hosts and ``table`` has none."""
    if table.topology is not None:
        return table
    hit = _placed.get(table)
    if hit is None:
        topo = job_topology()
        hit = _placed[table] = table if topo is None else table.with_topology(topo)
    return hit


def get_cost_table() -> CostTable:
    """The table in use."""
    return _on_job_hosts(_TABLE.current if _TABLE.installed else _default_table())


def set_cost_table(table: CostTable | None) -> CostTable:
    """Install ``table`` (the defaults for None) on this rank; returns the previous one.

    Every rank must install the same table, or plans may differ between ranks.
    """
    if table is not None and not isinstance(table, CostTable):
        raise TypeError(f"table must be a CostTable or None, got {type(table).__name__}")
    prev = get_cost_table()
    _TABLE.current = DEFAULT_TABLE if table is None else table
    _TABLE.installed = table is not None
    _forget_defaults(None)
    return prev


def _forget_defaults(_: object) -> None:
    """The GPU transport or the cache file may have changed: so may the default table."""
    _auto.clear()
    _placed.clear()
    _TABLE.version += 1


for _name in ("gpu_transport", "cuda_aware", "cost_cache"):
    config.on_update(_name, _forget_defaults)
