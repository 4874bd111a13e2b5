"""Every example runs green under mpiexec: exit 0 and its closing "OK" line.

The examples check themselves against NumPy (they assert); this test runs each one
as users do, ``mpiexec -n N python examples/FILE``, with a time limit.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest
from mpirun import job_env, mpiexec

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
TIMEOUT = 180

# (file, ranks, line it must print, what it needs from sbpmpi)
CASES = [
    ("s1_create_global.py", 2, "S1 OK", []),
    ("s1_create_global.py", 3, "S1 OK", []),
    ("s2_local_to_global.py", 2, "S2 OK", []),
    ("s3_global_to_local.py", 2, "S3 OK", []),
    ("s4_global_to_global.py", 2, "S4 OK", ["sbpmpi.comm.trace:trace"]),
    ("s5_sbp_meanings.py", 2, "S5 OK", []),
    ("s5_sbp_meanings.py", 3, "S5 OK", []),
    ("s6_data_parallel.py", 2, "S6 OK", ["sbpmpi.ops:matmul", "sbpmpi.comm.trace:trace"]),
    ("s7_model_parallel.py", 2, "S7 OK", ["sbpmpi.ops:matmul", "sbpmpi.comm.trace:trace"]),
    ("s8_matmul_signatures.py", 2, "S8 OK", ["sbpmpi.ops:matmul", "sbpmpi.comm.trace:trace"]),
    ("s9_auto_boxing.py", 2, "S9 OK", ["sbpmpi.ops:matmul", "sbpmpi.comm.trace:trace"]),
    ("s10_2d_sbp.py", 4, "S10 OK", ["sbpmpi.ops:matmul"]),
    ("s11_launch_env.py", 2, "S11 OK", []),
    ("s12_collectives.py", 2, "S12 OK", ["sbpmpi.comm:send", "sbpmpi.comm:reduce_scatter"]),
    ("s12_collectives.py", 3, "S12 OK", ["sbpmpi.comm:send", "sbpmpi.comm:reduce_scatter"]),
    ("mlp_three_layouts.py", 4, "MLP OK", ["sbpmpi.ops:matmul", "sbpmpi.ops:relu",
                                           "sbpmpi.comm.trace:trace"]),
    ("train_mlp.py", 2, "TRAIN_MLP OK", ["sbpmpi.optim:SGD"]),  # more layouts: test_train.py
    *[("heat2d.py", n, "HEAT2D OK", ["sbpmpi:map_overlap"]) for n in (1, 2, 3, 4)],
    *[("life.py", n, "LIFE OK", ["sbpmpi:map_overlap"]) for n in (1, 2, 3, 4)],
    ("array_api_sklearn.py", 3, "ARRAY_API_SKLEARN OK",  # skipped where scikit-learn is missing
     ["sbpmpi.array_api:asarray", "sklearn:set_config", "scipy:__version__"]),
]
# train_gpt.py runs with arguments (below; every layout and world size: test_gpt.py);
# gpt_reference.py is its companion module, not a program
RUN_WITH_ARGUMENTS = {"train_gpt.py"}
COMPANIONS = {"gpt_reference.py", "gpt_pipeline.py"}  # imported by train_gpt.py
# (layout, ranks): small sizes and few steps; the docs' command runs the full 50 steps
GPT_RUNS = [("sp", 3, ["--check"]), ("2d", 2, ["--check"]),
            ("tp", 2, ["--dropout", "0.1", "--compare-dp"]),
            ("pp", 2, ["--check", "--pp", "2", "--microbatches", "4", "--schedule", "1f1b"]),
            ("dp", 2, ["--check", "--graph", "--clip", "0"])]  # captured (sm.graph), buckets
GPT_SMALL = ["--layers", "2", "--heads", "4", "--dim", "16", "--seq", "8", "--batch", "4",
             "--steps", "4", "--sample", "8"]


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


def run(cmd, n=4, timeout=TIMEOUT):
    return subprocess.run(cmd, cwd=ROOT, env=job_env(n, timeout), capture_output=True,
                          text=True, timeout=timeout)


def test_every_example_file_is_run_here():
    files = {p.name for p in EXAMPLES.glob("*.py")}
    assert files == {c[0] for c in CASES} | RUN_WITH_ARGUMENTS | COMPANIONS


@pytest.mark.parametrize("name,n,ok,needs", CASES, ids=[f"{c[0]}-n{c[1]}" for c in CASES])
def test_example(name, n, ok, needs):
    lacking = missing(needs)
    if lacking:
        pytest.skip(f"needs {', '.join(lacking)}, not in this tree yet")
    r = run([*mpiexec(n), sys.executable, str(EXAMPLES / name)], n)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    assert ok in r.stdout.splitlines(), r.stdout[-3000:]
    assert "Traceback" not in r.stderr, r.stderr[-3000:]


@pytest.mark.parametrize("layout,n,extra", GPT_RUNS, ids=[f"{c[0]}-n{c[1]}" for c in GPT_RUNS])
def test_train_gpt_checks_itself(layout, n, extra):
    """``mpiexec -n N python examples/train_gpt.py --layout L --check``, as users run it."""
    r = run([*mpiexec(n), sys.executable, str(EXAMPLES / "train_gpt.py"), "--layout", layout,
             *extra, *GPT_SMALL], n)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    assert "TRAIN_GPT OK" in r.stdout.splitlines(), r.stdout[-3000:]
    assert "max relative difference so far" in r.stdout  # it did compare
    assert "Traceback" not in r.stderr, r.stderr[-3000:]


def test_launch_env_example_under_the_launcher():
    r = run([sys.executable, "-m", "sbpmpi.launch", "-n", "3",
             str(EXAMPLES / "s11_launch_env.py")])
    assert r.returncode == 0, r.stderr[-3000:]
    assert "started by sbpmpi.launch" in r.stdout
    assert "S11 OK" in r.stdout.splitlines()


def test_2d_example_with_too_few_ranks_says_so():
    r = run([*mpiexec(2), sys.executable, str(EXAMPLES / "s10_2d_sbp.py")], 2)
    assert r.returncode == 2
    assert "needs 4 ranks, got 2: run under mpiexec -n 4" in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("name,needed,ok", [("s1_create_global.py", 2, "S1 OK"),
                                            ("s10_2d_sbp.py", 4, None)])
def test_example_without_mpiexec_says_run_under_mpiexec(name, needed, ok):
    """A forgotten mpiexec: a world of 1 process. s1_create_global.py still runs and says
    how to get the 2-rank version; s10_2d_sbp.py cannot run and says so."""
    r = run([sys.executable, str(EXAMPLES / name)], 1)
    assert f"run under mpiexec -n {needed} python " in r.stderr, r.stderr[-3000:]
    if ok:
        assert r.returncode == 0 and ok in r.stdout.splitlines()
        assert "note: S1 runs on a world of 1 process" in r.stderr
    else:
        assert r.returncode == 2 and "needs 4 ranks, got 1" in r.stderr


def test_examples_use_the_shared_hint():
    """Each example asks sm.launch.expect_world, not a copy of the hint of its own."""
    for path in EXAMPLES.glob("*.py"):
        if path.name in COMPANIONS:
            continue
        text = path.read_text()
        assert text.count("sm.launch.expect_world(") == 1, path.name
        assert "run under mpiexec" not in text, path.name


def test_placement_beyond_a_world_of_one_says_run_under_mpiexec():
    import sbpmpi as sm

    with pytest.raises(ValueError, match=r"out of range for a world of 1 process .*"
                                         r"run under mpiexec -n 3 \(was mpiexec forgotten\?\)"):
        sm.placement("cpu", [0, 1, 2], world_size=1)
    with pytest.raises(ValueError) as e:  # a world of 2 did use mpiexec: no such hint
        sm.placement("cpu", [0, 2], world_size=2)
    assert "mpiexec" not in str(e.value)
