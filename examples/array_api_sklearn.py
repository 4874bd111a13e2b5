"""scikit-learn on global tensors through the Array API: kernels and a metric, across ranks.

    mpiexec -n 3 python examples/array_api_sklearn.py

With ``sklearn.set_config(array_api_dispatch=True)``, scikit-learn's array-API code
paths find ``sbpmpi.array_api`` through ``X.__array_namespace__()`` and compute with
global tensors: every rank runs the same calls, and the rows of ``X`` stay split over the
ranks. The results are checked against scikit-learn on NumPy arrays. (Estimators that
assign through boolean masks, such as ``MinMaxScaler``, need ``__setitem__``, which the
namespace does not have yet.)
"""

from __future__ import annotations

import os

os.environ.setdefault("SCIPY_ARRAY_API", "1")  # scikit-learn's dispatch needs SciPy's

import numpy as np  # noqa: E402
import sklearn  # noqa: E402
from sklearn.metrics import mean_squared_error  # noqa: E402
from sklearn.metrics.pairwise import euclidean_distances, rbf_kernel  # noqa: E402

import sbpmpi as sm  # noqa: E402

xp = sm.array_api


def main() -> None:
    sm.launch.expect_world(3, what="the scikit-learn example")  # a note when run without mpiexec
    rng = np.random.default_rng(0)
    X, Y = rng.normal(size=(11, 4)), rng.normal(size=(6, 4))  # 11 rows: uneven shards
    y_true, y_pred = rng.normal(size=11), rng.normal(size=11)

    Xg, Yg = xp.asarray(X), xp.asarray(Y)  # split over every rank along the rows
    with sklearn.config_context(array_api_dispatch=True):
        K = rbf_kernel(Xg, Yg, gamma=0.3)
        D = euclidean_distances(Xg, Yg)
        mse = mean_squared_error(xp.asarray(y_true), xp.asarray(y_pred))

    assert isinstance(K, sm.GlobalTensor) and isinstance(D, sm.GlobalTensor)
    np.testing.assert_allclose(K.numpy(), rbf_kernel(X, Y, gamma=0.3), rtol=1e-12)
    np.testing.assert_allclose(D.numpy(), euclidean_distances(X, Y), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(float(mse), mean_squared_error(y_true, y_pred), rtol=1e-12)
    if sm.env.get_rank() == 0:
        print(f"rbf_kernel: {K.shape} {K.sbp}; euclidean_distances: {D.shape} {D.sbp}; "
              f"mse {float(mse):.6f}")
        print("ARRAY_API_SKLEARN OK")


if __name__ == "__main__":
    main()
