"""S5: what each SBP means, for a 2x2 global tensor.

The same global value [[1, 2], [3, 4]] laid out with each SBP; every rank prints its
local array and ``sm.visualize`` draws which ranks hold which block.

- ``split(0)``: rank k holds row block k; ``split(1)``: column block k (balanced: the
  first n % p ranks get one extra row or column; the others may hold nothing).
- ``broadcast``: every rank holds the whole tensor.
- ``partial_sum``: every rank holds a 2x2 array and the global value is their sum
  (``partial_max`` / ``partial_min``: their max / min).

    mpiexec -n 2 python examples/s5_sbp_meanings.py [--device cuda]
"""

from __future__ import annotations

import argparse

import numpy as np

import sbpmpi as sm


def main() -> None:
    ap = argparse.ArgumentParser(description="S5: what each SBP means")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = ap.parse_args()
    sm.launch.expect_world(2, what="S5")  # a note when run without mpiexec
    rank, world = sm.env.get_rank(), sm.env.get_world_size()
    placement = sm.placement(args.device, ranks=list(range(world)))
    value = np.array([[1.0, 2.0], [3.0, 4.0]])
    reduce = {"sum": np.sum, "max": np.max, "min": np.min}

    for sbp in (sm.sbp.split(0), sm.sbp.split(1), sm.sbp.broadcast,
                sm.sbp.partial_sum, sm.sbp.partial_max, sm.sbp.partial_min):
        x = sm.tensor(value, placement=placement, sbp=sbp)
        local = sm.backend.asnumpy(x.to_local())
        locals_ = sm.comm.all_gather_object(local)  # every rank's array, for printing and checks
        if rank == 0:
            print(f"--- {sbp!r} ---")
            for r, a in enumerate(locals_):
                print(f"rank {r} holds {a.tolist()}")
            sm.visualize(x)
        if isinstance(sbp, sm.sbp.Split):
            blocks = np.array_split(value, world, axis=sbp.dim)
            for r in range(world):
                np.testing.assert_array_equal(locals_[r], blocks[r])
        elif isinstance(sbp, sm.sbp.Broadcast):
            for a in locals_:
                np.testing.assert_array_equal(a, value)
        else:  # partial: the reduction of the ranks' arrays is the value
            np.testing.assert_array_equal(reduce[sbp.op](np.stack(locals_), axis=0), value)
        np.testing.assert_array_equal(x.numpy(), value)

    # a partial_sum made from local arrays: the global value is the sum of what ranks hold
    mine = np.full((2, 2), float(rank + 1))
    s = sm.to_global(mine, placement=placement, sbp=sm.sbp.partial_sum)
    np.testing.assert_array_equal(s.numpy(), np.full((2, 2), world * (world + 1) / 2))
    if rank == 0:
        print(f"partial_sum of ranks holding full((2, 2), rank + 1):\n{s.numpy()}")
        print("S5 OK")
    else:
        s.numpy()


if __name__ == "__main__":
    main()
