"""Large conversions in a loop: ``x.to_global`` against raw mpi4py, preallocated and not.

    mpiexec -n 2 python scripts/bench_reuse.py [--sizes-mib 1,16,64] [--repeats 15]
                                               [--block 1] [--json out.json]

For each conversion (S(0)->B, P->S(0), S(0)->S(1) of a float32 tensor of about the given
size) three things are timed in the same run, interleaved repeat by repeat after warm-up:

- ``prealloc``: the raw mpi4py call into an output (and pack buffer) allocated once,
  before the loop: the floor a hand-written loop can reach;
- ``alloc``: the raw call allocating its output on every call, as user code converting a
  layout must (what ``python -m sbpmpi bench`` compares with);
- ``sbpmpi``: ``y = x.to_global(sbp=...)`` in a loop;
- ``box``: ``sm.boxing.box``, the engine behind ``x.to_global`` without the cross-rank
  consistency check (``SBPMPI_CHECK``), which adds one small all-reduce per call: on an
  oversubscribed machine each extra synchronisation can cost a scheduling slice;
- ``redist``: ``sbpmpi.runtime.redistribute`` on the local shard, the compiled program
  alone (its data path and buffers, without the tensor layer above it).

So ``sbpmpi - box`` is the consistency check, ``box - redist`` the tensor layer (argument
checks, cache lookups, wrapping the result) and ``redist - prealloc`` the data path.

The order of the variants rotates from repeat to repeat. Every variant keeps its previous
result alive until the next one replaces it (as
``y = f(x)`` in a loop does), so a reused buffer is never the one still in use. A
repeat's time is the slowest rank's; the table gives medians and the ratios
sbpmpi / prealloc and sbpmpi / alloc. ``SBPMPI_HOST_POOL_BYTES=0`` turns sbpmpi's host
buffer pool off, for comparison.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from mpi4py import MPI

import sbpmpi as sm
from sbpmpi.backend import host_pool
from sbpmpi.core.layout import Layout
from sbpmpi.runtime import redistribute

world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
F32 = MPI.FLOAT

Variants = dict[str, Callable[[], Any]]


def cases(nbytes: int) -> list[tuple[str, tuple[int, ...], Variants]]:
    """(conversion, global shape, {variant: call}) for float32 tensors of about ``nbytes``."""
    p, me = size, rank
    cols = 240
    rows = max(p, nbytes // (cols * 4) // (2 * p) * (2 * p))
    r, c = rows // p, cols // p
    pl = sm.placement("cpu", list(range(p)))
    full = np.random.default_rng(me).standard_normal((rows, cols)).astype(np.float32)
    xs = sm.to_global(full[me * r:(me + 1) * r].copy(), placement=pl, sbp=sm.sbp.split(0))
    xq = sm.to_global(full, placement=pl, sbp=sm.sbp.partial_sum)
    ls, lq = xs.to_local(), xq.to_local()
    ag_out = np.empty((rows, cols), np.float32)
    rs_out = np.empty((r, cols), np.float32)
    a2a_send = np.empty((p, r, c), np.float32)
    a2a_out = np.empty((rows, c), np.float32)
    f32 = np.dtype(np.float32)

    def redist(x: Any, sbp: Any) -> Any:
        dst = Layout.make(x.shape, pl, sbp)
        local, src = x.to_local(), x.layout
        return lambda: redistribute(local, src, dst, f32)

    def ag(out: np.ndarray) -> np.ndarray:
        world.Allgather([ls, F32], [out, F32])
        return out

    def rs(out: np.ndarray) -> np.ndarray:
        world.Reduce_scatter_block([lq, F32], [out, F32], op=MPI.SUM)
        return out

    def a2a(send: np.ndarray, out: np.ndarray) -> np.ndarray:
        np.copyto(send, ls.reshape(r, p, c).transpose(1, 0, 2))
        world.Alltoall([send, F32], [out, F32])
        return out

    return [
        ("S(0)->B", (rows, cols), {
            "prealloc": lambda: ag(ag_out),
            "alloc": lambda: ag(np.empty((rows, cols), np.float32)),
            "sbpmpi": lambda: xs.to_global(sbp=sm.sbp.broadcast),
            "box": lambda: sm.boxing.box(xs, None, sm.sbp.broadcast),
            "redist": redist(xs, sm.sbp.broadcast)}),
        ("P->S(0)", (rows, cols), {
            "prealloc": lambda: rs(rs_out),
            "alloc": lambda: rs(np.empty((r, cols), np.float32)),
            "sbpmpi": lambda: xq.to_global(sbp=sm.sbp.split(0)),
            "box": lambda: sm.boxing.box(xq, None, sm.sbp.split(0)),
            "redist": redist(xq, sm.sbp.split(0))}),
        ("S(0)->S(1)", (rows, cols), {
            "prealloc": lambda: a2a(a2a_send, a2a_out),
            "alloc": lambda: a2a(np.empty((p, r, c), np.float32),
                                 np.empty((rows, c), np.float32)),
            "sbpmpi": lambda: xs.to_global(sbp=sm.sbp.split(1)),
            "box": lambda: sm.boxing.box(xs, None, sm.sbp.split(1)),
            "redist": redist(xs, sm.sbp.split(1))}),
    ]


def measure(variants: Variants, repeats: int, warmup: int, block: int) -> dict[str, list[float]]:
    """Seconds of each variant per repeat (slowest rank), interleaved; results are held
    until the variant's next call replaces them.

    Each repeat runs every variant for ``block`` consecutive calls (the order of variants
    rotates from repeat to repeat) and keeps the median of the calls after the first: the
    steady state of a loop of that conversion. The first call of a block follows another
    variant's memory traffic; with ``block=1`` it is the only call (every call then runs
    after a different variant).
    """
    held: dict[str, Any] = {}
    for _ in range(warmup):
        for k, fn in variants.items():
            held[k] = fn()
    names = list(variants)
    times = {k: np.zeros((repeats, block)) for k in names}
    for i in range(repeats):
        for k in names[i % len(names):] + names[:i % len(names)]:  # rotate: no fixed order
            fn = variants[k]
            for j in range(block):
                world.Barrier()
                t0 = time.perf_counter()
                held[k] = fn()
                times[k][i, j] = time.perf_counter() - t0
    worst = np.array([times[k] for k in names])
    world.Allreduce(MPI.IN_PLACE, worst, op=MPI.MAX)  # each call's slowest rank
    steady = worst[:, :, 1:] if block > 1 else worst
    per_repeat = np.median(steady, axis=2)
    return {k: [float(t) for t in per_repeat[n]] for n, k in enumerate(names)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes-mib", default="1,16,64")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--block", type=int, default=1,
                    help="consecutive calls of a variant per repeat; the first is left out "
                         "(1: single calls, each after another variant)")
    ap.add_argument("--json", default=None, help="also write the results to this file")
    a = ap.parse_args(argv)
    pool = host_pool.host_pool_limit()
    rows = []
    if rank == 0:
        print(f"x.to_global in a loop vs raw mpi4py, {size} ranks, float32 (medians of the "
              f"slowest rank over {a.repeats} interleaved repeats of {a.block} calls; host "
              f"pool limit: "
              f"{pool if pool is not None else 'none'} bytes)")
        print(f"{'conversion':<12}{'MiB':>5}{'prealloc ms':>13}{'alloc ms':>10}"
              f"{'sbpmpi ms':>11}{'x prealloc':>12}{'x alloc':>9}{'box ms':>9}{'box x pre':>11}"
              f"{'redist x pre':>14}{'paired':>8}{'spread':>8}", flush=True)
    for mib in (float(s) for s in a.sizes_mib.split(",") if s):
        for name, shape, variants in cases(int(mib * (1 << 20))):
            t = measure(variants, a.repeats, a.warmup, a.block)
            med = {k: statistics.median(v) for k, v in t.items()}
            spread = max(max(v) / min(v) for v in t.values())
            row = {"conversion": name, "mib": mib, "shape": list(shape),
                   **{f"{k}_ms": med[k] * 1e3 for k in med},
                   "ratio_prealloc": med["sbpmpi"] / med["prealloc"],
                   "ratio_alloc": med["sbpmpi"] / med["alloc"],
                   "box_ratio_prealloc": med["box"] / med["prealloc"],
                   "redist_ratio_prealloc": med["redist"] / med["prealloc"],
                   "paired_ratio_prealloc": statistics.median(
                       s / q for s, q in zip(t["sbpmpi"], t["prealloc"])),
                   "spread": spread, "repeats": a.repeats, "block": a.block}
            rows.append(row)
            if rank == 0:
                print(f"{name:<12}{mib:>5g}{row['prealloc_ms']:>13.3f}{row['alloc_ms']:>10.3f}"
                      f"{row['sbpmpi_ms']:>11.3f}{row['ratio_prealloc']:>12.3f}"
                      f"{row['ratio_alloc']:>9.3f}{row['box_ms']:>9.3f}"
                      f"{row['box_ratio_prealloc']:>11.3f}{row['redist_ratio_prealloc']:>14.3f}"
                      f"{row['paired_ratio_prealloc']:>8.3f}{spread:>8.2f}", flush=True)
    if rank == 0:
        doc = {"world_size": size, "host_pool_limit": pool,
               "host_pool_stats": host_pool.host_pool_stats() if pool is not None else None,
               "mpi": MPI.Get_library_version().splitlines()[0], "results": rows}
        text = json.dumps(doc, indent=1)
        if a.json:
            with open(a.json, "w") as f:
                f.write(text)
            print(f"wrote {a.json}")
        else:
            print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
