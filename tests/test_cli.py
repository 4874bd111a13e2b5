"""python -m sbpmpi info / bench, and the pure-Python PNG writer behind bench's plot."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
from mpirun import job_env, mpiexec

from sbpmpi import cli

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT = 180


def run(args, n=None, cwd=None, timeout=TIMEOUT):
    """``python -m sbpmpi ARGS``, under ``mpiexec -n n`` when n is given."""
    cmd = [sys.executable, "-m", "sbpmpi", *args]
    if n is not None:
        cmd = [*mpiexec(n), *cmd]
    return subprocess.run(cmd, cwd=cwd, env=job_env(n or 1, timeout), capture_output=True,
                          text=True, timeout=timeout)


def read_png(data: bytes) -> tuple[int, int, list[bytes]]:
    """Decode an 8-bit RGB PNG with filter 0 rows (what Canvas writes); check the CRCs."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width, height = 8, b"", 0, 0
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])
        assert crc == zlib.crc32(kind + body) & 0xFFFFFFFF, kind
        if kind == b"IHDR":
            width, height, depth, ctype = struct.unpack(">IIBB", body[:10])
            assert (depth, ctype) == (8, 2)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    raw = zlib.decompress(idat)
    stride = 1 + 3 * width
    rows = [raw[y * stride:(y + 1) * stride] for y in range(height)]
    assert all(r[0] == 0 for r in rows)
    return width, height, [r[1:] for r in rows]


def test_sizes_parse_and_print():
    assert cli.parse_size("512") == 512
    assert cli.parse_size("64K") == 64 * 1024
    assert cli.parse_size("1m") == 1 << 20
    assert cli.parse_size("2MiB") == 2 << 20
    assert cli.parse_size(" 1G ") == 1 << 30
    for bad in ("", "K", "12Q", "abc"):
        with pytest.raises(ValueError, match="is not a number of bytes"):
            cli.parse_size(bad)
    assert [cli.format_size(n) for n in (1, 1023, 1024, 1536, 1 << 20, 3 << 30)] == \
        ["1", "1023", "1K", "1.5K", "1M", "3G"]


def test_canvas_png_round_trip():
    c = cli.Canvas(7, 5)
    c.set(0, 0, (255, 0, 0))
    c.set(6, 4, (0, 0, 255))
    c.set(99, 99, (1, 2, 3))  # outside: ignored
    c.line(0, 4, 6, 0, (0, 200, 0))
    w, h, rows = read_png(c.png())
    assert (w, h) == (7, 5)
    for y in range(h):
        for x in range(w):
            assert tuple(rows[y][3 * x:3 * x + 3]) == c.get(x, y)
    assert c.get(0, 0) == (255, 0, 0)
    assert c.get(0, 4) == c.get(6, 0) == c.get(3, 2) == (0, 200, 0)  # ends and middle
    assert c.get(6, 4) == (0, 0, 255)
    assert c.get(1, 1) == (255, 255, 255)
    with pytest.raises(ValueError, match="canvas size"):
        cli.Canvas(0, 3)


def test_dashed_line_leaves_gaps():
    c = cli.Canvas(40, 3)
    c.line(0, 1, 39, 1, (0, 0, 0), dash=5)
    on = [c.get(x, 1) == (0, 0, 0) for x in range(40)]
    assert on[:5] == [True] * 5 and on[5:10] == [False] * 5 and on[10:15] == [True] * 5


def test_plot_draws_every_series():
    series = {"sbpmpi S(0)->B": [(1024, 0.1), (65536, 2.0), (1 << 20, 5.0)],
              "MPI Allgather": [(1024, 0.3), (65536, 4.0), (1 << 20, 9.0)]}
    c = cli.draw_plot(series, title="t", xlabel="size", ylabel="GB/s")
    w, h, rows = read_png(c.png())
    colors = {tuple(r[i:i + 3]) for r in rows for i in range(0, len(r), 3)}
    assert cli._COLORS[0] in colors  # both series of the pair share the first color
    assert (0, 0, 0) in colors  # axes and text
    # an empty plot and a one-point series still make an image
    read_png(cli.draw_plot({}).png())
    read_png(cli.draw_plot({"a": [(10, 1.0)]}).png())


def test_plot_lines_writes_a_png(tmp_path):
    out = tmp_path / "p.png"
    how = cli.plot_lines(str(out), {"MPI x": [(1, 1.0), (2, 3.0)]}, "t", "x", "y")
    assert how in ("matplotlib", "built-in PNG writer")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_usage_and_unknown_command():
    assert cli.main(["--help"]) == 0
    assert cli.main([]) == 2
    assert cli.main(["frobnicate"]) == 2


def test_info_single_process():
    from mpi4py import MPI

    r = run(["info", "--json"])
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["world_size"] == 1
    assert d["mpi_library_version"] == MPI.Get_library_version().strip().splitlines()[0].strip()
    assert d["ranks"][0]["rank"] == 0 and d["ranks"][0]["local_rank"] == 0
    assert os.path.isfile(d["mpiexec"].split(" (")[0])
    text = run(["info"])
    assert text.returncode == 0, text.stderr
    for part in ("MPI library:", "mpiexec:", "ranks:", "boxing cost table:", "CUDA_VISIBLE"):
        assert part in text.stdout


@pytest.mark.parametrize("n", [2, 3])
def test_info_under_mpiexec_prints_one_table_on_rank_0(n):
    r = run(["info", "--json"], n=n)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)  # exactly one JSON document: only rank 0 printed
    assert d["world_size"] == n
    assert [row["rank"] for row in d["ranks"]] == list(range(n))
    assert len({row["pid"] for row in d["ranks"]}) == n
    by_host: dict[str, list[int]] = {}
    for row in d["ranks"]:
        by_host.setdefault(row["host"], []).append(row["rank"])
    for row in d["ranks"]:
        peers = by_host[row["host"]]
        assert row["local_rank"] == peers.index(row["rank"])
        assert row["local_size"] == len(peers)


def test_bench_under_mpiexec_writes_table_json_and_png(tmp_path):
    sizes = ["64K", "256K"]
    r = run(["bench", "--sizes", ",".join(sizes), "--repeats", "2", "--warmup", "1",
             "--overhead-repeats", "3", "--out", "b.png", "--json", "b.json"], n=2, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    d = json.loads((tmp_path / "b.json").read_text())
    assert d["world_size"] == 2 and d["dtype"] == "float32"
    res = d["results"]
    convs = {x["conversion"] for x in res}
    assert {"S(0)->B", "P->B", "P->S(0)", "S(0)->S(1)"} <= convs
    for conv in convs:
        got = sorted(x["mib"] for x in res if x["conversion"] == conv)
        assert got == sorted(cli.parse_size(s) / (1 << 20) for s in sizes)
    for x in res:
        assert x["sbpmpi_ms"] > 0 and x["raw_ms"] > 0
        assert x["ratio"] == pytest.approx(x["sbpmpi_ms"] / x["raw_ms"])
        nbytes = x["shape"][0] * x["shape"][1] * 4
        assert 0 < nbytes <= x["mib"] * (1 << 20)
        assert x["conversion"] in r.stdout
    assert "bandwidth = global tensor bytes / time" in r.stdout
    png = (tmp_path / "b.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    if not _has_matplotlib():  # the built-in writer: decode it fully
        w, h, _ = read_png(png)
        assert (w, h) == (900, 560)


def test_bandwidth_series_from_results():
    from types import SimpleNamespace as R

    results = [R(conversion="S(0)->B", shape=(4, 256), sbpmpi_ms=2.0, raw_ms=1.0,
                 plan="all_gather(axis 0: S(0) -> B)"),
               R(conversion="S(0)->B", shape=(8, 256), sbpmpi_ms=2.0, raw_ms=4.0,
                 plan="all_gather(axis 0: S(0) -> B)"),
               R(conversion="B->S(0)", shape=(4, 256), sbpmpi_ms=0.01, raw_ms=0.001,
                 plan="local_slice(axis 0: B -> S(0))")]
    s = cli.bandwidth_series(results, itemsize=4)
    assert list(s) == ["sbpmpi S(0)->B", "MPI S(0)->B"]  # no data moved: not plotted
    assert s["sbpmpi S(0)->B"] == [(4096.0, 4096 / 2e-3 / 1e9), (8192.0, 8192 / 2e-3 / 1e9)]
    assert s["MPI S(0)->B"] == [(4096.0, 4096 / 1e-3 / 1e9), (8192.0, 8192 / 4e-3 / 1e9)]
    table = cli.format_bandwidth(results, 4)
    assert "B->S(0)" in table and f"{4096 / 2e-3 / 1e9:.3f}" in table


def test_bench_device_needs_support_in_the_benchmark():
    def run_cpu_only(sizes, repeats, warmup, dtype=None, overhead_repeats=1):
        return [], []

    def run_any(sizes, repeats, warmup, dtype=None, overhead_repeats=1, device_type="cpu"):
        return [], []

    assert cli._bench_run_kwargs(run_cpu_only, "cpu") == {}
    with pytest.raises(ValueError, match="'cpu' placements only"):
        cli._bench_run_kwargs(run_cpu_only, "cuda")
    assert cli._bench_run_kwargs(run_any, "cuda") == {"device_type": "cuda"}


def _has_matplotlib():
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def test_bench_rejects_bad_arguments(tmp_path):
    r = run(["bench", "--sizes", "12Q"], cwd=tmp_path)
    assert r.returncode == 2 and "12Q" in r.stderr
    r = run(["bench", "--repeats", "0"], cwd=tmp_path)
    assert r.returncode == 2 and "--repeats must be positive" in r.stderr
