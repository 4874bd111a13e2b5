"""``ops.kernel.Scratch``: where a kernel's into form takes its temporaries. Eager
(``FRESH``) makes new arrays; a replay's keeps one per (module, shape, dtype, number) for
the next call; ``written_into`` makes the eager kernel of such a form."""

from __future__ import annotations

import numpy as np

from sbpmpi.ops.kernel import FRESH, Scratch, written_into


def test_fresh_makes_new_arrays_and_a_kept_scratch_the_same_ones():
    a, b = FRESH.get(np, (3,), np.float64), FRESH.get(np, (3,), np.float64)
    assert a is not b and FRESH.nbytes == 0
    s = Scratch()
    x = s.get(np, (3, 2), np.float32)
    assert s.get(np, (3, 2), np.float32) is x
    assert s.get(np, (3, 2), np.float32, 1) is not x  # another temporary of the kernel
    assert s.get(np, (3, 2), np.float64) is not x
    assert s.get(np, (2, 3), np.float32) is not x
    assert s.nbytes == 24 + 24 + 48 + 24


def test_written_into_gives_a_new_result_with_new_temporaries():
    def into(xp, operands, shape, out, scratch):
        t = scratch.get(xp, shape, out.dtype)
        np.multiply(operands[0], 2.0, out=t)
        np.add(t, operands[1], out=out)

    x, y = np.arange(4.0), np.ones(4)
    kernel = written_into(into, np.float64)
    assert kernel.into is into and kernel.into_scratch
    r1, r2 = kernel(np, [x, y], (4,)), kernel(np, [x, y], (4,))
    np.testing.assert_array_equal(r1, 2 * x + y)
    assert r1.dtype == np.float64
    assert r1 is not r2 and not np.shares_memory(r1, r2)
    kept = Scratch()
    out = np.empty(4)
    into(np, [x, y], (4,), out, kept)
    np.testing.assert_array_equal(out, r1)  # the replay's form: the same bits
    assert kept.nbytes == 32
