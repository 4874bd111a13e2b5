"""Cost of the exit-time agreement per step, against raw mpi4py, in one run.

    mpiexec -n 4 python scripts/bench_exit_agreement.py [--reps 2000] [--json out.json]

Rows (medians of ``--reps`` calls, microseconds, every rank timing the same loop):

- ``raw Allreduce 16 B``: the blocking all-reduce the consistency check used before.
- ``raw Iallreduce+Wait 16 B``: the same exchange non-blocking.
- ``check_collective``: the whole check now (Iallreduce polled with MPI_Test plus one
  MPI_Testsome per poll over the receives posted for the peers' notices, one per peer,
  hashing included).
- ``check_collective, exchange not polled (before)``: the same check with its exchange
  simply waited for (what the blocking all-reduce cost before, hashing included).
- ``sm.comm.all_reduce 8 B, exit watch on / off``: a small sm.comm collective with the
  default exit watch (one small object and a list append/remove) and without
  (``sm.config.override(exit_watch=False)``, as ``SBPMPI_EXIT_WATCH=0``).
Ratios are against the raw Allreduce.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))

import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

import sbpmpi as sm  # noqa: E402
from sbpmpi.comm.info import library_line  # noqa: E402
from sbpmpi.runtime import consistency


def _median_us(fn, reps: int) -> float:
    comm = MPI.COMM_WORLD
    times = []
    for _ in range(reps):
        comm.Barrier()
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e6


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=2000)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    comm = MPI.COMM_WORLD
    buf = np.zeros(2, dtype=np.int64)
    x = np.ones(1)
    pl = sm.placement("cpu", list(range(comm.Get_size())))
    t = sm.zeros(4, placement=pl, sbp=sm.sbp.broadcast)
    rows = {
        "raw Allreduce 16 B": lambda: comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.MAX),
        "raw Iallreduce+Wait 16 B": lambda: comm.Iallreduce(MPI.IN_PLACE, buf,
                                                            op=MPI.MAX).Wait(),
        "check_collective": lambda: consistency.check_collective("x.numpy", (t,)),
    }
    res = {k: _median_us(f, args.reps) for k, f in rows.items()}
    from sbpmpi.comm.lifecycle import exit_agreement

    state = exit_agreement.STATE
    saved_comm, state.comm = state.comm, None  # wait() = request.Wait()
    res["check_collective, exchange not polled (before)"] = _median_us(rows["check_collective"],
                                                                       args.reps)
    state.comm = saved_comm
    res["sm.comm.all_reduce 8 B, exit watch on"] = _median_us(
        lambda: sm.comm.all_reduce(x), args.reps)
    with sm.config.override(exit_watch=False):
        res["sm.comm.all_reduce 8 B, exit watch off"] = _median_us(
            lambda: sm.comm.all_reduce(x), args.reps)
    if comm.Get_rank() == 0:
        base = res["raw Allreduce 16 B"]
        print(f"exit-time agreement cost, {comm.Get_size()} ranks, median of {args.reps} "
              f"({library_line()})")
        print(f"{'step':42s} {'us':>8s} {'x raw':>7s}")
        for k, v in res.items():
            print(f"{k:42s} {v:8.2f} {v / base:7.2f}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"ranks": comm.Get_size(), "median_us": res}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
