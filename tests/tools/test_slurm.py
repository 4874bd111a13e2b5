"""Batch jobs on a real Slurm: the shipped sbatch scripts, srun and the launcher, run on a
private one-node cluster (tests/tools/slurm_cluster.py) started for this test session.

Skipped, with the reason, where Slurm is not installed or the user is not root. The
commands are the docs' (docs/running.md, "Batch jobs"), typed as shown there, from a directory where
``scripts``, ``examples`` and ``tests`` lead to this checkout (so job output files land
in a temporary directory, not in the checkout).
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import slurm_cluster

ROOT = Path(__file__).resolve().parents[2]
JOB_TIMEOUT = 120  # seconds any one job may take here; each runs in a few seconds

# the commands, as docs/running.md's "Batch jobs" shows them
CPU_JOB = "sbatch {opts}scripts/slurm/cpu.sbatch examples/s6_data_parallel.py"
FAILING_JOB = "sbatch -n 2 scripts/slurm/cpu.sbatch tests/fault_programs/uncaught.py main"
SRUN_INFO = "srun -n 4 python -m sbpmpi info"
LAUNCH_JOB = ("sbatch -n 2 -o launch-%j.out --wrap 'echo batch step ${SLURM_STEP_ID:-none}; "
              "python -m sbpmpi.launch -n 2 step_probe.py'")
GPU_JOB = "sbatch -n 2 scripts/slurm/gpu.sbatch examples/s11_launch_env.py"
DOCS_COMMANDS = [CPU_JOB.format(opts=f"-n {n} " if n else "") for n in (None, 1, 2, 4)] + [
    f"SBPMPI_SRUN_MPI=pmi2 {CPU_JOB.format(opts='-n 2 ')}", FAILING_JOB, SRUN_INFO, LAUNCH_JOB,
    GPU_JOB]


def test_unavailable_says_what_is_missing(monkeypatch):
    monkeypatch.setattr(slurm_cluster.shutil, "which", lambda name, path=None: None)
    why = slurm_cluster.unavailable()
    assert why is not None and "munged, slurmctld, slurmd, sbatch, srun" in why, why
    assert "apt-get install slurmctld slurmd slurm-client munge" in why, why


def test_unavailable_needs_root(monkeypatch):
    monkeypatch.setattr(slurm_cluster.shutil, "which", lambda name, path=None: "/bin/" + name)
    monkeypatch.setattr(slurm_cluster.os, "geteuid", lambda: 1000)
    assert "needs root" in (slurm_cluster.unavailable() or ""), slurm_cluster.unavailable()


def test_pmi_read_split_is_found_for_its_own_job_only(tmp_path):
    # the lines a slurmd 22.05 wrote when it cut a rank's PMI-1 put (CI, stop 46)
    cluster = slurm_cluster.SlurmCluster(root=tmp_path, node="n1", cpus=1, gpus=0, env={})
    (tmp_path / "slurmd-n1.log").write_text(
        "[2026-12-07T20:44:07.806] [36276001.0] error: mpi/pmi2: request not begin with 'cmd='\n"
        "[2026-12-07T20:44:07.806] [36276001.0] error: mpi/pmi2: invalid client request\n")
    assert cluster.pmi_read_split("36276001")
    assert not cluster.pmi_read_split("36276000")
    assert not cluster.pmi_read_split("3627600")


def test_docs_show_the_commands_the_tests_run():
    text = (ROOT / "docs" / "running.md").read_text()
    section = text[text.index("## Batch jobs"):]
    missing = [c for c in DOCS_COMMANDS if c not in section]
    assert not missing, missing


# -- the PMI choice of the sbatch scripts, with stand-ins for srun and mpi4py ----------------

SLURM_LIST = {"all": "none pmi2 pmix cray_shasta", "no-pmix": "none pmi2 cray_shasta"}
MPI_VERSIONS = {
    "openmpi": "Open MPI v5.0.3, package: Open MPI builder Distribution, ident: 5.0.3",
    "mpich": "MPICH Version:      5.0.2\nMPICH configure:    --with-device=ch4:ucx,ofi",
    "mpich+pmix": "MPICH Version:      4.2.0\nMPICH configure:    --with-pmix=/usr --with-pm=no",
    "cray": "MPI VERSION    : CRAY MPICH version 8.1.28.15 (ANL base 3.4a2)",
    "intel": "Intel(R) MPI Library 2021.11 for Linux* OS",
}


@pytest.fixture(scope="module")
def stand_ins(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("stand_ins")
    (d / "srun").write_text("#!/bin/sh\necho 'MPI plugin types are...'\n"
                            "for p in $FAKE_SLURM; do printf '\\t%s\\n' \"$p\"; done\n"
                            "echo 'specific pmix plugin versions available: pmix_v4'\n")
    (d / "srun").chmod(0o755)
    (d / "mpi4py").mkdir()
    (d / "mpi4py" / "__init__.py").write_text(
        "class _Rc:\n    initialize = True\n\n\nrc = _Rc()\n")
    (d / "mpi4py" / "MPI.py").write_text(
        "import os\n\n\ndef Get_library_version():\n    return os.environ['FAKE_MPI']\n")
    return d


def srun_mpi_function(script: str) -> str:
    text = (ROOT / "scripts" / "slurm" / f"{script}.sbatch").read_text()
    start = text.index("srun_mpi() {")
    return text[start:text.index("\n}\n", start) + 3]


def test_sbatch_scripts_share_the_pmi_choice():
    assert srun_mpi_function("cpu") == srun_mpi_function("gpu")


@pytest.mark.parametrize("slurm_has, mpi, override, expected", [
    ("all", "openmpi", "", "pmix"),
    ("no-pmix", "openmpi", "", "default"),
    ("all", "mpich", "", "pmi2"),
    ("all", "mpich+pmix", "", "pmix"),
    ("no-pmix", "mpich+pmix", "", "pmi2"),
    ("all", "intel", "", "pmi2"),
    ("all", "cray", "", "default"),
    ("all", "mpich", "pmix", "pmix (from SBPMPI_SRUN_MPI)"),
])
def test_sbatch_scripts_choose_the_pmi_plugin(stand_ins, slurm_has, mpi, override, expected):
    func = srun_mpi_function("cpu")
    env = {"PATH": f"{stand_ins}:{Path(sys.executable).parent}:/usr/bin:/bin",
           "PYTHONPATH": str(stand_ins), "FAKE_SLURM": SLURM_LIST[slurm_has],
           "FAKE_MPI": MPI_VERSIONS[mpi], "SBPMPI_SRUN_MPI": override}
    p = subprocess.run(["bash", "-c", f"set -euo pipefail\n{func}\nsrun_mpi"], env=env,
                       capture_output=True, text=True, timeout=60, check=False)
    assert p.returncode == 0, p
    choice = p.stdout.strip()
    assert choice.split(" (")[0] == expected.split(" (")[0], choice
    assert choice.startswith(expected), choice


@pytest.fixture(scope="session")
def slurm() -> Iterator[slurm_cluster.SlurmCluster]:
    why = slurm_cluster.unavailable()
    if why:
        pytest.skip(why)
    with slurm_cluster.start(timeout=60) as cluster:
        work = cluster.root / "work"
        work.mkdir()
        for name in ("scripts", "examples", "tests"):
            (work / name).symlink_to(ROOT / name)
        yield cluster


def run(slurm: slurm_cluster.SlurmCluster, command: str, *, timeout: float = 60,
        env: dict[str, str] | None = None):
    """Run a command line of the docs in the work directory."""
    return slurm.run(shlex.split(command), cwd=slurm.root / "work", timeout=timeout, env=env)


def submit(slurm: slurm_cluster.SlurmCluster, command: str,
           env: dict[str, str] | None = None) -> tuple[dict[str, str], str, float]:
    """Submit with ``command`` (an sbatch line), wait for the end of the job; return its
    ``scontrol show job`` fields, its output file's text and the seconds it took."""
    name, *args = shlex.split(command)
    assert name == "sbatch", command
    t0 = time.monotonic()
    info = slurm.submit(args, JOB_TIMEOUT, cwd=slurm.root / "work", env=env)
    seconds = time.monotonic() - t0
    text = Path(info["StdOut"]).read_text(errors="replace")
    return info, text, seconds


@pytest.mark.parametrize("n", [None, 1, 2, 4])
def test_cpu_sbatch_runs_an_example_at_n_tasks(slurm, n):
    # no counts at all: Slurm's default of one task
    info, out, _ = submit(slurm, CPU_JOB.format(opts=f"-n {n} " if n else ""))
    n = n or 1
    assert info["JobState"] == "COMPLETED", (info, out)
    assert out.count("S6 OK") == 1, out  # one job of n ranks, not n jobs of one rank
    ranks = ", ".join(str(r) for r in range(n))
    assert f"on cpu ranks [{ranks}] (mesh ({n},))" in out, out
    assert f"sbpmpi-cpu: job {info['JobId']}: {n} task(s) on 1 node(s)" in out, out
    # the MPICH wheel has PMI-2 and no PMIx: the script picks pmi2 by itself
    assert "sbpmpi-cpu: srun --mpi=pmi2 (Slurm has: " in out, out
    assert f"sbpmpi-cpu: python: {Path(slurm.env['PATH'].split(':')[0]) / 'python'} " in out, out


def test_cpu_sbatch_srun_mpi_override(slurm):
    info, out, _ = submit(slurm, CPU_JOB.format(opts="-n 2 "), env={"SBPMPI_SRUN_MPI": "pmi2"})
    assert "sbpmpi-cpu: srun --mpi=pmi2 (from SBPMPI_SRUN_MPI)" in out, out
    assert info["JobState"] == "COMPLETED" and out.count("S6 OK") == 1, (info, out)


def test_failing_rank_ends_the_job_failed_in_seconds(slurm):
    info, out, seconds = submit(slurm, FAILING_JOB)
    assert info["JobState"] == "FAILED", (info, out)
    assert "sbpmpi: rank 1: uncaught ValueError: bad value on rank 1" in out, out
    assert seconds < 30, (seconds, out)  # the script's time limit is 30 minutes


def test_srun_info_lists_four_ranks(slurm):
    out = run(slurm, SRUN_INFO).stdout
    assert "world:        4 rank(s) on 1 host(s)" in out, out
    rows = re.findall(r"^\s+(\d)\s+\S+\s+(\d)/4\s", out, re.M)
    assert sorted(rows) == [(str(r), str(r)) for r in range(4)], out


def test_lone_task_warning_is_pure():
    from sbpmpi.env import lone_task_warning

    assert lone_task_warning({}, 1) is None
    assert lone_task_warning({"SLURM_STEP_NUM_TASKS": "1"}, 1) is None
    assert lone_task_warning({"SLURM_STEP_NUM_TASKS": "4"}, 4) is None  # a real 4-rank world
    w = lone_task_warning({"SLURM_STEP_NUM_TASKS": "4", "SLURM_PROCID": "2"}, 1)
    assert w is not None and "srun started 4 tasks" in w and "task 2" in w \
        and "--mpi=pmi2" in w, w


def test_srun_with_the_wrong_pmi_plugin_warns(slurm):
    # --mpi=none: Slurm gives MPICH no PMI, so each task is a world of one process
    r = run(slurm, "srun --mpi=none -n 2 python -c 'import sbpmpi'")
    assert r.stderr.count("srun started 2 tasks, but MPI sees a world of 1") == 2, r.stderr
    r = run(slurm, "srun -n 2 python -c 'import sbpmpi'")  # the cluster's pmi2 default
    assert "MPI sees a world of 1" not in r.stderr, r.stderr


def test_launch_inside_an_allocation_uses_srun(slurm):
    # each rank reports the Slurm job step it runs in: a batch script has none, processes
    # started by srun (here: MPICH's mpiexec starting its proxies with srun) have one
    probe = slurm.root / "work" / "step_probe.py"
    probe.write_text("import os\n"
                     "import sys\n"
                     "e = os.environ\n"
                     "sys.stdout.write(f\"rank {e['RANK']} of {e['WORLD_SIZE']}: \"\n"
                     "                 f\"job {e['SLURM_JOB_ID']} \"\n"
                     "                 f\"step {e.get('SLURM_STEP_ID', 'none')}\\n\")\n")
    info, out, _ = submit(slurm, LAUNCH_JOB)
    assert info["JobState"] == "COMPLETED", (info, out)
    job = info["JobId"]
    assert "batch step none" in out, out
    # one write per line, but the two ranks' lines may still come out interleaved
    steps = re.findall(rf"rank (\d) of 2: job {job} step (\w+)", out)
    assert sorted(r for r, _ in steps) == ["0", "1"], out
    assert all(step.isdigit() for _, step in steps), out


def test_gpu_sbatch_gives_each_task_one_gpu(slurm):
    if not slurm.gpus:
        pytest.skip("no stand-in GPUs in the test cluster (mknod not allowed)")
    info, out, _ = submit(slurm, GPU_JOB)
    assert info["JobState"] == "COMPLETED", (info, out)
    # python -m sbpmpi info's table: rank, host, local rank, CUDA_VISIBLE_DEVICES
    rows = re.findall(r"^\s+(\d)\s+\S+\s+(\d)/2\s+(\S+)\s", out, re.M)
    assert sorted(rows) == [("0", "0", "0"), ("1", "1", "1")], out
    assert "S11 OK" in out, out
