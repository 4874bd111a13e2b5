"""The boxing benchmark's results as CSV and as a matplotlib plot.

``python -m sbpmpi bench`` writes a JSON document of its results (see
:func:`sbpmpi.tools.cli.bench`); this module turns that plain data into a CSV table and a
PNG of bandwidth (global tensor bytes / time) against size: one colour per
conversion, a solid line for sbpmpi and a dashed line for the raw MPI call moving the
same data, byte-size ticks, and a title naming the ranks, the device, the MPI library
and the date. matplotlib comes with the ``plot`` extra (``pip install 'sbpmpi[plot]'``);
``python -m sbpmpi plot bench.json`` redraws a saved run.

A tool module: the command line uses it, the library does not.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["format_bytes", "bandwidth_series", "write_csv", "CSV_COLUMNS", "have_matplotlib",
           "plot_bandwidth", "bandwidth_figure", "plot_title", "INSTALL_HINT"]

INSTALL_HINT = "pip install 'sbpmpi[plot]' (matplotlib)"
CSV_COLUMNS = ("conversion", "raw_call", "bytes", "shape", "raw_ms", "sbpmpi_ms", "ratio",
               "raw_GBps", "sbpmpi_GBps", "repeats", "spread", "noisy", "plan")


def format_bytes(n: float) -> str:
    """Bytes in binary units for axis ticks: ``"512 B"``, ``"64 KiB"``, ``"1.5 MiB"``."""
    for unit, k in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= k:
            v = n / k
            return f"{v:.0f} {unit}" if abs(v - round(v)) < 0.05 else f"{v:.1f} {unit}"
    return f"{n:.0f} B"


def _nbytes(row: Mapping[str, Any], itemsize: int) -> float:
    return float(math.prod(row["shape"])) * itemsize


def _moves_data(row: Mapping[str, Any]) -> bool:
    plan = str(row.get("plan", ""))
    return not (plan.startswith("local_") and ") -> " not in plan)


def bandwidth_series(rows: Sequence[Mapping[str, Any]], itemsize: int,
                     ) -> dict[str, dict[str, list[tuple[float, float]]]]:
    """conversion -> {"sbpmpi": [(bytes, GB/s), ...], "MPI": [...]}, sorted by bytes.

    ``rows`` are the benchmark's results as plain data (``sbpmpi.tools.bench.as_dict``).
    Conversions that move no data (a local slice) are left out.
    """
    out: dict[str, dict[str, list[tuple[float, float]]]] = {}
    for r in rows:
        if not _moves_data(r):
            continue
        nbytes = _nbytes(r, itemsize)
        pair = out.setdefault(str(r["conversion"]), {"sbpmpi": [], "MPI": []})
        for side, ms in (("sbpmpi", r["sbpmpi_ms"]), ("MPI", r["raw_ms"])):
            if ms > 0:
                pair[side].append((nbytes, nbytes / (ms * 1e-3) / 1e9))
    for pair in out.values():
        for side in pair:
            pair[side].sort()
    return out


def write_csv(rows: Sequence[Mapping[str, Any]], itemsize: int, path: str) -> None:
    """One line per measured conversion and size, columns :data:`CSV_COLUMNS`."""
    with open(path, "w", newline="", encoding="utf8") as f:
        w = csv.writer(f)
        w.writerow(CSV_COLUMNS)
        for r in rows:
            nbytes = _nbytes(r, itemsize)

            def gbps(ms: float, nbytes: float = nbytes) -> str:
                return f"{nbytes / (ms * 1e-3) / 1e9:.6g}" if ms > 0 else ""
            w.writerow([r["conversion"], r.get("raw_call", ""), int(nbytes),
                        "x".join(str(n) for n in r["shape"]), f"{r['raw_ms']:.6g}",
                        f"{r['sbpmpi_ms']:.6g}", f"{r['ratio']:.4g}", gbps(r["raw_ms"]),
                        gbps(r["sbpmpi_ms"]), r.get("repeats", ""),
                        f"{r.get('spread', float('nan')):.3g}", int(bool(r.get("noisy"))),
                        r.get("plan", "")])


def have_matplotlib() -> bool:
    """Whether matplotlib can be imported."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def plot_title(doc: Mapping[str, Any]) -> str:
    """``"sbpmpi boxing vs raw MPI: 4 ranks, cpu float32, MPICH 5.0.2, 2026-11-23"``."""
    device = doc.get("device", "cpu")
    if doc.get("gpu"):
        device = f"{device} ({doc['gpu']})"
    date = str(doc.get("date", ""))[:10]
    parts = [f"{doc.get('world_size', '?')} ranks", f"{device} {doc.get('dtype', '')}".strip(),
             str(doc.get("mpi_library") or doc.get("mpi", "MPI")), date]
    return "sbpmpi boxing vs raw MPI: " + ", ".join(p for p in parts if p)


def plot_bandwidth(doc: Mapping[str, Any], path: str, itemsize: int = 4) -> None:
    """Write the bandwidth plot of a benchmark document (``bench --json``) to ``path``.

    Raises ImportError without matplotlib.
    """
    import matplotlib.pyplot as plt

    fig = bandwidth_figure(doc, itemsize)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def bandwidth_figure(doc: Mapping[str, Any], itemsize: int = 4) -> Any:
    """The matplotlib Figure of :func:`plot_bandwidth` (one Axes; close it when done)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullLocator

    rows = list(doc.get("results", []))
    series = bandwidth_series(rows, itemsize)
    raw_call = {str(r["conversion"]): str(r.get("raw_call", "")) for r in rows}
    noisy = {(str(r["conversion"]), _nbytes(r, itemsize)) for r in rows if r.get("noisy")}
    colors = plt.get_cmap("tab10").colors  # type: ignore[attr-defined]
    fig, ax = plt.subplots(figsize=(10, 6.2))
    handles = []
    for i, (conv, pair) in enumerate(series.items()):
        color = colors[i % len(colors)]
        for side, style, marker in (("sbpmpi", "-", "o"), ("MPI", "--", "s")):
            pts = pair[side]
            if not pts:
                continue
            ax.plot([x for x, _ in pts], [y for _, y in pts], linestyle=style, marker=marker,
                    color=color, linewidth=2 if side == "sbpmpi" else 1.5, markersize=5,
                    markerfacecolor=color if side == "sbpmpi" else "white")
            if side == "sbpmpi":  # a ring around ratios flagged noisy
                bad = [(x, y) for x, y in pts if (conv, x) in noisy]
                if bad:
                    ax.plot([x for x, _ in bad], [y for _, y in bad], linestyle="none",
                            marker="o", markersize=12, markerfacecolor="none",
                            markeredgecolor="0.4")
        call = raw_call.get(conv)
        handles.append(Line2D([], [], color=color, linewidth=6,
                              label=f"{conv}  (raw: {call})" if call else conv))
    handles += [Line2D([], [], color="black", linestyle="-", marker="o", label="sbpmpi"),
                Line2D([], [], color="black", linestyle="--", marker="s",
                       markerfacecolor="white", label="raw MPI (mpi4py)")]
    if noisy:
        handles.append(Line2D([], [], linestyle="none", marker="o", markersize=12,
                              markerfacecolor="none", markeredgecolor="0.4",
                              label="noisy (< 5 repeats or max/min > 1.5)"))
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    xs = sorted({x for pair in series.values() for pts in pair.values() for x, _ in pts})
    if xs:
        lo, hi = math.floor(math.log2(xs[0]) + 0.05), math.ceil(math.log2(xs[-1]) - 0.05)
        step = max(1, math.ceil((hi - lo + 1) / 10))
        ax.xaxis.set_major_locator(FixedLocator([2.0 ** k for k in range(lo, hi + 1, step)]))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xlim(2.0 ** (math.log2(xs[0]) - 0.3), 2.0 ** (math.log2(xs[-1]) + 0.3))
    else:
        ax.text(0.5, 0.5, "no conversion that moves data was measured", ha="center",
                transform=ax.transAxes)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: format_bytes(v)))
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_xlabel("global tensor size")
    ax.set_ylabel("bandwidth: global bytes / time (GB/s)")
    ax.set_title(plot_title(doc), fontsize=11)
    ax.grid(True, which="major", alpha=0.3)
    ax.grid(True, which="minor", axis="y", alpha=0.1)
    ax.legend(handles=handles, fontsize=8, loc="best", framealpha=0.9)
    fig.tight_layout()
    return fig
