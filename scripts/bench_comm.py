"""Benchmark sbpmpi.comm against raw mpi4py buffer calls, measured in the same run.

    mpiexec -n 4 python scripts/bench_comm.py [--sizes 8,1024,65536,1048576] [--json out.json]

For each op and message size: the median time per call of the raw mpi4py call and of
the sbpmpi.comm call (same arrays), their ratio, and the Python overhead in microseconds.
Rank 0 prints each row as it is measured and writes JSON. Calls alternate raw/sbpmpi
in blocks so that drift in machine load hits both alike. A ratio from fewer than 5
blocks, or whose blocks spread wider than max/min = 1.5 on either side, is flagged noisy.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import numpy as np
from mpi4py import MPI

from sbpmpi import comm as C
from sbpmpi.comm.mpi_library import library_line
from sbpmpi.tools.bench import NOISY_MIN_REPEATS, NOISY_SPREAD

world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()


def timed(fn: Callable[[], None], reps: int) -> float:
    """Seconds per call, the slowest rank's, of ``reps`` calls after a barrier."""
    world.Barrier()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    dt = (time.perf_counter() - t0) / reps
    return world.allreduce(dt, op=MPI.MAX)


def cases(nbytes: int) -> dict[str, tuple[Callable[[], None], Callable[[], None]]]:
    n = max(1, nbytes // 8)
    D = MPI.DOUBLE
    x = np.ones(n)
    y = np.empty(n * size)
    z = np.empty(n)
    w = np.empty(n * size)
    counts = [n] * size
    displs = [i * n for i in range(size)]
    return {
        "all_reduce": (lambda: world.Allreduce(MPI.IN_PLACE, [x, n, D], op=MPI.SUM),
                       lambda: C.all_reduce(x)),
        "broadcast": (lambda: world.Bcast([x, n, D], root=0), lambda: C.broadcast(x, 0)),
        "all_gather": (lambda: world.Allgather([x, n, D], [y, n, D]),
                       lambda: C.all_gather(y, x)),
        "all_gather_v": (lambda: world.Allgatherv([x, n, D], [y, (counts, displs), D]),
                         lambda: C.all_gather_v(y, x, counts)),
        "reduce_scatter": (lambda: world.Reduce_scatter_block([y, n, D], [z, n, D], op=MPI.SUM),
                           lambda: C.reduce_scatter(z, y)),
        "all_to_all": (lambda: world.Alltoall([y, n, D], [w, n, D]),
                       lambda: C.all_to_all(w, y)),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--sizes", default="8,1024,65536,1048576",
                    help="message sizes in bytes per rank (comma separated)")
    ap.add_argument("--reps", type=int, default=0, help="calls per block (0: by size)")
    ap.add_argument("--blocks", type=int, default=5, help="alternating blocks per case")
    ap.add_argument("--json", default="", help="also write the results here")
    a = ap.parse_args()
    rows = []
    if rank == 0:
        print(f"sbpmpi.comm vs raw mpi4py, {size} ranks, {library_line()}"
              f" (noisy: < {NOISY_MIN_REPEATS} blocks or max/min > {NOISY_SPREAD:g})")
        print(f"{'op':<15}{'bytes':>10}{'raw us':>10}{'sbpmpi us':>11}{'ratio':>8}{'+us':>8}",
              flush=True)
    for nbytes in [int(s) for s in a.sizes.split(",") if s]:
        reps = a.reps or max(20, min(2000, 2_000_000 // max(nbytes, 1000)))
        for op, (raw, ours) in cases(nbytes).items():
            raw(), ours()  # warm up (pool, caches, MPI connections)
            t_raw, t_sm = [], []
            for _ in range(a.blocks):
                t_raw.append(timed(raw, reps))
                t_sm.append(timed(ours, reps))
            r, s = statistics.median(t_raw), statistics.median(t_sm)
            spread = max(max(t) / min(t) if min(t) > 0 else float("inf") for t in (t_raw, t_sm))
            noisy = a.blocks < NOISY_MIN_REPEATS or spread > NOISY_SPREAD
            row = {"op": op, "bytes": nbytes, "ranks": size, "raw_us": r * 1e6,
                   "sbpmpi_us": s * 1e6, "ratio": s / r if r else float("nan"),
                   "overhead_us": (s - r) * 1e6, "blocks": a.blocks, "spread": spread,
                   "noisy": noisy}
            rows.append(row)
            if rank == 0:
                print(f"{row['op']:<15}{row['bytes']:>10}{row['raw_us']:>10.2f}"
                      f"{row['sbpmpi_us']:>11.2f}{row['ratio']:>8.2f}{row['overhead_us']:>8.2f}"
                      f"{'  noisy' if noisy else ''}", flush=True)
    if rank == 0:
        out = json.dumps({"ranks": size, "results": rows}, indent=1)
        if a.json:
            with open(a.json, "w") as f:
                f.write(out)
        else:
            print(out)


if __name__ == "__main__":
    main()
