"""The host buffer pool (``backend.empty``): reused memory, never shared by live arrays.

Serial tests drive the pool directly; the MPI tests run loops of conversions through
``x.to_global`` that keep many results alive, and check against NumPy that every value
stays right and that no two live shards share memory.
"""

from __future__ import annotations

import gc
import threading

import numpy as np
import pytest
from mpi4py import MPI

import sbpmpi as sm
from sbpmpi import backend
from sbpmpi.backend import host_pool
from sbpmpi.runtime import collective_steps, packing

MIB = 1 << 20


@pytest.fixture(autouse=True)
def fresh_pool():
    """Each test starts from an empty pool with the default limit; after it, the setting
    ``host_pool_bytes`` as it was."""
    host_pool.clear_host_pool()
    with sm.config.override(host_pool_bytes=None):
        yield
    host_pool.clear_host_pool()


def stats() -> dict[str, int]:
    return host_pool.host_pool_stats()


def pooled(a: np.ndarray) -> bool:
    return not a.flags.owndata and a.base is not None


def test_large_host_arrays_reuse_memory_once_freed():
    a = backend.empty(np, (MIB // 4,), np.float32)
    assert pooled(a) and a.flags.c_contiguous and a.flags.writeable and a.flags.aligned
    addr = a.ctypes.data
    before = stats()
    del a
    assert stats()["idle_blocks"] == before["idle_blocks"] + 1
    b = backend.empty(np, (512, 512), np.float32)
    assert b.ctypes.data == addr and b.shape == (512, 512) and b.dtype == np.float32
    assert stats()["hits"] == before["hits"] + 1


def _mapping_of(addr: int) -> str | None:
    """The /proc/self/maps line of the mapping that holds ``addr`` (None off Linux)."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                lo, hi = (int(v, 16) for v in line.split()[0].split("-"))
                if lo <= addr < hi:
                    return line
    except OSError:
        return None
    return ""


def test_blocks_are_mappings_of_their_own_on_huge_page_boundaries():
    """A block starts on a 2 MiB boundary, in a private anonymous mapping (not the heap,
    where glibc puts large allocations once its mmap threshold has grown), and its memory
    is the program's to write; a dropped block is unmapped."""
    a = backend.empty(np, (3 * MIB,), np.uint8)
    addr = a.ctypes.data
    assert addr % (2 * MIB) == 0, hex(addr)
    line = _mapping_of(addr)
    if line is not None:
        assert "[heap]" not in line and line.split()[1].endswith("p"), line  # private
    a[:] = 7
    assert int(a.sum()) == 7 * 3 * MIB
    del a
    host_pool.clear_host_pool()
    gc.collect()
    if line is not None:
        assert _mapping_of(addr) != line  # unmapped (or now part of another mapping)


def test_a_block_that_cannot_be_mapped_frees_idle_blocks_first(monkeypatch):
    """No memory for a new block: the idle blocks go, then one more try, then MemoryError
    naming the size."""
    a = backend.empty(np, (MIB,), np.uint8)
    del a
    assert stats()["idle_blocks"] == 1
    real = host_pool.map_block
    calls = []

    def fail_once(size):
        calls.append(size)
        if len(calls) == 1:
            raise OSError(12, "Cannot allocate memory")
        return real(size)

    monkeypatch.setattr(host_pool, "map_block", fail_once)
    b = backend.empty(np, (4 * MIB,), np.uint8)
    assert b.size == 4 * MIB and len(calls) == 2 and stats()["idle_blocks"] == 0

    def fail(size):
        raise OSError(12, "Cannot allocate memory")

    monkeypatch.setattr(host_pool, "map_block", fail)
    with pytest.raises(MemoryError, match=str(8 * MIB)):
        backend.empty(np, (8 * MIB,), np.uint8)


def test_small_object_and_non_numpy_requests_are_not_pooled():
    assert backend.empty(np, (10,), np.float64).flags.owndata
    assert backend.empty(np, (), np.float64).shape == ()
    assert backend.empty(np, 4 * MIB, object).flags.owndata  # objects need NumPy's own init

    class FakeXp:
        @staticmethod
        def empty(shape, dtype):
            return ("fake", shape, dtype)

    assert backend.empty(FakeXp, (MIB,), np.float32) == ("fake", (MIB,), np.float32)


def test_shapes_and_dtypes():
    for shape, dt in [(MIB, np.uint8), ((3, 512, 1024), np.complex128), ((MIB // 2,), bool),
                      ((MIB // 8, 0), np.float32), ((2, MIB // 4), np.dtype("f4,i8"))]:
        a = backend.empty(np, shape, dt)
        want = (shape,) if isinstance(shape, int) else shape
        assert a.shape == want and a.dtype == np.dtype(dt) and a.flags.c_contiguous
        a[...] = 1
        assert (a == np.ones(1, dt)[0]).all()


def test_live_arrays_never_share_memory_and_keep_their_values():
    live = []
    for i in range(24):  # sizes that fall into the same and into different size classes
        a = backend.empty(np, (MIB // 8 + (i % 3) * 1000,), np.float64)
        a[:] = i
        live.append(a)
        if i % 4 == 3:  # free some, so later requests take blocks from the pool
            live.pop(len(live) // 2)
    assert stats()["hits"] > 0
    for i, a in enumerate(live):
        for b in live[i + 1:]:
            assert not np.shares_memory(a, b)
    for a in live:
        assert (a == a[0]).all()


def test_a_view_keeps_the_block_out_of_the_pool():
    a = backend.empty(np, (MIB,), np.uint8)
    a[:] = 7
    views = [(a[10:20], 7), (a.reshape(1024, 1024)[3], 7),
             (np.frombuffer(memoryview(a), np.uint8), 7), (a.view(np.int32)[::5], 0x07070707)]
    del a
    assert stats()["idle_blocks"] == 0
    for keep, want in views:
        others = [backend.empty(np, (MIB,), np.uint8) for _ in range(3)]
        for o in others:
            o[:] = 1
            assert not np.shares_memory(o, keep)
        assert (keep == want).all()
        del others
    del keep, views
    assert stats()["idle_blocks"] >= 1


def test_a_block_in_a_reference_cycle_comes_back_after_collection():
    gc.collect()
    host_pool.clear_host_pool()
    gc.disable()
    try:
        a = backend.empty(np, (MIB,), np.uint8)
        cycle: list = [a]
        cycle.append(cycle)
        del a, cycle
        assert stats()["idle_blocks"] == 0
        gc.collect()
        assert stats()["idle_blocks"] == 1
    finally:
        gc.enable()


def test_idle_memory_stays_under_the_limit():
    sm.config.update(host_pool_bytes=3 * MIB)
    arrays = [backend.empty(np, (MIB,), np.uint8) for _ in range(5)]
    big = backend.empty(np, (4 * MIB,), np.uint8)  # over the limit: freed, not kept
    del arrays
    assert stats()["idle_bytes"] <= 3 * MIB and stats()["idle_blocks"] == 3
    dropped = stats()["dropped"]
    del big
    assert stats()["idle_bytes"] <= 3 * MIB and stats()["dropped"] == dropped + 1
    # a new size class pushes out the least recently returned blocks
    c = backend.empty(np, (2 * MIB,), np.uint8)
    del c
    s = stats()
    assert s["idle_bytes"] <= 3 * MIB and s["idle_blocks"] == 2
    assert s["idle_bytes"] > 0
    sm.config.update(host_pool_bytes=0)  # the pool frees its idle blocks at once
    assert host_pool.host_pool_limit() == 0 and stats()["idle_bytes"] == 0


def test_limit_zero_turns_the_pool_off():
    sm.config.update(host_pool_bytes=0)
    assert host_pool.host_pool_limit() == 0
    a = backend.empty(np, (8 * MIB,), np.uint8)
    assert a.flags.owndata
    del a
    assert stats()["idle_blocks"] == 0


@pytest.mark.parametrize("text, want", [("1048576", MIB), ("512M", 512 * MIB), ("2g", 2 << 30),
                                        ("64KiB", 64 << 10), (" 3 MB ", 3 * MIB), ("0", 0)])
def test_environment_variable_sizes(monkeypatch, text, want):
    assert sm.config.host_pool_bytes.parse(text) == want
    monkeypatch.setenv("SBPMPI_HOST_POOL_BYTES", text)
    sm.config.reset("host_pool_bytes")  # the environment's value, read again
    assert host_pool.host_pool_limit() == want
    assert sm.config.host_pool_bytes.source == "environment"


@pytest.mark.parametrize("text", ["lots", "-5", "1.5G", "12T"])
def test_bad_environment_variable_names_it(monkeypatch, text):
    monkeypatch.setenv("SBPMPI_HOST_POOL_BYTES", text)
    with pytest.raises(ValueError, match=f"SBPMPI_HOST_POOL_BYTES='{text}' is not understood"):
        sm.config.reset("host_pool_bytes")
    assert sm.config.host_pool_bytes.value is None  # unchanged


@pytest.mark.parametrize("bad, error", [(-1, ValueError), (1.5, TypeError), (True, TypeError),
                                        ("1M", TypeError)])
def test_bad_limit_argument(bad, error):
    with pytest.raises(error, match=r"host_pool_bytes=.* is not allowed; expected a number of "
                                    r"bytes >= 0"):
        sm.config.update(host_pool_bytes=bad)


def test_default_limit_is_sane():
    limit = host_pool.host_pool_limit()
    assert limit >= 64 * MIB


def test_threads_never_get_the_same_live_block():
    errors: list[str] = []

    def work(k: int) -> None:
        mine = []
        for i in range(60):
            a = backend.empty(np, (MIB // 8,), np.float64)
            a[:] = k * 1000 + i
            mine.append((a, k * 1000 + i))
            if len(mine) > 3:
                mine.pop(0)
            for b, v in mine:
                if not (b == v).all():
                    errors.append(f"thread {k}: a live array changed under it")
                    return

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]


# -- conversions under MPI ------------------------------------------------------------------

world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()


def expected_local(y, value: np.ndarray) -> np.ndarray:
    """This rank's part of ``value`` in ``y``'s (non-partial) layout."""
    box = y.layout.local_ranges(rank)
    if box is None:
        return np.empty(y.to_local().shape, value.dtype)
    return value[tuple(slice(a, b) for a, b in box)]


def all_ok(errors: list[str]) -> None:
    every = world.allgather(errors[:4])
    bad = [e for es in every for e in es]
    assert not bad, "\n".join(bad)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("every_array", [True, False], ids=["all-pooled", "default"])
def test_conversions_in_a_loop_never_share_live_memory(monkeypatch, every_array):
    """Hold many results of S(0)->B, P->S(0), S(0)->S(1), S(1)->S(0), P->B, B->P and a
    placement change alive; free some between rounds; every value stays right and no two
    live shards share memory (except with an input, where a shard is a view by design)."""
    if every_array:
        monkeypatch.setattr(host_pool, "MIN_POOLED_BYTES", 1)  # the whole executor goes through it
        rows, cols = 6 * size + 1, 10  # uneven splits
    else:  # outputs of about a MiB and more: the default threshold
        rows, cols = 1024 * size, 160
    pl = sm.placement("cpu", list(range(size)))
    other = sm.placement("cpu", list(range(size))[::-1][: max(1, size - 1)])
    rng = np.random.default_rng(7)
    value = rng.standard_normal((rows, cols))
    # integers: sums are exact in any order of reduction, so results compare exactly
    parts = [rng.integers(-1000, 1000, (rows, cols)).astype(np.float64) for _ in range(size)]
    xs = sm.tensor(value, placement=pl, sbp=sm.sbp.split(0))
    x1 = sm.tensor(value, placement=pl, sbp=sm.sbp.split(1))
    xb = sm.tensor(value, placement=pl, sbp=sm.sbp.broadcast)
    xq = sm.to_global(parts[rank], placement=pl, sbp=sm.sbp.partial_sum)
    total = np.sum(parts, axis=0)
    inputs = [t.to_local() for t in (xs, x1, xb, xq)]
    cases = [(xs, {"sbp": sm.sbp.broadcast}, value), (xs, {"sbp": sm.sbp.split(1)}, value),
             (x1, {"sbp": sm.sbp.split(0)}, value), (xq, {"sbp": sm.sbp.split(0)}, total),
             (xq, {"sbp": sm.sbp.broadcast}, total),
             (xs, {"placement": other, "sbp": sm.sbp.split(1)}, value)]
    errors: list[str] = []
    held: list[tuple[object, np.ndarray, str]] = []
    hits = host_pool.host_pool_stats()["hits"]
    for rnd in range(4):
        for x, kw, want in cases:
            y = x.to_global(**kw)
            held.append((y, want, f"round {rnd} {x.sbp} -> {kw}"))
        bp = xb.to_global(sbp=sm.sbp.partial_sum)  # B -> P: a filled shard off rank 0
        got = bp.to_local()
        if not np.array_equal(got, value if rank == 0 else np.zeros_like(value)):
            errors.append(f"rank {rank} round {rnd}: B -> P shard is wrong")
        locs = [y.to_local() for y, _, _ in held]
        for (y, want, ctx), a in zip(held, locs):
            if not np.array_equal(a, expected_local(y, want)):
                errors.append(f"rank {rank} {ctx}: shard changed or wrong")
        for i, a in enumerate(locs):
            if a.size == 0:
                continue
            for j in range(i + 1, len(locs)):
                b = locs[j]
                if b.size and np.shares_memory(a, b) and not any(
                        np.shares_memory(a, z) and np.shares_memory(b, z) for z in inputs):
                    errors.append(f"rank {rank}: live shards '{held[i][2]}' and "
                                  f"'{held[j][2]}' share memory")
        del locs, got, bp
        held = held[::2]  # drop half: their memory goes back to the pool
    for x, want in ((xs, value), (x1, value), (xb, value)):
        if not np.array_equal(x.to_local(), expected_local(x, want)):
            errors.append(f"rank {rank}: an input changed")
    reused = host_pool.host_pool_stats()["hits"] > hits
    if size > 1 and not reused:
        errors.append(f"rank {rank}: the pool was never used")
    all_ok(errors)


# -- all-to-all and reduce-scatter steps that handle their own block locally ------------------



@pytest.mark.parametrize("shape,dim,sizes", [((3, 8, 5), 1, [4, 4]), ((3, 9, 5), 1, [3, 3, 3]),
                                             ((3, 10, 2), 1, [4, 3, 3]), ((7, 4), 0, [3, 2, 2]),
                                             ((2, 6), 1, [6]), ((4, 0, 3), 1, [0, 0])])
def test_pack_and_unpack_leave_out_one_block(shape, dim, sizes):
    _pack, _unpack = packing.pack, packing.unpack
    x = np.arange(np.prod(shape), dtype=np.float64).reshape(shape)
    starts = np.cumsum([0] + sizes)
    blocks = [np.take(x, range(starts[q], starts[q + 1]), axis=dim) for q in range(len(sizes))]
    for skip in [-1, *range(len(sizes))]:
        want = np.concatenate([np.empty(0)] + [b.reshape(-1) for q, b in enumerate(blocks)
                                               if q != skip])
        flat = np.full(want.size + 3, -1.0)
        _pack(x, dim, sizes, flat, skip)
        np.testing.assert_array_equal(flat[:want.size], want)
        back = np.full(shape, -7.0)
        _unpack(flat, dim, sizes, back, skip)
        for q, b in enumerate(blocks):
            got = np.take(back, range(starts[q], starts[q + 1]), axis=dim)
            np.testing.assert_array_equal(got, np.full(b.shape, -7.0) if q == skip else b)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("threshold", [0, None], ids=["own-block-local", "default"])
def test_all_to_all_and_reduce_scatter_steps_against_numpy(monkeypatch, threshold):
    """S(i) -> S(j) and P -> S(j) (sum, max, min) on 1-d and 2-d meshes, even and uneven,
    2-d and 3-d tensors, with the own block handled locally (threshold 0) and with the
    default choice; every result is compared with NumPy while all are held alive."""
    if threshold is not None:  # read by the compiled steps at every call
        monkeypatch.setattr(collective_steps, "OWN_BLOCK_BYTES", threshold)
    meshes = [sm.placement("cpu", list(range(size)))]
    if size == 4:
        meshes.append(sm.placement("cpu", [[0, 1], [2, 3]]))
    rng = np.random.default_rng(3)
    errors: list[str] = []
    held = []
    shapes = [(4 * size, 6 * size), (2 * size + 1, 3 * size + 2), (3, 2 * size + 1, 5),
              (size + 1, 2, 2 * size)]
    for pl in meshes:
        for shape in shapes:
            value = rng.standard_normal(shape)
            nd = len(shape)
            for i in range(nd):
                for j in range(nd):
                    if i == j:
                        continue
                    if pl.ndim == 1:
                        src, dst = [sm.sbp.split(i)], [sm.sbp.split(j)]
                    else:
                        src = [sm.sbp.split(i), sm.sbp.split(j)]
                        dst = [sm.sbp.split(j), sm.sbp.split(i)]
                    x = sm.tensor(value, placement=pl, sbp=src)
                    held.append((x.to_global(sbp=dst), value, f"{shape} {src} -> {dst} {pl}"))
                    if not np.array_equal(x.to_local(), expected_local(x, value)):
                        errors.append(f"rank {rank}: input of {shape} {src} changed")
            for j in range(nd):  # P -> S(j)
                if pl.ndim == 1:  # every rank holds a different part: a real reduction
                    parts = [rng.integers(-50, 50, shape).astype(np.float64) for _ in range(size)]
                    for kind, fn in (("sum", np.sum), ("max", np.max), ("min", np.min)):
                        x = sm.to_global(parts[rank].copy(), placement=pl,
                                         sbp=sm.sbp.partial_sum if kind == "sum" else
                                         getattr(sm.sbp, f"partial_{kind}"))
                        held.append((x.to_global(sbp=[sm.sbp.split(j)]), fn(parts, axis=0),
                                     f"{shape} P{kind} -> S({j}) {pl}"))
                else:  # a partial and a split mesh axis
                    x = sm.tensor(value, placement=pl, sbp=[sm.sbp.partial_sum, sm.sbp.split(0)])
                    held.append((x.to_global(sbp=[sm.sbp.split(j), sm.sbp.split(0)]), value,
                                 f"{shape} (P, S(0)) -> (S({j}), S(0)) {pl}"))
    for y, want, ctx in held:
        if not np.array_equal(y.to_local(), expected_local(y, want)):
            errors.append(f"rank {rank}: {ctx} is wrong")
    all_ok(errors)


def test_reuse_hands_out_the_first_runs_arrays_again_in_order():
    """backend.Reuse (a captured graph's conversions): the arrays made by empty() in the
    first run come back in the same order; another shape or dtype, or another thread,
    gets a new array; outside the block, empty() makes new arrays as usual."""
    big = host_pool.MIN_POOLED_BYTES // 8 + 1  # one pooled array, the others small
    r = backend.Reuse()
    with r:
        first = [backend.empty(np, (3, 4), np.float64), backend.empty(np, big, np.float64),
                 backend.empty(np, 5, np.int32)]
    with r:
        again = [backend.empty(np, (3, 4), np.float64), backend.empty(np, big, np.float64),
                 backend.empty(np, 5, np.int32)]
    assert all(a is b for a, b in zip(first, again))
    with r:
        other = backend.empty(np, (4, 3), np.float64)  # not what was recorded first
        same = backend.empty(np, big, np.float64)  # the order goes on
        seen = []
        t = threading.Thread(target=lambda: seen.append(backend.empty(np, 5, np.int32)))
        t.start()
        t.join()
    assert other is not first[0] and other.shape == (4, 3)
    assert same is first[1]
    assert seen[0] is not first[2]
    assert backend.empty(np, (3, 4), np.float64) is not first[0]
