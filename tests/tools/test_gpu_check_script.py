"""scripts/gpu_check.sh, the GPU check: one run that fits the device tool's lease (at most 8
minutes, steps in priority order with time kept for the later ones), whose every named file
exists (pytest collects nothing and exits 4 when a named file is missing), which runs end to
end on a machine without a GPU (every GPU step SKIP) and writes its summary and logs as it
goes; and scripts/gpu_table.py, the table it makes of the timings."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"
LEASE = 480  # seconds of one run on the GPU machine (8 minutes)
PATH_RE = re.compile(r"(?<![\w./-])((?:tests|scripts|examples)/[\w./-]+\.(?:py|sh))")
PRIORITY = ["env", "gpu-n2-staged", "gpu-n2-ipc", "cuda-core-n2", "bench-n2", "gpt-n2"]


def _env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "PYTHON": sys.executable, **extra}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


def _gpu_check(*args: str, timeout: float = 60, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=timeout, env=_env(**env))


def _steps() -> list[tuple[str, int, int, str]]:
    """(name, limit, kept, needs) of every step, in the script's order."""
    out = _gpu_check("list")
    assert out.returncode == 0, out.stderr
    rows = []
    for ln in out.stdout.splitlines():
        name, limit, _, _, kept, _, needs = ln.split()
        rows.append((name, int(limit), int(kept), needs))
    return rows


def test_the_steps_fit_one_run_in_priority_order():
    steps = _steps()
    names = [n for n, *_ in steps]
    assert len(set(names)) == len(names), names
    assert names[:len(PRIORITY)] == PRIORITY, names
    for later in ("gpu-n4-ipc", "pseudo-nodes", "bench-n4"):
        assert later in names[len(PRIORITY):], names
    budget = int(re.search(r"BUDGET=\$\{GPU_CHECK_BUDGET:-(\d+)\}", SCRIPT.read_text())[1])
    assert budget <= LEASE - 15, budget  # the setup (installing the wheels) comes first
    assert all(0 < limit <= budget // 2 and 0 <= kept <= limit for _, limit, kept, _ in steps)
    assert sum(kept for *_, kept, _ in steps) <= budget  # every kept time fits together
    assert all(kept > 0 for n, _, kept, _ in steps if n in PRIORITY)
    text = SCRIPT.read_text()
    assert 'timeout -k 10 "$secs" bash -c "$cmds"' in text  # every step under its limit


def test_every_path_it_names_exists():
    text = SCRIPT.read_text()
    out = _gpu_check(GPU_CHECK_DRY="1")  # the commands as every step runs them
    assert out.returncode == 0, out.stderr
    for name, *_ in _steps():
        assert f"== {name} " in out.stdout, (name, out.stdout)
    named = set(PATH_RE.findall(text)) | set(PATH_RE.findall(out.stdout))
    assert {"tests/comm/gpu/test_gpu_transport_cuda.py", "tests/comm/gpu/test_gpu_transport_mpi.py",
            "scripts/run_tests.py", "scripts/gpu_table.py", "examples/train_gpt.py"} <= named
    missing = sorted(p for p in named if not (ROOT / p).is_file())
    assert not missing, f"gpu_check.sh names files that do not exist: {missing}"
    if (ROOT.parent / "shared" / "gpu").is_dir():  # beside a developer's checkout
        shared = set(re.findall(r"\.\./shared/gpu/[\w.-]+", text))
        assert shared and all((ROOT / p).is_file() for p in shared), shared
    docs = (ROOT / "docs" / "gpu.md").read_text()  # the documented command runs the script
    assert "bash scripts/gpu_check.sh" in docs and "wheels.sh pytest-timeout" in docs


def test_an_unknown_step_is_refused():
    out = _gpu_check("no-such-step")
    assert out.returncode == 2 and "no step named 'no-such-step'" in out.stderr


def test_it_stops_at_once_when_sbpmpi_does_not_import(tmp_path):
    """After the setup, ``import sbpmpi`` failing (here an mpi4py that does not import, as
    where the carried wheels did not install) stops the script before any step (exit 3),
    saying what failed, the error's last line and what to check, in its output and in
    summary.md (it went on to fail or skip every step)."""
    broken = tmp_path / "broken" / "mpi4py"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text('raise ImportError("no mpi4py here (stand-in)")\n')
    py = tmp_path / "python"
    py.write_text(f"#!/bin/sh\nPYTHONPATH={broken.parent}${{PYTHONPATH:+:$PYTHONPATH}} "
                  f'exec {sys.executable} "$@"\n')
    py.chmod(0o755)
    out_dir = tmp_path / "out"
    t0 = time.monotonic()
    out = _gpu_check(timeout=120, OUT=str(out_dir), PYTHON=str(py), LOGS=str(tmp_path / "logs"))
    took = time.monotonic() - t0
    assert out.returncode == 3, out.stdout[-3000:] + out.stderr[-3000:]
    assert took < 60, took
    said = out.stderr
    assert 'import sbpmpi"` failed after the setup' in said, said
    assert "ImportError: no mpi4py here (stand-in)" in said, said  # the traceback's last line
    assert "Check:\n  - the wheels in .whl/" in said, said
    carried = any(ROOT.glob(".whl/*.whl"))  # a developer's checkout may hold them
    assert ("their install log" if carried else "none were carried") in said, said
    assert (out_dir / "summary.md").read_text() in said + "\n"
    assert "Traceback" in (out_dir / "import.log").read_text()
    assert not list(out_dir.glob("env*.log")) and "== env" not in out.stdout  # no step ran


def _summary(out_dir: Path) -> dict[str, tuple[str, str]]:
    """step -> (status, note) of the summary the script wrote."""
    rows = {}
    for ln in (out_dir / "summary.md").read_text().splitlines():
        cells = [c.strip() for c in ln.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0] not in ("step", "---"):
            rows[cells[0]] = (cells[1], cells[3])
    return rows


def test_without_a_gpu_it_runs_end_to_end_with_every_gpu_step_skipped(tmp_path):
    t0 = time.monotonic()
    out = _gpu_check(timeout=240, OUT=str(tmp_path), GPU_CHECK_NO_GPU="1",
                     LOGS=str(tmp_path / "logs"))
    took = time.monotonic() - t0
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert took < 240, took
    rows = _summary(tmp_path)
    steps = _steps()
    assert list(rows) == [n for n, *_ in steps]
    for name, _, _, needs in steps:
        status, note = rows[name]
        if needs == "any":
            assert status == "PASS", (name, rows)
            assert (tmp_path / f"{name}.log").is_file()
        else:
            assert status == "SKIP" and note, (name, rows)
    assert "GPU transport: ipc" in (tmp_path / "env.log").read_text()  # sbpmpi info ran
    assert "| env | PASS |" in out.stdout  # the summary closes the output


def test_a_budget_too_small_skips_every_step_with_the_reason(tmp_path):
    out = _gpu_check("env", timeout=60, OUT=str(tmp_path), GPU_CHECK_BUDGET="5")
    assert out.returncode == 0, out.stdout + out.stderr
    assert _summary(tmp_path) == {"env": ("SKIP", _summary(tmp_path)["env"][1])}
    assert "no time" in _summary(tmp_path)["env"][1]


def _bench_doc(rows: list[tuple[str, float, float, float | None]]) -> dict:
    return {"gpu": "Stand-in GPU", "mpi": "Open MPI v4.1.6", "host": "h", "date": "d",
            "results": [{"conversion": c, "mib": mib, "sbpmpi_ms": ms, "proxy_ms": copy}
                        for c, mib, ms, copy in rows]}


def test_the_gpu_table_names_every_transport_and_the_targets(tmp_path):
    staged = [("S(0)->B", 1, 0.5, 0.01), ("S(0)->B", 64, 9.0, 1.0), ("P->B", 64, 12.0, 1.0),
              ("B->S(0)", 64, 0.001, None)]
    ipc = [("S(0)->B", 1, 0.05, 0.01), ("S(0)->B", 64, 2.5, 1.0), ("P->B", 64, 6.0, 1.0)]
    for name, rows in (("staged", staged), ("ipc", ipc)):
        (tmp_path / f"bench-{name}-n2.json").write_text(json.dumps(_bench_doc(rows)))
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_table.py"),
                          *sorted(map(str, tmp_path.glob("bench-*.json")))],
                         capture_output=True, text=True, check=True).stdout
    assert "**2 ranks**, Stand-in GPU, Open MPI v4.1.6" in out
    assert "| conversion | MiB | staged ms | ipc ms | copy ms | ipc targets |" in out
    assert "| S(0)->B | 1 | 0.500 | 0.050 | 0.010 | ok < 100 us, ok <= staged |" in out
    assert "| S(0)->B | 64 | 9.000 | 2.500 | 1.000 | ok <= 3x copy, ok <= staged |" in out
    assert "| P->B | 64 | 12.000 | 6.000 | 1.000 | MISS <= 5x copy, ok <= staged |" in out
    assert "B->S(0)" not in out  # a slice, no communication: not in the table
