"""S2: local to global.

Each rank makes a local (2, 5) array; ``sm.to_global(local, placement=..., sbp=...)``
makes them one global tensor. With ``split(0)`` the global tensor is the locals
stacked along dim 0; with ``partial_sum`` it is their elementwise sum; with
``broadcast`` it is the first rank's array. The local arrays are not changed.

    mpiexec -n 2 python examples/s2_local_to_global.py [--device cuda]
"""

from __future__ import annotations

import argparse

import numpy as np

import sbpmpi as sm


def main() -> None:
    ap = argparse.ArgumentParser(description="S2: local to global")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = ap.parse_args()
    sm.launch.expect_world(2, what="S2")  # a note when run without mpiexec
    rank, world = sm.env.get_rank(), sm.env.get_world_size()
    np.set_printoptions(precision=3, suppress=True)
    placement = sm.placement(args.device, ranks=list(range(world)))

    def local_of(r: int) -> np.ndarray:  # the array rank r starts with
        return np.arange(10, dtype=np.float64).reshape(2, 5) + 100 * r

    local = local_of(rank)
    before = local.copy()
    all_locals = [local_of(r) for r in range(world)]  # NumPy reference of every rank's array

    x = sm.to_global(local, placement=placement, sbp=sm.sbp.split(0))
    whole = x.numpy()
    if rank == 0:
        print(f"split(0): {world} locals of (2, 5) -> {repr(x)}\n{whole}")
    assert x.shape == (2 * world, 5)
    np.testing.assert_array_equal(whole, np.concatenate(all_locals, axis=0))

    p = sm.to_global(local, placement=placement, sbp=sm.sbp.partial_sum)
    psum = p.numpy()
    if rank == 0:
        print(f"partial_sum: the global value is the sum of the locals:\n{psum}")
    assert p.shape == (2, 5)
    np.testing.assert_array_equal(psum, np.sum(all_locals, axis=0))

    b = sm.to_global(local, placement=placement, sbp=sm.sbp.broadcast)
    np.testing.assert_array_equal(sm.backend.asnumpy(b.to_local()), all_locals[0])
    if rank == 0:
        print(f"broadcast: every rank now holds rank 0's array:\n{all_locals[0]}")

    np.testing.assert_array_equal(local, before)  # to_global leaves the local array as it was
    if rank == 0:
        print("S2 OK")


if __name__ == "__main__":
    main()
