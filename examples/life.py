"""Life: Conway's Game of Life on a split board with ``sm.map_overlap``.

The board (a glider and a few random cells on a torus) is split by rows over the ranks;
each generation is one ``sm.map_overlap``: every rank's rows padded by one row and
column of its neighbours' cells (``boundary="periodic"``: the board wraps around), the
neighbours counted, the rule applied, the padding trimmed. A second board lies on an
infinite-looking field of dead cells (``boundary="constant"``, value 0) and is split on
both axes. After the generations both are compared with NumPy on the whole board.

    mpiexec -n 4 python examples/life.py [--generations 12]
"""

from __future__ import annotations

import argparse

import numpy as np

import sbpmpi as sm


def generation(b: np.ndarray) -> np.ndarray:
    """One generation of a board padded by one cell (np.roll: only the padding is wrong,
    and it is trimmed)."""
    neighbours = sum(np.roll(np.roll(b, i, 0), j, 1)
                     for i in (-1, 0, 1) for j in (-1, 0, 1) if (i, j) != (0, 0))
    return ((neighbours == 3) | ((b == 1) & (neighbours == 2))).astype(b.dtype)


def on_whole_board(board: np.ndarray, generations: int, boundary: str) -> np.ndarray:
    """The same generations by NumPy on the whole board, padded as map_overlap pads."""
    mode = {"periodic": "wrap", "constant": "constant"}[boundary]
    for _ in range(generations):
        board = generation(np.pad(board, 1, mode=mode))[1:-1, 1:-1]
    return board


def main() -> None:
    ap = argparse.ArgumentParser(description="Life: Conway's Game of Life, split board")
    ap.add_argument("--generations", type=int, default=12)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = ap.parse_args()
    world = sm.launch.expect_world(4, what="life")
    rank = sm.env.get_rank()
    rows = sm.placement(args.device, list(range(world)))
    grid = sm.placement(args.device, np.arange(world).reshape((2, world // 2) if world % 2 == 0
                                                        else (1, world)))

    board = np.zeros((13, 11), dtype=np.int8)
    board[1:4, 1:4] = [[0, 1, 0], [0, 0, 1], [1, 1, 1]]  # a glider
    board[6:, 4:] = np.random.default_rng(1).random((7, 7)) < 0.4
    for placement, sbp, boundary in [(rows, sm.sbp.split(0), "periodic"),
                                     (grid, (sm.sbp.split(0), sm.sbp.split(1)), "constant")]:
        b = sm.tensor(board, placement=placement, sbp=sbp)
        for _ in range(args.generations):
            b = sm.map_overlap(generation, b, depth=1, boundary=boundary, value=0)
        expected = on_whole_board(board, args.generations, boundary)
        np.testing.assert_array_equal(b.numpy(), expected)
        assert b.dtype == np.int8
        if rank == 0:
            print(f"life ({boundary}): {board.shape} board on {placement.hierarchy} ranks, "
                  f"{args.generations} generations, {int(expected.sum())} cells alive")
    if rank == 0:
        print("LIFE OK")


if __name__ == "__main__":
    main()
