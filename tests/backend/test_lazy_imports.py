"""``import sbpmpi`` imports no SciPy: SciPy reads ``SCIPY_ARRAY_API`` once, at its own first
import, so a program that imports sbpmpi and then enables SciPy's array-API mode got
NumPy-only SciPy (``special.erf`` refused global tensors; ``logsumexp`` and others
silently returned NumPy arrays). sbpmpi's ``erf`` imports ``scipy.special`` at its first
call."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

PROGRAM = """
import os, sys
import numpy as np
import sbpmpi as sm
assert not [m for m in sys.modules if m == "scipy" or m.startswith("scipy.")], \\
    sorted(m for m in sys.modules if m.startswith("scipy"))
os.environ["SCIPY_ARRAY_API"] = "1"
from scipy._lib._array_api import SCIPY_ARRAY_API
assert SCIPY_ARRAY_API, SCIPY_ARRAY_API
x = sm.tensor(np.array([0.0, 0.5, -1.0]), placement=sm.placement("cpu", [0]),
              sbp=sm.sbp.broadcast)
got = sm.erf(x).numpy()
import math
assert np.allclose(got, [math.erf(v) for v in (0.0, 0.5, -1.0)], rtol=1e-15), got
assert "scipy.special" in sys.modules  # imported at the first call
print("LAZY-OK")
"""


def test_import_sbpmpi_imports_no_scipy():
    pytest.importorskip("scipy")
    env = {k: v for k, v in os.environ.items() if k != "SCIPY_ARRAY_API"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    res = subprocess.run([sys.executable, "-c", PROGRAM], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and "LAZY-OK" in res.stdout, res.stdout + res.stderr
