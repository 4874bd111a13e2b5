"""Cost rows per GPU transport and the calibration cache file (serial)."""

from __future__ import annotations

import json

import pytest

import sbpmpi as sm
from sbpmpi.boxing import cost
from sbpmpi.comm.gpu import select
from sbpmpi.runtime import cost_cache, cost_table


@pytest.fixture
def clean(monkeypatch, tmp_path):
    monkeypatch.setattr(cost_table.backend, "cupy_available", lambda: True)  # as on a GPU node
    prev_installed = cost_table._TABLE.installed
    prev = cost_table._TABLE.current
    cost_table.set_cost_table(None)
    with sm.config.override(gpu_transport=None, cost_cache=str(tmp_path / "costs.json")):
        yield monkeypatch
        monkeypatch.undo()
    cost_table.set_cost_table(prev if prev_installed else None)


def test_default_device_row_follows_the_transport(clean):
    for name in ("ipc", "staged", "mpi"):
        sm.config.update(gpu_transport=name)
        t = sm.boxing.get_cost_table()
        assert t.device == cost.GPU_TRANSPORT_COSTS[name] and t.host == cost.DEFAULT_TABLE.host
        assert (name in t.source) or name == "mpi"
    sm.config.update(gpu_transport="ipc")
    ipc = cost.primitive_seconds("all_gather", 2, 64 << 20, "cuda", cost_table.get_cost_table())
    sm.config.update(gpu_transport="staged")
    staged = cost.primitive_seconds("all_gather", 2, 64 << 20, "cuda", cost_table.get_cost_table())
    assert staged > 50 * ipc  # the planner sees why staged steps are dear
    assert cost.step_seconds("cuda", cost_table.get_cost_table()) == cost.GPU_TRANSPORT_COSTS["staged"].step
    mine = cost.table_for_transport("ipc")
    cost_table.set_cost_table(mine)
    sm.config.update(gpu_transport="staged")
    assert sm.boxing.get_cost_table() is mine  # an installed table wins
    with pytest.raises(ValueError, match="transport 'nccl' is not one of"):
        cost.table_for_transport("nccl")


def test_cache_round_trip_and_reuse(clean, tmp_path):
    path = str(tmp_path / "costs.json")
    assert cost_cache.cache_path() == path
    table = cost.table_for_transport("ipc")
    key = cost_cache.cache_key()
    assert key.endswith("1 ranks") and "transport" in key and "|" in key
    assert cost_cache.write_cache_entry(key, table) == path
    doc = json.load(open(path))
    assert set(doc[key]) >= {"cpu", "cuda", "source", "measured"}
    got = cost_cache.table_from(cost_cache.read_cache()[key], key)
    assert got.host == table.host and got.device == table.device and "cached" in got.source
    # calibrate(reuse=True) installs the cached entry without measuring
    reused = sm.boxing.calibrate(reuse=True)
    assert reused.device == table.device and sm.boxing.get_cost_table() is reused
    sm.config.update(cost_cache="off")
    assert cost_cache.cache_path() is None and cost_cache.read_cache() == {}
    assert cost_cache.write_cache_entry(key, table) is None


def test_calibrate_stores_and_the_cached_row_is_used_at_start(clean, tmp_path):
    t = sm.boxing.calibrate(["cpu"], repeats=1, large_bytes=1 << 16)
    entry = cost_cache.read_cache()[cost_cache.cache_key()]
    assert cost_cache.costs_from(entry["cpu"]) == t.host
    # with a GPU on a single node, the cached device row is the default at start
    key = cost_cache.cache_key()
    clean.setattr(cost_cache, "cache_key", lambda world_size=None: key)
    name = select.gpu_transport().name
    row = cost_cache.cached_device_row(name)
    assert row is not None and row.costs == t.device and "cached" in row.source
    other = "ipc" if name != "ipc" else "staged"
    assert cost_cache.cached_device_row(other) is None  # another transport's entry does not count
    cost_table.set_cost_table(None)
    assert sm.boxing.get_cost_table().device == t.device
    assert "cached" in sm.boxing.get_cost_table().source


def test_bench_table_has_the_device_copy_proxy():
    from sbpmpi.tools.bench import Result, format_tables, received_share

    assert received_share("S(0)->B", 2) == 0.5 and received_share("P->B", 4) == 1.5
    assert received_share("S(0)->S(1)", 4) == 3 / 16 and received_share("B->S(0)", 4) == 0
    assert received_share("2x2 (P,P)->(B,B)", 4) == 1.5 and received_share("P->S(0)", 1) == 0
    rows = [Result("S(0)->B", 64, (2, 8), "all_gather", 60.0, 0.5, 0.5 / 60, 2,
                   proxy_ms=0.1),
            Result("B->S(0)", 64, (2, 8), "local_slice", 0.01, 0.01, 1.0, 2,
                   proxy_ms=0.0)]
    text = format_tables(rows, [])
    assert "copy ms" in text and "x copy" in text and "5.0" in text
    cpu = format_tables([Result("S(0)->B", 64, (2, 8), "all_gather", 1.0, 1.0, 1.0, 2)], [])
    assert "copy ms" not in cpu


def test_without_a_gpu_the_plain_defaults(monkeypatch):
    monkeypatch.setattr(cost_table.backend, "cupy_available", lambda: False)
    prev_installed, prev = cost_table._TABLE.installed, cost_table._TABLE.current
    cost_table.set_cost_table(None)
    try:
        with sm.config.override(gpu_transport="ipc"):
            assert sm.boxing.get_cost_table() is cost.DEFAULT_TABLE
    finally:
        cost_table.set_cost_table(prev if prev_installed else None)


def test_cpu_only_work_binds_no_gpu(monkeypatch, tmp_path):
    """With CuPy and a GPU present (a stand-in module), looking up the cost table names the
    GPU only when the cache holds an entry of this machine, and never binds it."""
    import sys

    from fake_cuda import fake_cupy_module

    from sbpmpi import backend

    calls: list[tuple[str, int]] = []
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy_module(calls))
    monkeypatch.setattr(backend._BINDING, "device", None)
    backend._cupy.cache_clear()  # the module is looked up once per process
    prev_installed, prev = cost_table._TABLE.installed, cost_table._TABLE.current
    try:
        assert backend.cupy_available()

        def table() -> cost.CostTable:
            cost_table.set_cost_table(None)  # forget the cached default
            return sm.boxing.get_cost_table()

        sm.config.update(gpu_transport=None, cost_cache="off")
        assert table().device == cost.table_for_transport(select.gpu_transport().name).device
        path = tmp_path / "costs.json"
        sm.config.update(cost_cache=str(path))
        assert table().source  # no file yet
        cost_cache.write_cache_entry("another-host | lib | GPU | transport staged | 1 ranks",
                              cost.table_for_transport("ipc"), str(path))
        table()
        assert calls == []  # nothing of this machine cached: the GPU is not even named
        key = cost_cache.cache_key()
        assert "Stand-in GPU" in key and calls == [("properties", 0)]
        mine = cost.table_for_transport("ipc")
        cost_cache.write_cache_entry(key, mine, str(path))
        got = table()
        assert got.device == mine.device and "cached" in got.source  # the cached row is used
        assert ("use", 0) not in calls  # named, never bound
        assert backend.bind_device() == 0 and calls[-1] == ("use", 0)  # real GPU work binds
    finally:
        sm.config.reset("gpu_transport", "cost_cache")
        monkeypatch.undo()  # the real cupy (or none) again, before anything looks it up
        backend._cupy.cache_clear()
        cost_table.set_cost_table(prev if prev_installed else None)
