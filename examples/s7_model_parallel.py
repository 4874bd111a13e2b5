"""S7: model parallelism.

The input ``x`` is broadcast and the weight ``w`` is split by columns (``split(1)``):
every rank computes the output columns of its weight block, no communication. The
output is ``split(1)``.

    mpiexec -n 2 python examples/s7_model_parallel.py [--device cuda]
"""

from __future__ import annotations

import argparse

import numpy as np

import sbpmpi as sm


def main() -> None:
    ap = argparse.ArgumentParser(description="S7: model parallel matmul")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = ap.parse_args()
    sm.launch.expect_world(2, what="S7")  # a note when run without mpiexec
    rank, world = sm.env.get_rank(), sm.env.get_world_size()
    placement = sm.placement(args.device, ranks=list(range(world)))

    x = sm.randn(4, 5, placement=placement, sbp=sm.sbp.broadcast, dtype=np.float64)
    w = sm.randn(5, 8, placement=placement, sbp=sm.sbp.split(1), dtype=np.float64)
    with sm.trace() as t:
        y = sm.matmul(x, w)
    if rank == 0:
        print(f"x: {x.sbp}  w: {w.sbp}  ->  y = sm.matmul(x, w): {y.sbp}, shape {y.shape}")
        sm.visualize(y)
    assert y.sbp == (sm.sbp.split(1),), y.sbp
    assert y.shape == (4, 8)
    assert len(t) == 0, f"model parallel matmul should not communicate, got\n{t}"
    np.testing.assert_allclose(y.numpy(), x.numpy() @ w.numpy(), rtol=1e-12, atol=1e-12)
    if rank == 0:
        print("S7 OK")


if __name__ == "__main__":
    main()
