"""Benchmark: boxing conversions against the raw mpi4py call a user would write.

    mpiexec -n 4 python scripts/bench_boxing.py [--sizes-mib 1,16,64] [--json out.json]

Each conversion (``sm.boxing.box``, the engine behind ``x.to_global``) is timed at each
size in the same run as its raw counterpart (raw and
sbpmpi alternate, after warm-up); a repeat's time is the slowest rank's, and the
table reports medians and the ratio sbpmpi / raw. Both sides allocate their output,
as user code converting a layout must. A second table measures the per-conversion
Python overhead on tiny tensors: the best repeat of sbpmpi minus the best repeat of
the raw call (minima, because scheduling noise on a shared machine only adds time);
its last row goes through ``x.to_global``, which adds ``sbpmpi.runtime.consistency``'s
cross-rank check (``SBPMPI_CHECK=0`` turns it off).

Rank 0 prints each row as soon as it is measured. A ratio is flagged ``noisy`` when it
comes from fewer than 5 repeats, or when either side's repeats spread wider than
max / min = 1.5: repeat with more ``--repeats`` on a quieter machine before quoting it.

The raw reference calls mpi4py directly: that is what is being compared against.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from mpi4py import MPI

__all__ = ["main", "run", "Result", "format_header", "format_row", "format_tables",
           "noisy_note", "printer", "as_dict", "RAW_CALLS",
           "NOISY_MIN_REPEATS", "NOISY_SPREAD", "received_share"]

NOISY_MIN_REPEATS = 5  # fewer repeats than this: the median is not worth quoting
NOISY_SPREAD = 1.5  # max / min of one side's repeats wider than this: a noisy machine


@dataclass
class Result:
    """One measured conversion."""

    conversion: str
    mib: float
    shape: tuple[int, ...]
    plan: str
    raw_ms: float
    sbpmpi_ms: float
    ratio: float
    world_size: int
    raw_call: str = ""  # the mpi4py call it is compared with, e.g. "Allgather"
    repeats: int = 0
    spread: float = 1.0  # the wider of the two sides' max / min over the repeats

    @property
    def noisy(self) -> bool:
        """Too few repeats, or repeats too far apart, to quote the ratio."""
        return self.repeats < NOISY_MIN_REPEATS or self.spread > NOISY_SPREAD
    proxy_ms: float | None = None  # cuda: a device-to-device copy of the bytes a rank receives


def received_share(conversion: str, p: int) -> float:
    """Share of the global tensor each rank receives in ``conversion`` on ``p`` ranks (the
    algorithmic minimum: all-reduce moves it twice); the device-copy proxy copies this
    many bytes."""
    if p <= 1 or conversion.startswith("B->"):
        return 0.0
    if conversion.startswith("2x2"):
        return (2.0 if "(P,P)" in conversion else 1.0) * 3 / 4
    if conversion.startswith("P->B"):
        return 2 * (p - 1) / p
    if conversion.startswith("S(0)->S(1)"):
        return (p - 1) / (p * p)
    return (p - 1) / p


def _device_copy(nbytes: int) -> tuple[Callable[[], Any], Callable[[], Any]]:
    """(copy, same copy): a device-to-device copy of ``nbytes`` (the physical proxy)."""
    from .. import backend

    cp = backend.get_xp("cuda")
    src = cp.ones(max(nbytes, 1), dtype=np.uint8)
    dst = cp.empty_like(src)

    def copy() -> Any:
        dst[:nbytes] = src[:nbytes]
        return dst
    return copy, copy


Case = tuple[str, Callable[[], Any], Callable[[], Any], str]

# the raw mpi4py call each conversion is compared with (by name; 2x2 rows add the prefix)
RAW_CALLS = {"S(0)->B": "Allgather", "P->B": "Allreduce", "P->S(0)": "Reduce_scatter_block",
             "S(0)->S(1)": "Alltoall", "B->S(0)": "slice", "S(0)->B x.to_global": "Allgather",
             "2x2 (S(0),S(1))->(B,B)": "Allgather", "2x2 (P,P)->(B,B)": "Allreduce"}


def _spread(times: Any) -> float:
    lo = float(np.min(times))
    return float(np.max(times)) / lo if lo > 0 else float("inf")


def _time_pair(raw: Callable[[], Any], ours: Callable[[], Any], repeats: int,
               warmup: int, sync: Callable[[], None], best: bool = False,
               ) -> tuple[float, float, float]:
    """Median (or with ``best`` the minimum) over repeats of the slowest rank's seconds of
    ``raw`` and ``ours``, interleaved; and the wider spread (max / min) of the two."""
    world = MPI.COMM_WORLD
    for _ in range(warmup):
        raw()
        ours()
    sync()
    tr: list[float] = []
    to: list[float] = []
    for _ in range(repeats):
        for fn, acc in ((raw, tr), (ours, to)):
            world.Barrier()
            t0 = time.perf_counter()
            fn()
            sync()
            acc.append(time.perf_counter() - t0)
    both = np.array([tr, to])
    world.Allreduce(MPI.IN_PLACE, both, op=MPI.MAX)
    tr_max, to_max = both
    pick = min if best else statistics.median
    return float(pick(tr_max)), float(pick(to_max)), max(_spread(tr_max), _spread(to_max))


class _Raw:
    """The raw mpi4py calls, on host arrays or (CUDA-aware MPI) GPU arrays; without a
    CUDA-aware MPI, GPU data is copied to and from host arrays around the call, as user
    code would have to."""

    def __init__(self, xp: Any, dtype: np.dtype) -> None:
        from .. import backend, comm
        from ..comm.dtypes import dtype_info

        self.xp = xp
        self.t = dtype_info(dtype).mpi  # the datatype sm.comm sends ``dtype`` as
        self.gpu = xp is not np
        self.direct = not self.gpu or comm.is_cuda_aware()
        self._sync = backend.synchronize

    def __call__(self, fn: Callable[..., Any], send: Any, recv: Any, **kw: Any) -> None:
        if self.direct:
            if self.gpu:
                self._sync()
            fn([send, self.t], [recv, self.t], **kw)
            return
        hs = self.xp.asnumpy(send)
        hr = np.empty(recv.shape, dtype=hs.dtype)
        fn([hs, self.t], [hr, self.t], **kw)
        recv.set(hr)


def _cases(nbytes: int, dtype: np.dtype, device_type: str = "cpu",
           user_api: bool = False) -> list[Case]:
    """(name, raw, sbpmpi, plan) for a tensor of about ``nbytes``."""
    import sbpmpi as sm

    from .. import backend

    world = MPI.COMM_WORLD
    p, me = world.Get_size(), world.Get_rank()
    xp = backend.get_xp(device_type)
    mpi = _Raw(xp, dtype)
    cols = 240 * max(1, p // 4 * 2) if p > 4 else 240  # divisible by p for p <= 6
    rows = max(p, nbytes // (cols * dtype.itemsize) // (2 * p) * (2 * p))
    shape = (rows, cols)
    pl = sm.placement(device_type, list(range(p)))
    rng = np.random.default_rng(me)
    full = xp.asarray(rng.standard_normal(shape).astype(dtype))
    r = rows // p
    out: list[Case] = []

    def plan_of(x: Any, placement: Any = None, sbp: Any = None) -> str:
        return sm.boxing.plan_for(x, placement, sbp).summary()

    box = sm.boxing.box  # the engine itself; x.to_global adds sbpmpi.runtime.consistency's check

    # S(0) -> B: Allgather
    xs = sm.to_global(full[:r].copy(), placement=pl, sbp=sm.sbp.split(0))
    ls = xs.to_local()

    def raw_ag() -> Any:
        o = xp.empty(shape, dtype)
        mpi(world.Allgather, ls, o)
        return o
    out.append(("S(0)->B", raw_ag, lambda: box(xs, None, sm.sbp.broadcast),
                plan_of(xs, sbp=sm.sbp.broadcast)))

    # P -> B: Allreduce
    xp_ = sm.to_global(full, placement=pl, sbp=sm.sbp.partial_sum)
    lp = xp_.to_local()

    def raw_ar() -> Any:
        o = xp.empty_like(lp)
        mpi(world.Allreduce, lp, o, op=MPI.SUM)
        return o
    out.append(("P->B", raw_ar, lambda: box(xp_, None, sm.sbp.broadcast),
                plan_of(xp_, sbp=sm.sbp.broadcast)))

    # P -> S(0): Reduce_scatter_block
    def raw_rs() -> Any:
        o = xp.empty((r, cols), dtype)
        mpi(world.Reduce_scatter_block, lp, o, op=MPI.SUM)
        return o
    out.append(("P->S(0)", raw_rs, lambda: box(xp_, None, sm.sbp.split(0)),
                plan_of(xp_, sbp=sm.sbp.split(0))))

    # S(0) -> S(1): pack the column blocks, Alltoall
    c = cols // p

    def raw_a2a() -> Any:
        send = xp.ascontiguousarray(ls.reshape(r, p, c).transpose(1, 0, 2))
        o = xp.empty((rows, c), dtype)
        mpi(world.Alltoall, send, o)
        return o
    out.append(("S(0)->S(1)", raw_a2a, lambda: box(xs, None, sm.sbp.split(1)),
                plan_of(xs, sbp=sm.sbp.split(1))))

    # B -> S(0): a slice, no communication
    xb = sm.to_global(full, placement=pl, sbp=sm.sbp.broadcast)
    lb = xb.to_local()
    out.append(("B->S(0)", lambda: lb[me * r:(me + 1) * r],
                lambda: box(xb, None, sm.sbp.split(0)), plan_of(xb, sbp=sm.sbp.split(0))))

    if user_api:  # the same conversion through x.to_global (adds the consistency check)
        out.append(("S(0)->B x.to_global", raw_ag, lambda: xs.to_global(sbp=sm.sbp.broadcast),
                    plan_of(xs, sbp=sm.sbp.broadcast)))

    if p == 4:  # 2x2 mesh
        mesh = sm.placement(device_type, [[0, 1], [2, 3]])
        i, j = divmod(me, 2)
        rr, cc = rows // 2, cols // 2
        blk = full[i * rr:(i + 1) * rr, j * cc:(j + 1) * cc].copy()
        xm = sm.to_global(blk, placement=mesh, sbp=(sm.sbp.split(0), sm.sbp.split(1)))
        lm = xm.to_local()

        def raw_nd() -> Any:
            blocks = xp.empty((4, rr, cc), dtype)
            mpi(world.Allgather, lm, blocks)
            return blocks.reshape(2, 2, rr, cc).transpose(0, 2, 1, 3).reshape(rows, cols)
        bb = (sm.sbp.broadcast, sm.sbp.broadcast)
        out.append(("2x2 (S(0),S(1))->(B,B)", raw_nd, lambda: box(xm, None, bb),
                    plan_of(xm, sbp=bb)))
        xq = sm.to_global(full, placement=mesh, sbp=(sm.sbp.partial_sum, sm.sbp.partial_sum))
        lq = xq.to_local()

        def raw_nd_ar() -> Any:
            o = xp.empty_like(lq)
            mpi(world.Allreduce, lq, o, op=MPI.SUM)
            return o
        out.append(("2x2 (P,P)->(B,B)", raw_nd_ar, lambda: box(xq, None, bb),
                    plan_of(xq, sbp=bb)))
    return out


def run(sizes_mib: Sequence[float] = (1, 16, 64), repeats: int = 10, warmup: int = 2,
        dtype: Any = np.float32, overhead_repeats: int = 300, device_type: str = "cpu",
        on_result: Callable[[str, Result], None] | None = None,
        ) -> tuple[list[Result], list[Result]]:
    """Measure every conversion at every size, and the overhead at a tiny size.

    ``device_type="cuda"`` places the tensors (and the raw buffers) on the GPU.
    ``on_result(kind, result)`` is called on every rank as each row is measured, with
    ``kind`` ``"size"`` or ``"overhead"`` (for printing progress).
    """
    from .. import backend

    dt = np.dtype(dtype)
    p = MPI.COMM_WORLD.Get_size()

    def sync() -> None:
        if device_type != "cpu":
            backend.synchronize()

    def report(kind: str, r: Result) -> Result:
        if on_result is not None:
            on_result(kind, r)
        return r

    results = []
    for mib in sizes_mib:
        for name, raw, ours, plan in _cases(int(mib * (1 << 20)), dt, device_type):
            shape = tuple(ours().shape)
            tr, to, spread = _time_pair(raw, ours, repeats, warmup, sync)
            proxy = None
            if device_type == "cuda":
                nbytes = int(received_share(name, p) * math.prod(shape) * dt.itemsize)
                proxy = _time_pair(*_device_copy(nbytes), repeats, warmup, sync)[0] * 1e3
            results.append(report("size", Result(
                name, mib, shape, plan, tr * 1e3, to * 1e3, to / tr, p,
                RAW_CALLS.get(name, ""), repeats, spread, proxy)))
    small = []
    for name, raw, ours, plan in _cases(p * 2 * 240 * dt.itemsize, dt, device_type, True):
        tr, to, spread = _time_pair(raw, ours, overhead_repeats, 20, sync, best=True)
        small.append(report("overhead", Result(
            name, 0.0, tuple(ours().shape), plan, tr * 1e3, to * 1e3, to / tr, p,
            RAW_CALLS.get(name, ""), overhead_repeats, spread)))
    return results, small


def as_dict(r: Result) -> dict[str, Any]:
    """``r`` as plain data for JSON, with its ``noisy`` flag."""
    return asdict(r) | {"noisy": r.noisy}


def format_header(kind: str, p: int, proxy: bool = False) -> str:
    """Title and column names of the ``"size"`` or ``"overhead"`` table (``proxy``: with
    the device-copy columns of a cuda run)."""
    if kind == "size":
        return (f"boxing vs raw mpi4py, {p} ranks (medians of the slowest rank; ratio = "
                f"sbpmpi / raw; noisy: < {NOISY_MIN_REPEATS} repeats or max/min > "
                f"{NOISY_SPREAD:g})"
                + ("; copy = device-to-device copy of the bytes a rank receives, x copy = "
                   "sbpmpi / copy" if proxy else "") + "\n"
                f"{'conversion':<24}{'MiB':>6}{'raw ms':>10}{'sbpmpi ms':>11}{'ratio':>8}"
                + (f"{'copy ms':>10}{'x copy':>8}" if proxy else "") + f"{'':>7}  plan")
    return (f"per-conversion overhead on tiny tensors ({p} ranks; best of the repeats)\n"
            f"{'conversion':<24}{'shape':>12}{'raw us':>9}{'sbpmpi us':>11}{'overhead us':>13}")


def format_row(kind: str, r: Result) -> str:
    """One row of the ``"size"`` or ``"overhead"`` table."""
    if kind == "size":
        extra = ""
        if r.proxy_ms is not None:
            c = r.proxy_ms
            extra = f"{c:>10.3f}" + (f"{r.sbpmpi_ms / c:>8.1f}" if c > 0 else f"{'-':>8}")
        return (f"{r.conversion:<24}{r.mib:>6g}{r.raw_ms:>10.3f}{r.sbpmpi_ms:>11.3f}"
                f"{r.ratio:>8.2f}{extra}{'noisy' if r.noisy else '':>7}  {r.plan}")
    return (f"{r.conversion:<24}{str(r.shape):>12}{r.raw_ms * 1e3:>9.1f}"
            f"{r.sbpmpi_ms * 1e3:>11.1f}{(r.sbpmpi_ms - r.raw_ms) * 1e3:>13.1f}")


def format_tables(results: Sequence[Result], small: Sequence[Result]) -> str:
    """Both tables, whole (what rank 0 printed row by row while measuring)."""
    p = results[0].world_size if results else MPI.COMM_WORLD.Get_size()
    proxy = any(r.proxy_ms is not None for r in results)
    lines = [format_header("size", p, proxy), *(format_row("size", r) for r in results), "",
             format_header("overhead", p), *(format_row("overhead", r) for r in small)]
    return "\n".join(lines)


def noisy_note(results: Sequence[Result]) -> str:
    """A line saying how many ratios are noisy and what to do, or ``""``."""
    bad = [r for r in results if r.noisy]
    if not bad:
        return ""
    few = min(r.repeats for r in bad) < NOISY_MIN_REPEATS
    return (f"note: {len(bad)} of {len(results)} ratios are noisy ("
            + (f"fewer than {NOISY_MIN_REPEATS} repeats" if few else
               f"repeats spread wider than max/min {NOISY_SPREAD:g}")
            + "): rerun with more --repeats on a quieter machine before quoting them")


def printer(rank: int) -> Callable[[str, Result], None]:
    """An ``on_result`` for :func:`run` that prints each row on rank 0 as it comes."""
    started: set[str] = set()

    def show(kind: str, r: Result) -> None:
        if rank != 0:
            return
        if kind not in started:
            if started:
                print()
            print(format_header(kind, r.world_size, r.proxy_ms is not None), flush=True)
            started.add(kind)
        print(format_row(kind, r), flush=True)
    return show


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench_boxing", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes-mib", default="1,16,64",
                    help="tensor sizes in MiB, comma separated (default 1,16,64)")
    ap.add_argument("--repeats", type=int, default=10, help="timed repeats per size")
    ap.add_argument("--warmup", type=int, default=2, help="untimed repeats first")
    ap.add_argument("--overhead-repeats", type=int, default=300,
                    help="repeats of the tiny conversions")
    ap.add_argument("--json", default=None, help="write the results as JSON to this file")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                    help="placement type of the tensors (default cpu)")
    ap.add_argument("--calibrate", action="store_true",
                    help="measure the cost table first (sm.boxing.calibrate) so plans use it")
    a = ap.parse_args(argv)
    sizes = [float(s) for s in a.sizes_mib.split(",") if s]
    if a.calibrate:
        from ..runtime import calibrate

        table = calibrate()
        if MPI.COMM_WORLD.Get_rank() == 0:
            print(table, flush=True)
    rank = MPI.COMM_WORLD.Get_rank()
    results, small = run(sizes, a.repeats, a.warmup, overhead_repeats=a.overhead_repeats,
                         device_type=a.device, on_result=printer(rank))
    if rank == 0:
        note = noisy_note(results)
        if note:
            print(note, flush=True)
        if a.json:
            from ..comm.mpi_library import library_line

            doc = {"world_size": MPI.COMM_WORLD.Get_size(), "device": a.device,
                   "mpi": library_line(),
                   "results": [as_dict(r) for r in results],
                   "overhead": [as_dict(r) | {"overhead_us": (r.sbpmpi_ms - r.raw_ms) * 1e3}
                                for r in small]}
            with open(a.json, "w") as f:
                json.dump(doc, f, indent=1)
            print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
