"""S3: global to local.

``x.to_local()`` returns this rank's shard itself, not a copy: writing into it
changes the global tensor. Shards are plain NumPy arrays (CuPy on ``cuda``), so any
array code works on them.

    mpiexec -n 2 python examples/s3_global_to_local.py [--device cuda]
"""

from __future__ import annotations

import argparse

import numpy as np

import sbpmpi as sm


def main() -> None:
    ap = argparse.ArgumentParser(description="S3: global to local")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = ap.parse_args()
    sm.launch.expect_world(2, what="S3")  # a note when run without mpiexec
    rank, world = sm.env.get_rank(), sm.env.get_world_size()
    placement = sm.placement(args.device, ranks=list(range(world)))

    ref = np.arange(4 * 5, dtype=np.float64).reshape(4, 5)  # the global value, in NumPy
    x = sm.tensor(ref.copy(), placement=placement, sbp=sm.sbp.split(0))  # each rank keeps its rows
    mine = np.array_split(np.arange(4), world)[rank]  # the balanced rows of this rank

    local = x.to_local()
    assert local is x.to_local(), "to_local() must return the shard itself"
    views = sm.comm.all_gather_object(f"rank {rank}: to_local() =\n{sm.backend.asnumpy(local)}")
    if rank == 0:
        print(repr(x))
        print("\n".join(views))
    np.testing.assert_array_equal(sm.backend.asnumpy(local), ref[mine])

    local *= 10  # in place on the shard: no copy was made, so x changes too
    ref *= 10
    whole = x.numpy()  # collective: every rank takes part
    np.testing.assert_array_equal(whole, ref)
    if rank == 0:
        print(f"after local *= 10 on every rank, x.numpy() =\n{whole}")
        print("S3 OK")


if __name__ == "__main__":
    main()
