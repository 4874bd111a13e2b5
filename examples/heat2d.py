"""Heat: the explicit 2-D heat equation on a 2-D split grid, periodic, with ``map_overlap``.

``u[t+1] = u[t] + nu * laplacian(u[t])`` on a periodic grid. The grid is split on both
of its axes over a 2x2 mesh of ranks (1xN on a world that has no 2-D mesh), and every
step is one ``sm.map_overlap``: each rank's block padded by one cell of its neighbours'
data (corners included), the 5-point stencil applied, the padding trimmed. After the
steps the result is compared with the same steps computed by NumPy on the whole grid.

    mpiexec -n 4 python examples/heat2d.py [--steps 20] [--n 24]
"""

from __future__ import annotations

import argparse

import numpy as np

import sbpmpi as sm

NU = 0.2  # nu * dt / dx**2: stable below 0.25


def step(u: np.ndarray) -> np.ndarray:
    """One explicit step on a block padded by one cell (np.roll: only the padding is wrong,
    and it is trimmed)."""
    lap = (np.roll(u, 1, 0) + np.roll(u, -1, 0) + np.roll(u, 1, 1) + np.roll(u, -1, 1)
           - 4.0 * u)
    return u + NU * lap


def mesh_of(world: int) -> tuple[int, int]:
    """2x2 on 4 ranks, 2x(N/2) on an even world, else 1xN."""
    return (2, world // 2) if world % 2 == 0 and world > 2 else (1, world)


def main() -> None:
    ap = argparse.ArgumentParser(description="Heat: explicit 2-D heat equation, periodic")
    ap.add_argument("--n", type=int, default=24, help="grid size (n x n+3)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = ap.parse_args()
    world = sm.launch.expect_world(4, what="heat2d (a 2x2 mesh)")
    rank = sm.env.get_rank()
    mesh = sm.placement(args.device, np.arange(world).reshape(mesh_of(world)))
    shape = (args.n, args.n + 3)  # uneven blocks on most meshes

    rng = np.random.default_rng(0)
    u0 = rng.random(shape)
    u0[shape[0] // 3: shape[0] // 2, 2:6] += 5.0  # a hot patch
    u = sm.tensor(u0, placement=mesh, sbp=(sm.sbp.split(0), sm.sbp.split(1)))
    for _ in range(args.steps):
        u = sm.map_overlap(step, u, depth=1, boundary="periodic")

    expected = u0
    for _ in range(args.steps):  # the same steps on the whole grid
        expected = step(expected)
    got = u.numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)
    assert np.isclose(got.sum(), u0.sum())  # periodic diffusion keeps the heat
    if rank == 0:
        print(f"heat2d: {shape} grid on a {mesh.hierarchy} mesh, {args.steps} steps, "
              f"max {got.max():.4f}, total heat {got.sum():.4f}")
        print("HEAT2D OK")


if __name__ == "__main__":
    main()
