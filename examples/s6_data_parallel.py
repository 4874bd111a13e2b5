"""S6: data parallelism.

The batch ``x`` is split by rows (``split(0)``), the weight ``w`` is broadcast: every
rank multiplies its rows by the whole weight, no communication. ``sm.matmul`` infers
the output SBP ``split(0)`` from the inputs' SBPs.

    mpiexec -n 2 python examples/s6_data_parallel.py [--device cuda]
"""

from __future__ import annotations

import argparse

import numpy as np

import sbpmpi as sm


def main() -> None:
    ap = argparse.ArgumentParser(description="S6: data parallel matmul")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = ap.parse_args()
    sm.launch.expect_world(2, what="S6")  # a note when run without mpiexec
    rank, world = sm.env.get_rank(), sm.env.get_world_size()
    placement = sm.placement(args.device, ranks=list(range(world)))

    x = sm.randn(4, 5, placement=placement, sbp=sm.sbp.split(0), dtype=np.float64)
    w = sm.randn(5, 8, placement=placement, sbp=sm.sbp.broadcast, dtype=np.float64)
    with sm.trace() as t:
        y = sm.matmul(x, w)
    if rank == 0:
        print(f"x: {x.sbp}  w: {w.sbp}  ->  y = sm.matmul(x, w): {y.sbp}, shape {y.shape}")
        print(f"communication on rank 0: {len(t)} calls")
        sm.visualize(y)
    assert y.sbp == (sm.sbp.split(0),), y.sbp
    assert y.shape == (4, 8)
    assert len(t) == 0, f"data parallel matmul should not communicate, got\n{t}"
    np.testing.assert_allclose(y.numpy(), x.numpy() @ w.numpy(), rtol=1e-12, atol=1e-12)
    if rank == 0:
        print("S6 OK")


if __name__ == "__main__":
    main()
