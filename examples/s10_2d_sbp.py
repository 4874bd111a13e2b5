"""S10: 2-D SBP on a 2x2 mesh of ranks.

``sm.placement("cpu", ranks=[[0, 1], [2, 3]])`` is a 2x2 mesh. The SBP is a tuple with
one entry per mesh axis: ``(broadcast, split(0))`` broadcasts along mesh axis 0 and
splits tensor dim 0 along mesh axis 1, so ranks 0 and 2 hold rows 0-1 of a (4, 6)
tensor and ranks 1 and 3 hold rows 2-3. Matmul signatures are inferred per mesh
axis: (S(0), B) @ (B, S(1)) gives (S(0), S(1)).

    mpiexec -n 4 python examples/s10_2d_sbp.py [--device cuda]
"""

from __future__ import annotations

import argparse

import numpy as np

import sbpmpi as sm


def main() -> None:
    ap = argparse.ArgumentParser(description="S10: 2-D SBP on a 2x2 mesh")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = ap.parse_args()
    sm.launch.expect_world(4, minimum=4, what="S10 (a 2x2 mesh)")  # exits on fewer
    rank = sm.env.get_rank()
    np.set_printoptions(precision=3, suppress=True)
    mesh = sm.placement(args.device, ranks=[[0, 1], [2, 3]])

    x = sm.randn(4, 6, placement=mesh, sbp=(sm.sbp.broadcast, sm.sbp.split(0)))
    whole = x.numpy()
    local = sm.backend.asnumpy(x.to_local()) if x.is_local_member else None
    views = sm.comm.all_gather_object(None if local is None else local.tolist())
    if rank == 0:
        print(repr(x))
        sm.visualize(x)
        for r in range(4):
            print(f"rank {r} holds rows {'0-1' if r % 2 == 0 else '2-3'}:\n{np.array(views[r])}")
    if rank < 4:  # ranks 0, 2 hold rows 0-1; ranks 1, 3 rows 2-3
        assert local is not None
        rows = slice(0, 2) if rank % 2 == 0 else slice(2, 4)
        np.testing.assert_array_equal(local, whole[rows])

    a = sm.randn(4, 6, placement=mesh, sbp=(sm.sbp.split(0), sm.sbp.broadcast), dtype=np.float64)
    b = sm.randn(6, 8, placement=mesh, sbp=(sm.sbp.broadcast, sm.sbp.split(1)), dtype=np.float64)
    y = sm.matmul(a, b)
    if rank == 0:
        print(f"a {a.sbp} @ b {b.sbp} -> y {y.sbp}")
        sm.visualize(y)
    assert y.sbp == (sm.sbp.split(0), sm.sbp.split(1)), y.sbp
    np.testing.assert_allclose(y.numpy(), a.numpy() @ b.numpy(), rtol=1e-12, atol=1e-12)
    if rank == 0:
        print("S10 OK")


if __name__ == "__main__":
    main()
