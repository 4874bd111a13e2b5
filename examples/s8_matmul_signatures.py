"""S8: matmul SBP signatures, and how sbpmpi chooses one.

For ``y = a @ b`` the valid (a, b) -> y signatures are:

    (S(0), B) -> S(0)      (B, S(1)) -> S(1)      (S(1), S(0)) -> P(sum)
    (P, B)    -> P         (B, P)    -> P         (B, B)       -> B

You never name one: ``sm.matmul`` prices every signature (the boxing of the inputs it
needs now, plus the reduction a partial output will need later) and takes the
cheapest. Inputs that already fit a signature with a split or broadcast output run
with no communication at all. For partial inputs a reduce-scatter now can be cheaper
than a partial output, and ``sm.explain`` shows the prices.

    mpiexec -n 2 python examples/s8_matmul_signatures.py [--device cuda]
"""

from __future__ import annotations

import argparse

import numpy as np

import sbpmpi as sm

S, B, P = sm.sbp.split, sm.sbp.broadcast, sm.sbp.partial_sum
SIGNATURES = [
    ((S(0), B), S(0)),
    ((B, S(1)), S(1)),
    ((B, B), B),
    ((S(1), S(0)), P),
    ((P, B), P),
    ((B, P), P),
]


def main() -> None:
    ap = argparse.ArgumentParser(description="S8: matmul SBP signatures")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = ap.parse_args()
    sm.launch.expect_world(2, what="S8")  # a note when run without mpiexec
    rank, world = sm.env.get_rank(), sm.env.get_world_size()
    placement = sm.placement(args.device, ranks=list(range(world)))
    rng = np.random.default_rng(0)  # the same values on every rank
    a_val, b_val = rng.standard_normal((6, 4)), rng.standard_normal((4, 5))

    rows = []
    for (sa, sb), listed in SIGNATURES:
        a = sm.tensor(a_val, placement=placement, sbp=sa)
        b = sm.tensor(b_val, placement=placement, sbp=sb)
        with sm.trace() as t:
            y = sm.matmul(a, b)
        np.testing.assert_allclose(y.numpy(), a_val @ b_val, rtol=1e-12, atol=1e-12)
        ops = ", ".join(sorted({r.op for r in t})) or "none"
        rows.append(f"  ({str(sa):>4}, {str(sb):>4})  listed -> {str(listed):<4}  "
                    f"chosen -> {str(y.sbp[0]):<4}  communication: {ops}")
        if not isinstance(listed, sm.sbp.Partial):
            # a split/broadcast output costs nothing now or later: it must be taken as is
            assert y.sbp == (listed,), f"({sa}, {sb}) gave {y.sbp}, expected ({listed},)"
            assert len(t) == 0, f"({sa}, {sb}) fits a signature but communicated:\n{t}"
    a = sm.tensor(a_val, placement=placement, sbp=P)
    b = sm.tensor(b_val, placement=placement, sbp=B)
    why = sm.explain(sm.matmul, a, b)
    if rank == 0:
        print("y = a @ b for inputs that fit each listed signature "
              "(values checked against NumPy):")
        print("\n".join(rows))
        print(f"\nwhy (P, B) is computed the way it is:\n{why}")
        print("S8 OK")


if __name__ == "__main__":
    main()
