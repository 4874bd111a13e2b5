"""What a training step allocates and how long it takes, eager against its replay as a
graph (``sm.graph``): docs/graph.md, "Buffers planned once".

    mpiexec -n 2 python scripts/bench_graph_allocations.py [--reps 21] [--json out.json]

Two steps, each as the tests of tests/capture build them: the MLP of
``tests/capture/test_graph_capture.py`` in ``dp`` with Adam (7-6-3, float64, 64 rows) and
the GPT of ``examples/train_gpt.py`` in ``dp`` with gradient buckets and AdamW (float64;
``--gpt`` sets its size, the tests' small one by default). For each, eager and replayed:
the NumPy data bytes and allocations of one step (every allocation, counted with
``tests/capture/numpy_allocations.py``), ``tracemalloc``'s peak over one step (all
domains: NumPy's data and Python's objects), and the step's time: wall-clock seconds
of the slowest rank and rank 0's CPU seconds (``time.process_time``: steadier than the
wall clock on a machine shared with other jobs; MPI's waits spin, so at n > 1 it counts
them too), medians over ``--reps`` steps, the two variants interleaved. Rank 0 prints a
table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
from mpi4py import MPI

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests" / "capture"), str(ROOT / "examples"), str(ROOT)]

import train_gpt  # noqa: E402
from numpy_allocations import counting  # noqa: E402
from test_graph_capture import _inputs, make  # noqa: E402
from test_graph_gpt import SMALL, step_of  # noqa: E402

import sbpmpi as sm  # noqa: E402


def mlp() -> tuple[Any, Any, tuple[Any, ...]]:
    lay, _, step = make("dp", "adam")
    _, _, step2 = make("dp", "adam")
    return step, sm.graph(step2), _inputs(lay, 64)


def gpt(extra: list[str]) -> tuple[Any, Any, tuple[Any, ...]]:
    args = train_gpt.parse(SMALL + extra + ["--layout", "dp"])
    data = train_gpt.load_corpus()
    eager = step_of(train_gpt.build(args, "dp"))
    graph = sm.graph(step_of(train_gpt.build(args, "dp")))
    return eager, graph, train_gpt.batch_at(data, 0, args.batch, args.seq, args.seed)


def one_step(fn: Any, args: tuple[Any, ...]) -> tuple[int, int, int]:
    """(NumPy bytes, NumPy allocations, tracemalloc peak) of one call."""
    with counting() as sizes:
        fn(*args)
    tracemalloc.start()
    fn(*args)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return sum(sizes), len(sizes), peak


def measure(name: str, eager: Any, graph: Any, args: tuple[Any, ...], reps: int,
            results: list[dict[str, Any]]) -> list[str]:
    comm = MPI.COMM_WORLD
    for _ in range(3):  # warm-up; the graph captures twice, then replays
        eager(*args)
        graph(*args)
    rows = {}
    for label, fn in (("eager", eager), ("graph replay", graph)):
        rows[label] = one_step(fn, args)
    times: dict[str, list[float]] = {"eager": [], "graph replay": []}
    cpu: dict[str, list[float]] = {"eager": [], "graph replay": []}
    for _ in range(reps):
        for label, fn in (("eager", eager), ("graph replay", graph)):
            comm.Barrier()
            t0, c0 = time.perf_counter(), time.process_time()
            fn(*args)
            cpu[label].append(time.process_time() - c0)
            times[label].append(comm.allreduce(time.perf_counter() - t0, op=MPI.MAX))
    out = []
    for label in ("eager", "graph replay"):
        nbytes, count, peak = rows[label]
        ms = 1e3 * statistics.median(times[label])
        cms = 1e3 * statistics.median(cpu[label])
        out.append(f"| {name} | {label} | {nbytes:,} | {count} | {peak:,} | {ms:.2f} | "
                   f"{cms:.2f} |")
        results.append(dict(step=name, variant=label, numpy_bytes=nbytes,
                            numpy_allocations=count, tracemalloc_peak=peak, step_ms=ms,
                            cpu_ms=cms, reps=reps))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=21)
    ap.add_argument("--gpt", default="", help="extra train_gpt.py flags, e.g. '--dim 64'")
    ap.add_argument("--json", default="", help="also write the rows here (rank 0)")
    a = ap.parse_args()
    results: list[dict[str, Any]] = []
    lines = measure("MLP dp, Adam", *mlp(), a.reps, results)
    lines += measure("GPT dp, AdamW" + (f" ({a.gpt})" if a.gpt else ""),
                     *gpt(a.gpt.split()), a.reps, results)
    if MPI.COMM_WORLD.rank == 0:
        n = MPI.COMM_WORLD.size
        print(f"n = {n}, NumPy {np.__version__}, {a.reps} timed steps per variant "
              f"(median, slowest rank)\n")
        print("| step | variant | NumPy bytes allocated | NumPy allocations | "
              "tracemalloc peak (bytes) | step ms | CPU ms (rank 0) |")
        print("|---|---|---|---|---|---|---|")
        print("\n".join(lines))
        if a.json:
            Path(a.json).write_text(json.dumps({"ranks": n, "results": results}, indent=1))


if __name__ == "__main__":
    main()
