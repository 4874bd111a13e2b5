"""S1: create a global tensor directly.

Every rank runs this same program. ``sm.randn(4, 5, placement=..., sbp=split(0))``
builds a (4, 5) global tensor whose rows are cut into one block per rank; each rank
computes only its own block (no communication).

    mpiexec -n 2 python examples/s1_create_global.py            # NumPy shards
    mpiexec -n 2 python examples/s1_create_global.py --device cuda   # CuPy shards
"""

from __future__ import annotations

import argparse

import numpy as np

import sbpmpi as sm


def main() -> None:
    ap = argparse.ArgumentParser(description="S1: create a global tensor directly")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = ap.parse_args()
    sm.launch.expect_world(2, what="S1")  # a note when run without mpiexec
    rank, world = sm.env.get_rank(), sm.env.get_world_size()
    np.set_printoptions(precision=3, suppress=True)

    placement = sm.placement(args.device, ranks=list(range(world)))
    sbp = sm.sbp.split(0)
    sm.manual_seed(0)
    x = sm.randn(4, 5, placement=placement, sbp=sbp)

    local = sm.backend.asnumpy(x.to_local())  # this rank's block (a CuPy array on cuda)
    whole = x.numpy()  # the whole (4, 5) value, on every rank (collective)

    # print every rank's view in rank order from rank 0
    views = sm.comm.all_gather_object(
        f"rank {rank}: x.shape={x.shape}, x.to_local() has shape {local.shape}:\n{local}")
    if rank == 0:
        print(repr(x))
        print("\n".join(views))
        print(f"x.numpy() (the same on every rank):\n{whole}")
        sm.visualize(x)

    # check against NumPy: the shards are the rows of the whole value, cut balanced
    assert x.shape == (4, 5)
    rows = np.array_split(np.arange(4), world)[rank]
    np.testing.assert_array_equal(local, whole[rows])
    others = sm.comm.all_gather_object(whole)
    assert all(np.array_equal(o, whole) for o in others), "ranks disagree on x.numpy()"
    # the value depends only on the seed, not on the layout
    sm.manual_seed(0)
    y = sm.randn(4, 5, placement=placement, sbp=sm.sbp.broadcast)
    np.testing.assert_array_equal(sm.backend.asnumpy(y.to_local()), whole)
    if rank == 0:
        print("S1 OK")


if __name__ == "__main__":
    main()
