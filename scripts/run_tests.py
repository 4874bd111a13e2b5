"""The test command: serial tests, then the MPI tests at each world size.

    python scripts/run_tests.py              # sizes 1 2 3 4
    python scripts/run_tests.py --sizes 2 -- -k boxing
    python scripts/run_tests.py --mpiexec-args "--bind-to none"
    python scripts/run_tests.py --hosts 2      # across 2 hosts made on this machine (root)

Runs on any MPI: it detects the family of the mpiexec (MPICH/Hydra, Intel MPI, Open MPI
4 or 5, srun; sbpmpi/tools/launcher_family.py) and sets what it needs in the environment of
every run, so that mpiexec calls made by the tests get it too: under Open MPI as root
OMPI_ALLOW_RUN_AS_ROOT(_CONFIRM)=1, and oversubscription when the sizes exceed the
cores. Extra mpiexec arguments come from --mpiexec-args and $SBPMPI_MPIEXEC_ARGS (which
is passed on to the tests); $SBPMPI_MPIEXEC picks the mpiexec.

Every mpiexec gets a time limit (MPIEXEC_TIMEOUT) and every test a per-test
timeout (pytest-timeout, thread method), so a hang ends the run instead of CI.
Prints one closing line ``total: N passed, N failed, N skipped``.

``--hosts K`` runs across K hosts, each a network namespace of this machine
(tests/tools/hosts_cluster.py; root, Linux): the MPI tests at K x ``--ppn`` ranks (2 per host
by default), then the tests that start jobs of their own (faults, the abort runner, the
exit agreement) with one rank per host. The MPI library keeps its defaults. Where the
hosts cannot be made (not root, no ``ip``), it says why and runs nothing.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parent.parent


def mpiexec_cmd() -> str:
    given = os.environ.get("SBPMPI_MPIEXEC")
    exe = shutil.which(given) if given else (shutil.which("mpiexec") or shutil.which("mpirun"))
    if exe is None:
        sys.exit(f"SBPMPI_MPIEXEC={given!r} is not an executable" if given else
                 "no mpiexec on PATH: pip install 'sbpmpi[mpich]' or load your site MPI")
    return exe


def launcher_family():  # noqa: ANN201 - a module
    """sbpmpi/tools/launcher_family.py, loaded by path: importing the sbpmpi package would
    start MPI in this process, which only starts mpiexec."""
    path = ROOT / "sbpmpi" / "tools" / "launcher_family.py"
    spec = importlib.util.spec_from_file_location("_sbpmpi_launcher_family", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def glue_mpiexec_args(argv: list[str]) -> list[str]:
    """``--mpiexec-args --x`` -> ``--mpiexec-args=--x`` (argparse would take --x for an
    option), up to a ``--``."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        if argv[i] == "--":
            return out + argv[i:]
        if argv[i] == "--mpiexec-args" and i + 1 < len(argv):
            out.append(f"--mpiexec-args={argv[i + 1]}")
            i += 2
            continue
        out.append(argv[i])
        i += 1
    return out


def hosts_cluster():  # noqa: ANN201 - a module
    """tests/tools/hosts_cluster.py, loaded by path (it imports nothing of sbpmpi)."""
    path = ROOT / "tests" / "tools" / "hosts_cluster.py"
    spec = importlib.util.spec_from_file_location("_sbpmpi_hosts_cluster", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


# the tests that start jobs of their own, run with one rank per host under --hosts
OWN_JOBS = ["tests/faults/test_faults.py", "tests/faults/test_abort_runner.py",
            "tests/faults/test_exit_codes.py"]
# the tests of the hosts themselves, also run at 1 and 3 ranks per host under --hosts
TOPOLOGY_TESTS = ["tests/comm/test_world.py", "tests/core/test_placement_by_node.py",
                  "tests/boxing/test_hierarchical.py"]


class MpiRun(NamedTuple):
    """One ``mpiexec`` of the MPI tests: its name, ranks, environment, arguments, tests."""

    name: str
    n: int
    env: dict[str, str]
    args: list[str]
    where: list[str]


def counts(xml: Path) -> tuple[int, int, int]:
    if not xml.exists():
        return 0, 1, 0
    root = ET.parse(xml).getroot()
    suites = [root] if root.tag == "testsuite" else list(root)
    t = f = s = 0
    for su in suites:
        t += int(su.get("tests", 0))
        f += int(su.get("failures", 0)) + int(su.get("errors", 0))
        s += int(su.get("skipped", 0))
    return t - f - s, f, s


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--sizes", default="1,2,3,4", help="MPI world sizes (comma separated)")
    ap.add_argument("--no-serial", action="store_true", help="skip the serial (non-MPI) tests")
    ap.add_argument("--timeout", type=int, default=int(os.environ.get("SBPMPI_TEST_TIMEOUT", 1800)),
                    help="seconds allowed for each mpiexec run")
    ap.add_argument("--mpiexec-args", action="append", default=[], metavar="ARGS",
                    help="extra mpiexec arguments, one string split like a shell; may be repeated "
                         "(also $SBPMPI_MPIEXEC_ARGS, which comes first)")
    ap.add_argument("--logs", default=str(ROOT / "test-logs"),
                    help="folder for the rank logs and JUnit files (emptied first)")
    ap.add_argument("--hosts", type=int, default=0, metavar="K",
                    help="run across K hosts made on this machine (root): the MPI tests at "
                         "K x --ppn ranks, the fault, abort and exit tests at 1 rank per host")
    ap.add_argument("--ppn", type=int, default=2, help="with --hosts: MPI ranks per host")
    ap.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    a = ap.parse_args(glue_mpiexec_args(sys.argv[1:]))
    sizes = [int(x) for x in a.sizes.split(",") if x]
    if any(n < 1 for n in sizes):
        ap.error(f"--sizes must be positive, got {a.sizes!r}")
    if a.hosts < 0 or a.ppn < 1:
        ap.error(f"--hosts must be >= 0 and --ppn >= 1, got {a.hosts} and {a.ppn}")
    try:
        extra = " ".join(filter(None, [os.environ.get("SBPMPI_MPIEXEC_ARGS", ""),
                                       *a.mpiexec_args]))
        mpiexec_args = shlex.split(extra)
    except ValueError as e:
        ap.error(f"--mpiexec-args / SBPMPI_MPIEXEC_ARGS: {e}")
    if a.hosts:
        hc = hosts_cluster()
        why = hc.unavailable()
        if why:
            print(f"--hosts {a.hosts}: no cluster of hosts here: {why}; nothing run")
            print("total: 0 passed, 0 failed, 0 skipped")
            return 0
        # a SIGTERM (a CI runner's time limit) ends through the ``with``: the hosts go too
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        with hc.start(a.hosts, mpiexec=mpiexec_cmd()) as cluster:
            print(f"hosts: {', '.join(cluster.names)} (tests/tools/hosts_cluster.py)", flush=True)
            return run(a, mpiexec_args, cluster)
    return run(a, mpiexec_args, None)


def run(a: argparse.Namespace, mpiexec_args: list[str], cluster) -> int:  # noqa: ANN001
    """The serial and the MPI runs; on ``cluster`` (a hosts_cluster.HostsCluster) when given."""
    exe = mpiexec_cmd() if cluster is None else str(cluster.mpiexec_wrapper)
    extra = shlex.join(mpiexec_args)
    sizes = [int(x) for x in a.sizes.split(",") if x]
    logs = Path(a.logs).resolve()
    shutil.rmtree(logs, ignore_errors=True)
    logs.mkdir()
    env = dict(os.environ, SBPMPI_TEST_LOGDIR=str(logs), PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    # test files or folders among the pytest arguments replace the default "tests"
    given = [x for x in a.pytest_args if not x.startswith("-") and (ROOT / x.split("::")[0]).exists()]
    where = given or ["tests"]
    options = [x for x in a.pytest_args if x not in given]
    if cluster is None:
        if extra:
            env["SBPMPI_MPIEXEC_ARGS"] = extra  # for the mpiexec calls the tests make
        serial = (env, where)
        runs = [MpiRun(f"mpi n={n}", n, env, mpiexec_args, where) for n in sizes]
    else:
        # every mpiexec, the tests' own too, spans the hosts (the arguments given come
        # after the hosts'): the MPI tests at a.ppn ranks per host, the tests of the
        # hosts also at 1 and 3, and the jobs the serial tests start at 1 rank per host
        def on_hosts(ppn: int) -> dict[str, str]:
            e = cluster.env(ppn, env)
            e["SBPMPI_MPIEXEC_ARGS"] = " ".join(filter(None, [e["SBPMPI_MPIEXEC_ARGS"], extra]))
            return e

        def mpi_run(ppn: int, tests: list[str]) -> MpiRun:
            e = on_hosts(ppn)
            return MpiRun(f"{a.hosts}x{ppn} mpi", a.hosts * ppn, e,
                          shlex.split(e["SBPMPI_MPIEXEC_ARGS"]), tests)

        serial = (on_hosts(1), where if given else OWN_JOBS)
        topology = [x for x in given if x.split("::")[0] in TOPOLOGY_TESTS] if given \
            else TOPOLOGY_TESTS
        runs = [mpi_run(a.ppn, where)] + [mpi_run(ppn, topology) for ppn in (1, 3)
                                          if ppn != a.ppn and topology]
    # the tests start jobs of up to 4 ranks themselves
    info, added = launcher_family().needed_env(exe, max([4, *(r.n for r in runs)]), environ=env)
    for e in {id(x): x for x in [serial[0], *(r.env for r in runs)]}.values():
        e.update(added)
    print(f"mpiexec: {exe} ({info.description})"
          + ("; environment added: " + " ".join(f"{k}={v}" for k, v in added.items())
             if added else ""), flush=True)
    results = []
    if not a.no_serial:
        xml = logs / "serial.xml"
        t0 = time.time()
        cmd = [sys.executable, "-m", "pytest", "-q", "-m", "not mpi", f"--junitxml={xml}",
               *serial[1], *options]
        print("$", " ".join(cmd), flush=True)
        rc = subprocess.call(cmd, cwd=ROOT, env=serial[0])
        if rc == 5 and given:  # the files given have no serial tests
            rc = 0
        name = "serial" if cluster is None else f"{a.hosts}x1 own"
        results.append((name, rc, counts(xml), time.time() - t0))
    for run in runs:
        n = run.n
        xml = logs / f"mpi-n{n}.xml"
        t0 = time.time()
        cmd = [exe, "-n", str(n), *run.args, sys.executable,
               str(ROOT / "scripts" / "mpi_pytest.py"),
               "-q", "--with-mpi", "-m", "mpi", f"--junitxml={xml}", *run.where, *options]
        print("$", " ".join(cmd), flush=True)
        rc = subprocess.call(cmd, cwd=ROOT, env=dict(run.env, MPIEXEC_TIMEOUT=str(a.timeout)))
        if rc == 5 and given:  # pytest: no test collected; the files given have no MPI tests
            rc = 0
        if rc != 0:
            for f in sorted(logs.glob(f"n{n}-rank*.log")):
                print(f"----- {f.name} (last lines) -----")
                print("\n".join(f.read_text(errors="replace").splitlines()[-60:]))
        results.append((run.name, rc, counts(xml), time.time() - t0))
    print("\n run         rc  passed  failed  skipped  seconds")
    tp = tf = ts = 0
    bad = False
    for name, rc, (p, f, s), dt in results:
        print(f" {name:<10} {rc:>3} {p:>7} {f:>7} {s:>8} {dt:>8.1f}")
        tp, tf, ts = tp + p, tf + f, ts + s
        bad = bad or rc != 0
    if bad and tf == 0:
        tf = 1  # a rank failed or the run died: never report green
    print(f"total: {tp} passed, {tf} failed, {ts} skipped")
    return 1 if bad or tf else 0  # a run without its JUnit file counts as failed


if __name__ == "__main__":
    sys.exit(main())
