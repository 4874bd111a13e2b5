"""A private one-node Slurm cluster for the tests (and for trying the sbatch scripts by hand).

Where ``munged``, ``slurmctld`` and ``slurmd`` are installed and the user is root, this
writes a ``slurm.conf`` for this machine (its CPUs and memory, oversubscription allowed,
``MpiDefault=pmi2`` as at a site whose MPI is MPICH, one stand-in GPU per CPU slot) in a
fresh temporary directory, starts munge and the two daemons in the foreground on
free TCP ports with their own state directories, pid files, logs and munge socket, waits
until the node is idle, and stops exactly the processes it started. Nothing is read from
or written to ``/etc/slurm``, ``/run/munge`` or ``/var/spool``, so it cannot clash with a
Slurm already on the machine, nor with a second test run at the same time.

    import slurm_cluster
    reason = slurm_cluster.unavailable()        # None, or why it cannot run here
    with slurm_cluster.start() as c:
        c.run(["sinfo"])                        # SLURM_CONF and PATH set (c.env)

By hand (prints the environment to use, stops on Ctrl-C)::

    python tests/tools/slurm_cluster.py

Oversubscription: the node declares ``max(CPUs, 4)`` CPUs (``SlurmdParameters=
config_overrides`` makes slurmd accept more than it counts), so ``sbatch -n 4`` runs on a
2-core CI machine exactly as typed, the way ``mpiexec -n 4`` oversubscribes there. The
partition's ``OverSubscribe=FORCE`` would not do: it shares CPUs between jobs, while one
job of more tasks than CPUs stays pending (``PartitionConfig``) unless every ``sbatch`` and
``srun`` adds ``--overcommit``, which the shipped commands must not need.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "srun", "sinfo", "scontrol", "scancel")
END_STATES = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
              "PREEMPTED", "BOOT_FAIL", "DEADLINE")


def _which(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/local/sbin:/sbin")


def unavailable() -> str | None:
    """Why a private cluster cannot be started here, or None when it can."""
    missing = [n for n in DAEMONS + CLIENTS if _which(n) is None]
    if missing:
        return (f"Slurm is not installed ({', '.join(missing)} not found); on Debian/Ubuntu: "
                f"apt-get install slurmctld slurmd slurm-client munge")
    if os.name != "posix" or os.geteuid() != 0:
        return "starting slurmd needs root (it runs jobs as their user); the user is not root"
    return None


def _free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _memory_mb() -> int:
    try:
        text = Path("/proc/meminfo").read_text()
        kb = int(re.search(r"MemTotal:\s+(\d+)", text).group(1))  # type: ignore[union-attr]
        return max(kb // 1024 - 512, 512)  # leave some for the daemons
    except (OSError, AttributeError, ValueError):
        return 1024


class PmiReadSplit(RuntimeError):
    """A job's ranks sent Slurm a PMI-1 request it cut (``pmi_read_split``)."""


@dataclass
class SlurmCluster:
    """A running private cluster; ``env`` is the environment for its client commands."""

    root: Path
    node: str
    cpus: int
    gpus: int  # stand-in GPUs (gres/gpu), 0 where they could not be made
    env: dict[str, str]
    nodes: list[str] = field(default_factory=list)  # every node's name (``node``: the first)
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    def run(self, cmd: Sequence[str], *, timeout: float = 60, cwd: str | Path | None = None,
            check: bool = True, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        """Run a client command (``sbatch``, ``srun``, ...) against this cluster, with
        ``env`` added to the cluster's environment."""
        p = subprocess.run(list(cmd), env=dict(self.env, **(env or {})), cwd=cwd,
                           capture_output=True, text=True, timeout=timeout, check=False)
        if check and p.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} exited {p.returncode}:\n{p.stdout}{p.stderr}"
                               f"{self.logs()}")
        return p

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job`` as a dict (``JobState``, ``Reason``, ``StdOut``, ...)."""
        out = self.run(["scontrol", "show", "job", "-o", job_id], timeout=30).stdout
        return dict(kv.split("=", 1) for kv in out.split() if "=" in kv)

    def wait_job(self, job_id: str, timeout: float) -> dict[str, str]:
        """Wait until the job has ended; raise TimeoutError (after cancelling it) if not,
        PmiReadSplit (after cancelling it) as soon as a slurmd refuses a PMI-1 request of
        one of its steps, which no rank recovers from."""
        deadline = time.monotonic() + timeout
        while True:
            info = self.job(job_id)
            if info.get("JobState") in END_STATES:
                return info
            if self.pmi_read_split(job_id):
                self.run(["scancel", job_id], check=False)
                raise PmiReadSplit(f"job {job_id}: a slurmd refused a PMI-1 request longer "
                                   f"than its reader takes{self.logs()}")
            if time.monotonic() > deadline:
                self.run(["scancel", job_id], check=False)
                raise TimeoutError(f"job {job_id} still {info.get('JobState')} "
                                   f"(reason {info.get('Reason')}) after {timeout:.0f} s"
                                   f"{self.logs()}")
            time.sleep(0.2)

    def pmi_read_split(self, job_id: str) -> bool:
        """Whether a slurmd refused a PMI-1 request of a step of ``job_id``.

        Slurm's mpi/pmi2 plugin reads a PMI-1 request with one ``read()`` of at most 1024
        bytes (its source: "TODO: read until newline"); a longer request (an MPI library's
        address that grew past it) is cut, both pieces are refused ("invalid client
        request") and the ranks may wait in MPI_Init for an answer that never comes.
        """
        mark = f"[{job_id}."
        for f in self.root.glob("slurmd-*.log"):
            for line in f.read_text(errors="replace").splitlines():
                if mark in line and "mpi/pmi2: invalid client request" in line:
                    return True
        return False

    def submit(self, args: Sequence[str], timeout: float, *, cwd: str | Path | None = None,
               env: dict[str, str] | None = None) -> dict[str, str]:
        """``sbatch`` ``args`` (``env`` added to the environment) and wait for the end of
        the job (``wait_job``)."""
        out = self.run(["sbatch", *args], cwd=cwd, env=env).stdout
        m = re.search(r"Submitted batch job (\d+)", out)
        if m is None:
            raise RuntimeError(f"sbatch {' '.join(args)}: no job id in {out!r}")
        return self.wait_job(m.group(1), timeout)

    def logs(self, lines: int = 20) -> str:
        out = []
        for f in [self.root / "slurmctld.log", *sorted(self.root.glob("slurmd-*.log")),
                  self.root / "munged.log"]:
            if f.exists():
                tail = f.read_text(errors="replace").splitlines()[-lines:]
                out.append(f"\n----- {f} (last lines) -----\n" + "\n".join(tail))
        return "".join(out)

    def stop(self) -> None:
        """Stop the daemons this cluster started (by their PIDs), newest first."""
        for name in reversed(list(self.procs)):
            p = self.procs[name]
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(10)
        self.procs.clear()

    def __enter__(self) -> SlurmCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)


def _stand_in_gpus(where: Path, n: int) -> int:
    """Make ``n`` stand-in GPU devices (character devices like /dev/null, which is what
    Slurm's gres/gpu accepts) for Slurm to hand out and name in CUDA_VISIBLE_DEVICES;
    return how many were made (0 where mknod is not allowed)."""
    where.mkdir()
    try:
        for i in range(n):
            os.mknod(where / f"gpu{i}", stat.S_IFCHR | 0o600, os.makedev(1, 3))
    except OSError:
        return 0
    (where.parent / "gres.conf").write_text(
        f"AutoDetect=off\nName=gpu File={where}/gpu[0-{n - 1}]\n")
    return n


@dataclass(frozen=True)
class SlurmNode:
    """A node of the cluster: its name (the host's name), address, and the command prefix
    that runs its ``slurmd`` (empty: on this machine)."""

    name: str
    address: str
    prefix: tuple[str, ...] = ()


def _conf(root: Path, ctld: SlurmNode, nodes: Sequence[SlurmNode], cpus: int, gpus: int,
          mem_mb: int, ports: list[int]) -> str:
    gres = f" Gres=gpu:{gpus}" if gpus else ""
    node_lines = "\n".join(f"NodeName={n.name} NodeAddr={n.address} CPUs={cpus} "
                            f"RealMemory={mem_mb}{gres} State=UNKNOWN" for n in nodes)
    first_job_id = random.SystemRandom().randrange(1_000_000, 60_000_000, 1000)
    return f"""\
# cluster written by tests/tools/slurm_cluster.py
ClusterName=sbpmpitest
# job ids unlike an earlier cluster's: MPICH names its shared memory after the PMI job id
# and an aborted job leaves it in /dev/shm, which would break a later job of the same id
FirstJobId={first_job_id}
SlurmctldHost={ctld.name}({ctld.address})
SlurmctldPort={ports[0]}
SlurmdPort={ports[1]}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={root}/munge.socket
StateSaveLocation={root}/ctld
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd-%n.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=pmi2
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
KillWait=5
MinJobAge=600
InactiveLimit=0
GresTypes=gpu
{node_lines}
PartitionName=debug Nodes={",".join(n.name for n in nodes)} Default=YES MaxTime=60 State=UP
"""


def start(cpus: int | None = None, timeout: float = 60, hosts: Any = None) -> SlurmCluster:
    """Start a private cluster of ``cpus`` CPUs a node (default: this machine's, at least
    4); raise RuntimeError (with the daemons' logs) if it does not come up within
    ``timeout`` seconds. Use as a context manager to stop it.

    One node, this machine, by default. ``hosts``: a running ``hosts_cluster.HostsCluster``
    (tests/tools/hosts_cluster.py): a node per host, its ``slurmd`` inside the host's namespaces
    and named after it, ``slurmctld`` on this machine at the hosts' bridge address.
    """
    why = unavailable()
    if why:
        raise RuntimeError(why)
    root = Path(tempfile.mkdtemp(prefix="sbpmpi-slurm-"))  # short: the munge socket path
    os.chmod(root, 0o700)
    (root / "ctld").mkdir()
    (root / "spool").mkdir()
    (root / "munge").mkdir(mode=0o700)
    key = root / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    node = socket.gethostname().split(".")[0]
    if hosts is None:
        ctld = SlurmNode(node, "127.0.0.1")
        nodes = [ctld]
    else:  # the hosts reach this machine at the bridge's address
        ctld = SlurmNode(node, hosts.subnet.rsplit(".", 1)[0] + ".1")
        nodes = [SlurmNode(h.name, h.address, tuple(h.prefix_keeping_mounts()))
                 for h in hosts.hosts]
    for n in nodes:
        (root / "spool" / n.name).mkdir()
    cpus = cpus or max(os.cpu_count() or 1, 4)
    gpus = _stand_in_gpus(root / "dev", cpus)
    (root / "slurm.conf").write_text(_conf(root, ctld, nodes, cpus, gpus, _memory_mb(),
                                           _free_ports(2)))
    py_bin = os.path.dirname(sys.executable)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_",
                                                                    "SALLOC_", "SRUN_"))}
    env["SLURM_CONF"] = str(root / "slurm.conf")
    # the jobs run the Python of this test run: its venv's bin first on PATH (sbatch and
    # srun pass the submitter's environment on by default)
    env["PATH"] = os.pathsep.join([py_bin, env.get("PATH", ""), "/usr/sbin", "/usr/bin"])
    if (Path(py_bin).parent / "pyvenv.cfg").exists():
        env["VIRTUAL_ENV"] = str(Path(py_bin).parent)
    c = SlurmCluster(root, nodes[0].name, cpus, gpus, env, nodes=[n.name for n in nodes])
    daemons = [
        ("munged", [_which("munged") or "munged", "--foreground", "--force",
                    f"--socket={root}/munge.socket", f"--key-file={key}",
                    f"--pid-file={root}/munge/munged.pid", f"--log-file={root}/munged.log",
                    f"--seed-file={root}/munge/munged.seed"]),
        ("slurmctld", [_which("slurmctld") or "slurmctld", "-D", "-c", "-i",
                       "-f", str(c.conf)]),
    ] + [(f"slurmd-{n.name}", [*n.prefix, _which("slurmd") or "slurmd", "-D", "-N", n.name,
                               "-f", str(c.conf)]) for n in nodes]
    try:
        for name, cmd in daemons:
            with open(root / f"{name}.stdout", "wb") as out:
                c.procs[name] = subprocess.Popen(cmd, env=env, stdout=out,
                                                 stderr=subprocess.STDOUT,
                                                 start_new_session=True,
                                                 preexec_fn=_die_with_parent)
            if name == "munged":
                _wait_for(lambda: (root / "munge.socket").exists(), 10, "munged's socket", c)
        _wait_for(lambda: _node_idle(c), timeout,
                  f"node{'s' if len(nodes) > 1 else ''} {', '.join(c.nodes)} to be idle", c)
    except BaseException:
        c.stop()
        raise
    return c


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the test process dies (Linux), so a killed
    test run leaves no daemons behind."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _node_idle(c: SlurmCluster) -> bool:
    p = c.run(["sinfo", "-h", "-N", "-o", "%t"], check=False, timeout=10)
    return p.returncode == 0 and p.stdout.split() == ["idle"] * len(c.nodes)


def _wait_for(cond, timeout: float, what: str, c: SlurmCluster) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        dead = [f"{n} exited {p.returncode}" for n, p in c.procs.items() if p.poll() is not None]
        if dead or time.monotonic() > deadline:
            out = "".join((c.root / f"{n}.stdout").read_text(errors="replace")
                          for n in c.procs if (c.root / f"{n}.stdout").exists())
            raise RuntimeError(f"waiting for {what}: "
                               f"{'; '.join(dead) or f'not within {timeout:.0f} s'}\n{out}"
                               f"{c.logs()}")
        time.sleep(0.2)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # stop the daemons on SIGTERM too
    with start() as cluster:
        print(f"one-node Slurm up in {cluster.root} (node {cluster.node}, {cluster.cpus} CPUs)")
        print(f"export SLURM_CONF={cluster.env['SLURM_CONF']}")
        print("Ctrl-C stops it")
        try:
            signal.pause()
        except KeyboardInterrupt:
            pass
