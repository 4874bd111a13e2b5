"""``backend.memory``: the one type per kind of memory reuse, checked on its own.

``Scratch`` (temporaries by module, shape, dtype and number; kept, or new each time),
``BlockPool`` (idle blocks by size class: the host pool and the pinned staging pool are
two of them) and ``Block`` (an address and the bytes that keep it alive).
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

from sbpmpi.backend import device_copy
from sbpmpi.backend.memory import FRESH, Block, BlockPool, Scratch


def test_scratch_limit_drops_every_array_before_one_more():
    s = Scratch(limit=2)
    a, b = s.get(np, (2,), np.float64), s.get(np, (3,), np.float64)
    assert s.get(np, (2,), np.float64) is a and len(s.arrays) == 2
    c = s.get(np, (4,), np.float64)  # a third: the first two are forgotten
    assert list(s.arrays.values()) == [c]
    assert s.get(np, (2,), np.float64) is not a and s.get(np, (3,), np.float64) is not b


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_scalars_give_what_a_python_scalar_gives_without_a_new_array(dtype):
    s = Scratch()
    x = np.linspace(-1, 1, 7, dtype=dtype)
    to = s.scalars(np, np.dtype(dtype))
    z = to(0.1)
    assert z.shape == () and z.dtype == dtype
    np.testing.assert_array_equal(np.multiply(x, z), x * 0.1)  # NEP 50: the same bits
    assert np.multiply(x, z).dtype == (x * 0.1).dtype
    assert to(1 / 3) is z and s.scalars(np, np.dtype(dtype))(2.5) is z  # one kept 0-d
    np.testing.assert_array_equal(np.add(x, z), x + 2.5)
    # a parameter of shape (): its temporaries are not the scalar
    assert s.get(np, (), np.dtype(dtype)) is not z
    assert FRESH.scalars(np, np.dtype(dtype))(0.5) is not FRESH.scalars(np, np.dtype(dtype))(0.5)


def test_temporaries_are_the_numbered_arrays_and_the_scalars_looked_up_once():
    s = Scratch(limit=8)
    (a, b), to = s.temporaries(np, (3, 2), np.dtype(np.float32), 2)
    assert a is s.get(np, (3, 2), np.dtype(np.float32), 0)
    assert b is s.get(np, (3, 2), np.dtype(np.float32), 1) and a is not b
    assert s.temporaries(np, (3, 2), np.dtype(np.float32), 2) == ((a, b), to)
    assert to(0.5) is s.scalars(np, np.dtype(np.float32))(0.5)
    (c, d), _ = FRESH.temporaries(np, (3, 2), np.dtype(np.float32), 2)
    assert FRESH.temporaries(np, (3, 2), np.dtype(np.float32), 2).arrays[0] is not c
    for n in range(9):  # over the limit: every array and set forgotten
        s.get(np, (n + 5,), np.float64)
    assert s.temporaries(np, (3, 2), np.dtype(np.float32), 2).arrays[0] is not a


def test_scalars_of_another_module_stay_python_numbers():
    class OtherXp:  # CuPy passes a Python scalar to its kernels as it is
        __name__ = "cupy"

    assert Scratch().scalars(OtherXp(), np.float32)(0.25) == 0.25  # type: ignore[arg-type]


def _pool(per_size=None, limit=None):
    made = []

    def new(size):
        made.append(size)
        return Block(len(made), np.empty(size, np.uint8))

    pool = BlockPool(new, lambda n: -(-n // 100) * 100, lambda b: b.memory.size, per_size,
                     None if limit is None else (lambda: limit))
    return pool, made


def test_block_pool_hands_back_the_last_returned_block_of_a_size_class():
    pool, made = _pool()
    a, b = pool.acquire(150), pool.acquire(120)
    assert made == [200, 200] and pool.allocations == 2 and pool.bytes_allocated == 400
    pool.release(a)
    pool.release(b)
    assert pool.cached_bytes() == 400 and pool.idle_blocks() == 2
    assert pool.acquire(101) is b and pool.acquire(200) is a and pool.reuses == 2
    assert pool.acquire(50).memory.size == 100 and made == [200, 200, 100]
    assert pool.cached_bytes() == 0


def test_block_pool_keeps_per_size_and_drops_least_recently_returned_over_its_limit():
    pool, _ = _pool(per_size=1)
    a, b = pool.acquire(100), pool.acquire(100)
    pool.release(a)
    pool.release(b)  # one idle block of a size class at most
    assert pool.idle_blocks() == 1 and pool.dropped == 1 and pool.acquire(100) is a

    pool, _ = _pool(limit=500)
    x, y, z, big = pool.acquire(200), pool.acquire(100), pool.acquire(300), pool.acquire(600)
    pool.release(big)  # larger than the limit: never kept
    assert pool.idle_blocks() == 0 and pool.dropped == 1
    pool.release(x)
    pool.release(y)
    pool.release(z)  # 600 idle bytes: the 200-byte class, returned first, goes
    assert pool.cached_bytes() == 400 and pool.dropped == 2
    assert pool.acquire(200) is not x and pool.acquire(100) is y and pool.acquire(300) is z


def test_block_pool_reads_its_limit_once_and_again_after_forget():
    limit = [1000]
    pool = BlockPool(lambda n: np.empty(n, np.uint8), lambda n: n, lambda b: b.size,
                     read_limit=lambda: limit[0])
    blocks = [pool.acquire(300) for _ in range(3)]
    for b in blocks:
        pool.release(b)
    assert pool.get_limit() == 1000 and pool.cached_bytes() == 900
    limit[0] = 500
    assert pool.get_limit() == 1000  # read once
    pool.forget_limit()  # over the new limit: the idle blocks go
    assert pool.get_limit() == 500 and pool.cached_bytes() == 0


def test_block_pool_takes_blocks_back_from_other_threads():
    pool, _ = _pool()
    blocks = [pool.acquire(100) for _ in range(64)]
    threads = [threading.Thread(target=lambda part=blocks[i::4]: [pool.release(b) for b in part])
               for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert pool.idle_blocks() == 64 and pool.cached_bytes() == 6400


def test_pinned_pool_reuses_by_power_of_two_size():
    pool = device_copy.pinned_pool(keep=2)
    a = pool.acquire(5000)
    assert a.nbytes == 8192 and pool.allocations == 1
    pool.release(a)
    b = pool.acquire(6000)
    assert b is a and pool.reuses == 1
    c = pool.acquire(100)
    assert c.nbytes == 4096 and pool.allocations == 2
    pool.release(b)
    pool.release(c)
    assert pool.cached_bytes() == 8192 + 4096
    extra = [pool.acquire(4096) for _ in range(3)]
    for e in extra:
        pool.release(e)
    assert pool.cached_bytes() == 8192 + 2 * 4096  # at most keep=2 per size
    pool.clear()
    assert pool.cached_bytes() == 0
