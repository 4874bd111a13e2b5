"""Per-op overhead on tiny tensors: sbpmpi against NumPy on the shard and PyTorch DTensor.

    mpiexec -n 2 python scripts/bench_ops.py [--rows-per-rank 8] [--cols 16] [--json out.json]

Each op runs on float32 tensors of shape (rows-per-rank * p, cols), so every rank's shard
is tiny and the time is the framework's overhead, not arithmetic. For each op the same
work is timed in the same run, interleaved in blocks so that drift in machine load hits
every system alike:

- ``numpy``: the local computation on the shard alone (the floor: no framework at all);
- ``sbpmpi``: the global op (inference, boxing if any, local compute, wrapping);
- ``dtensor``: PyTorch DTensor over gloo on CPU, when torch is installed.

A block is ``reps`` calls followed by a barrier; its time per call is the slowest rank's.
The table reports the median over blocks and the ratio sbpmpi / DTensor. Rank 0 prints
the table and the JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

import sbpmpi as sm  # noqa: E402

world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()

Case = dict[str, Callable[[], Any]]


def timed(fn: Callable[[], Any], reps: int) -> float:
    """Seconds per call, the slowest rank's, of ``reps`` calls ended by a barrier."""
    world.Barrier()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    world.Barrier()
    return world.allreduce((time.perf_counter() - t0) / reps, op=MPI.MAX)


def numpy_cases(a: np.ndarray, b: np.ndarray, w: np.ndarray) -> Case:
    """What each op computes on this rank's shard, with no framework around it."""
    return {
        "add": lambda: a + b,
        "mul": lambda: a * b,
        "relu": lambda: np.maximum(a, 0),
        "matmul (DP)": lambda: a @ w,
        "sum over split dim": lambda: a.sum(0),
        "to_global S(0)->B": lambda: np.concatenate([a] * size),
        "x.numpy()": lambda: np.concatenate([a] * size),
    }


def sbpmpi_cases(a: np.ndarray, b: np.ndarray, w: np.ndarray) -> Case:
    pl = sm.placement("cpu", ranks=list(range(size)))
    s0, bc = sm.sbp.split(0), sm.sbp.broadcast
    x = sm.to_global(a, placement=pl, sbp=s0)
    y = sm.to_global(b, placement=pl, sbp=s0)
    wg = sm.to_global(w, placement=pl, sbp=bc)
    return {
        "add": lambda: x + y,
        "mul": lambda: x * y,
        "relu": lambda: sm.relu(x),
        "matmul (DP)": lambda: x @ wg,
        "sum over split dim": lambda: x.sum(0),
        "to_global S(0)->B": lambda: x.to_global(sbp=bc),
        "x.numpy()": lambda: x.numpy(),
    }


def dtensor_cases(a: np.ndarray, b: np.ndarray, w: np.ndarray) -> Case | None:
    """The same ops in PyTorch DTensor (gloo, CPU); None when torch is not installed."""
    try:
        import torch
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import DTensor, Replicate, Shard
    except ImportError:
        return None
    torch.set_num_threads(1)
    if not dist.is_initialized():
        port = world.bcast(_free_port() if rank == 0 else None, root=0)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                                rank=rank, world_size=size)
    mesh = init_device_mesh("cpu", (size,))
    x = DTensor.from_local(torch.from_numpy(a), mesh, [Shard(0)])
    y = DTensor.from_local(torch.from_numpy(b), mesh, [Shard(0)])
    wd = DTensor.from_local(torch.from_numpy(w), mesh, [Replicate()])
    return {
        "add": lambda: x + y,
        "mul": lambda: x * y,
        "relu": lambda: torch.relu(x),
        "matmul (DP)": lambda: x @ wd,
        "sum over split dim": lambda: x.sum(0),
        "to_global S(0)->B": lambda: x.redistribute(mesh, [Replicate()]),
        "x.numpy()": lambda: x.full_tensor().numpy(),
    }


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rows-per-rank", type=int, default=8)
    ap.add_argument("--cols", type=int, default=16)
    ap.add_argument("--reps", type=int, default=200, help="calls per block")
    ap.add_argument("--blocks", type=int, default=7, help="blocks per op and system")
    ap.add_argument("--no-torch", action="store_true", help="leave DTensor out")
    ap.add_argument("--json", default="", help="also write the results here")
    args = ap.parse_args()
    rng = np.random.default_rng(rank)
    shape = (args.rows_per_rank, args.cols)
    a = rng.standard_normal(shape, dtype=np.float32)
    b = rng.standard_normal(shape, dtype=np.float32)
    w = np.random.default_rng(0).standard_normal((args.cols, args.cols), dtype=np.float32)
    systems: dict[str, Case] = {"numpy": numpy_cases(a, b, w), "sbpmpi": sbpmpi_cases(a, b, w)}
    dt = None if args.no_torch else dtensor_cases(a, b, w)
    if dt is not None:
        systems["dtensor"] = dt
    rows = []
    if rank == 0:
        print(_header("dtensor" in systems), flush=True)
    for op in systems["sbpmpi"]:
        for case in systems.values():  # warm up: caches, plans, connections
            for _ in range(10):
                case[op]()
        times: dict[str, list[float]] = {name: [] for name in systems}
        for _ in range(args.blocks):
            for name, case in systems.items():
                times[name].append(timed(case[op], args.reps))
        med = {name: statistics.median(t) * 1e6 for name, t in times.items()}
        row: dict[str, Any] = {"op": op, "ranks": size, "shape": [shape[0] * size, shape[1]],
                               **{f"{name}_us": round(v, 2) for name, v in med.items()},
                               "sbpmpi_minus_numpy_us": round(med["sbpmpi"] - med["numpy"], 2)}
        if "dtensor" in med:
            row["sbpmpi_over_dtensor"] = round(med["sbpmpi"] / med["dtensor"], 3)
        rows.append(row)
        if rank == 0:
            print(_format_row(row, "dtensor" in med), flush=True)
    if rank == 0:
        out = json.dumps({"ranks": size, "mpi": MPI.Get_library_version().splitlines()[0],
                          "numpy": np.__version__, "results": rows}, indent=1)
        if args.json:
            with open(args.json, "w") as f:
                f.write(out)
        print(out)


def _header(with_dtensor: bool) -> str:
    cols = f"{'op':<20}{'numpy us':>10}{'sbpmpi us':>11}{'+us':>8}"
    if with_dtensor:
        cols += f"{'dtensor us':>12}{'sbpmpi/dt':>11}"
    return f"per-op time, {size} ranks, float32, median of blocks\n{cols}"


def _format_row(row: dict[str, Any], with_dtensor: bool) -> str:
    line = (f"{row['op']:<20}{row['numpy_us']:>10.2f}{row['sbpmpi_us']:>11.2f}"
            f"{row['sbpmpi_minus_numpy_us']:>8.2f}")
    if with_dtensor:
        line += f"{row['dtensor_us']:>12.2f}{row['sbpmpi_over_dtensor']:>11.2f}"
    return line


if __name__ == "__main__":
    main()
