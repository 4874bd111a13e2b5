"""Jobs across hosts: a private cluster of two hosts on this machine (tests/tools/hosts_cluster.py),
MPI started across them with the library's defaults, the GPT example's 2d layout (data
parallel across the hosts, tensor parallel inside each) against its NumPy reference, and
``sbatch -N 2`` of the shipped CPU script on a Slurm whose ``slurmd`` runs in each host.

Skipped, with the reason, where namespaces cannot be made (not root, no ``ip``) or Slurm is
not installed. ``scripts/run_tests.py --hosts 2`` runs the whole MPI suite across hosts;
these are the jobs that start their own ``mpiexec`` (or ``sbatch``) there.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import hosts_cluster
import pytest
import slurm_cluster

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 240  # seconds a job may take here (2 shared cores, TCP between the hosts)
SMALL_GPT = ["--layers", "2", "--heads", "4", "--dim", "16", "--seq", "8", "--batch", "5",
             "--sample", "6", "--steps", "4"]


def real_mpiexec() -> str:
    """The mpiexec on PATH (under ``run_tests.py --hosts`` $SBPMPI_MPIEXEC is the outer
    cluster's wrapper, not a launcher to wrap again)."""
    exe = shutil.which("mpiexec") or shutil.which("mpirun")
    if exe is None:
        pytest.skip("no mpiexec on PATH")
    return exe


@pytest.fixture(scope="module")
def hosts() -> Iterator[hosts_cluster.HostsCluster]:
    why = hosts_cluster.unavailable()
    if why:
        pytest.skip(why)
    with hosts_cluster.start(2, mpiexec=real_mpiexec()) as c:
        yield c


def run_job(c: hosts_cluster.HostsCluster, n: int, ppn: int, cmd: list[str],
            timeout: float = TIMEOUT) -> subprocess.CompletedProcess:
    env = c.env(ppn)
    env["PYTHONPATH"] = str(ROOT)
    env["MPIEXEC_TIMEOUT"] = str(int(timeout) - 10)
    return subprocess.run(c.mpiexec(n, ppn) + cmd, env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, check=False)


def leftovers(c: hosts_cluster.HostsCluster) -> list[str]:
    """What of cluster ``c`` is still on this machine."""
    out = []
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    out += [f"namespace {n}" for n in c.names if n in netns]
    out += [f"link {h.link}" for h in c.hosts if f" {h.link}@" in links or f" {h.link}:" in links]
    out += [f"bridge {c.bridge}" for _ in [0] if f" {c.bridge}:" in links]
    out += [f"/etc/hosts: {x}" for x in Path("/etc/hosts").read_text().splitlines()
            if x.rstrip().endswith(f"{hosts_cluster.TAG} {c.id}")]
    out += [f"state {c.root}" for _ in [0] if c.root.exists()]
    return out


def test_unavailable_says_why(monkeypatch):
    monkeypatch.setattr(hosts_cluster.sys, "platform", "linux")
    monkeypatch.setattr(hosts_cluster.os, "geteuid", lambda: 1000)
    assert "needs root" in (hosts_cluster.unavailable() or "")
    monkeypatch.setattr(hosts_cluster.os, "geteuid", lambda: 0)
    monkeypatch.setattr(hosts_cluster.shutil, "which", lambda name, path=None: None)
    why = hosts_cluster.unavailable() or ""
    assert "ip, unshare, nsenter, tc not found" in why and "apt-get install" in why, why


def test_a_cluster_leaves_nothing_behind_also_after_a_failure():
    why = hosts_cluster.unavailable()
    if why:
        pytest.skip(why)
    made = None
    with pytest.raises(RuntimeError, match="a failure inside"):
        with hosts_cluster.start(2, mpiexec=real_mpiexec()) as c:
            made = c
            assert leftovers(c), "the cluster is not there while it runs"
            assert c.run_on(1, ["hostname"], capture_output=True, text=True).stdout.strip() \
                == c.names[1]
            raise RuntimeError("a failure inside")
    assert made is not None and leftovers(made) == []


def test_mpi_sees_two_hosts(hosts):
    p = run_job(hosts, 4, 2, [sys.executable, "-m", "sbpmpi", "info"])
    assert p.returncode == 0, p
    assert "world:        4 rank(s) on 2 host(s)" in p.stdout, p.stdout


def test_train_gpt_2d_across_two_hosts_equals_the_reference(hosts):
    """Data parallel across the hosts, tensor parallel inside each (float64): every step's
    loss within the example's --check tolerance of the one-process NumPy reference, and
    the program exits cleanly with the library's default network layer."""
    p = run_job(hosts, 4, 2, [sys.executable, "examples/train_gpt.py", "--layout", "2d",
                              "--check", *SMALL_GPT])
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count("TRAIN_GPT OK") == 1, p.stdout
    assert "layout 2d on [[0, 1], [2, 3]], float64" in p.stdout, p.stdout
    # the example prints every few steps the largest relative difference so far (it
    # fails above 1e-10 itself): the last step's line carries all of them
    last = re.findall(r"^step\s+3: loss \S+ \(max relative difference so far (\S+)\)$",
                      p.stdout, re.M)
    assert len(last) == 1 and float(last[0]) <= 1e-10, p.stdout


# -- Slurm across the hosts ------------------------------------------------------------------

@pytest.fixture(scope="module")
def slurm(hosts) -> Iterator[slurm_cluster.SlurmCluster]:
    why = slurm_cluster.unavailable()
    if why:
        pytest.skip(why)
    with slurm_cluster.start(timeout=90, hosts=hosts) as cluster:
        # ofi as nsc-mpiexec chooses between these hosts: under srun the MPICH wheel's UCX
        # layer put addresses with stray bytes in them (UCX: "failed to unpack address")
        # that Slurm's PMI-1 reader then cut, or not, as the environment's size moved them
        cluster.env.update(UCX_TLS="self,tcp", MPICH_CH4_NETMOD="ofi", PYTHONPATH=str(ROOT))
        work = cluster.root / "work"
        work.mkdir()
        for name in ("scripts", "examples", "tests"):
            (work / name).symlink_to(ROOT / name)
        yield cluster


def test_sbatch_cpu_script_runs_across_two_nodes(slurm):
    info = slurm.submit(["-N", "2", "scripts/slurm/cpu.sbatch", "examples/s6_data_parallel.py"],
                        TIMEOUT, cwd=slurm.root / "work")
    text = Path(info["StdOut"]).read_text(errors="replace")
    assert info["JobState"] == "COMPLETED", (info, text, slurm.logs())
    assert text.count("S6 OK") == 1, text
    assert f"sbpmpi-cpu: job {info['JobId']}: 2 task(s) on 2 node(s)" in text, text


def test_srun_in_a_batch_job_places_ranks_on_both_nodes(slurm):
    info = slurm.submit(["-N", "2", "-n", "4", "-o", "info-%j.out", "--wrap",
                         "srun --mpi=pmi2 python -m sbpmpi info"], TIMEOUT, cwd=slurm.root / "work")
    text = Path(info["StdOut"]).read_text(errors="replace")
    assert info["JobState"] == "COMPLETED", (info, text, slurm.logs())
    assert "world:        4 rank(s) on 2 host(s)" in text, text
