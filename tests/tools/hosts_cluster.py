"""A private cluster of hosts on this machine, for the tests (and for trying things by hand).

Each host is a Linux network namespace with its own hostname (a persistent UTS
namespace), joined to the others by a bridge, so that MPI sees several hosts: its
shared-memory split gives one communicator per host and messages between hosts go over
TCP. ``mpiexec`` reaches the hosts through an ``ssh`` stand-in that runs a command inside
a host's namespaces. The file system, ``/dev/shm``, the PIDs and the Python environment
are the machine's, so the same paths work on every host. Root only (Linux).

Every name is this cluster's own: namespaces ``sbh<id>-<i>``, a bridge and links
``sbh<id>...``, a free ``10.x.y.0/24``, hostnames ``sbh<id>-<i>`` in ``/etc/hosts`` on
lines tagged ``# sbpmpi-hosts <id>``, and a state folder ``/run/sbpmpi-hosts/<id>`` (the
``ssh`` stand-in and an ``mpiexec`` wrapper), so it cannot clash with another cluster of
this kind, nor with ``../shared/multinode``'s. :meth:`HostsCluster.stop` removes all of it,
also after a failure; :func:`start` first removes what a cluster whose process died left.

    import hosts_cluster
    reason = hosts_cluster.unavailable()          # None, or why it cannot run here
    with hosts_cluster.start(2) as c:             # two hosts
        c.shape("10gbit", "20us")                 # optional: link rate and delay
        subprocess.run(c.mpiexec(4, ppn=2) + [sys.executable, "prog.py"], env=c.env())

``c.env()`` holds ``SBPMPI_MPIEXEC`` (the wrapper: ``mpiexec`` run inside the first host,
as on a cluster's first compute node) and ``SBPMPI_MPIEXEC_ARGS`` (the launcher
arguments: the hosts, ranks per host, the ``ssh`` stand-in), so that every ``mpiexec`` the
tests start -- from this namespace or from a rank on any host -- spans the hosts. The MPI
library keeps its defaults (no netmod chosen); only ``UCX_TLS=self,tcp``: UCX tells
machines apart by boot id, not hostname, and would otherwise pass messages between these
"hosts" through shared memory.

By hand::

    python tests/tools/hosts_cluster.py run -k 2 --ppn 2 -- python -m sbpmpi info   # mpiexec -n 4
    python tests/tools/hosts_cluster.py up -k 2      # prints the environment, stops on Ctrl-C
    python tests/tools/hosts_cluster.py clean        # what dead clusters left behind
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import ipaddress
import os
import random
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

STATE = Path("/run/sbpmpi-hosts")
HOSTS_FILE = Path("/etc/hosts")
TAG = "# sbpmpi-hosts"
TOOLS = ("ip", "unshare", "nsenter", "tc")


def _which(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin:/sbin:/bin")


def _run(cmd: Sequence[str], check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
    p = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout, check=False)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {p.returncode}: {p.stderr.strip()}")
    return p


def unavailable() -> str | None:
    """Why a cluster of hosts cannot be made here, or None when it can."""
    if sys.platform != "linux":
        return f"network namespaces need Linux, this is {sys.platform}"
    if os.geteuid() != 0:
        return "making network namespaces needs root; the user is not root"
    missing = [t for t in TOOLS if _which(t) is None]
    if missing:
        return (f"{', '.join(missing)} not found (iproute2 and util-linux; on Debian/Ubuntu: "
                f"apt-get install iproute2 util-linux)")
    probe = f"sbhprobe{os.getpid()}"
    p = _run(["ip", "netns", "add", probe], check=False)
    if p.returncode != 0:
        return f"ip netns add fails here: {p.stderr.strip()}"
    _run(["ip", "netns", "del", probe], check=False)
    return None


@dataclass(frozen=True)
class Host:
    """One host: its name (hostname and namespace), address, UTS mount and link."""

    name: str
    address: str
    uts: Path
    link: str  # the root-namespace end of its veth pair, on the bridge

    def prefix(self) -> list[str]:
        """The command prefix that runs a program on this host."""
        return ["ip", "netns", "exec", self.name, "nsenter", f"--uts={self.uts}", "--"]

    def prefix_keeping_mounts(self) -> list[str]:
        """The same in this machine's mount namespace: ``ip netns exec`` mounts a sysfs of
        its own, without ``/sys/fs/cgroup`` (which ``slurmd`` needs)."""
        return ["nsenter", f"--net=/run/netns/{self.name}", f"--uts={self.uts}", "--"]


@dataclass
class HostsCluster:
    """A running cluster; :meth:`stop` (or leaving the ``with`` block) removes it."""

    id: str
    root: Path
    bridge: str
    subnet: str
    hosts: list[Host] = field(default_factory=list)
    shaping: str = "unshaped"
    family: str = "mpich"

    @property
    def names(self) -> list[str]:
        return [h.name for h in self.hosts]

    @property
    def ssh(self) -> Path:
        """The ``ssh`` stand-in: ``ssh [options] HOST COMMAND...`` runs it on HOST."""
        return self.root / "ssh"

    @property
    def mpiexec_wrapper(self) -> Path:
        """``mpiexec`` run inside the first host (its hostname is reachable from every host)."""
        return self.root / "mpiexec"

    def launcher_args(self, ppn: int, hosts: int | None = None) -> list[str]:
        """The ``mpiexec`` arguments that place ``ppn`` ranks on each of the first ``hosts``
        hosts (all by default), filling them in order."""
        names = self.names[:hosts or len(self.hosts)]
        if self.family == "openmpi":
            return ["--host", ",".join(f"{n}:{ppn}" for n in names),
                    "--prtemca", "plm_ssh_agent", str(self.ssh),
                    "--mca", "btl", "tcp,self,sm", "--mca", "btl_tcp_if_include", "eth0",
                    "--mca", "pml", "ob1", "--prtemca", "oob_tcp_if_include", "eth0"]
        return ["-launcher", "ssh", "-launcher-exec", str(self.ssh), "-hosts", ",".join(names),
                "-ppn", str(ppn)]

    def mpiexec(self, n: int, ppn: int) -> list[str]:
        """``[mpiexec, -n, N, *launcher args]``: put the program after it."""
        return [str(self.mpiexec_wrapper), "-n", str(n), *self.launcher_args(ppn)]

    def env(self, ppn: int = 2, base: dict[str, str] | None = None) -> dict[str, str]:
        """``base`` (this environment) with every ``mpiexec`` of sbpmpi and of the tests
        spanning the hosts, ``ppn`` ranks on each."""
        env = dict(os.environ if base is None else base)
        env["SBPMPI_MPIEXEC"] = str(self.mpiexec_wrapper)
        env["SBPMPI_MPIEXEC_ARGS"] = shlex.join(self.launcher_args(ppn))
        env.setdefault("UCX_TLS", "self,tcp")
        return env

    def shape(self, rate: str | None = "10gbit", delay: str | None = "20us") -> str:
        """Limit what each host sends to ``rate`` after a ``delay`` (``tc`` on its link).

        ``netem`` does both; a kernel without it gets ``tbf`` (the rate only) and the
        returned description says that the delay could not be set.
        """
        said = []
        for h in self.hosts:
            _run(h.prefix() + ["tc", "qdisc", "del", "dev", "eth0", "root"], check=False)
            netem = ["netem"] + (["rate", rate] if rate else []) + \
                (["delay", delay] if delay else []) + ["limit", "100000"]
            p = _run(h.prefix() + ["tc", "qdisc", "add", "dev", "eth0", "root", *netem],
                     check=False)
            if p.returncode == 0:
                said = [f"netem rate {rate or 'unlimited'} delay {delay or '0'}"]
                continue
            if not rate:
                raise RuntimeError(f"tc netem is not available here ({p.stderr.strip()}): "
                                   f"no delay can be set")
            _run(h.prefix() + ["tc", "qdisc", "add", "dev", "eth0", "root", "tbf", "rate", rate,
                               "burst", "256kb", "latency", "50ms"])
            said = [f"tbf rate {rate} (no netem in this kernel: delay {delay or '0'} not set)"]
        self.shaping = "; ".join(said) or "unshaped"
        return self.shaping

    def run_on(self, host: int, cmd: Sequence[str], **kw: object) -> subprocess.CompletedProcess:
        """Run ``cmd`` on host ``host`` (0-based) and wait for it."""
        return subprocess.run(self.hosts[host].prefix() + list(cmd), **kw)  # type: ignore[call-overload]

    def stop(self) -> None:
        """Remove everything this cluster made (safe to call twice)."""
        _teardown(self.root)

    def __enter__(self) -> HostsCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


# -- making and removing ------------------------------------------------------------------

@contextlib.contextmanager
def _locked() -> Iterator[None]:
    """One writer of /etc/hosts and of the subnet choice at a time (among these clusters)."""
    STATE.mkdir(parents=True, exist_ok=True)
    with open(STATE / ".lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _rewrite_hosts(keep: Callable[[str], bool], add: Sequence[str] = ()) -> None:
    """Rewrite /etc/hosts in place (it may be a bind mount, which a rename would break)."""
    lines = HOSTS_FILE.read_text().splitlines(keepends=True)
    text = "".join(x for x in lines if keep(x))
    if text and not text.endswith("\n"):
        text += "\n"
    text += "".join(f"{a}\n" for a in add)
    with open(HOSTS_FILE, "r+") as f:
        f.seek(0)
        f.write(text)
        f.truncate()


def _used_subnets() -> set[str]:
    out = _run(["ip", "-o", "-4", "route", "show", "table", "all"], check=False).stdout
    out += _run(["ip", "-o", "-4", "addr", "show"], check=False).stdout
    used = set()
    for word in out.split():
        try:
            net = ipaddress.ip_network(word, strict=False)
        except ValueError:
            continue
        if net.version == 4:
            used.add(str(ipaddress.ip_network(f"{net.network_address}/24", strict=False)))
    return used


def _free_subnet() -> str:
    used = _used_subnets()
    rng = random.SystemRandom()
    for _ in range(1000):
        net = f"10.{rng.randrange(224, 254)}.{rng.randrange(0, 256)}.0/24"
        if net not in used:
            return net
    raise RuntimeError("no free 10.x.y.0/24 subnet found for the cluster of hosts")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clean_stale() -> list[str]:
    """Remove the clusters whose owning process has died; returns their ids."""
    gone = []
    if not STATE.exists():
        return gone
    for d in STATE.iterdir():
        if not d.is_dir():
            continue
        try:
            owner = int((d / "owner").read_text())
        except (OSError, ValueError):
            owner = -1
        if owner <= 0 or not _pid_alive(owner):
            _teardown(d)
            gone.append(d.name)
    return gone


def _teardown(root: Path) -> None:
    """Undo what :func:`start` recorded in ``root`` (each step alone: one failing does not
    stop the others)."""
    cid = root.name
    rec = root / "made"
    made = rec.read_text().split() if rec.exists() else []
    for item in reversed(made):
        kind, _, name = item.partition(":")
        if kind == "netns":
            pids = _run(["ip", "netns", "pids", name], check=False).stdout.split()
            for sig in (signal.SIGTERM, signal.SIGKILL):
                for pid in pids:
                    with contextlib.suppress(OSError, ValueError):
                        os.kill(int(pid), sig)
                if pids:
                    time.sleep(0.5)
                pids = _run(["ip", "netns", "pids", name], check=False).stdout.split()
            _run(["ip", "netns", "del", name], check=False)
        elif kind == "uts":
            _run(["umount", name], check=False)
        elif kind == "link":
            if _run(["ip", "link", "show", name], check=False).returncode == 0:
                _run(["ip", "link", "del", name], check=False)
    if HOSTS_FILE.exists():
        mark = f"{TAG} {cid}"
        with contextlib.suppress(OSError):
            with _locked():
                _rewrite_hosts(lambda line: not line.rstrip().endswith(mark))
    shutil.rmtree(root, ignore_errors=True)


def _family(mpiexec: str) -> str:
    try:
        out = subprocess.run([mpiexec, "--version"], capture_output=True, text=True,
                             timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return "mpich"
    low = out.lower()
    return "openmpi" if ("open mpi" in low or "open-mpi" in low or "prte" in low) else "mpich"


def _write_scripts(c: HostsCluster, mpiexec: str) -> None:
    cases = "\n".join(f"    {h.name}|{h.address}) ns={h.name} uts={h.uts} ;;" for h in c.hosts)
    c.ssh.write_text(f"""#!/bin/sh
# ssh stand-in of the cluster of hosts {c.id} (tests/tools/hosts_cluster.py): runs the command
# inside the host's network and UTS namespaces. Options (hydra and PRRTE pass -x) are skipped.
while [ $# -gt 0 ]; do
    case "$1" in
        -[bcDEeFIiJLlmOopQRSWw]) shift 2 ;;
        -*) shift ;;
        *) break ;;
    esac
done
host=${{1:?no host}}; shift
case "$host" in
{cases}
    *) echo "ssh stand-in: $host is not a host of cluster {c.id}" >&2; exit 255 ;;
esac
exec ip netns exec "$ns" nsenter --uts="$uts" -- sh -c "$*"
""")
    first = c.hosts[0]
    c.mpiexec_wrapper.write_text(f"""#!/bin/sh
# mpiexec run inside the first host of cluster {c.id} (tests/tools/hosts_cluster.py)
exec {shlex.join(first.prefix())} {shlex.quote(mpiexec)} "$@"
""")
    c.ssh.chmod(0o755)
    c.mpiexec_wrapper.chmod(0o755)


def start(k: int = 2, *, mpiexec: str | None = None) -> HostsCluster:
    """Make a cluster of ``k`` hosts; raise RuntimeError (after removing what was made)
    when it cannot. ``mpiexec``: the real one (``$SBPMPI_MPIEXEC`` or the one on PATH)."""
    if not isinstance(k, int) or not 1 <= k <= 16:
        raise ValueError(f"k must be 1..16 hosts, got {k!r}")
    why = unavailable()
    if why:
        raise RuntimeError(why)
    real = mpiexec or os.environ.get("SBPMPI_MPIEXEC") or shutil.which("mpiexec")
    if not real:
        raise RuntimeError("no mpiexec on PATH")
    real = shutil.which(real) or real
    clean_stale()
    cid = f"{os.getpid() % 100000:05d}{random.SystemRandom().randrange(16 ** 2):02x}"
    cid = cid[-6:]
    root = STATE / cid
    root.mkdir(parents=True)
    (root / "owner").write_text(str(os.getpid()))
    made = root / "made"
    made.write_text("")

    def record(item: str) -> None:
        with open(made, "a") as f:
            f.write(item + "\n")

    c = HostsCluster(cid, root, bridge=f"sbh{cid}b", subnet="", family=_family(real))
    try:
        with _locked():
            c.subnet = _free_subnet()
            base = c.subnet.rsplit(".", 1)[0]
            record(f"link:{c.bridge}")
            _run(["ip", "link", "add", c.bridge, "type", "bridge"])
            _run(["ip", "addr", "add", f"{base}.1/24", "dev", c.bridge])
            _run(["ip", "link", "set", c.bridge, "up"])
            lines = []
            for i in range(1, k + 1):
                name, link = f"sbh{cid}-{i}", f"sbh{cid}v{i}"
                h = Host(name, f"{base}.{10 + i}", root / f"uts-{i}", link)
                record(f"netns:{name}")
                _run(["ip", "netns", "add", name])
                record(f"link:{link}")
                _run(["ip", "link", "add", link, "type", "veth", "peer", "name", "eth0",
                      "netns", name])
                _run(["ip", "link", "set", link, "master", c.bridge, "up"])
                _run(["ip", "-n", name, "link", "set", "lo", "up"])
                _run(["ip", "-n", name, "addr", "add", f"{h.address}/24", "dev", "eth0"])
                _run(["ip", "-n", name, "link", "set", "eth0", "up"])
                h.uts.touch()
                record(f"uts:{h.uts}")
                _run(["unshare", f"--uts={h.uts}", "hostname", name])
                lines.append(f"{h.address} {name} {TAG} {cid}")
                c.hosts.append(h)
            _rewrite_hosts(lambda line: True, lines)
        _write_scripts(c, real)
        for i, h in enumerate(c.hosts):  # each host knows its name and reaches the others
            got = _run(h.prefix() + ["hostname"]).stdout.strip()
            if got != h.name:
                raise RuntimeError(f"host {i + 1} calls itself {got!r}, not {h.name!r}")
        if k > 1:
            _run(c.hosts[0].prefix() + ["ping", "-c", "1", "-W", "5", c.hosts[1].name],
                 check=_which("ping") is not None)
    except BaseException:
        c.stop()
        raise
    return c



def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("action", choices=("run", "up", "clean"))
    ap.add_argument("-k", type=int, default=2, help="number of hosts")
    ap.add_argument("--ppn", type=int, default=2, help="ranks per host")
    ap.add_argument("--rate", default=None, help="shape each host's link (e.g. 10gbit)")
    ap.add_argument("--delay", default=None, help="with --rate: one-way delay (e.g. 20us)")
    ap.add_argument("-n", type=int, default=None, help="ranks (default: k * ppn)")
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    a = ap.parse_args(argv[:cut])
    command = argv[cut + 1:]
    # a SIGTERM (timeout, a CI runner) ends through the ``with`` below: the hosts go too
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if a.action == "clean":
        print("removed:", " ".join(clean_stale()) or "nothing")
        return 0
    why = unavailable()
    if why:
        print(f"hosts_cluster: {why}", file=sys.stderr)
        return 2
    with start(a.k) as c:
        if a.rate or a.delay:
            print("links:", c.shape(a.rate, a.delay), flush=True)
        env = c.env(a.ppn)
        if a.action == "up":
            print(f"{a.k} hosts up ({', '.join(c.names)}):")
            for k in ("SBPMPI_MPIEXEC", "SBPMPI_MPIEXEC_ARGS", "UCX_TLS"):
                print(f"export {k}={shlex.quote(env[k])}")
            print("Ctrl-C removes them", flush=True)
            with contextlib.suppress(KeyboardInterrupt):
                signal.pause()
            return 0
        if not command:
            ap.error("run: give the program after --")
        return subprocess.call(c.mpiexec(a.n or a.k * a.ppn, a.ppn) + command, env=env)


if __name__ == "__main__":
    sys.exit(main())
