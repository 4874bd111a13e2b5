"""python -m sbpmpi info / bench / plot / --version, and bench's plot, CSV and progress."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from mpirun import job_env, mpiexec

from sbpmpi.tools import benchplot, cli

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 180


def run(args, n=None, cwd=None, timeout=TIMEOUT):
    """``python -m sbpmpi ARGS``, under ``mpiexec -n n`` when n is given."""
    cmd = [sys.executable, "-m", "sbpmpi", *args]
    if n is not None:
        cmd = [*mpiexec(n), *cmd]
    return subprocess.run(cmd, cwd=cwd, env=job_env(n or 1, timeout), capture_output=True,
                          text=True, timeout=timeout)


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
    assert d["mpi_library_version"] == MPI.Get_library_version().replace("\0", "").strip().splitlines()[0].strip()
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


def test_bench_under_mpiexec_writes_table_json_csv_and_png(tmp_path):
    sizes = ["64K", "256K"]
    r = run(["bench", "--sizes", ",".join(sizes), "--repeats", "2", "--warmup", "1",
             "--overhead-repeats", "3", "--out", "b.png", "--json", "b.json", "--csv", "b.csv"],
            n=2, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    d = json.loads((tmp_path / "b.json").read_text())
    assert d["world_size"] == 2 and d["dtype"] == "float32" and d["date"] and d["mpi_library"]
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
        assert x["repeats"] == 2 and x["noisy"] is True  # 2 repeats: too few to quote
    lines = r.stdout.splitlines()
    # the size table streams: one header, then one row per measurement, flagged noisy
    heads = [i for i, line in enumerate(lines) if line.startswith("boxing vs raw mpi4py")]
    assert len(heads) == 1
    rows = [line for line in lines if "  noisy  " in line]
    assert len(rows) == len(res)
    assert "note: " in r.stdout and "ratios are noisy" in r.stdout
    assert "bandwidth = global tensor bytes / time" in r.stdout
    with open(tmp_path / "b.csv", newline="") as f:
        table = list(csv.DictReader(f))
    assert len(table) == len(res) and set(table[0]) == set(benchplot.CSV_COLUMNS)
    assert {row["conversion"] for row in table} == convs
    if benchplot.have_matplotlib():
        assert (tmp_path / "b.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    else:
        assert not (tmp_path / "b.png").exists()
        assert "pip install 'sbpmpi[plot]'" in r.stdout


def test_version():
    from sbpmpi import __version__

    r = run(["--version"])
    assert r.returncode == 0 and r.stdout.strip() == f"sbpmpi {__version__}"
    assert __version__[0].isdigit()


def test_noisy_flag_and_note():
    from sbpmpi.tools import bench as bb

    def result(repeats, spread):
        return bb.Result("S(0)->B", 1.0, (4, 240), "p", 1.0, 1.1, 1.1, 2, "Allgather",
                         repeats, spread)
    assert not result(5, 1.5).noisy
    assert result(4, 1.0).noisy and result(10, 1.51).noisy
    assert bb.noisy_note([result(10, 1.2)]) == ""
    assert "1 of 2 ratios are noisy (repeats spread" in bb.noisy_note([result(10, 1.2),
                                                                         result(10, 2.0)])
    assert "fewer than 5 repeats" in bb.noisy_note([result(3, 1.0)])
    assert bb.as_dict(result(3, 1.0))["noisy"] is True
    assert bb.format_row("size", result(3, 1.0)).split()[5] == "noisy"


def test_rows_are_reported_as_they_are_measured(capsys):
    """run() hands each row to on_result before the next is measured (one rank here)."""
    from sbpmpi.tools import bench as bb

    seen = []
    printer = bb.printer(0)

    def on_result(kind, r):
        seen.append((kind, r.conversion))
        printer(kind, r)
    results, small = bb.run([0.03], repeats=1, warmup=0, overhead_repeats=1,
                            on_result=on_result)
    assert seen == [("size", r.conversion) for r in results] + \
        [("overhead", r.conversion) for r in small]
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("boxing vs raw mpi4py") and out.count("") == 1
    assert len(out) == 2 + len(results) + 1 + 2 + len(small)
    assert all(r.raw_call for r in results)


def row(conv, call, shape, ours_ms, raw_ms, plan, repeats=10, spread=1.0):
    """A benchmark result as bench writes it to JSON."""
    return {"conversion": conv, "raw_call": call, "shape": shape, "sbpmpi_ms": ours_ms,
            "raw_ms": raw_ms, "ratio": ours_ms / raw_ms, "plan": plan, "repeats": repeats,
            "spread": spread, "noisy": repeats < 5 or spread > 1.5}


ROWS = [
    row("S(0)->B", "Allgather", [4, 256], 2.0, 1.0, "all_gather(axis 0: S(0) -> B)"),
    row("S(0)->B", "Allgather", [8, 256], 2.0, 4.0, "all_gather(axis 0: S(0) -> B)", repeats=3),
    row("P->B", "Allreduce", [4, 256], 1.0, 1.0, "all_reduce(axis 0: P -> B)"),
    row("B->S(0)", "slice", [4, 256], 0.01, 0.001, "local_slice(axis 0: B -> S(0))"),
]


def test_bandwidth_series_pairs_each_conversion():
    s = benchplot.bandwidth_series(ROWS, itemsize=4)
    assert list(s) == ["S(0)->B", "P->B"]  # B->S(0) moves no data: not plotted
    assert s["S(0)->B"]["sbpmpi"] == [(4096.0, 4096 / 2e-3 / 1e9), (8192.0, 8192 / 2e-3 / 1e9)]
    assert s["S(0)->B"]["MPI"] == [(4096.0, 4096 / 1e-3 / 1e9), (8192.0, 8192 / 4e-3 / 1e9)]
    table = cli.format_bandwidth([type("R", (), r)() for r in ROWS], 4)
    assert "B->S(0)" in table and f"{4096 / 2e-3 / 1e9:.3f}" in table


def test_byte_ticks():
    assert [benchplot.format_bytes(n) for n in (512, 1024, 65536, 1.5 * (1 << 20), 1 << 30)] \
        == ["512 B", "1 KiB", "64 KiB", "1.5 MiB", "1 GiB"]


def test_csv_rows(tmp_path):
    benchplot.write_csv(ROWS, 4, str(tmp_path / "r.csv"))
    with open(tmp_path / "r.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["conversion"] for r in rows] == [r["conversion"] for r in ROWS]
    assert rows[0]["bytes"] == "4096" and rows[0]["shape"] == "4x256"
    assert float(rows[0]["sbpmpi_GBps"]) == pytest.approx(4096 / 2e-3 / 1e9)
    assert [r["noisy"] for r in rows] == ["0", "1", "0", "0"]


def test_outputs_without_a_plot_keep_json_and_csv():
    assert cli.outputs_for("b.png", "", "", True) == ("b.png", "", "")
    assert cli.outputs_for("b.png", "", "", False) == ("", "b.json", "b.csv")
    assert cli.outputs_for("b.png", "x.json", "", False) == ("", "x.json", "b.csv")
    assert cli.outputs_for("", "", "", True) == ("", "sbpmpi-bench.json", "sbpmpi-bench.csv")


DOC = {"world_size": 4, "device": "cpu", "dtype": "float32", "mpi_library": "MPICH 5.0.2",
       "date": "2026-11-23 04:00 UTC", "results": ROWS}


@pytest.mark.skipif(not benchplot.have_matplotlib(), reason="needs matplotlib (sbpmpi[plot])")
def test_plot_pairs_each_conversion_in_one_colour():
    import matplotlib.pyplot as plt

    fig = benchplot.bandwidth_figure(DOC, 4)
    try:
        ax = fig.axes[0]
        drawn = [ln for ln in ax.get_lines() if ln.get_linestyle() in ("-", "--")]
        by_colour: dict = {}
        for ln in drawn:
            by_colour.setdefault(ln.get_color(), []).append(ln.get_linestyle())
        assert sorted(map(sorted, by_colour.values())) == [["-", "--"], ["-", "--"]]
        title = ax.get_title()
        for part in ("4 ranks", "cpu", "MPICH 5.0.2", "2026-11-23"):
            assert part in title
        fig.canvas.draw()
        ticks = [t.get_text() for t in ax.get_xticklabels()]
        assert "4 KiB" in ticks and "8 KiB" in ticks
        legend = [t.get_text() for t in ax.get_legend().get_texts()]
        assert "S(0)->B  (raw: Allgather)" in legend and "sbpmpi" in legend
        assert any(t.startswith("noisy") for t in legend)  # ROWS[1] is noisy
    finally:
        plt.close(fig)


def test_plot_command_redraws_a_saved_run(tmp_path):
    (tmp_path / "b.json").write_text(json.dumps(DOC))
    r = run(["plot", "b.json", "--csv", "b.csv"], cwd=tmp_path)
    assert (tmp_path / "b.csv").exists()
    if benchplot.have_matplotlib():
        assert r.returncode == 0, r.stderr
        assert (tmp_path / "b.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    else:
        assert r.returncode == 1 and "sbpmpi[plot]" in r.stderr
    (tmp_path / "bad.json").write_text("[]")
    r = run(["plot", "bad.json"], cwd=tmp_path)
    assert r.returncode == 2 and "no 'results' list" in r.stderr


def test_bench_without_matplotlib_writes_json_and_csv_and_says_how(tmp_path, monkeypatch,
                                                                    capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(benchplot, "have_matplotlib", lambda: False)
    assert cli.main(["bench", "--sizes", "32K", "--repeats", "1", "--warmup", "0",
                     "--overhead-repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert (tmp_path / "sbpmpi-bench.json").exists() and (tmp_path / "sbpmpi-bench.csv").exists()
    assert not (tmp_path / "sbpmpi-bench.png").exists()
    assert "pip install 'sbpmpi[plot]'" in out
    assert "python -m sbpmpi plot sbpmpi-bench.json --out sbpmpi-bench.png" in out


def test_bench_rejects_bad_arguments(tmp_path):
    r = run(["bench", "--sizes", "12Q"], cwd=tmp_path)
    assert r.returncode == 2 and "12Q" in r.stderr
    r = run(["bench", "--repeats", "0"], cwd=tmp_path)
    assert r.returncode == 2 and "--repeats must be positive" in r.stderr
