"""scripts/gpu_check.sh, the GPU check: every step fits one command on the GPU machine (the run
tool allows 10 minutes; each step runs under ``timeout`` of at most 540 s) and names only files
that exist (pytest collects nothing and exits 4 when a named file is missing)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"
LIMIT = 540
PATH_RE = re.compile(r"(?<![\w./-])((?:tests|scripts)/[\w./-]+\.(?:py|sh))")


def _gpu_check(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=60, env=dict(os.environ, GPU_CHECK_DRY="1"))


def _steps() -> list[tuple[str, int]]:
    out = _gpu_check("list")
    assert out.returncode == 0, out.stderr
    return [(name, int(secs)) for name, secs, _ in (ln.split() for ln in out.stdout.splitlines())]


def test_every_step_fits_nine_minutes():
    steps = _steps()
    names = [n for n, _ in steps]
    assert len(set(names)) == len(names), names
    for want in ["info", "serial", *(f"suite-n{n}-{h}" for n in range(1, 5) for h in "ab"),
                 *(f"ipc-n{n}" for n in range(1, 5)), "ipc-unit", "ipc-hier", "calibrate",
                 "bench-staged-n2", "bench-ipc-n4", "aware-check", "aware-n2", "aware-n4",
                 "aware-bench-mpi-n2", "aware-bench-ipc-n4"]:
        assert want in names, f"no step {want!r} in {names}"
    assert all(0 < secs <= LIMIT for _, secs in steps), steps
    text = SCRIPT.read_text()
    assert 'timeout -k 10 "$secs" bash -c "$cmds"' in text  # every step under its limit
    limits = [int(v) for v in re.findall(r"(?:--timeout |LIMIT=|timeout )(\d+)", text)]
    assert limits and max(limits) <= LIMIT, limits


def test_every_path_it_names_exists():
    text = SCRIPT.read_text()
    named = set(PATH_RE.findall(text))
    for name, _ in _steps():  # the commands as each step runs them
        out = _gpu_check(name, "/tmp/sbpmpi-gpu-check-dry")
        assert out.returncode == 0 and f"== {name} " in out.stdout, (name, out.stdout, out.stderr)
        named |= set(PATH_RE.findall(out.stdout))
    assert {"tests/comm/gpu/test_gpu_transport_cuda.py",
            "tests/comm/gpu/test_gpu_transport_mpi.py", "scripts/run_tests.py"} <= named, named
    missing = sorted(p for p in named if not (ROOT / p).is_file())
    assert not missing, f"gpu_check.sh names files that do not exist: {missing}"
    if (ROOT.parent / "shared" / "gpu").is_dir():  # beside a developer's checkout
        shared = set(re.findall(r"\.\./shared/gpu/[\w.-]+", text))
        assert shared and all((ROOT / p).is_file() for p in shared), shared


def test_an_unknown_step_is_refused():
    out = _gpu_check("no-such-step")
    assert out.returncode == 2 and "no step named 'no-such-step'" in out.stderr
