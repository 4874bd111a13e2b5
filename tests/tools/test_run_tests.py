"""scripts/run_tests.py on any MPI: it passes --mpiexec-args and $SBPMPI_MPIEXEC_ARGS to
every mpiexec, and sets what the detected launcher needs in the environment. Checked with
a stand-in mpiexec that answers --version like Open MPI 5 and records how it was called."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sbpmpi.tools import launcher_family

ROOT = Path(__file__).resolve().parents[2]
OMPI5 = "mpiexec (Open MPI) 5.0.11\n\nReport bugs to https://www.open-mpi.org/community/help/\n"
MPICH = "HYDRA build details:\n    Version:                                 5.0.2\n"

RECORDER = """#!{python}
import json, os, sys
if sys.argv[1:] == ["--version"]:
    sys.stdout.write({text!r})
    sys.exit(0)
keys = [k for k in os.environ if k.startswith(("OMPI_", "PRTE_", "SBPMPI_MPIEXEC_ARGS"))]
with open({log!r}, "a") as f:
    f.write(json.dumps({{"argv": sys.argv[1:], "env": {{k: os.environ[k] for k in keys}}}})
            + "\\n")
"""


def run_tests(tmp_path, text, args, extra_env=None):
    fake = tmp_path / "mpiexec"
    log = tmp_path / "calls.jsonl"
    fake.write_text(RECORDER.format(python=sys.executable, text=text, log=str(log)))
    fake.chmod(0o755)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_", "PRTE_", "PMI_", "PMIX_", "SBPMPI_MPIEXEC"))}
    env.update(SBPMPI_MPIEXEC=str(fake), **(extra_env or {}))
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "run_tests.py"), "--no-serial",
                        "--logs", str(tmp_path / "logs"), *args], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=120)
    calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return r, calls


def test_open_mpi_gets_its_environment_and_the_mpiexec_args(tmp_path):
    r, calls = run_tests(tmp_path, OMPI5, ["--sizes", "1,3", "--mpiexec-args", "--bind-to none",
                                           "--mpiexec-args=--report-bindings", "--",
                                           "tests/core/test_layout.py"],
                         {"SBPMPI_MPIEXEC_ARGS": "--display-map"})
    assert r.returncode != 0  # the stand-in ran no tests: never reported green
    assert "Open MPI 5.0.11 (prterun)" in r.stdout
    assert [c["argv"][:7] for c in calls] == [
        ["-n", str(n), "--display-map", "--bind-to", "none", "--report-bindings",
         sys.executable] for n in (1, 3)]
    for c in calls:
        assert c["argv"][-1] == "tests/core/test_layout.py"  # only the files given
        assert "tests" not in c["argv"]
        env = c["env"]
        assert env["SBPMPI_MPIEXEC_ARGS"] == "--display-map --bind-to none --report-bindings"
        assert (env.get("OMPI_ALLOW_RUN_AS_ROOT") == "1") == (os.geteuid() == 0)
        many = max(4, 3) > launcher_family.physical_cores()
        assert (env.get("PRTE_MCA_rmaps_default_mapping_policy") == ":oversubscribe") == many


def test_mpich_gets_nothing_added(tmp_path):
    r, calls = run_tests(tmp_path, MPICH, ["--sizes", "2", "--", "-k", "nothing"])
    assert "MPICH Hydra 5.0.2" in r.stdout and "environment added" not in r.stdout
    assert len(calls) == 1 and calls[0]["argv"][:3] == ["-n", "2", sys.executable]
    assert "tests" in calls[0]["argv"]  # no file given: the whole folder
    assert not any(k.startswith(("OMPI_", "PRTE_")) for k in calls[0]["env"])


def test_bad_mpiexec_args_are_refused(tmp_path):
    r, calls = run_tests(tmp_path, MPICH, ["--mpiexec-args", "'unclosed"])
    assert r.returncode == 2 and "--mpiexec-args" in r.stderr and calls == []


@pytest.mark.parametrize("example", sorted({
    line.split('--mpiexec-args "', 1)[1].split('"', 1)[0]
    for page in (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
    for line in page.read_text().splitlines() if '--mpiexec-args "' in line
} - {"..."}))
def test_the_docs_mpiexec_args_examples_are_accepted(tmp_path, example):
    """Every ``--mpiexec-args "..."`` the README or the docs show goes through the launcher."""
    prog = tmp_path / "p.py"
    prog.write_text("")
    r = subprocess.run([sys.executable, "-m", "sbpmpi.launch", "--dry-run", "-n", "2",
                        "--mpiexec-args", example, str(prog)], capture_output=True, text=True,
                       timeout=60, env=dict(os.environ, SBPMPI_MPIEXEC_ARGS=""))
    assert r.returncode == 0, r.stderr
    assert f" -n 2 {example} " in r.stdout.splitlines()[-1]


def test_hosts_runs_the_files_given_and_the_tests_of_the_hosts_at_1_2_3_ranks_per_host(tmp_path):
    import hosts_cluster

    why = hosts_cluster.unavailable()
    if why:
        pytest.skip(why)
    r, calls = run_tests(tmp_path, MPICH, ["--hosts", "2", "--", "tests/comm/test_world.py",
                                           "tests/ops/test_every_op.py", "-x"])
    assert r.returncode != 0  # the stand-in runs no test: no JUnit file, never green
    runs = [(c["argv"][c["argv"].index("-n") + 1], c["argv"][c["argv"].index("-ppn") + 1],
             [x for x in c["argv"] if x.startswith("tests/") or x == "-x"]) for c in calls]
    assert runs == [("4", "2", ["tests/comm/test_world.py", "tests/ops/test_every_op.py", "-x"]),
                    ("2", "1", ["tests/comm/test_world.py", "-x"]),
                    ("6", "3", ["tests/comm/test_world.py", "-x"])], (runs, r.stdout)
    assert all("-hosts" in c["argv"] and "-launcher-exec" in c["argv"] for c in calls), calls
    assert "hosts: sbh" in r.stdout and "2x1 mpi" in r.stdout, r.stdout
