"""S9: automatic boxing between two model-parallel layers.

``y0 = x @ w0`` with x broadcast and w0 split(1) gives y0 split(1). ``y1 = y0 @ w1``
with w1 split(1) has no signature that takes y0 and w1 as they are, so sbpmpi
converts an input by itself, choosing the cheapest valid signature by its cost
table. The user writes no collective; ``sm.trace()`` shows what was inserted.

    mpiexec -n 2 python examples/s9_auto_boxing.py [--device cuda]
"""

from __future__ import annotations

import argparse

import numpy as np

import sbpmpi as sm


def main() -> None:
    ap = argparse.ArgumentParser(description="S9: automatic boxing")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = ap.parse_args()
    sm.launch.expect_world(2, what="S9")  # a note when run without mpiexec
    rank, world = sm.env.get_rank(), sm.env.get_world_size()
    placement = sm.placement(args.device, ranks=list(range(world)))

    x = sm.randn(4, 5, placement=placement, sbp=sm.sbp.broadcast, dtype=np.float64)
    w0 = sm.randn(5, 8, placement=placement, sbp=sm.sbp.split(1), dtype=np.float64)
    w1 = sm.randn(8, 6, placement=placement, sbp=sm.sbp.split(1), dtype=np.float64)
    y0 = sm.matmul(x, w0)
    with sm.trace() as t:
        y1 = sm.matmul(y0, w1)
    if rank == 0:
        print(f"y0 = x @ w0: ({x.sbp[0]}, {w0.sbp[0]}) -> {y0.sbp[0]}")
        print(f"y1 = y0 @ w1: ({y0.sbp[0]}, {w1.sbp[0]}) -> {y1.sbp[0]}")
        print(f"communication sbpmpi inserted for y1 on rank 0:\n{t}")
    assert y0.sbp == (sm.sbp.split(1),), y0.sbp
    if world > 1:
        assert len(t) > 0, "y0 @ w1 cannot be computed without moving data"
    xv, w0v, w1v = x.numpy(), w0.numpy(), w1.numpy()
    np.testing.assert_allclose(y1.numpy(), xv @ w0v @ w1v, rtol=1e-10, atol=1e-10)
    if rank == 0:
        print("S9 OK")


if __name__ == "__main__":
    main()
