"""Time and per-rank peak memory of qr, svd and lstsq on tall-skinny matrices: sbpmpi
(TSQR) at n ranks, NumPy in one process, and Heat on the same data in the same run.

    python scripts/bench_linalg.py [--rows 400003 --cols 24] [--sizes 2,4] [--reps 3]
        [--rounds 1] [--heat-python /work/venv-heat/bin/python] [--json out.json]

The driver (this script without ``--worker``; it makes no MPI call) starts one job per
library and world size on the same matrix: float64, ``rows x cols``, its values drawn
block by block of 4,096 rows from NumPy's generator seeded with (seed, block), so that
every job makes the same matrix whatever its split; the split jobs make only their own
rows (uneven: the first ``rows % n`` ranks hold one more). Per call and job: the median
over ``--reps`` of the slowest rank's time (a barrier before, the maximum over the ranks
after; the calls interleaved rep by rep, and with ``--rounds`` the jobs run that many
times one after another, the median of their medians reported), and each rank's peak
memory growth during the first call (the kernel's peak-RSS
mark reset before it, ``MALLOC_MMAP_THRESHOLD_`` low so that freed arrays leave the
resident set; the results included). The split jobs run one BLAS thread per rank; NumPy
in one process runs twice, with every core and with one BLAS thread.

- sbpmpi: ``xp.linalg.qr(x)`` (``mode="reduced"``), ``xp.linalg.svd(x,
  full_matrices=False)``, ``sm.linalg.lstsq(x, b)``, on ``x`` split by rows.
- NumPy: ``numpy.linalg.qr``, ``svd(full_matrices=False)``, ``lstsq``.
- Heat (``--heat-python``: a Python with ``heat`` and its own ``mpi4py``, e.g. a venv;
  skipped, and said so, when it does not run): ``ht.linalg.qr`` and ``ht.linalg.svd`` of
  the same matrix with ``split=0`` (Heat has no ``lstsq``), under that Python's
  ``mpiexec``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BLOCK = 4096
SEED = 35
MIB = 1 << 20


# -- the matrix, the same in every job ----------------------------------------------------------

def rows_of(rows: int, cols: int, lo: int, hi: int) -> Any:
    """Rows ``lo:hi`` of the benchmark matrix (and of its right-hand side, last column)."""
    import numpy as np

    out = np.empty((hi - lo, cols + 1))
    for b in range(lo // BLOCK, (hi - 1) // BLOCK + 1 if hi > lo else lo // BLOCK):
        start, stop = b * BLOCK, min((b + 1) * BLOCK, rows)
        block = np.random.default_rng([SEED, b]).normal(size=(stop - start, cols + 1))
        a, z = max(start, lo), min(stop, hi)
        out[a - lo:z - lo] = block[a - start:z - start]
    return out


def split_range(rows: int, parts: int, index: int) -> tuple[int, int]:
    q, r = divmod(rows, parts)
    start = index * q + min(index, r)
    return start, start + q + (1 if index < r else 0)


# -- measuring ----------------------------------------------------------------------------------

def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def peak_growth(call: Any) -> int:
    """The peak resident memory during ``call()`` less the resident memory before it."""
    gc.collect()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return -1
    before = _status("VmRSS")
    out = call()
    peak = _status("VmHWM")
    del out
    gc.collect()
    return peak - before


def measure(calls: dict[str, Any], reps: int, barrier: Any, slowest: Any,
            gather: Any) -> dict[str, dict[str, Any]]:
    """Per call: the per-rank memory growth of a first run, then ``reps`` timed runs, the
    calls interleaved rep by rep (a noisy machine hits them alike)."""
    growth = {}
    for name, call in calls.items():
        barrier()
        growth[name] = gather(peak_growth(call))
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(reps):
        for name, call in calls.items():
            barrier()
            t0 = time.perf_counter()
            call()
            times[name].append(slowest(time.perf_counter() - t0))
    return {name: {"seconds": statistics.median(times[name]), "growth": growth[name],
                   "all": times[name]} for name in calls}


# -- the workers ---------------------------------------------------------------------------------

def worker_numpy(rows: int, cols: int, reps: int) -> dict[str, Any]:
    import numpy as np

    data = rows_of(rows, cols, 0, rows)
    a, b = np.ascontiguousarray(data[:, :cols]), np.ascontiguousarray(data[:, cols])
    del data
    calls = {"qr": lambda: np.linalg.qr(a), "svd": lambda: np.linalg.svd(a, full_matrices=False),
             "lstsq": lambda: np.linalg.lstsq(a, b, rcond=None)}
    return {"size": 1, "shard": a.nbytes, "whole": a.nbytes,
            "calls": measure(calls, reps, lambda: None, lambda t: t, lambda g: [g])}


def worker_sbpmpi(rows: int, cols: int, reps: int) -> dict[str, Any]:
    import numpy as np

    import sbpmpi as sm
    from sbpmpi import array_api as xp

    rank, size = sm.env.get_rank(), sm.env.get_world_size()
    lo, hi = split_range(rows, size, rank)
    data = rows_of(rows, cols, lo, hi)
    pl = sm.placement("cpu", list(range(size)))
    x = sm.to_global(np.ascontiguousarray(data[:, :cols]), placement=pl, sbp=sm.sbp.split(0))
    b = sm.to_global(np.ascontiguousarray(data[:, cols]), placement=pl, sbp=sm.sbp.split(0))
    del data
    calls = {"qr": lambda: xp.linalg.qr(x), "svd": lambda: xp.linalg.svd(x, full_matrices=False),
             "lstsq": lambda: sm.linalg.lstsq(x, b)}
    # warm up on a small matrix: imports, the consistency check's caches, BLAS threads
    small = sm.to_global(np.ones((2 * cols, cols)) + np.eye(2 * cols, cols) * (rank + 1),
                         placement=pl, sbp=sm.sbp.split(0))
    xp.linalg.qr(small), xp.linalg.svd(small, full_matrices=False)
    sm.linalg.lstsq(small, small[:, 0])

    def slowest(t: float) -> float:
        return max(sm.comm.all_gather_object(t))

    res = measure(calls, reps, sm.comm.barrier, slowest, sm.comm.all_gather_object)
    return {"rank": rank, "size": size, "shard": x.to_local().nbytes, "whole": x.nbytes,
            "calls": res}


def worker_heat(rows: int, cols: int, reps: int) -> dict[str, Any]:
    import heat as ht
    import numpy as np
    import torch

    comm = ht.MPI_WORLD
    rank, size = comm.rank, comm.size
    lo, hi = split_range(rows, size, rank)
    data = rows_of(rows, cols, lo, hi)
    local = torch.from_numpy(np.ascontiguousarray(data[:, :cols]))
    del data
    a = ht.array(local, is_split=0)
    a.balance_()  # Heat's own even split (it matches ours)
    calls = {"qr": lambda: ht.linalg.qr(a), "svd": lambda: ht.linalg.svd(a)}
    small = ht.array(torch.ones(2 * cols, cols, dtype=torch.float64) +
                     torch.eye(2 * cols, cols, dtype=torch.float64), is_split=0)
    ht.linalg.qr(small), ht.linalg.svd(small)

    def slowest(t: float) -> float:
        return max(comm.handle.allgather(t))

    res = measure(calls, reps, comm.handle.Barrier, slowest, comm.handle.allgather)
    return {"rank": rank, "size": size, "shard": a.larray.numel() * 8,
            "whole": rows * cols * 8,
            "calls": res, "version": ht.__version__}


WORKERS = {"numpy": worker_numpy, "sbpmpi": worker_sbpmpi, "heat": worker_heat}


# -- the driver ----------------------------------------------------------------------------------

def run_job(python: str, mpiexec: str | None, n: int, worker: str, args: argparse.Namespace,
            threads: int | None) -> dict[str, Any] | str:
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", SBPMPI_COST_CACHE="off")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    if threads is not None:
        for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            env[v] = str(threads)
    cmd = [python, __file__, "--worker", worker, "--rows", str(args.rows), "--cols",
           str(args.cols), "--reps", str(args.reps)]
    if mpiexec is not None:
        cmd = [mpiexec, "-n", str(n), *cmd]
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3000)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"did not run: {e}"
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        return f"did not run (exit {done.returncode}): {tail[0][:200]}"
    return json.loads(lines[-1])  # type: ignore[no-any-return]


def _median_of_rounds(rounds: list[Any]) -> Any:
    """One job's rounds as one result: per call the median of the rounds' medians and the
    largest growth; a message when no round ran."""
    done = [r for r in rounds if isinstance(r, dict)]
    if not done:
        return rounds[-1]
    out = dict(done[0])
    out["calls"] = {call: {"seconds": statistics.median(r["calls"][call]["seconds"] for r in done),
                           "growth": [max(g) for g in zip(*(r["calls"][call]["growth"]
                                                             for r in done))],
                           "rounds": [r["calls"][call]["seconds"] for r in done]}
                    for call in done[0]["calls"]}
    return out


def _cell(r: Any, call: str, key: str) -> Any:
    """A job's median seconds (``key`` "s") or largest growth in MiB ("g") for ``call``."""
    if not isinstance(r, dict) or call not in r["calls"]:
        return None
    v = r["calls"][call]
    return v["seconds"] if key == "s" else max(v["growth"]) / MIB


def table(results: dict[str, Any], args: argparse.Namespace) -> str:
    whole = args.rows * args.cols * 8
    numpy, numpy1 = results.get("numpy"), results.get("numpy 1 thread")
    lines = [f"{args.rows} x {args.cols} float64 ({whole / MIB:.0f} MiB), median of "
             f"{args.reps} (of each of {args.rounds} interleaved rounds); growth: the "
             f"largest per-rank peak growth during the call",
             "",
             "| call | n | sbpmpi s | Heat s | NumPy s | NumPy 1 thread s | sbpmpi / Heat | "
             "NumPy / sbpmpi | sbpmpi growth MiB | Heat growth MiB | NumPy growth MiB |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for call in ("qr", "svd", "lstsq"):
        for n in args.sizes:
            ours = results.get(f"sbpmpi n={n}")
            heat = results.get(f"heat n={n}")

            s, h, p, p1 = (_cell(r, call, "s") for r in (ours, heat, numpy, numpy1))
            gs, gh, gp = (_cell(r, call, "g") for r in (ours, heat, numpy))

            def f(v: Any, fmt: str = "{:.3f}") -> str:
                return "-" if v is None else fmt.format(v)

            lines.append(
                f"| {call} | {n} | {f(s)} | {f(h)} | {f(p)} | {f(p1)} | "
                f"{f(s / h if s and h else None, '{:.2f}x')} | "
                f"{f(p / s if s and p else None, '{:.2f}x')} | {f(gs, '{:.1f}')} | "
                f"{f(gh, '{:.1f}')} | {f(gp, '{:.1f}')} |")
    notes = [f"{k}: {v}" for k, v in results.items() if isinstance(v, str)]
    return "\n".join(lines + ([""] + notes if notes else []))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=400_003)
    ap.add_argument("--cols", type=int, default=24)
    ap.add_argument("--sizes", type=lambda s: [int(v) for v in s.split(",")], default=[2, 4])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=1,
                    help="run every job this many times, the jobs interleaved; report the "
                         "median over the rounds of each job's median")
    ap.add_argument("--heat-python", default="/work/venv-heat/bin/python")
    ap.add_argument("--json")
    ap.add_argument("--worker", choices=sorted(WORKERS))
    args = ap.parse_args()
    if args.worker:
        result = WORKERS[args.worker](args.rows, args.cols, args.reps)
        if result.pop("rank", 0) == 0:
            print(json.dumps(result), flush=True)
        return
    mpiexec = shutil.which("mpiexec", path=str(Path(sys.executable).parent)) or \
        shutil.which("mpiexec")
    heat_py = args.heat_python
    heat_mpiexec = shutil.which("mpiexec", path=str(Path(heat_py).parent)) \
        if heat_py and Path(heat_py).exists() else None
    jobs: list[tuple[str, str, str | None, int, str, int | None]] = [
        ("numpy", sys.executable, None, 1, "numpy", None),
        ("numpy 1 thread", sys.executable, None, 1, "numpy", 1)]
    for n in args.sizes:
        jobs.append((f"sbpmpi n={n}", sys.executable, mpiexec, n, "sbpmpi", 1))
        jobs.append((f"heat n={n}", heat_py, heat_mpiexec, n, "heat", 1))
    runs: dict[str, list[Any]] = {name: [] for name, *_ in jobs}
    for _ in range(args.rounds):
        for name, python, launcher, n, worker, threads in jobs:
            if worker == "heat" and heat_mpiexec is None:
                runs[name].append(f"not run: no Heat Python at {heat_py!r}")
                continue
            runs[name].append(run_job(python, launcher, n, worker, args, threads))
    results = {name: _median_of_rounds(r) for name, r in runs.items()}
    print(table(results, args))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
