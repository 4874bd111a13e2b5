"""S4: global to global (boxing).

``x.to_global(sbp=...)`` converts a global tensor to another SBP (or placement): the
value stays the same, the shards change. ``split(0) -> broadcast`` is an all-gather:
afterwards every rank's local array is the whole tensor. ``sm.trace()`` shows the
communication the conversion made on this rank.

    mpiexec -n 2 python examples/s4_global_to_global.py [--device cuda]
"""

from __future__ import annotations

import argparse

import numpy as np

import sbpmpi as sm


def main() -> None:
    ap = argparse.ArgumentParser(description="S4: global to global (boxing)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = ap.parse_args()
    sm.launch.expect_world(2, what="S4")  # a note when run without mpiexec
    rank, world = sm.env.get_rank(), sm.env.get_world_size()
    np.set_printoptions(precision=3, suppress=True)
    placement = sm.placement(args.device, ranks=list(range(world)))

    x = sm.randn(4, 5, placement=placement, sbp=sm.sbp.split(0))
    whole = x.numpy()  # NumPy reference of the global value
    with sm.trace() as t:
        y = x.to_global(placement=placement, sbp=sm.sbp.broadcast)
    if rank == 0:
        print(f"x: {repr(x)}\ny: {repr(y)}")
        print(f"communication of split(0) -> broadcast on rank 0:\n{t}")
        print(f"y.to_local() on rank 0 (the whole tensor):\n{sm.backend.asnumpy(y.to_local())}")
    assert y.shape == (4, 5)
    assert y.sbp == (sm.sbp.broadcast,)
    np.testing.assert_array_equal(sm.backend.asnumpy(y.to_local()), whole)
    if world > 1:
        assert len(t) > 0, "split -> broadcast must communicate"

    # more conversions, each checked against the NumPy value
    for sbp in (sm.sbp.split(1), sm.sbp.partial_sum, sm.sbp.split(0)):
        z = y.to_global(sbp=sbp)
        np.testing.assert_allclose(z.numpy(), whole, rtol=1e-6, atol=1e-6)
        if rank == 0:
            print(f"broadcast -> {sbp!r}: local shape {tuple(z.to_local().shape)} on rank 0")
    if rank == 0:
        print("S4 OK")


if __name__ == "__main__":
    main()
