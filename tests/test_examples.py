"""Every example runs green under mpiexec: exit 0 and its closing "OK" line.

The examples check themselves against NumPy (they assert); this test runs each one
as users do, ``mpiexec -n N python examples/FILE``, with a time limit.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sbpmpi.launch import find_mpiexec

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
TIMEOUT = 180

# (file, ranks, line it must print, what it needs from sbpmpi)
CASES = [
    ("s1_create_global.py", 2, "S1 OK", []),
    ("s1_create_global.py", 3, "S1 OK", []),
    ("s2_local_to_global.py", 2, "S2 OK", []),
    ("s3_global_to_local.py", 2, "S3 OK", []),
    ("s4_global_to_global.py", 2, "S4 OK", ["sbpmpi.trace:trace"]),
    ("s5_sbp_meanings.py", 2, "S5 OK", []),
    ("s5_sbp_meanings.py", 3, "S5 OK", []),
    ("s6_data_parallel.py", 2, "S6 OK", ["sbpmpi.ops:matmul", "sbpmpi.trace:trace"]),
    ("s7_model_parallel.py", 2, "S7 OK", ["sbpmpi.ops:matmul", "sbpmpi.trace:trace"]),
    ("s8_matmul_signatures.py", 2, "S8 OK", ["sbpmpi.ops:matmul", "sbpmpi.trace:trace"]),
    ("s9_auto_boxing.py", 2, "S9 OK", ["sbpmpi.ops:matmul", "sbpmpi.trace:trace"]),
    ("s10_2d_sbp.py", 4, "S10 OK", ["sbpmpi.ops:matmul"]),
    ("s11_launch_env.py", 2, "S11 OK", []),
    ("s12_collectives.py", 2, "S12 OK", ["sbpmpi.comm:send", "sbpmpi.comm:reduce_scatter"]),
    ("s12_collectives.py", 3, "S12 OK", ["sbpmpi.comm:send", "sbpmpi.comm:reduce_scatter"]),
    ("mlp_three_layouts.py", 4, "MLP OK", ["sbpmpi.ops:matmul", "sbpmpi.ops:relu",
                                           "sbpmpi.trace:trace"]),
    ("train_mlp.py", 2, "TRAIN_MLP OK", ["sbpmpi.optim:SGD"]),  # more layouts: test_train.py
]


def missing(needs):
    out = []
    for need in needs:
        mod, _, name = need.partition(":")
        try:
            if not hasattr(importlib.import_module(mod), name):
                out.append(need)
        except ImportError:
            out.append(need)
    return out


def run(cmd, timeout=TIMEOUT):
    env = dict(os.environ, MPIEXEC_TIMEOUT=str(timeout - 20), PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_every_example_file_is_run_here():
    files = {p.name for p in EXAMPLES.glob("*.py")}
    assert files == {c[0] for c in CASES}


@pytest.mark.parametrize("name,n,ok,needs", CASES, ids=[f"{c[0]}-n{c[1]}" for c in CASES])
def test_example(name, n, ok, needs):
    lacking = missing(needs)
    if lacking:
        pytest.skip(f"needs {', '.join(lacking)}, not in this tree yet")
    r = run([find_mpiexec().path, "-n", str(n), sys.executable, str(EXAMPLES / name)])
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    assert ok in r.stdout.splitlines(), r.stdout[-3000:]
    assert "Traceback" not in r.stderr, r.stderr[-3000:]


def test_s11_under_the_launcher():
    r = run([sys.executable, "-m", "sbpmpi.launch", "-n", "3",
             str(EXAMPLES / "s11_launch_env.py")])
    assert r.returncode == 0, r.stderr[-3000:]
    assert "started by sbpmpi.launch" in r.stdout
    assert "S11 OK" in r.stdout.splitlines()


def test_s10_with_too_few_ranks_says_so():
    r = run([find_mpiexec().path, "-n", "2", sys.executable, str(EXAMPLES / "s10_2d_sbp.py")])
    assert r.returncode != 0
    assert "needs 4 ranks" in r.stderr
