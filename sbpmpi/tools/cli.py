"""The command line: ``python -m sbpmpi info``, ``bench``, ``plot`` and ``--version``.

``info`` prints the MPI library and version, whether it is CUDA-aware (and why), the
GPUs each rank sees and is bound to, and the boxing cost table. Run it alone or under
``mpiexec -n N`` (rank 0 prints one row per rank).

``bench`` runs the boxing benchmark (:mod:`sbpmpi.tools.bench`) under ``mpiexec``: it
times SBP conversions against the raw mpi4py call that moves the same data, prints each
row as it is measured, and writes JSON, CSV and (with matplotlib, the ``plot`` extra) a
PNG of bandwidth against size (:mod:`sbpmpi.tools.benchplot`). ``plot`` redraws the PNG from
a saved JSON file.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import math
import os
import platform
import socket
import sys
from collections.abc import Sequence
from typing import Any

__all__ = ["main", "info", "collect_info", "format_info", "bench", "plot", "parse_size",
           "format_size", "format_bandwidth", "outputs_for"]


# -- info ------------------------------------------------------------------------------------

def _version(module: str) -> str:
    try:
        return str(importlib.import_module(module).__version__)
    except Exception:
        return "-"


def _rank_info() -> dict[str, Any]:
    """What this rank sees: host, local rank, visible GPUs, the GPU it is bound to."""
    from .. import backend, env

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
    from .. import comm

    try:
        return dict(comm.info())
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}"}


def _cost_table(calibrate: bool) -> str:
    """The boxing cost table as text (``calibrate`` measures it now: collective)."""
    from .. import boxing

    if calibrate:
        return str(boxing.calibrate())
    try:
        return str(boxing.get_cost_table())
    except Exception as e:
        return f"(boxing.get_cost_table() failed: {type(e).__name__}: {e})"


def collect_info(calibrate: bool = False) -> dict[str, Any] | None:
    """Gather the report on rank 0 (collective over the world); None on other ranks."""
    from .. import __version__, comm, env
    from . import launch

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
                         "(sbpmpi.runtime.calibrate.cache_path())")
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


def format_bandwidth(results: Sequence[Any], itemsize: int) -> str:
    """Bandwidth table (global bytes / time) of boxing benchmark results."""
    rows = []
    for r in results:
        nbytes = float(math.prod(r.shape)) * itemsize
        rows.append([r.conversion, format_size(nbytes), "x".join(str(n) for n in r.shape),
                     f"{nbytes / (r.sbpmpi_ms * 1e-3) / 1e9:.3f}" if r.sbpmpi_ms > 0 else "-",
                     f"{nbytes / (r.raw_ms * 1e-3) / 1e9:.3f}" if r.raw_ms > 0 else "-"])
    return "\n".join(_table(["conversion", "bytes", "shape", "sbpmpi GB/s", "MPI GB/s"], rows))


def outputs_for(out: str, json_path: str, csv_path: str, plotting: bool,
                ) -> tuple[str, str, str]:
    """(png, json, csv) paths to write: what was asked; without a plot (no matplotlib or
    ``--out ''``) the JSON and CSV default to the PNG's name, so the run is never lost."""
    stem = os.path.splitext(out)[0] if out else "sbpmpi-bench"
    if not plotting or not out:
        json_path = json_path or stem + ".json"
        csv_path = csv_path or stem + ".csv"
    return (out if plotting else ""), json_path, csv_path


def bench(argv: Sequence[str] = ()) -> int:
    """``python -m sbpmpi bench [--sizes ...] [--out plot.png] [--json f] [--csv f]``."""
    import numpy as np

    from .. import env

    ap = argparse.ArgumentParser(
        prog="python -m sbpmpi bench",
        description="Run the boxing benchmark (sbpmpi.tools.bench): each SBP conversion "
                    "against the raw mpi4py call moving the same data, in the same run. "
                    "Prints each row as it is measured, flags noisy ratios, and writes a PNG "
                    "of bandwidth against size (matplotlib: the 'plot' extra), JSON and CSV. "
                    "Run under mpiexec -n 2 or more.")
    ap.add_argument("--sizes", default="1M,16M,64M",
                    help="global tensor sizes, comma separated, in bytes with units K, M, G "
                         "(default 1M,16M,64M)")
    ap.add_argument("--repeats", type=int, default=10,
                    help="timed repeats per size (fewer than 5 are flagged noisy)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed repeats first")
    ap.add_argument("--overhead-repeats", type=int, default=300,
                    help="repeats of the tiny conversions that measure per-call overhead")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--out", default="sbpmpi-bench.png", help="PNG plot to write ('' for none)")
    ap.add_argument("--json", default="",
                    help="write the results as JSON to this file (default without a plot: "
                         "the PNG's name with .json)")
    ap.add_argument("--csv", default="",
                    help="write the results as CSV to this file (default without a plot: "
                         "the PNG's name with .csv)")
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
    from . import bench as boxing_bench
    from . import benchplot, launch

    rank, world = env.get_rank(), env.get_world_size()
    dtype = np.dtype(np.float32)
    if rank == 0:
        if world == 1:
            print("note: one rank: conversions move no data; run under mpiexec -n 2 or more",
                  file=sys.stderr)
        from ..runtime.consistency import check_enabled

        checks = "on (SBPMPI_CHECK=0 turns them off)" if check_enabled() else "off"
        print(f"{world} ranks, {a.device}, {dtype}, {launch.mpi_library().vendor}; consistency "
              f"checks {checks}; {a.repeats} repeats per size", flush=True)
    results, small = boxing_bench.run([s / (1 << 20) for s in sizes], a.repeats, a.warmup,
                                      dtype=dtype, overhead_repeats=a.overhead_repeats,
                                      device_type=a.device,
                                      on_result=boxing_bench.printer(rank))
    if rank != 0:
        return 0
    note = boxing_bench.noisy_note(results)
    if note:
        print(note, flush=True)
    print("\nbandwidth = global tensor bytes / time", flush=True)
    print(format_bandwidth(results, dtype.itemsize), flush=True)
    from ..comm.info import library_line

    doc = {"world_size": world, "device": a.device, "dtype": str(dtype),
           "itemsize": dtype.itemsize, "mpi_library": launch.mpi_library().vendor,
           "mpi": library_line(), "host": socket.gethostname(),
           "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "results": [boxing_bench.as_dict(r) for r in results],
           "overhead": [boxing_bench.as_dict(r) for r in small]}
    if a.device == "cuda":
        doc["gpu"] = _gpu_name()
    plotting = benchplot.have_matplotlib()
    png, json_path, csv_path = outputs_for(a.out, a.json, a.csv, plotting)
    if json_path:
        with open(json_path, "w") as f:
            json.dump(doc, f, indent=1)
        print(f"wrote {json_path}")
    if csv_path:
        benchplot.write_csv(doc["results"], dtype.itemsize, csv_path)
        print(f"wrote {csv_path}")
    if png:
        benchplot.plot_bandwidth(doc, png, dtype.itemsize)
        print(f"wrote {png}")
    elif a.out:
        print(f"no plot: matplotlib is not installed; {benchplot.INSTALL_HINT}, then "
              f"python -m sbpmpi plot {json_path} --out {a.out}", flush=True)
    return 0


def _gpu_name() -> str:
    try:
        cp = importlib.import_module("cupy")
        name = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)["name"]
        return name.decode() if isinstance(name, bytes) else str(name)
    except Exception:
        return ""


def plot(argv: Sequence[str] = ()) -> int:
    """``python -m sbpmpi plot bench.json [--out plot.png]``: redraw a saved benchmark."""
    from . import benchplot

    ap = argparse.ArgumentParser(prog="python -m sbpmpi plot",
                                 description="Draw the bandwidth plot of a saved benchmark "
                                             "(the JSON of python -m sbpmpi bench).")
    ap.add_argument("json", help="JSON file written by python -m sbpmpi bench")
    ap.add_argument("--out", default="", help="PNG to write (default: the JSON's name, .png)")
    ap.add_argument("--csv", default="", help="also write the results as CSV to this file")
    a = ap.parse_args(list(argv))
    try:
        with open(a.json, encoding="utf8") as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        ap.error(f"cannot read {a.json!r}: {e}")
    if not isinstance(doc, dict) or not isinstance(doc.get("results"), list):
        ap.error(f"{a.json!r} is not the JSON of python -m sbpmpi bench (no 'results' list)")
    itemsize = int(doc.get("itemsize", 4))
    if a.csv:
        benchplot.write_csv(doc["results"], itemsize, a.csv)
        print(f"wrote {a.csv}")
    if not benchplot.have_matplotlib():
        print(f"sbpmpi plot: matplotlib is not installed; {benchplot.INSTALL_HINT}",
              file=sys.stderr)
        return 1
    out = a.out or os.path.splitext(a.json)[0] + ".png"
    benchplot.plot_bandwidth(doc, out, itemsize)
    print(f"wrote {out}")
    return 0


# -- entry point -----------------------------------------------------------------------------

_COMMANDS = {"info": info, "bench": bench, "plot": plot}


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m sbpmpi {info,bench,plot} [options]`` or ``--version``; returns the exit
    status."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] in (["--version"], ["-V"]):
        from .._version import __version__

        print(f"sbpmpi {__version__}")
        return 0
    if not args or args[0] in ("-h", "--help") or args[0] not in _COMMANDS:
        print("usage: python -m sbpmpi {info,bench,plot} [options]\n"
              "       python -m sbpmpi --version\n\n"
              "  info   MPI library, CUDA-awareness, GPUs per rank, boxing cost table\n"
              "  bench  boxing benchmark against raw MPI: rows as measured, JSON, CSV, PNG\n"
              "  plot   draw the PNG of a saved bench JSON (needs matplotlib: sbpmpi[plot])\n\n"
              "Run info and bench alone or under mpiexec -n N; 'python -m sbpmpi CMD -h' for "
              "options.\n"
              "To launch programs: python -m sbpmpi.launch -n N (prog.py | -m mod | -c code)",
              file=sys.stdout if args[:1] in (["-h"], ["--help"]) else sys.stderr)
        if args and args[0] not in ("-h", "--help"):
            print(f"\nunknown command {args[0]!r}; expected one of {sorted(_COMMANDS)}",
                  file=sys.stderr)
        return 0 if args[:1] in (["-h"], ["--help"]) else 2
    return _COMMANDS[args[0]](args[1:])
