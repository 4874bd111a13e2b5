"""The client sweep under ``mpiexec``: each case of ``client_cases`` on NumPy and on global
tensors, compared on every rank.

    SCIPY_ARRAY_API=1 mpiexec -n 3 python tests/array_api/client_program.py [--only TEXT]

Prints one line per case, ``CASE <library> | <name> | <result> | <output kind> | <time>``:
``ok`` (NumPy's values, in global arrays where the case was given global arrays, unless
it is one of ``client_cases.NUMPY_RESULTS``), ``refused`` (a case of
``client_cases.REFUSED`` that raised), or ``FAIL: ...`` (another error, other values, or
NumPy arrays where global ones were due). Exits 1 when any case fails or when the ranks
disagree on a case's result, after printing ``CLIENTS DONE passed=N refused=N failed=N``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from typing import Any

assert os.environ.get("SCIPY_ARRAY_API") == "1", "set SCIPY_ARRAY_API=1 before starting"

import numpy as np  # noqa: E402
import sklearn  # noqa: E402
from mpi4py import MPI  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import client_cases  # noqa: E402

import sbpmpi as sm  # noqa: E402

xp = sm.array_api
world = MPI.COMM_WORLD


def plain(v: Any) -> tuple[str, Any]:
    """(kind, value as nested lists of NumPy arrays): kind is "global" when a GlobalTensor
    is in the result, "numpy" when arrays are but none is global, else "scalar"."""
    kinds: set[str] = set()

    def conv(v: Any) -> Any:
        if isinstance(v, sm.GlobalTensor):
            kinds.add("global")
            return np.asarray(v.numpy())
        if isinstance(v, np.ndarray):
            kinds.add("numpy")
            return v
        if isinstance(v, dict):
            return {k: conv(e) for k, e in v.items()}
        if isinstance(v, (list, tuple)):
            return [conv(e) for e in v]
        if isinstance(v, (str, bytes)):
            return v
        if hasattr(v, "_asdict"):
            return conv(dict(v._asdict()))
        if hasattr(v, "__iter__") and not np.isscalar(v):
            return [conv(e) for e in v]
        if hasattr(v, "__dict__") and not np.isscalar(v):
            return conv({k: e for k, e in vars(v).items() if not k.startswith("_")})
        return np.asarray(v)

    out = conv(v)
    return ("global" if "global" in kinds else "numpy" if kinds else "scalar"), out


def compare(got: Any, want: Any, rtol: float, atol: float, where: str = "") -> str | None:
    """None when equal (NumPy's allclose, NaN equal to NaN), else where they differ."""
    if isinstance(want, dict):
        if not isinstance(got, dict) or sorted(got) != sorted(want):
            return f"{where}: keys {sorted(got) if isinstance(got, dict) else type(got)} != " \
                   f"{sorted(want)}"
        for k in want:
            d = compare(got[k], want[k], rtol, atol, f"{where}.{k}")
            if d:
                return d
        return None
    if isinstance(want, list):
        if not isinstance(got, list) or len(got) != len(want):
            return f"{where}: {type(got).__name__} of {len(got) if isinstance(got, list) else '?'}" \
                   f" items != list of {len(want)}"
        for i, (g, w) in enumerate(zip(got, want)):
            d = compare(g, w, rtol, atol, f"{where}[{i}]")
            if d:
                return d
        return None
    if isinstance(want, (str, bytes)):
        return None if got == want else f"{where}: {got!r} != {want!r}"
    g, w = np.asarray(got), np.asarray(want)
    if g.shape != w.shape:
        return f"{where}: shape {g.shape} != {w.shape}"
    if w.dtype.kind in "fc" or g.dtype.kind in "fc":
        ok = np.allclose(g, w, rtol=rtol, atol=atol, equal_nan=True)
    else:
        ok = bool(np.all(g == w))
    if not ok:
        return f"{where}: values differ (max abs diff " \
               f"{np.max(np.abs(g.astype(complex) - w.astype(complex))) if g.size else 0:.3g})"
    return None


def run_case(case: client_cases.Case) -> tuple[str, str]:
    """(result, output kind) of one case on this rank."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            with sklearn.config_context(array_api_dispatch=False):
                want_kind, want = plain(case.run(lambda a: np.array(a, copy=True)))
        except Exception as e:  # the reference itself fails: the case is wrong
            return f"FAIL: NumPy reference raised {type(e).__name__}: {e}", "-"
        given: list[bool] = []

        def to(a: Any) -> Any:
            given.append(True)
            return xp.asarray(a)

        try:
            with sklearn.config_context(array_api_dispatch=True):
                kind, got = plain(case.run(to))
        except Exception as e:
            msg = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
            if case.name in client_cases.REFUSED:
                return "refused", msg
            return f"FAIL: {msg}", "-"
    diff = compare(got, want, case.rtol, case.atol)
    if diff:
        return f"FAIL: {diff}", kind
    numpy_by_design = case.name in client_cases.NUMPY_RESULTS
    if given and want_kind != "scalar" and (kind == "numpy") != numpy_by_design:
        return ("FAIL: listed as a NumPy result but returned global arrays" if numpy_by_design
                else "FAIL: NumPy arrays returned for global arrays (not a global result)"), kind
    if case.name in client_cases.REFUSED:
        return "FAIL: listed as refused but passed", kind
    return "ok", kind


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="", help="run the cases whose name contains TEXT")
    a = ap.parse_args()
    counts = {"ok": 0, "refused": 0, "FAIL": 0}
    bad = False
    for case in client_cases.cases():
        if a.only and a.only not in f"{case.library} {case.name}":
            continue
        t0 = time.perf_counter()
        result, kind = run_case(case)
        seconds = time.perf_counter() - t0
        everyone = world.allgather(result)
        if any(r != everyone[0] for r in everyone):
            result = "FAIL: ranks disagree: " + " / ".join(sorted(set(everyone)))
        key = result.split(":")[0]
        counts[key] = counts.get(key, 0) + 1
        bad |= key == "FAIL"
        if world.Get_rank() == 0:
            print(f"CASE {case.library} | {case.name} | {result} | {kind} | {seconds:.2f} s",
                  flush=True)
    if world.Get_rank() == 0:
        print(f"CLIENTS DONE passed={counts['ok']} refused={counts['refused']} "
              f"failed={counts['FAIL']}", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
