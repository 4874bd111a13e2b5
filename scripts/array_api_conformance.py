"""Run the Array API conformance suite (data-apis/array-api-tests) on ``sbpmpi.array_api``
under ``mpiexec -n N``.

    python scripts/array_api_conformance.py --suite PATH [--n 1,2,3,4] [--max-examples 20]
        [--out DIR] [-- extra pytest arguments]

``PATH`` is a checkout of data-apis/array-api-tests with its ``array-api`` submodule
(``git clone --recurse-submodules``); the suite needs ``hypothesis`` and ``ndindex``.
Every rank runs the whole suite as the same SPMD program, with Hypothesis settings that
make every rank draw the same examples: derandomized, no example database, no deadline,
and no health check that depends on time (``too_slow``); failures are not shrunk, and
the global random generators are seeded from the test ID before each test (some tests
draw values with ``strategy.example()``, outside ``@given``). Each rank writes its own JUnit
file (``DIR/n{N}/rank{R}.xml``) and log; the script then checks that every rank recorded
the same outcome for every test ID and prints a table of passed / failed / xfailed /
skipped per world size and per test file.

The xfails file ``scripts/array_api_xfails.txt`` holds one test ID per line followed by
``#`` and the reason; a line without a reason is refused. Exit status: 0 when every run
finished with no failure and identical outcomes on every rank, 1 otherwise.

The same file is a pytest plugin (``-p array_api_conformance``, loaded by each rank): it
replaces the suite's Hypothesis profile with the SPMD settings above.
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
import zlib
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
XFAILS = HERE / "array_api_xfails.txt"
OUTCOMES = ("passed", "failed", "xfailed", "skipped")


# -- the pytest plugin (runs inside every rank) ---------------------------------------------------

@pytest.hookimpl(trylast=True)  # after the suite's conftest registered its profile
def pytest_configure(config: object) -> None:
    """Load a Hypothesis profile every rank draws alike, on top of the suite's own."""
    from hypothesis import HealthCheck, Phase, settings

    base = settings.get_profile("array-api-tests")
    # no shrinking: a failure is reported with the example that found it (shrinking
    # multiplies the time of every failing test and adds nothing to the outcome)
    settings.register_profile("sbpmpi-spmd", parent=base, derandomize=True, database=None,
                              deadline=None, print_blob=False,
                              phases=[Phase.explicit, Phase.generate],
                              suppress_health_check=[HealthCheck.too_slow])
    settings.load_profile("sbpmpi-spmd")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Seed Python's and NumPy's global random generators from the test ID, the same on
    every rank: some tests draw values outside ``@given`` (``strategy.example()``), which
    would otherwise differ between ranks."""
    import random

    import numpy as np

    seed = zlib.crc32(item.nodeid.encode())
    random.seed(seed)
    np.random.seed(seed)


def _worker(args: argparse.Namespace, extra: list[str]) -> int:
    """One rank: run pytest on the suite, JUnit and log under ``--worker DIR``."""
    from mpi4py import MPI

    rank = MPI.COMM_WORLD.Get_rank()
    out = Path(args.worker)
    log = open(out / f"rank{rank}.log", "w")  # noqa: SIM115 (kept open for pytest's output)
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    os.chdir(args.suite)
    sys.path.insert(0, str(HERE))
    paths = [] if any(not a.startswith("-") for a in extra) else ["array_api_tests"]
    code = pytest.main([
        *paths, "-p", "array_api_conformance", "-p", "no:cacheprovider",
        "--max-examples", str(args.max_examples), "--derandomize", "--disable-deadline",
        "--xfails-file", str(out / "xfails.txt"), f"--junitxml={out / f'rank{rank}.xml'}",
        "-q", "-rN", *extra])
    return int(code)


# -- the driver ---------------------------------------------------------------------------------

def read_xfails(path: Path) -> list[str]:
    """The test IDs of the xfails file; every line ``ID  # reason`` (or blank, or a comment)."""
    ids = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        test_id, sep, reason = text.partition("#")
        if not sep or not reason.strip():
            sys.exit(f"{path}:{i}: every xfail needs a reason after '#': {text!r}")
        ids.append(test_id.strip())
    return ids


def outcomes_of(junit: Path) -> dict[str, str]:
    """Test ID -> passed / failed / xfailed / skipped, from one rank's JUnit file."""
    out = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        test_id = f"{case.get('classname')}::{case.get('name')}"
        kind = "passed"
        for child in case:
            if child.tag in ("failure", "error"):
                kind = "failed"
            elif child.tag == "skipped":
                kind = "xfailed" if child.get("type") == "pytest.xfail" else "skipped"
        out[test_id] = kind
    return out


def file_of(test_id: str) -> str:
    """The test file of a JUnit test ID (``array_api_tests.test_x.TestClass::name``)."""
    parts = test_id.split("::")[0].split(".")
    return next((p for p in parts if p.startswith("test_")), parts[-1])


def run(n: int, args: argparse.Namespace, extra: list[str], out: Path) -> dict[str, str] | None:
    """Run the suite at ``n`` ranks; the outcome of each test ID (None: the ranks
    disagree or a rank wrote no JUnit file)."""
    d = out / f"n{n}"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    (d / "xfails.txt").write_text("".join(f"{i}\n" for i in read_xfails(Path(args.xfails))))
    env = dict(os.environ, ARRAY_API_TESTS_MODULE="sbpmpi.array_api",
               ARRAY_API_TESTS_VERSION="2024.12", SBPMPI_TIMEOUT=str(args.op_timeout),
               PYTHONPATH=os.pathsep.join([str(HERE), str(ROOT),
                                           os.environ.get("PYTHONPATH", "")]))
    mpiexec = os.environ.get("SBPMPI_MPIEXEC") or shutil.which("mpiexec") or "mpiexec"
    cmd = [mpiexec, "-n", str(n), sys.executable, str(Path(__file__).resolve()),
           "--suite", str(Path(args.suite).resolve()), "--max-examples", str(args.max_examples),
           "--worker", str(d), "--", *extra]
    t0 = time.monotonic()
    try:
        rc = subprocess.run(cmd, env=env, timeout=args.timeout).returncode
    except subprocess.TimeoutExpired:
        rc = 124
    print(f"n={n}: exit {rc} after {time.monotonic() - t0:.0f} s; logs in {d}", flush=True)
    per_rank = []
    for r in range(n):
        junit = d / f"rank{r}.xml"
        if not junit.exists():
            print(f"n={n}: rank {r} wrote no JUnit file (see {d / f'rank{r}.log'})")
            return None
        per_rank.append(outcomes_of(junit))
    differ = sorted(t for t in set().union(*per_rank)
                    if len({o.get(t) for o in per_rank}) > 1)
    if differ:
        print(f"n={n}: the ranks disagree on {len(differ)} test IDs, e.g.:")
        for t in differ[:10]:
            print(f"  {t}: " + ", ".join(f"rank {r} {o.get(t)}" for r, o in enumerate(per_rank)))
        return None
    return per_rank[0]


def table(results: dict[int, dict[str, str]]) -> str:
    """Markdown table: per world size, then per test file, the count of each outcome."""
    rows = ["| n | test file | " + " | ".join(OUTCOMES) + " | pass rate |",
            "|---|---|" + "---|" * (len(OUTCOMES) + 1)]
    for n, res in sorted(results.items()):
        by_file: dict[str, collections.Counter[str]] = collections.defaultdict(
            collections.Counter)
        for t, kind in res.items():
            by_file[file_of(t)][kind] += 1
        total: collections.Counter[str] = sum(by_file.values(), collections.Counter())
        for name, c in [*sorted(by_file.items()), ("**all**", total)]:
            counted = sum(c[k] for k in OUTCOMES)
            rate = f"{100 * c['passed'] / counted:.1f}%" if counted else "-"
            rows.append(f"| {n} | {name} | " + " | ".join(str(c[k]) for k in OUTCOMES)
                        + f" | {rate} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    extra: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--suite", required=True, help="checkout of data-apis/array-api-tests")
    p.add_argument("--n", default="1,2,3,4", help="world sizes, comma-separated")
    p.add_argument("--max-examples", type=int, default=20)
    p.add_argument("--xfails", default=str(XFAILS))
    p.add_argument("--out", default=None, help="folder of JUnit files and logs (default: a "
                   "new temporary folder)")
    p.add_argument("--timeout", type=float, default=3600, help="seconds per world size")
    p.add_argument("--op-timeout", type=float, default=300,
                   help="SBPMPI_TIMEOUT of the runs: seconds one collective may wait")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if not (Path(args.suite) / "array_api_tests").is_dir():
        p.error(f"--suite {args.suite}: no array_api_tests folder (a checkout of "
                f"data-apis/array-api-tests with its array-api submodule is expected)")
    if args.worker:
        return _worker(args, extra)
    read_xfails(Path(args.xfails))  # a line without a reason stops here, before any run
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="array-api-conf-"))
    results: dict[int, dict[str, str]] = {}
    ok = True
    for n in (int(s) for s in args.n.split(",")):
        res = run(n, args, extra, out)
        if res is None:
            ok = False
            continue
        results[n] = res
        ok = ok and "failed" not in res.values()
    if results:
        print(table(results))
        sets = {n: frozenset(t for t, k in r.items() if k == "passed") for n, r in results.items()}
        if len(set(sets.values())) > 1:
            print("the pass sets differ between world sizes: " + ", ".join(
                f"n={n}: {len(s)}" for n, s in sorted(sets.items())))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
