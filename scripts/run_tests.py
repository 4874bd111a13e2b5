"""The test command: serial tests, then the MPI tests at each world size.

    python scripts/run_tests.py              # sizes 1 2 3 4
    python scripts/run_tests.py --sizes 2 -- -k boxing

Every mpiexec gets a time limit (MPIEXEC_TIMEOUT) and every test a per-test
timeout (pytest-timeout, thread method), so a hang ends the run instead of CI.
Prints one closing line ``total: N passed, N failed, N skipped``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def mpiexec_cmd() -> str:
    exe = shutil.which("mpiexec") or shutil.which("mpirun")
    if exe is None:
        sys.exit("no mpiexec on PATH: pip install 'sbpmpi[mpich]' or load your site MPI")
    return exe


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
    ap.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    a = ap.parse_args()
    logs = ROOT / "test-logs"
    shutil.rmtree(logs, ignore_errors=True)
    logs.mkdir()
    env = dict(os.environ, SBPMPI_TEST_LOGDIR=str(logs), PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    results = []
    if not a.no_serial:
        xml = logs / "serial.xml"
        t0 = time.time()
        cmd = [sys.executable, "-m", "pytest", "-q", "-m", "not mpi", f"--junitxml={xml}",
               "tests", *a.pytest_args]
        print("$", " ".join(cmd), flush=True)
        rc = subprocess.call(cmd, cwd=ROOT, env=env)
        results.append(("serial", rc, counts(xml), time.time() - t0))
    for n in [int(x) for x in a.sizes.split(",") if x]:
        xml = logs / f"mpi-n{n}.xml"
        t0 = time.time()
        cmd = [mpiexec_cmd(), "-n", str(n), sys.executable, str(ROOT / "scripts" / "mpi_pytest.py"),
               "-q", "--with-mpi", "-m", "mpi", f"--junitxml={xml}", "tests", *a.pytest_args]
        print("$", " ".join(cmd), flush=True)
        rc = subprocess.call(cmd, cwd=ROOT, env=dict(env, MPIEXEC_TIMEOUT=str(a.timeout)))
        if rc != 0:
            for f in sorted(logs.glob(f"n{n}-rank*.log")):
                print(f"----- {f.name} (last lines) -----")
                print("\n".join(f.read_text(errors="replace").splitlines()[-60:]))
        results.append((f"mpi n={n}", rc, counts(xml), time.time() - t0))
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
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
