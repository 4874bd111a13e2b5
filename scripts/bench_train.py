"""Benchmark a data-parallel training step of an MLP: sbpmpi against NumPy, mpi4py and torch.

    mpiexec -n 2 python scripts/bench_train.py [--reps 21] [--json out.json]   # one run
    python scripts/bench_train.py --ranks 2 [--runs 3] [--json out.json]        # the driver

One SGD step (forward, cross-entropy, backward, update) of an MLP
``relu(... relu(x @ W1 + b1) ...) @ Wk + bk``, float64, timed as the slowest rank's
seconds, for these variants:

* ``1-proc``: the same step in NumPy on rank 0 alone at the same global batch (the
  other ranks idle without spinning a core): the scaling reference, 1/n is perfect;
* ``DP plain``: sbpmpi data parallel, each gradient all-reduced (blocking) when backward
  reaches its parameter;
* ``DP buckets``: the same model wrapped in ``sm.nn.DataParallel`` (gradients reduced
  in buckets whose all-reduces start during backward; ``--bucket-cap-mb`` and
  ``--first-bucket-mb``, DDP's 25 and 1 by default);
* ``mpi4py by hand``: NumPy gradients, then one ``Allreduce`` per gradient (no overlap);
* ``torch DDP``: ``DistributedDataParallel`` on gloo (CPU), when torch is importable;
* ``tensor parallel`` (and ``2-D`` on a (n/2) x 2 mesh when n >= 4 is even), for the
  two-layer models;
* with ``--graph``: ``DP graph``, ``DP buckets graph`` and ``TP graph``, the ``DP
  plain``, ``DP buckets`` and ``tensor parallel`` steps captured as graphs
  (``sm.graph``: replayed without op dispatch).

The variants are interleaved (each repetition runs every variant once, after a common
warm-up), so a slow stretch of a shared machine hits all of them alike; each variant's
time is the median over ``--reps`` repetitions. Three models: ``compute-bound``
(1024x512x512x16: 97% of the gradient bytes are the first layer's weight, which backward
produces last, so there is little compute to hide its all-reduce behind), ``deep``
(512 rows through 8 layers of 256x256 and a 256x16 head: gradients of similar size,
produced one after another, where a bucket's all-reduce can overlap the earlier layers'
backward) and ``tiny`` (32x16x16x16: per-step overhead). ``--models`` picks some.

``--malloc-keep`` makes glibc keep freed memory (``mallopt``: arrays up to 32 MiB from
the heap, never trimmed), in every variant alike: by default each fresh temporary of a
few MiB is a new ``mmap`` whose pages fault in on first touch, which costs the variants
that make more temporaries per step (the framework's) more than the hand-written one.

The driver (not an MPI program) starts the ``--ranks`` run ``--runs`` times and reports,
per variant, the median of the runs' medians (the runs listed beside it). BLAS runs one
thread per rank (OMP/OPENBLAS/MKL_NUM_THREADS=1 are set before NumPy loads). Rank 0 (or
the driver) prints a table and, with ``--json``, writes the numbers.
"""

from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_v] = "1"

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, NamedTuple  # noqa: E402

import numpy as np  # noqa: E402

N_CLASSES = 16
PLAIN, BUCKETS, ONE, RAW, DDP = "DP plain", "DP buckets", "1-proc", "mpi4py by hand", "torch DDP"
GRAPH = "DP graph"  # DP plain captured as a graph (--graph)


class Model(NamedTuple):
    """An MLP: ``batch`` rows, layer widths ``widths`` (input first, classes last)."""

    batch: int
    widths: tuple[int, ...]

    @property
    def shape(self) -> str:
        """``batch x widths``, a run of three or more equal widths written ``w^k``."""
        parts, ws = [str(self.batch)], list(self.widths)
        while ws:
            k = 1
            while k < len(ws) and ws[k] == ws[0]:
                k += 1
            parts += [str(ws[0])] * k if k < 3 else [f"{ws[0]}^{k}"]
            ws = ws[k:]
        return "x".join(parts)


MODELS = {
    "compute-bound": Model(1024, (512, 512, N_CLASSES)),
    "deep": Model(512, (256,) * 9 + (N_CLASSES,)),
    "tiny": Model(32, (16, 16, N_CLASSES)),
}
Step = Callable[[], None]


# ---- the worker (an MPI program) ----------------------------------------------------------------

def init(widths: tuple[int, ...], seed: int = 0) -> list[np.ndarray]:
    """``[W1, b1, W2, b2, ...]`` as torch's Linear initialises them."""
    rng = np.random.default_rng(seed)
    out = []
    for d_in, d_out in zip(widths[:-1], widths[1:]):
        k = 1 / np.sqrt(d_in)
        out += [rng.uniform(-k, k, (d_in, d_out)), rng.uniform(-k, k, d_out)]
    return out


def numpy_grads(p: list[np.ndarray], x: np.ndarray, y: np.ndarray, n_total: int
                ) -> list[np.ndarray]:
    """Gradients of the mean cross-entropy over ``n_total`` samples, from the local ones."""
    ws, bs = p[0::2], p[1::2]
    acts, pre = [x], []
    for i, (w, b) in enumerate(zip(ws, bs)):
        a = acts[-1] @ w + b
        pre.append(a)
        acts.append(np.maximum(a, 0) if i < len(ws) - 1 else a)
    z = acts[-1] - acts[-1].max(1, keepdims=True)
    e = np.exp(z)
    d = e / e.sum(1, keepdims=True)
    d[np.arange(len(y)), y] -= 1
    d /= n_total
    grads: list[np.ndarray] = [np.empty(0)] * len(p)
    for i in reversed(range(len(ws))):
        grads[2 * i], grads[2 * i + 1] = acts[i].T @ d, d.sum(0)
        if i:
            d = (d @ ws[i].T) * (pre[i - 1] > 0)
    return grads


def sgd(p: list[np.ndarray], grads: list[np.ndarray], lr: float = 0.01) -> None:
    for a, g in zip(p, grads):
        a -= lr * g


def keep_freed_memory() -> None:
    """glibc: serve arrays up to 32 MiB from the heap and never trim it, so that a step's
    fresh temporaries reuse memory instead of faulting in new pages (``--malloc-keep``)."""
    import ctypes

    m_trim_threshold, m_mmap_threshold = -1, -3
    libc = ctypes.CDLL("libc.so.6")
    if not (libc.mallopt(m_mmap_threshold, 32 << 20) and libc.mallopt(m_trim_threshold, 1 << 30)):
        raise RuntimeError("bench_train: mallopt refused --malloc-keep's settings")


def worker(argv: list[str]) -> None:
    from mpi4py import MPI

    import sbpmpi as sm

    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=21)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--bucket-cap-mb", type=float, default=25.0)
    ap.add_argument("--first-bucket-mb", type=float, default=1.0)
    ap.add_argument("--malloc-keep", action="store_true",
                    help="keep freed memory in the process (glibc mallopt), every variant")
    ap.add_argument("--graph", action="store_true",
                    help="also the sbpmpi steps captured as graphs (sm.graph): 'DP graph', "
                         "'DP buckets graph', 'TP graph'")
    ap.add_argument("--json", default="", help="also write the results here")
    a = ap.parse_args(argv)
    if a.malloc_keep:
        keep_freed_memory()
    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    S, B = sm.sbp.split, sm.sbp.broadcast
    keep: list[Any] = []  # the DataParallel wrappers (their buckets stay in use)

    def sbpmpi_step(m: Model, p0: list[np.ndarray], x: np.ndarray, y: np.ndarray,
                    layout: str, graph: bool = False) -> Step:
        pl = sm.placement("cpu", np.arange(size).reshape(size // 2, 2).tolist()
                          if layout == "2-D" else list(range(size)))
        if layout in (PLAIN, BUCKETS):
            xs, ws, bs = (S(0),), [(B,)] * (len(p0) // 2), [(B,)] * (len(p0) // 2)
        elif layout == "tensor parallel":
            xs, ws, bs = (B,), [(S(1),), (S(0),)], [(S(0),), (B,)]
        else:  # 2-D: data parallel on mesh axis 0, tensor parallel on axis 1
            xs, ws, bs = (S(0), B), [(B, S(1)), (B, S(0))], [(B, S(0)), (B, B)]
        params = []
        for i, v in enumerate(p0):
            sbp = ws[i // 2] if i % 2 == 0 else bs[i // 2]
            params.append(sm.tensor(v, placement=pl, sbp=sbp, requires_grad=True))
        if layout == BUCKETS:
            module = sm.nn.Module()
            for i, v in enumerate(params):  # attribute order: the parameters' order
                setattr(module, f"p{i}", v)
            keep.append(sm.nn.DataParallel(module, bucket_cap_mb=a.bucket_cap_mb,
                                           first_bucket_mb=a.first_bucket_mb))
        opt = sm.optim.SGD(params, lr=0.01)
        xt = sm.tensor(x, placement=pl, sbp=xs)
        yt = sm.tensor(y, placement=pl, sbp=tuple(s if s == S(0) else B for s in xs))
        n_layers = len(params) // 2

        def body(xt: Any, yt: Any) -> Any:
            opt.zero_grad()
            h = xt
            for i in range(n_layers):
                h = h @ params[2 * i] + params[2 * i + 1]
                if i < n_layers - 1:
                    h = sm.relu(h)
            loss = sm.nn.cross_entropy(h, yt)
            loss.backward()
            opt.step()
            return loss

        run = sm.graph(body) if graph else body  # captured: replayed without dispatch
        return lambda: run(xt, yt)

    def local_rows(n: int) -> slice:
        return slice(rank * n // size, (rank + 1) * n // size)

    def raw_step(p0: list[np.ndarray], x: np.ndarray, y: np.ndarray) -> Step:
        p = [v.copy() for v in p0]
        xl, yl = x[local_rows(len(y))], y[local_rows(len(y))]

        def step() -> None:
            grads = numpy_grads(p, xl, yl, len(y))
            for g in grads:
                world.Allreduce(MPI.IN_PLACE, g, op=MPI.SUM)
            sgd(p, grads)

        return step

    def one_process_step(p0: list[np.ndarray], x: np.ndarray, y: np.ndarray) -> Step:
        p = [v.copy() for v in p0]
        return lambda: sgd(p, numpy_grads(p, x, y, len(y)))

    def torch_step(m: Model, x: np.ndarray, y: np.ndarray) -> Step | None:
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
        layers: list[Any] = []
        for d_in, d_out in zip(m.widths[:-1], m.widths[1:]):
            layers += [torch.nn.Linear(d_in, d_out), torch.nn.ReLU()]
        model = torch.nn.Sequential(*layers[:-1]).double()
        ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=a.bucket_cap_mb)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
        rows = local_rows(len(y))
        xl, yl = torch.from_numpy(x[rows]), torch.from_numpy(y[rows])

        def step() -> None:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(ddp(xl), yl).backward()
            opt.step()

        return step

    def timed(name: str, fn: Step) -> float:
        """Seconds of one step: the slowest rank's; ``1-proc`` is rank 0's alone (the
        others wait without spinning)."""
        if name == ONE:
            t = 0.0
            if rank == 0:
                t0 = time.perf_counter()
                fn()
                t = time.perf_counter() - t0
            req = world.Ibarrier()
            while not req.Test():
                time.sleep(0.001)
            return float(world.bcast(t, root=0))
        world.Barrier()
        t0 = time.perf_counter()
        fn()
        return float(world.allreduce(time.perf_counter() - t0, op=MPI.MAX))

    rows = []
    for mname in a.models.split(","):
        m = MODELS[mname]
        rng = np.random.default_rng(1)
        x = rng.standard_normal((m.batch, m.widths[0]))
        y = rng.integers(0, N_CLASSES, size=m.batch)
        p0 = init(m.widths)
        steps: dict[str, Step] = {ONE: one_process_step(p0, x, y), RAW: raw_step(p0, x, y)}
        layouts = [PLAIN, BUCKETS]
        if len(m.widths) == 3:
            layouts.append("tensor parallel")
            if size >= 4 and size % 2 == 0:
                layouts.append("2-D")
        for lay in layouts:
            steps[lay] = sbpmpi_step(m, p0, x, y, lay)
        if a.graph:
            steps[GRAPH] = sbpmpi_step(m, p0, x, y, PLAIN, graph=True)
            steps["DP buckets graph"] = sbpmpi_step(m, p0, x, y, BUCKETS, graph=True)
            if "tensor parallel" in layouts:
                steps["TP graph"] = sbpmpi_step(m, p0, x, y, "tensor parallel", graph=True)
        t = torch_step(m, x, y)
        if t is not None:
            steps[DDP] = t
        times: dict[str, list[float]] = {k: [] for k in steps}
        for rep in range(a.warmup + a.reps):
            for k, fn in steps.items():
                s = timed(k, fn)
                if rep >= a.warmup:
                    times[k].append(s)
        for k, ts in times.items():
            rows.append(dict(model=mname, shape=m.shape, variant=k,
                             step_ms=statistics.median(ts) * 1e3))
    if rank != 0:
        return
    table = with_ratios(rows)
    print_table(table, f"bench_train: {size} ranks, float64, SGD, one BLAS thread per rank; "
                       f"medians of {a.reps} interleaved repetitions")
    if a.json:
        Path(a.json).write_text(json.dumps({
            "ranks": size, "reps": a.reps, "malloc_keep": a.malloc_keep,
            "bucket_cap_mb": a.bucket_cap_mb,
            "first_bucket_mb": a.first_bucket_mb, "results": table}, indent=1))


# ---- the table --------------------------------------------------------------------------------

def with_ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` with each step time over the model's 1-proc, DP plain, mpi4py and DDP ones."""
    ref = {(r["model"], r["variant"]): r["step_ms"] for r in rows}
    out = []
    for r in rows:
        r = dict(r)
        for key, variant in (("vs_one_process", ONE), ("vs_dp_plain", PLAIN),
                             ("vs_mpi4py", RAW), ("vs_torch_ddp", DDP)):
            base = ref.get((r["model"], variant))
            r[key] = None if base is None else r["step_ms"] / base
        out.append(r)
    return out


def print_table(table: list[dict[str, Any]], title: str) -> None:
    def f(v: Any, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    print(title)
    head = ["model", "shape", "variant", "step ms", "x 1-proc", "x DP plain", "x mpi4py",
            "x torch DDP"]
    lines = [head] + [[r["model"], r["shape"], r["variant"], f(r["step_ms"], ".2f"),
                       f(r["vs_one_process"], ".2f"), f(r["vs_dp_plain"], ".2f"),
                       f(r["vs_mpi4py"], ".2f"), f(r["vs_torch_ddp"], ".2f")]
                      for r in table]
    widths = [max(len(line[j]) for line in lines) for j in range(len(head))]
    for line in lines:
        print("  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip())
    if not any(r["variant"] == DDP for r in table):
        print("(torch is not importable here: no torch DDP rows)")


# ---- the driver -------------------------------------------------------------------------------

def driver(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", default="", help="also write the results here")
    a, rest = ap.parse_known_args(argv)
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(a.runs):
            out = Path(tmp) / f"run{i}.json"
            cmd = ["mpiexec", "-n", str(a.ranks), sys.executable, __file__, "--worker", *rest,
                   "--json", str(out)]
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
            if r.returncode != 0:
                sys.exit(f"bench_train: run {i + 1} failed ({r.returncode}):\n{r.stdout}\n"
                         f"{r.stderr}")
            runs.append(json.loads(out.read_text()))
    keys = [(r["model"], r["shape"], r["variant"]) for r in runs[0]["results"]]
    per_run = [{(r["model"], r["shape"], r["variant"]): r["step_ms"] for r in run["results"]}
               for run in runs]
    rows = [dict(model=k[0], shape=k[1], variant=k[2],
                 step_ms=statistics.median(p[k] for p in per_run),
                 runs_ms=[p[k] for p in per_run]) for k in keys]
    table = with_ratios(rows)
    print_table(table, f"bench_train: {a.ranks} ranks, float64, SGD, one BLAS thread per "
                       f"rank; medians of {a.runs} runs of medians of "
                       f"{runs[0]['reps']} interleaved repetitions")
    for r in table:
        print(f"  {r['model']:14s} {r['variant']:16s} runs: "
              + ", ".join(f"{v:.2f}" for v in r["runs_ms"]))
    if a.json:
        Path(a.json).write_text(json.dumps({
            "ranks": a.ranks, "runs": a.runs, "reps": runs[0]["reps"],
            "malloc_keep": runs[0]["malloc_keep"],
            "bucket_cap_mb": runs[0]["bucket_cap_mb"],
            "first_bucket_mb": runs[0]["first_bucket_mb"], "results": table}, indent=1))


if __name__ == "__main__":
    if "--worker" in sys.argv or "--ranks" not in sys.argv:
        argv = [v for v in sys.argv[1:] if v != "--worker"]
        worker(argv)
    else:
        driver(sys.argv[1:])
