"""A two-layer MLP forward pass, ``relu(x @ w1) @ w2``, in three layouts.

1. data parallel: the batch is split by rows, the weights are broadcast; no
   communication at all.
2. model parallel (tensor parallel, as in Megatron-LM): w1 split by columns, w2 by
   rows; the hidden layer stays split and the output is a partial sum, reduced once.
3. 2-D hybrid on a mesh of (world / 2) x 2 ranks: data parallel along mesh axis 0,
   model parallel along mesh axis 1.

The same weights and batch give the same output in every layout, checked against
NumPy; ``sm.trace()`` counts the communication each layout needed.

    mpiexec -n 4 python examples/mlp_three_layouts.py [--device cuda]
"""

from __future__ import annotations

import argparse

import numpy as np

import sbpmpi as sm

S, B = sm.sbp.split, sm.sbp.broadcast


def forward(x: sm.GlobalTensor, w1: sm.GlobalTensor, w2: sm.GlobalTensor) -> sm.GlobalTensor:
    return sm.matmul(sm.relu(sm.matmul(x, w1)), w2)


def main() -> None:
    ap = argparse.ArgumentParser(description="two-layer MLP forward in three layouts")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=16)
    args = ap.parse_args()
    sm.launch.expect_world(4, what="MLP")  # a note when run without mpiexec
    rank, world = sm.env.get_rank(), sm.env.get_world_size()
    n, d_in, d_hid, d_out = args.batch, 6, args.hidden, 4
    rng = np.random.default_rng(7)  # the same values on every rank
    xv = rng.standard_normal((n, d_in))
    w1v = rng.standard_normal((d_in, d_hid))
    w2v = rng.standard_normal((d_hid, d_out))
    expected = np.maximum(xv @ w1v, 0.0) @ w2v  # NumPy reference on the whole arrays

    flat = sm.placement(args.device, ranks=list(range(world)))
    cols = 2 if world % 2 == 0 else 1
    mesh = sm.placement(args.device, ranks=np.arange(world).reshape(world // cols, cols).tolist())
    layouts = {
        "data parallel": (flat, S(0), B, B),
        "model parallel": (flat, B, S(1), S(0)),
        f"2-D hybrid {mesh.hierarchy}": (mesh, (S(0), B), (B, S(1)), (B, S(0))),
    }
    report = []
    for name, (pl, sx, s1, s2) in layouts.items():
        x = sm.tensor(xv, placement=pl, sbp=sx)
        w1 = sm.tensor(w1v, placement=pl, sbp=s1)
        w2 = sm.tensor(w2v, placement=pl, sbp=s2)
        with sm.trace() as t:
            y = forward(x, w1, w2)
            out = y.numpy()
        np.testing.assert_allclose(out, expected, rtol=1e-10, atol=1e-10, err_msg=name)
        sbp = ", ".join(str(s) for s in y.sbp)
        report.append(f"{name:<22} y sbp=({sbp})  communication calls on rank 0 "
                      f"(incl. the final numpy()): {len(t)}")
    if rank == 0:
        print(f"MLP {n}x{d_in} -> {d_hid} -> {d_out} on {world} ranks:")
        print("\n".join(report))
        print("MLP OK")


if __name__ == "__main__":
    main()
