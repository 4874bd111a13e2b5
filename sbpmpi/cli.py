"""The command line: ``python -m sbpmpi info`` and ``python -m sbpmpi bench``.

``info`` prints the MPI library and version, whether it is CUDA-aware (and why), the
GPUs each rank sees and is bound to, and the boxing cost table. Run it alone or under
``mpiexec -n N`` (rank 0 prints one row per rank).

``bench`` runs the boxing benchmark (:mod:`sbpmpi.boxing.bench`) under ``mpiexec``: it
times SBP conversions against the raw mpi4py call that moves the same data, prints the
tables and writes a PNG plot of bandwidth against size (with matplotlib when installed, otherwise with
the small pure-Python PNG writer below: zlib + struct and a 5x7 pixel font).
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import math
import os
import platform
import socket
import struct
import sys
import zlib
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

__all__ = ["main", "info", "collect_info", "format_info", "bench", "parse_size", "format_size",
           "bandwidth_series", "format_bandwidth", "Canvas", "draw_plot", "plot_lines"]


# -- info ------------------------------------------------------------------------------------

def _version(module: str) -> str:
    try:
        return str(importlib.import_module(module).__version__)
    except Exception:
        return "-"


def _rank_info() -> dict[str, Any]:
    """What this rank sees: host, local rank, visible GPUs, the GPU it is bound to."""
    from . import backend, env

    row: dict[str, Any] = {
        "rank": env.get_rank(),
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "local_rank": env.get_local_rank(),
        "local_size": env.get_local_world_size(),
        "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", "unset"),
        "gpus": backend.cuda_device_count(),
        "device": None,
        "gpu": "",
    }
    if row["gpus"]:
        try:
            dev = backend.bind_device()
            row["device"] = dev
            cp = importlib.import_module("cupy")
            props = cp.cuda.runtime.getDeviceProperties(dev)
            name = props["name"]
            name = name.decode() if isinstance(name, bytes) else str(name)
            row["gpu"] = f"{name} ({cp.cuda.Device(dev).pci_bus_id})"
        except Exception as e:  # report, do not fail: info is for diagnosing
            row["gpu"] = f"error: {type(e).__name__}: {e}"
    return row


def _comm_info() -> dict[str, Any]:
    from . import comm

    fn = getattr(comm, "info", None)
    if fn is None:
        return {"note": "sbpmpi.comm.info() is not available in this build"}
    try:
        out = fn()
        return dict(out) if isinstance(out, dict) else {"info": str(out)}
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}"}


def _cost_table(calibrate: bool) -> str:
    """The boxing cost table as text (``calibrate`` measures it now: collective)."""
    try:
        bx = importlib.import_module("sbpmpi.boxing")
    except Exception as e:
        return f"(sbpmpi.boxing failed to import: {type(e).__name__}: {e})"
    if calibrate and hasattr(bx, "calibrate"):
        table = bx.calibrate()
        return str(table)
    for name in ("cost_table", "get_cost_table", "current_cost_table"):
        obj = getattr(bx, name, None)
        if obj is None:
            continue
        try:
            table = obj() if callable(obj) else obj
        except Exception as e:
            return f"(boxing.{name}() failed: {type(e).__name__}: {e})"
        return str(table)
    return "(this build of sbpmpi.boxing has no cost table)"


def collect_info(calibrate: bool = False) -> dict[str, Any] | None:
    """Gather the report on rank 0 (collective over the world); None on other ranks."""
    from . import __version__, comm, env, launch

    rows = comm.all_gather_object(_rank_info())
    cinfo = _comm_info()
    table = _cost_table(calibrate)
    if env.get_rank() != 0:
        return None
    from mpi4py import MPI

    lib = launch.mpi_library()
    try:
        mpiexec = str(launch.find_mpiexec(check_family=False))
    except FileNotFoundError as e:
        mpiexec = f"not found: {e}"
    major, minor = MPI.Get_version()
    return {
        "sbpmpi": __version__,
        "python": platform.python_version(),
        "numpy": _version("numpy"),
        "mpi4py": _version("mpi4py"),
        "cupy": _version("cupy"),
        "mpi_library": lib.vendor,
        "mpi_library_version": lib.version,
        "mpi_library_path": lib.path,
        "mpi_standard": f"{major}.{minor}",
        "mpiexec": mpiexec,
        "world_size": len(rows),
        "hosts": len({r["host"] for r in rows}),
        "comm": cinfo,
        "ranks": rows,
        "cost_table": table,
    }


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    cells = [[str(c) for c in r] for r in rows]
    w = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(header)]
    out = ["  ".join(h.ljust(w[i]) for i, h in enumerate(header)).rstrip(),
           "  ".join("-" * n for n in w)]
    out += ["  ".join(c.ljust(w[i]) for i, c in enumerate(r)).rstrip() for r in cells]
    return out


def format_info(d: dict[str, Any]) -> str:
    """The ``info`` report as text."""
    lines = [
        f"sbpmpi {d['sbpmpi']}  (Python {d['python']}, NumPy {d['numpy']}, "
        f"mpi4py {d['mpi4py']}, CuPy {d['cupy']})",
        f"MPI library:  {d['mpi_library']}  (MPI standard {d['mpi_standard']})",
        f"              {d['mpi_library_version']}",
        f"library file: {d['mpi_library_path'] or 'unknown'}",
        f"mpiexec:      {d['mpiexec']}",
        f"world:        {d['world_size']} rank(s) on {d['hosts']} host(s)",
    ]
    c = d["comm"]
    aware = c.get("cuda_aware")
    if aware is not None:
        yn = "yes" if aware else "no"
        why = c.get("cuda_aware_reason") or c.get("reason") or ""
        lines.append(f"CUDA-aware:   {yn}" + (f"  ({why})" if why else ""))
    if c.get("gpu_transport"):
        lines.append(f"GPU transport: {c['gpu_transport']}  ({c.get('gpu_transport_reason', '')})")
    shown = {"mpi_library", "mpi_version", "mpi4py", "rank", "world_size", "cuda_aware",
             "cuda_aware_reason", "gpus_visible", "gpu", "ranks", "gpu_transport",
             "gpu_transport_reason"}
    rest = {k: v for k, v in c.items() if k not in shown}
    if rest:
        lines.append("communication (rank 0's sbpmpi.comm.info()):")
        lines += [f"  {k}: {v}" for k, v in rest.items()]
    lines.append("ranks:")
    header = ["rank", "host", "local", "CUDA_VISIBLE_DEVICES", "GPUs seen", "bound to", "GPU"]
    rows = [[r["rank"], r["host"], f"{r['local_rank']}/{r['local_size']}",
             r["CUDA_VISIBLE_DEVICES"], r["gpus"],
             "-" if r["device"] is None else f"device {r['device']}", r["gpu"] or "-"]
            for r in d["ranks"]]
    lines += ["  " + s for s in _table(header, rows)]
    lines.append("boxing cost table:")
    lines += ["  " + s for s in str(d["cost_table"]).splitlines()]
    return "\n".join(lines)


def info(argv: Sequence[str] = ()) -> int:
    """``python -m sbpmpi info [--json] [--calibrate]``."""
    ap = argparse.ArgumentParser(prog="python -m sbpmpi info",
                                 description="Show the MPI library, CUDA-awareness, the GPUs of "
                                             "each rank and the boxing cost table.")
    ap.add_argument("--json", action="store_true", help="print JSON instead of text")
    ap.add_argument("--calibrate", action="store_true",
                    help="measure the boxing cost table now (collective) instead of showing "
                         "the stored one, and refresh this machine's entry in the cache file "
                         "(sbpmpi.boxing.calibrate.cache_path())")
    a = ap.parse_args(list(argv))
    d = collect_info(calibrate=a.calibrate)
    if d is not None:
        print(json.dumps(d, indent=2, default=str) if a.json else format_info(d), flush=True)
    return 0


# -- bench -----------------------------------------------------------------------------------

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "KIB": 1 << 10, "M": 1 << 20,
          "MB": 1 << 20, "MIB": 1 << 20, "G": 1 << 30, "GB": 1 << 30, "GIB": 1 << 30}


def parse_size(text: str) -> int:
    """``"64K"`` -> 65536 bytes; ``"1M"``, ``"512"``, ``"2MiB"`` likewise."""
    t = text.strip().upper()
    i = len(t)
    while i and not t[i - 1].isdigit():
        i -= 1
    num, unit = t[:i], t[i:]
    if not num or unit not in _UNITS:
        raise ValueError(f"size {text!r} is not a number of bytes with an optional unit "
                         f"(K, M, G), e.g. 64K")
    return int(float(num) * _UNITS[unit])


def format_size(n: float) -> str:
    """Bytes as ``"64K"`` / ``"1M"`` (binary units)."""
    for unit, k in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= k:
            v = n / k
            return f"{v:.0f}{unit}" if abs(v - round(v)) < 1e-9 else f"{v:.1f}{unit}"
    return f"{int(n)}"


def _bench_run_kwargs(run: Any, device: str) -> dict[str, Any]:
    """The device argument for the boxing benchmark's ``run``, if it takes one."""
    params = inspect.signature(run).parameters
    for name in ("device_type", "device"):
        if name in params:
            return {name: device}
    if device != "cpu":
        raise ValueError(f"--device {device}: the boxing benchmark in this build measures "
                         f"'cpu' placements only")
    return {}


def bandwidth_series(results: Sequence[Any], itemsize: int) -> dict[str, list[tuple[float, float]]]:
    """Plot series from boxing benchmark results: label -> [(bytes, GB/s), ...].

    The bytes are those of the global tensor; bandwidth is bytes / time for sbpmpi
    (solid lines) and for the raw MPI call (labels starting with ``MPI``, dashed).
    Conversions that move no data (a local slice) are left out.
    """
    series: dict[str, list[tuple[float, float]]] = {}
    for r in results:
        if str(getattr(r, "plan", "")).startswith("local_") and ") -> " not in r.plan:
            continue
        nbytes = float(math.prod(r.shape)) * itemsize
        if r.sbpmpi_ms > 0:
            series.setdefault(f"sbpmpi {r.conversion}", []).append(
                (nbytes, nbytes / (r.sbpmpi_ms * 1e-3) / 1e9))
        if r.raw_ms > 0:
            series.setdefault(f"MPI {r.conversion}", []).append(
                (nbytes, nbytes / (r.raw_ms * 1e-3) / 1e9))
    order = [k for k in series if not k.startswith("MPI")] + \
        [k for k in series if k.startswith("MPI")]
    return {k: series[k] for k in order}


def format_bandwidth(results: Sequence[Any], itemsize: int) -> str:
    """Bandwidth table (global bytes / time) of boxing benchmark results."""
    rows = []
    for r in results:
        nbytes = float(math.prod(r.shape)) * itemsize
        rows.append([r.conversion, format_size(nbytes), "x".join(str(n) for n in r.shape),
                     f"{nbytes / (r.sbpmpi_ms * 1e-3) / 1e9:.3f}" if r.sbpmpi_ms > 0 else "-",
                     f"{nbytes / (r.raw_ms * 1e-3) / 1e9:.3f}" if r.raw_ms > 0 else "-"])
    return "\n".join(_table(["conversion", "bytes", "shape", "sbpmpi GB/s", "MPI GB/s"], rows))


def bench(argv: Sequence[str] = ()) -> int:
    """``python -m sbpmpi bench [--sizes ...] [--out plot.png] [--json file]``."""
    import numpy as np

    from . import env

    ap = argparse.ArgumentParser(
        prog="python -m sbpmpi bench",
        description="Run the boxing benchmark (sbpmpi.boxing.bench): each SBP conversion "
                    "against the raw mpi4py call moving the same data, in the same run. "
                    "Prints the tables and writes a PNG plot of bandwidth against size. "
                    "Run under mpiexec -n 2 or more.")
    ap.add_argument("--sizes", default="1M,16M,64M",
                    help="global tensor sizes, comma separated, in bytes with units K, M, G "
                         "(default 1M,16M,64M)")
    ap.add_argument("--repeats", type=int, default=10, help="timed repeats per size")
    ap.add_argument("--warmup", type=int, default=2, help="untimed repeats first")
    ap.add_argument("--overhead-repeats", type=int, default=300,
                    help="repeats of the tiny conversions that measure per-call overhead")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--out", default="sbpmpi-bench.png", help="PNG plot to write ('' for none)")
    ap.add_argument("--json", default="", help="also write the results as JSON to this file")
    a = ap.parse_args(list(argv))
    try:
        sizes = [parse_size(s) for s in a.sizes.split(",") if s.strip()]
    except ValueError as e:
        ap.error(str(e))
    if not sizes:
        ap.error("--sizes names no size")
    for name in ("repeats", "warmup", "overhead_repeats"):
        v = getattr(a, name)
        if v < (0 if name == "warmup" else 1):
            ap.error(f"--{name.replace('_', '-')} must be "
                     f"{'>= 0' if name == 'warmup' else 'positive'}, got {v}")
    try:
        from .boxing import bench as boxing_bench
    except ImportError as e:
        print(f"sbpmpi bench: the boxing benchmark is not available: {e}", file=sys.stderr)
        return 1
    try:
        extra = _bench_run_kwargs(boxing_bench.run, a.device)
    except ValueError as e:
        ap.error(str(e))
    rank, world = env.get_rank(), env.get_world_size()
    if world == 1 and rank == 0:
        print("note: one rank: conversions move no data; run under mpiexec -n 2 or more",
              file=sys.stderr)
    dtype = np.dtype(np.float32)
    results, small = boxing_bench.run([s / (1 << 20) for s in sizes], a.repeats, a.warmup,
                                      dtype=dtype, overhead_repeats=a.overhead_repeats, **extra)
    if rank != 0:
        return 0
    try:
        from .consistency import check_enabled

        checks = "on (SBPMPI_CHECK=0 turns them off)" if check_enabled() else "off"
    except Exception:  # pragma: no cover - trees without the checks
        checks = "n/a"
    print(f"{world} ranks, {a.device}, {dtype}; consistency checks {checks}", flush=True)
    print(boxing_bench.format_tables(results, small), flush=True)
    print("\nbandwidth = global tensor bytes / time", flush=True)
    print(format_bandwidth(results, dtype.itemsize), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"world_size": world, "device": a.device, "dtype": str(dtype),
                       "mpi": _mpi_library_line(),
                       "results": [asdict(r) for r in results],
                       "overhead": [asdict(r) for r in small]}, f, indent=1)
        print(f"wrote {a.json}")
    if a.out:
        how = plot_lines(a.out, bandwidth_series(results, dtype.itemsize),
                         title=f"boxing bandwidth, {world} ranks, {a.device}",
                         xlabel="global tensor size (bytes)", ylabel="bandwidth (GB/s)")
        print(f"wrote {a.out} ({how})")
    return 0


def _mpi_library_line() -> str:
    """First line of ``MPI.Get_library_version()``."""
    from mpi4py import MPI

    lines = MPI.Get_library_version().strip().splitlines()
    return lines[0].strip() if lines else "unknown MPI"


# -- bench: a PNG line plot without matplotlib -----------------------------------------------

# 5x7 pixel glyphs, one 5-bit row per entry (bit 4 = leftmost pixel); lowercase is drawn
# as uppercase.
_FONT: dict[str, tuple[int, ...]] = {
    "0": (14, 17, 19, 21, 25, 17, 14), "1": (4, 12, 4, 4, 4, 4, 14),
    "2": (14, 17, 1, 2, 4, 8, 31), "3": (31, 2, 4, 2, 1, 17, 14),
    "4": (2, 6, 10, 18, 31, 2, 2), "5": (31, 16, 30, 1, 1, 17, 14),
    "6": (6, 8, 16, 30, 17, 17, 14), "7": (31, 1, 2, 4, 8, 8, 8),
    "8": (14, 17, 17, 14, 17, 17, 14), "9": (14, 17, 17, 15, 1, 2, 12),
    "A": (14, 17, 17, 17, 31, 17, 17), "B": (30, 17, 17, 30, 17, 17, 30),
    "C": (14, 17, 16, 16, 16, 17, 14), "D": (28, 18, 17, 17, 17, 18, 28),
    "E": (31, 16, 16, 30, 16, 16, 31), "F": (31, 16, 16, 30, 16, 16, 16),
    "G": (14, 17, 16, 23, 17, 17, 15), "H": (17, 17, 17, 31, 17, 17, 17),
    "I": (14, 4, 4, 4, 4, 4, 14), "J": (7, 2, 2, 2, 2, 18, 12),
    "K": (17, 18, 20, 24, 20, 18, 17), "L": (16, 16, 16, 16, 16, 16, 31),
    "M": (17, 27, 21, 21, 17, 17, 17), "N": (17, 17, 25, 21, 19, 17, 17),
    "O": (14, 17, 17, 17, 17, 17, 14), "P": (30, 17, 17, 30, 16, 16, 16),
    "Q": (14, 17, 17, 17, 21, 18, 13), "R": (30, 17, 17, 30, 20, 18, 17),
    "S": (15, 16, 16, 14, 1, 1, 30), "T": (31, 4, 4, 4, 4, 4, 4),
    "U": (17, 17, 17, 17, 17, 17, 14), "V": (17, 17, 17, 17, 17, 10, 4),
    "W": (17, 17, 17, 21, 21, 21, 10), "X": (17, 17, 10, 4, 10, 17, 17),
    "Y": (17, 17, 17, 10, 4, 4, 4), "Z": (31, 1, 2, 4, 8, 16, 31),
    " ": (0, 0, 0, 0, 0, 0, 0), ".": (0, 0, 0, 0, 0, 12, 12), ",": (0, 0, 0, 0, 12, 4, 8),
    ":": (0, 12, 12, 0, 12, 12, 0), "-": (0, 0, 0, 31, 0, 0, 0), "_": (0, 0, 0, 0, 0, 0, 31),
    "/": (0, 1, 2, 4, 8, 16, 0), "(": (2, 4, 8, 8, 8, 4, 2), ")": (8, 4, 2, 2, 2, 4, 8),
    "%": (24, 25, 2, 4, 8, 19, 3), "+": (0, 4, 4, 31, 4, 4, 0), "=": (0, 0, 31, 0, 31, 0, 0),
    ">": (8, 4, 2, 1, 2, 4, 8), "<": (2, 4, 8, 16, 8, 4, 2), "[": (14, 8, 8, 8, 8, 8, 14),
    "]": (14, 2, 2, 2, 2, 2, 14), "|": (4, 4, 4, 4, 4, 4, 4), "*": (0, 4, 21, 14, 21, 4, 0),
    "'": (4, 4, 8, 0, 0, 0, 0), "#": (10, 10, 31, 10, 31, 10, 10),
}

_COLORS = ((31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189),
           (140, 86, 75), (227, 119, 194), (127, 127, 127))


class Canvas:
    """An RGB image in memory with the few drawing calls a line plot needs."""

    def __init__(self, width: int, height: int, bg: tuple[int, int, int] = (255, 255, 255)):
        if width < 1 or height < 1:
            raise ValueError(f"canvas size must be positive, got {width}x{height}")
        self.width, self.height = width, height
        self.px = bytearray(bytes(bg) * (width * height))

    def set(self, x: int, y: int, color: tuple[int, int, int]) -> None:
        if 0 <= x < self.width and 0 <= y < self.height:
            i = 3 * (y * self.width + x)
            self.px[i:i + 3] = bytes(color)

    def get(self, x: int, y: int) -> tuple[int, int, int]:
        i = 3 * (y * self.width + x)
        return self.px[i], self.px[i + 1], self.px[i + 2]

    def rect(self, x0: int, y0: int, x1: int, y1: int, color: tuple[int, int, int]) -> None:
        """Fill the rectangle with corners (x0, y0) and (x1, y1), both included."""
        for y in range(max(0, min(y0, y1)), min(self.height, max(y0, y1) + 1)):
            for x in range(max(0, min(x0, x1)), min(self.width, max(x0, x1) + 1)):
                self.set(x, y, color)

    def line(self, x0: int, y0: int, x1: int, y1: int, color: tuple[int, int, int],
             width: int = 1, dash: int = 0) -> None:
        """Bresenham line; ``dash`` > 0 draws ``dash`` pixels on, ``dash`` off."""
        dx, dy = abs(x1 - x0), -abs(y1 - y0)
        sx, sy = (1 if x0 < x1 else -1), (1 if y0 < y1 else -1)
        err, step = dx + dy, 0
        r = width // 2
        while True:
            if not dash or (step // dash) % 2 == 0:
                self.rect(x0 - r, y0 - r, x0 - r + width - 1, y0 - r + width - 1, color)
            if x0 == x1 and y0 == y1:
                break
            e2 = 2 * err
            if e2 >= dy:
                err += dy
                x0 += sx
            if e2 <= dx:
                err += dx
                y0 += sy
            step += 1

    def text(self, x: int, y: int, s: str, color: tuple[int, int, int] = (0, 0, 0),
             scale: int = 1, vertical: bool = False) -> None:
        """Draw ``s`` with its top-left corner at (x, y); ``vertical`` reads bottom-up."""
        for k, ch in enumerate(s):
            glyph = _FONT.get(ch.upper(), _FONT["#"])
            for row, bits in enumerate(glyph):
                for col in range(5):
                    if bits >> (4 - col) & 1:
                        gx, gy = 6 * k + col, row
                        for a in range(scale):
                            for b in range(scale):
                                if vertical:
                                    self.set(x + gy * scale + b, y - gx * scale - a, color)
                                else:
                                    self.set(x + gx * scale + a, y + gy * scale + b, color)

    def png(self) -> bytes:
        """The image as PNG bytes (8-bit RGB, no filtering)."""
        raw = b"".join(b"\x00" + bytes(self.px[3 * self.width * y:3 * self.width * (y + 1)])
                       for y in range(self.height))

        def chunk(kind: bytes, data: bytes) -> bytes:
            return (struct.pack(">I", len(data)) + kind + data
                    + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))

        ihdr = struct.pack(">IIBBBBB", self.width, self.height, 8, 2, 0, 0, 0)
        return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr)
                + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


def _decades(lo: float, hi: float, base: int = 10) -> list[float]:
    """Powers of ``base`` covering ``[lo, hi]``, at most about 9 of them."""
    a = math.floor(math.log(lo, base) + 1e-9)
    b = math.ceil(math.log(hi, base) - 1e-9)
    b = max(b, a + 1)
    step = max(1, math.ceil((b - a) / 8))
    a -= a % step
    b += -b % step
    return [float(base) ** k for k in range(a, b + 1, step)]


def _num(v: float) -> str:
    return f"{v:g}"


def draw_plot(series: dict[str, list[tuple[float, float]]], title: str = "", xlabel: str = "",
              ylabel: str = "", width: int = 900, height: int = 560) -> Canvas:
    """A log-log line plot of ``series`` (label -> [(x, y), ...], x, y > 0) on a Canvas.

    Series whose label starts with ``"MPI"`` are dashed; the others solid. A series and
    the MPI series of the same position share a color when they come in pairs.
    """
    pts = [(x, y) for s in series.values() for x, y in s if x > 0 and y > 0
           and math.isfinite(x) and math.isfinite(y)]
    c = Canvas(width, height)
    left, right, top, bottom = 80, 20, 40, 60
    pw, ph = width - left - right, height - top - bottom
    c.text(left, 12, title, scale=2)
    grey, black = (225, 225, 225), (0, 0, 0)
    if not pts:
        c.text(left, top + ph // 2, "no data", scale=2)
        return c
    xs = _decades(min(p[0] for p in pts), max(p[0] for p in pts), base=2)
    ys = _decades(min(p[1] for p in pts), max(p[1] for p in pts))
    lx0, lx1 = math.log10(xs[0]), math.log10(xs[-1])
    ly0, ly1 = math.log10(ys[0]), math.log10(ys[-1])

    def to_px(x: float, y: float) -> tuple[int, int]:
        return (left + round((math.log10(x) - lx0) / (lx1 - lx0) * pw),
                top + ph - round((math.log10(y) - ly0) / (ly1 - ly0) * ph))

    for v in xs:
        px, _ = to_px(v, ys[0])
        c.line(px, top, px, top + ph, grey)
        label = format_size(v) if v >= 1 else _num(v)
        c.text(px - 3 * len(label), top + ph + 8, label)
    for v in ys:
        _, py = to_px(xs[0], v)
        c.line(left, py, left + pw, py, grey)
        label = _num(v)
        c.text(left - 8 - 6 * len(label), py - 3, label)
    c.line(left, top, left, top + ph, black)
    c.line(left, top + ph, left + pw, top + ph, black)
    c.text(left + pw // 2 - 3 * len(xlabel), height - 22, xlabel)
    c.text(14, top + ph // 2 + 3 * len(ylabel), ylabel, vertical=True)
    names = list(series)
    c.rect(left + 4, top + 4, left + 48 + 6 * max(len(n) for n in names),
           top + 10 + 12 * len(names), (255, 255, 255))
    solid = [n for n in names if not n.startswith("MPI")]
    dashed = [n for n in names if n.startswith("MPI")]
    paired = len(solid) == len(dashed)
    for i, name in enumerate(names):
        if name in solid:
            color = _COLORS[solid.index(name) % len(_COLORS)]
        else:
            j = dashed.index(name) if paired else len(solid) + dashed.index(name)
            color = _COLORS[j % len(_COLORS)]
        data = sorted((x, y) for x, y in series[name] if x > 0 and y > 0
                      and math.isfinite(x) and math.isfinite(y))
        pix = [to_px(x, y) for x, y in data]
        for (a, b), (e, f) in zip(pix, pix[1:]):
            c.line(a, b, e, f, color, width=2, dash=6 if name in dashed else 0)
        for a, b in pix:
            c.rect(a - 2, b - 2, a + 2, b + 2, color)
        ly = top + 8 + 12 * i
        c.line(left + 10, ly + 3, left + 34, ly + 3, color, width=2,
               dash=4 if name in dashed else 0)
        c.text(left + 40, ly, name)
    return c


def plot_lines(path: str, series: dict[str, list[tuple[float, float]]], title: str = "",
               xlabel: str = "", ylabel: str = "") -> str:
    """Write a log-log line plot PNG to ``path``; return which writer drew it."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:
        with open(path, "wb") as f:
            f.write(draw_plot(series, title, xlabel, ylabel).png())
        return "built-in PNG writer"
    fig, ax = plt.subplots(figsize=(9, 5.6))
    for name, data in series.items():
        data = sorted(data)
        ax.plot([x for x, _ in data], [y for _, y in data], "--" if name.startswith("MPI")
                else "-", marker="o", label=name)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return "matplotlib"


# -- entry point -----------------------------------------------------------------------------

_COMMANDS = {"info": info, "bench": bench}


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m sbpmpi {info,bench} [options]``; returns the exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help") or args[0] not in _COMMANDS:
        print("usage: python -m sbpmpi {info,bench} [options]\n\n"
              "  info   MPI library, CUDA-awareness, GPUs per rank, boxing cost table\n"
              "  bench  boxing benchmark against raw MPI: table and PNG plot\n\n"
              "Run either alone or under mpiexec -n N; 'python -m sbpmpi CMD -h' for options.\n"
              "To launch programs: python -m sbpmpi.launch -n N prog.py [args]",
              file=sys.stdout if args[:1] in (["-h"], ["--help"]) else sys.stderr)
        if args and args[0] not in ("-h", "--help"):
            print(f"\nunknown command {args[0]!r}; expected one of {sorted(_COMMANDS)}",
                  file=sys.stderr)
        return 0 if args[:1] in (["-h"], ["--help"]) else 2
    return _COMMANDS[args[0]](args[1:])
