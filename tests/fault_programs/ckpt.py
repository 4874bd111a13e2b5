"""Checkpoint programs for the serial tests in tests/checkpoint/test_save_and_load.py.

    mpiexec -n 4 python ckpt.py save DIR        # (S(0), S(1)) on a 2x2 mesh, plus a state
    mpiexec -n N python ckpt.py load DIR        # any N: every SBP checked against NumPy
    mpiexec -n 2 python ckpt.py crash-during DIR     # rank 1 dies inside the collective write
    mpiexec -n 2 python ckpt.py crash-commit DIR     # rank 0 dies just before the rename

The values come from ``value(shape, salt)``, which the test recomputes with NumPy.
"""

from __future__ import annotations

import itertools
import os
import sys

import numpy as np
from mpi4py import MPI

import sbpmpi as sm
from sbpmpi import checkpoint
from sbpmpi.checkpoint import atomic_write
from sbpmpi.comm import file_io
from sbpmpi.comm.lifecycle import abort

rank, size = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
abort.install(force=True)
SHAPE = (5, 7)


def value(shape: tuple[int, ...], salt: int) -> np.ndarray:
    """The reference values (uneven sizes, distinct entries)."""
    n = int(np.prod(shape))
    return ((np.arange(n, dtype=np.float64) * 1.5 + salt) % 97 - 40).reshape(shape)


def sbps(pl: sm.Placement, ndim: int) -> list:
    one = [sm.sbp.broadcast, sm.sbp.partial_sum, sm.sbp.partial_max]
    one += [sm.sbp.split(d) for d in range(ndim)]
    return list(itertools.product(one, repeat=pl.ndim))


def main() -> None:
    mode, d = sys.argv[1], sys.argv[2]
    a = value(SHAPE, 0)
    if mode == "save":
        assert size == 4
        mesh = sm.placement("cpu", [[0, 1], [2, 3]])
        x = sm.tensor(a, placement=mesh, sbp=(sm.sbp.split(0), sm.sbp.split(1)))
        checkpoint.save(x, os.path.join(d, "x.npy"))
        w = sm.tensor(value((3, 4, 2), 1).astype(np.float32), placement=mesh,
                      sbp=(sm.sbp.partial_sum, sm.sbp.split(2)))
        b = sm.tensor(np.arange(6, dtype=np.int64), placement=sm.placement("cpu", [3, 1]),
                      sbp=sm.sbp.broadcast)
        checkpoint.save_state({"layer.w": w, "layer.b": b}, os.path.join(d, "state"))
    elif mode == "load":
        path = os.path.join(d, "x.npy")
        pls = [sm.placement("cpu", list(range(size)))]
        if size > 1:
            pls.append(sm.placement("cpu", list(range(size))[::-1]))
            pls.append(sm.placement("cpu", [[r] for r in range(size)]))  # an n x 1 mesh
        checked = 0
        for pl in pls:
            for nd in sbps(pl, 2):
                x = checkpoint.load(path, placement=pl, sbp=nd)
                assert x.shape == SHAPE and x.dtype == np.float64
                np.testing.assert_array_equal(x.numpy(), a, err_msg=f"{pl} {nd}")
                checked += 1
        state = checkpoint.load_state(os.path.join(d, "state"),
                                      placement=sm.placement("cpu", list(range(size))),
                                      sbp={"layer.w": sm.sbp.split(1), "layer.b": sm.sbp.split(0)})
        assert list(state) == ["layer.w", "layer.b"]
        np.testing.assert_array_equal(state["layer.w"].numpy(),
                                      value((3, 4, 2), 1).astype(np.float32))
        np.testing.assert_array_equal(state["layer.b"].numpy(), np.arange(6))
        assert state["layer.w"].dtype == np.float32 and state["layer.b"].dtype == np.int64
        if rank == 0:
            print(f"LOADED-OK n={size} layouts={checked}", flush=True)
    elif mode in ("crash-during", "crash-commit"):
        pl = sm.placement("cpu", list(range(size)))
        x = sm.tensor(value(SHAPE, 5), placement=pl, sbp=sm.sbp.split(1))
        if mode == "crash-during":
            def dying(step: str, path: str) -> None:
                # right after this rank's part of Write_at_all, before the ranks agree on it
                if step == "data" and rank == size - 1:
                    os._exit(9)

            file_io.set_fault_hook(dying)
        else:
            def dying_commit(tmp: str, path: str, mode: int | None = None) -> None:
                assert os.path.getsize(tmp) > 0
                print("rank 0: temporary file complete, dying before the rename", flush=True)
                os._exit(9)

            atomic_write.commit = dying_commit  # type: ignore[assignment]
        checkpoint.save(x, os.path.join(d, "x.npy"))
        print(f"rank {rank}: save returned (should not happen)", flush=True)
    else:
        raise SystemExit(f"unknown mode {mode}")


main()
