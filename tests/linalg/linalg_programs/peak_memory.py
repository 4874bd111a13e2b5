"""Each rank's peak memory growth during the size-of-the-data linalg calls, as JSON lines.

    mpiexec -n N python peak_memory.py ROWS COLS

The matrix (ROWS x COLS float64) is made shard by shard (no rank ever holds it whole)
and split by rows. Before each call the kernel's peak-RSS mark is reset
(``/proc/self/clear_refs``); the growth is the peak during the call (its results
included) less the resident memory before it. Run with ``MALLOC_MMAP_THRESHOLD_`` low, so
that freed arrays leave the resident set. Rank 0 prints one JSON object per call:
``{"call", "shard", "growth": [per rank]}``, all in bytes.
"""

from __future__ import annotations

import gc
import json
import os
import sys

os.environ.setdefault("SCIPY_ARRAY_API", "1")

import numpy as np  # noqa: E402

import sbpmpi as sm  # noqa: E402
from sbpmpi import array_api as xp  # noqa: E402
from sbpmpi.core.layout import balanced_range  # noqa: E402
from sbpmpi.linalg import blocks  # noqa: E402


def status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def growth(call) -> int:
    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the peak mark back to the resident set
    before = status("VmRSS")
    out = call()
    peak = status("VmHWM")
    del out
    gc.collect()
    return peak - before


def main() -> None:
    rows, cols = int(sys.argv[1]), int(sys.argv[2])
    rank, size = sm.env.get_rank(), sm.env.get_world_size()
    pl = sm.placement("cpu", list(range(size)))

    def split_matrix(m: int, n: int, seed: int) -> tuple[sm.GlobalTensor, sm.GlobalTensor]:
        lo, hi = balanced_range(m, size, rank)
        rng = np.random.default_rng([seed, rank])
        a = sm.to_global(rng.normal(size=(hi - lo, n)), placement=pl, sbp=sm.sbp.split(0))
        b = sm.to_global(rng.normal(size=(hi - lo,)), placement=pl, sbp=sm.sbp.split(0))
        return a, b

    import sklearn
    from sklearn.decomposition import PCA
    from sklearn.discriminant_analysis import LinearDiscriminantAnalysis
    from sklearn.linear_model import Ridge

    def labels(x: sm.GlobalTensor) -> sm.GlobalTensor:
        local = (np.abs(x.to_local()[:, 0] * 7).astype(np.int64) % 3)
        return sm.to_global(local, placement=pl, sbp=sm.sbp.split(0))

    def without_scipy(call):
        """``call`` with each block factored by NumPy's LAPACK (as where SciPy is absent)."""
        def run(a, b):
            lapack, blocks._LAPACK = blocks._LAPACK, None
            try:
                return call(a, b)
            finally:
                blocks._LAPACK = lapack
        return run

    calls = {
        "qr": lambda a, b: xp.linalg.qr(a),
        "svd": lambda a, b: xp.linalg.svd(a, full_matrices=False),
        "qr(numpy)": without_scipy(lambda a, b: xp.linalg.qr(a)),
        "svd(numpy)": without_scipy(lambda a, b: xp.linalg.svd(a, full_matrices=False)),
        "svdvals": lambda a, b: xp.linalg.svdvals(a),
        "matrix_norm(2)": lambda a, b: xp.linalg.matrix_norm(a, ord=2),
        "matrix_rank": lambda a, b: xp.linalg.matrix_rank(a),
        "pinv": lambda a, b: xp.linalg.pinv(a),
        "lstsq": lambda a, b: sm.linalg.lstsq(a, b),
        "svd_randomized": lambda a, b: sm.linalg.svd_randomized(a, 4),
        "PCA(full)": lambda a, b: PCA(4, svd_solver="full").fit(a),
        "PCA(randomized)": lambda a, b: PCA(4, svd_solver="randomized",
                                            power_iteration_normalizer="QR",
                                            random_state=0).fit(a),
        "Ridge(svd)": lambda a, b: Ridge(1.0, solver="svd").fit(a, b),
        "LinearDiscriminantAnalysis": lambda a, b: LinearDiscriminantAnalysis().fit(a, y),
    }
    with sklearn.config_context(array_api_dispatch=True):
        small, small_b = split_matrix(64 * size, cols, 1)
        y = labels(small)
        for call in calls.values():  # warm up: imports, caches, BLAS threads
            call(small, small_b)
        a, b = split_matrix(rows, cols, 2)
        y = labels(a)
        shard = a.to_local().nbytes
        for name, call in calls.items():
            g = growth(lambda: call(a, b))  # noqa: B023
            everyone = sm.comm.all_gather_object(g)
            if rank == 0:
                print(json.dumps({"call": name, "shard": shard, "whole": a.nbytes,
                                  "growth": everyone}), flush=True)


if __name__ == "__main__":
    main()
