"""Benchmark a training step of a two-layer MLP on global tensors.

    mpiexec -n 2 python scripts/bench_train.py [--batch 1024 --features 512 --hidden 512]
        [--reps 10] [--json out.json]

Per layout (data parallel, data parallel with gradient buckets (``sm.nn.DataParallel``:
the all-reduces start during backward), tensor parallel, 2-D on a (n/2) x 2 mesh when
n >= 4 is even) the median time of one SGD step (forward, cross-entropy, backward,
update) of ``relu(x @ W1 + b1) @ W2 + b2``, the slowest rank's, against

* the single-process NumPy step at the same global batch (rank 0 alone, the other
  ranks idle without spinning): the scaling ratio; 0.5 is perfect at 2 ranks;
* the same data-parallel step written by hand with NumPy and mpi4py (local gradients,
  one ``Allreduce`` per parameter): the framework's overhead;
* torch DDP (gloo, CPU) when torch is importable.

Two sizes: a compute-bound one (the flags) and a tiny one (batch 32, 16 features,
16 hidden) where per-step overhead dominates. ``--bucket-cap-mb`` and
``--first-bucket-mb`` set the buckets (DDP's 25 and 1 by default; with a smaller first
bucket the last layer's gradients are reduced while the first layer's are computed). BLAS runs one thread per rank
(OMP/OPENBLAS/MKL_NUM_THREADS=1 are set before NumPy loads). Rank 0 prints a table
and, with ``--json``, writes the numbers.
"""

from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_v] = "1"

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

import sbpmpi as sm  # noqa: E402

world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
S, B = sm.sbp.split, sm.sbp.broadcast
N_CLASSES = 16


def median_step(fn: Callable[[], None], reps: int, warmup: int = 2) -> float:
    """Median over ``reps`` steps of the slowest rank's seconds per step."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        world.Barrier()
        t0 = time.perf_counter()
        fn()
        times.append(world.allreduce(time.perf_counter() - t0, op=MPI.MAX))
    return statistics.median(times)


def idle_until_rank0_done(work: Callable[[], float]) -> float:
    """Rank 0 runs ``work``; the others wait without spinning a core."""
    result = work() if rank == 0 else 0.0
    req = world.Ibarrier()
    while not req.Test():
        time.sleep(0.002)
    return float(world.bcast(result, root=0))


def init(d_in: int, d_hid: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    k1, k2 = 1 / np.sqrt(d_in), 1 / np.sqrt(d_hid)
    return [rng.uniform(-k1, k1, (d_in, d_hid)), rng.uniform(-k1, k1, d_hid),
            rng.uniform(-k2, k2, (d_hid, N_CLASSES)), rng.uniform(-k2, k2, N_CLASSES)]


def numpy_grads(p: list[np.ndarray], x: np.ndarray, y: np.ndarray, n_total: int
                ) -> list[np.ndarray]:
    """Gradients of the mean cross-entropy over ``n_total`` samples, from the local ones."""
    w1, b1, w2, b2 = p
    a = x @ w1 + b1
    h = np.maximum(a, 0)
    z = h @ w2 + b2
    z -= z.max(1, keepdims=True)
    e = np.exp(z)
    dz = e / e.sum(1, keepdims=True)
    dz[np.arange(len(y)), y] -= 1
    dz /= n_total
    dh = (dz @ w2.T) * (a > 0)
    return [x.T @ dh, dh.sum(0), h.T @ dz, dz.sum(0)]


def sgd(p: list[np.ndarray], grads: list[np.ndarray], lr: float = 0.01) -> None:
    for a, g in zip(p, grads):
        a -= lr * g


def layouts(bucket_cap_mb: float, first_bucket_mb: float) -> dict[str, dict[str, Any]]:
    pl = sm.placement("cpu", list(range(size)))
    dp = dict(pl=pl, x=(S(0),), w1=(B,), w2=(B,))
    out = {"data parallel": dp,
           "DP, buckets": dict(dp, buckets=(bucket_cap_mb, first_bucket_mb)),
           "tensor parallel": dict(pl=pl, x=(B,), w1=(S(1),), w2=(S(0),))}
    if size >= 4 and size % 2 == 0:
        mesh = sm.placement("cpu", np.arange(size).reshape(size // 2, 2).tolist())
        out["2-D"] = dict(pl=mesh, x=(S(0), B), w1=(B, S(1)), w2=(B, S(0)))
    return out


class _Params(sm.nn.Module):
    """The four parameters as a module, for ``sm.nn.DataParallel``."""

    def __init__(self, params: list[sm.GlobalTensor]) -> None:
        self.w1, self.b1, self.w2, self.b2 = params


_keep: list[Any] = []  # the DataParallel wrappers of the runs (their buckets stay in use)


def sbpmpi_step(lay: dict[str, Any], p0: list[np.ndarray], x: np.ndarray, y: np.ndarray
                ) -> Callable[[], None]:
    pl = lay["pl"]
    b1 = tuple(S(0) if s == S(1) else B for s in lay["w1"])
    params = [sm.tensor(p0[0], placement=pl, sbp=lay["w1"], requires_grad=True),
              sm.tensor(p0[1], placement=pl, sbp=b1, requires_grad=True),
              sm.tensor(p0[2], placement=pl, sbp=lay["w2"], requires_grad=True),
              sm.tensor(p0[3], placement=pl, sbp=(B,) * pl.ndim, requires_grad=True)]
    w1, bb1, w2, bb2 = params
    if "buckets" in lay:
        cap, first = lay["buckets"]
        _keep.append(sm.nn.DataParallel(_Params(params), bucket_cap_mb=cap,
                                        first_bucket_mb=first))
    opt = sm.optim.SGD(params, lr=0.01)
    xt = sm.tensor(x, placement=pl, sbp=lay["x"])
    ysbp = tuple(s if s == S(0) else B for s in lay["x"])
    yt = sm.tensor(y, placement=pl, sbp=ysbp)

    def step() -> None:
        opt.zero_grad()
        logits = sm.relu(xt @ w1 + bb1) @ w2 + bb2
        sm.nn.cross_entropy(logits, yt).backward()
        opt.step()

    return step


def raw_dp_step(p0: list[np.ndarray], x: np.ndarray, y: np.ndarray) -> Callable[[], None]:
    p = [a.copy() for a in p0]
    lo, hi = rank * len(y) // size, (rank + 1) * len(y) // size
    xl, yl = x[lo:hi], y[lo:hi]

    def step() -> None:
        grads = numpy_grads(p, xl, yl, len(y))
        for g in grads:
            world.Allreduce(MPI.IN_PLACE, g, op=MPI.SUM)
        sgd(p, grads)

    return step


def torch_ddp_step(p0: list[np.ndarray], x: np.ndarray, y: np.ndarray, bucket_cap_mb: float
                   ) -> Callable[[], None] | None:
    try:
        import torch
        import torch.distributed as dist
    except Exception:  # noqa: BLE001 - any import failure means: not available here
        return None
    torch.set_num_threads(1)
    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(world.bcast(29500 + os.getpid() % 1000)))
        dist.init_process_group("gloo", rank=rank, world_size=size)
    model = torch.nn.Sequential(torch.nn.Linear(p0[0].shape[0], p0[0].shape[1]),
                                torch.nn.ReLU(),
                                torch.nn.Linear(p0[2].shape[0], N_CLASSES)).double()
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=bucket_cap_mb)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    lo, hi = rank * len(y) // size, (rank + 1) * len(y) // size
    xl, yl = torch.from_numpy(x[lo:hi]), torch.from_numpy(y[lo:hi])

    def step() -> None:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(ddp(xl), yl).backward()
        opt.step()

    return step


def bench(name: str, n: int, d_in: int, d_hid: int, reps: int, buckets: tuple[float, float]
          ) -> list[dict[str, Any]]:
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((n, d_in)), rng.integers(0, N_CLASSES, size=n)
    p0 = init(d_in, d_hid)

    def one_process() -> float:
        p = [a.copy() for a in p0]
        ts = []
        for i in range(reps + 2):
            t0 = time.perf_counter()
            sgd(p, numpy_grads(p, x, y, n))
            if i >= 2:
                ts.append(time.perf_counter() - t0)
        return statistics.median(ts)

    single = idle_until_rank0_done(one_process)
    raw = median_step(raw_dp_step(p0, x, y), reps)
    rows = []
    for lname, lay in layouts(*buckets).items():
        t = median_step(sbpmpi_step(lay, p0, x, y), reps)
        rows.append(dict(size=name, shape=f"{n}x{d_in}x{d_hid}x{N_CLASSES}", layout=lname,
                         step_ms=t * 1e3, one_process_ms=single * 1e3, vs_one_process=t / single,
                         raw_dp_ms=raw * 1e3, vs_raw_dp=t / raw))
    tstep = torch_ddp_step(p0, x, y, buckets[0])
    tddp = median_step(tstep, reps) if tstep is not None else None
    for r in rows:
        r["torch_ddp_ms"] = None if tddp is None else tddp * 1e3
        r["vs_torch_ddp"] = None if tddp is None else r["step_ms"] / (tddp * 1e3)
    rows.append(dict(size=name, shape=rows[0]["shape"], layout="mpi4py DP by hand",
                     step_ms=raw * 1e3, one_process_ms=single * 1e3,
                     vs_one_process=raw / single, raw_dp_ms=raw * 1e3, vs_raw_dp=1.0,
                     torch_ddp_ms=rows[0]["torch_ddp_ms"],
                     vs_torch_ddp=None if tddp is None else raw / tddp))
    if tddp is not None:
        rows.append(dict(size=name, shape=rows[0]["shape"], layout="torch DDP",
                         step_ms=tddp * 1e3, one_process_ms=single * 1e3,
                         vs_one_process=tddp / single, raw_dp_ms=raw * 1e3,
                         vs_raw_dp=tddp / raw, torch_ddp_ms=tddp * 1e3, vs_torch_ddp=1.0))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--features", type=int, default=512)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--bucket-cap-mb", type=float, default=25.0)
    ap.add_argument("--first-bucket-mb", type=float, default=1.0)
    ap.add_argument("--json", default="", help="also write the results here")
    a = ap.parse_args()
    buckets = (a.bucket_cap_mb, a.first_bucket_mb)
    rows = bench("compute-bound", a.batch, a.features, a.hidden, a.reps, buckets)
    rows += bench("tiny", 32, 16, 16, max(a.reps, 50), buckets)
    if rank != 0:
        return

    def f(v: Any, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    print(f"bench_train: {size} ranks, one BLAS thread per rank, float64, SGD; medians")
    head = ["size", "shape", "layout", "step ms", "1-proc ms", "x 1-proc", "mpi4py DP ms",
            "x mpi4py", "torch DDP ms", "x torch"]
    table = [head] + [[r["size"], r["shape"], r["layout"], f(r["step_ms"], ".2f"),
                       f(r["one_process_ms"], ".2f"), f(r["vs_one_process"], ".2f"),
                       f(r["raw_dp_ms"], ".2f"), f(r["vs_raw_dp"], ".2f"),
                       f(r["torch_ddp_ms"], ".2f"), f(r["vs_torch_ddp"], ".2f")] for r in rows]
    widths = [max(len(row[j]) for row in table) for j in range(len(head))]
    for row in table:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
    if rows[0]["torch_ddp_ms"] is None:
        print("(torch is not importable here: no torch DDP column)")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"ranks": size, "bucket_cap_mb": a.bucket_cap_mb,
                       "first_bucket_mb": a.first_bucket_mb, "results": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
