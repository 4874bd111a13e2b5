"""scikit-learn's estimators on a row-split data matrix (``array_api_dispatch=True``) equal
scikit-learn on the whole NumPy matrix, at n = 1..4 (issue 35): PCA with the "full" and
"randomized" solvers, Ridge with ``solver="svd"`` and LinearDiscriminantAnalysis. Their
SVDs of the split (centred) data take the tall path; ``test_linalg_memory.py`` measures
that each rank then holds a few copies of its shard, never the matrix.
"""

from __future__ import annotations

import numpy as np
import pytest
from linalg_cases import close
from mpi4py import MPI

import sbpmpi as sm

sklearn = pytest.importorskip("sklearn")
from sklearn.decomposition import PCA  # noqa: E402
from sklearn.discriminant_analysis import LinearDiscriminantAnalysis  # noqa: E402
from sklearn.linear_model import Ridge  # noqa: E402

size = MPI.COMM_WORLD.Get_size()
ROWS, COLS = 203, 6  # uneven at 2, 3 and 4 ranks


@pytest.fixture
def data(monkeypatch):
    """(X, y, classes) in NumPy and split by rows over every rank."""
    monkeypatch.setenv("SCIPY_ARRAY_API", "1")  # scikit-learn's array API dispatch needs it
    rng = np.random.default_rng(8)
    x = rng.normal(size=(ROWS, COLS)) * np.linspace(1, 3, COLS) + 2
    y = x @ rng.normal(size=COLS) + 0.1 * rng.normal(size=ROWS)
    classes = (x[:, 0] > 2).astype(np.int64) + (x[:, 1] > 2.5)
    pl = sm.placement("cpu", list(range(size)))

    def split(v):
        return sm.tensor(v, placement=pl, sbp=sm.sbp.split(0))

    return (x, y, classes), (split(x), split(y), split(classes))


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("solver", ["full", "randomized"])
def test_pca_equals_scikit_learn_on_numpy(data, solver):
    (x, _, _), (gx, _, _) = data
    kw = dict(n_components=3, svd_solver=solver, random_state=0)
    if solver == "randomized":
        kw["power_iteration_normalizer"] = "QR"  # the array API has no LU
    want = PCA(**kw).fit(x)
    with sklearn.config_context(array_api_dispatch=True):
        got = PCA(**kw).fit(gx)
        projected = got.transform(gx)
    for name in ("components_", "explained_variance_", "singular_values_", "mean_"):
        close(getattr(got, name), getattr(want, name))
    assert projected.sbp == (sm.sbp.split(0),)
    close(projected, want.transform(x))


@pytest.mark.mpi(min_size=1)
def test_ridge_with_the_svd_solver_equals_scikit_learn_on_numpy(data):
    (x, y, _), (gx, gy, _) = data
    want = Ridge(alpha=2.0, solver="svd").fit(x, y)
    with sklearn.config_context(array_api_dispatch=True):
        got = Ridge(alpha=2.0, solver="svd").fit(gx, gy)
        predicted = got.predict(gx)
    close(got.coef_, want.coef_)
    close(got.intercept_, np.asarray(want.intercept_))
    close(predicted, want.predict(x))


@pytest.mark.mpi(min_size=1)
def test_linear_discriminant_analysis_equals_scikit_learn_on_numpy(data):
    (x, _, c), (gx, _, gc) = data
    want = LinearDiscriminantAnalysis().fit(x, c)
    with sklearn.config_context(array_api_dispatch=True):
        got = LinearDiscriminantAnalysis().fit(gx, gc)
        projected = got.transform(gx)
    close(got.coef_, want.coef_)
    close(got.intercept_, want.intercept_)
    # the discriminant directions are singular vectors (scikit-learn does not fix their
    # signs here): each column of the projection up to its sign
    ref = want.transform(x)
    signs = np.sign(np.sum(projected.numpy() * ref, axis=0))
    close(projected, ref * signs)
