"""Real clients on global tensors (issue 29): scikit-learn's estimators and metrics that
declare array-API support, SciPy's array-API functions, array-api-extra and einops give
NumPy's values, at n = 1..4 (7 rows: uneven splits at 3 and 4 ranks).

Each size runs ``client_program.py`` under ``mpiexec`` with ``SCIPY_ARRAY_API=1`` (SciPy
reads it at its first import, so a program of its own), with a time limit. The cases are
``client_cases.cases()``; a case whose global run must raise is listed in
``client_cases.REFUSED`` with its reason, one that returns NumPy's arrays for global ones
by design in ``client_cases.NUMPY_RESULTS`` (both in docs/array_api.md, "Clients"); any
other case given global arrays must return global ones.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from mpirun import job_env, mpiexec

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
TIMEOUT = 480


@pytest.mark.timeout(TIMEOUT + 30)
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_clients_give_numpys_values(n):
    for lib in ("sklearn", "scipy", "array_api_extra", "einops"):
        pytest.importorskip(lib)
    env = job_env(n, TIMEOUT, {"SCIPY_ARRAY_API": "1"})
    res = subprocess.run([*mpiexec(n), sys.executable, str(HERE / "client_program.py")],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    lines = res.stdout.splitlines()
    failed = [ln for ln in lines if ln.startswith("CASE") and "| FAIL" in ln]
    done = [ln for ln in lines if ln.startswith("CLIENTS DONE")]
    assert res.returncode == 0 and done and not failed, (
        "\n".join(failed) + "\n" + "\n".join(lines[-5:]) + res.stderr[-3000:])
