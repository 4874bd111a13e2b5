"""The cases of the client sweep: real libraries' array-API code on global tensors.

Each :class:`Case` calls one function of scikit-learn (``array_api_dispatch=True``), SciPy
(``SCIPY_ARRAY_API=1``), array-api-extra or einops with arrays made by ``to`` from NumPy
data: ``to`` is the identity for the reference run and ``sbpmpi.array_api.asarray`` (rows
split over every rank, uneven at 3 and 4 ranks) for the global run. ``client_program.py``
runs both and compares. Imported only by that program (under ``mpiexec``, with
``SCIPY_ARRAY_API=1`` set before SciPy's first import).

A case whose global run must raise is listed in :data:`REFUSED` with its reason, one
whose result is NumPy's array by design in :data:`NUMPY_RESULTS` (both in
docs/array_api.md, "Clients").
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

Conv = Callable[[np.ndarray], Any]


class Case(NamedTuple):
    """One call: ``run(to)`` returns the result (arrays, scalars, tuples, estimators'
    fitted attributes in a dict), computed from arrays that ``to`` made."""

    library: str
    name: str
    run: Callable[[Conv], Any]
    rtol: float = 1e-9
    atol: float = 1e-12


#: Cases whose global run raises by design: name -> reason (docs/array_api.md, "Clients").
REFUSED: dict[str, str] = {}

#: Cases given global arrays whose result is NumPy's array by design (the client converts
#: with ``np.asarray``: the value gathered on every rank), name -> reason; any other case
#: given global arrays must return global ones where NumPy's run returns arrays.
NUMPY_RESULTS: dict[str, str] = {
    "cluster.contingency_matrix": "scikit-learn has no array-API path for it: np.unique, "
    "then scipy.sparse.coo_array, which converts its operands with np.asarray (as it does "
    "PyTorch's tensors), and its toarray()",
}

R = np.random.default_rng(7)
N = 7  # rows: uneven shards at 2, 3 and 4 ranks
X = R.uniform(0.1, 1.0, size=(N, 3))
Y = R.uniform(0.1, 1.0, size=(5, 3))
Xp = R.uniform(0.1, 1.0, size=(N, 3))  # paired with X
y_bin = np.array([0, 1, 1, 0, 1, 0, 1])
p_bin = np.array([0, 1, 0, 0, 1, 1, 1])
y_mc = np.array([0, 1, 2, 3, 2, 1, 0])
p_mc = np.array([0, 2, 2, 3, 1, 1, 0])
y_ml = np.array([[1, 0, 1], [0, 1, 1], [0, 0, 1], [1, 1, 0], [0, 1, 0], [1, 0, 0], [1, 1, 1]])
p_ml = np.array([[1, 1, 1], [0, 1, 0], [0, 0, 1], [1, 0, 0], [0, 1, 1], [1, 0, 1], [0, 1, 1]])
prob_bin = R.uniform(0.05, 0.95, size=N)
prob_mc = R.uniform(0.1, 1.0, size=(N, 4))
prob_mc /= prob_mc.sum(axis=1, keepdims=True)
prob_ml = R.uniform(0.05, 0.95, size=(N, 3))
y_reg = R.uniform(0.5, 3.0, size=N)
p_reg = R.uniform(0.5, 3.0, size=N)
y_reg2 = R.uniform(0.5, 3.0, size=(N, 2))
p_reg2 = R.uniform(0.5, 3.0, size=(N, 2))
w = R.uniform(0.5, 2.0, size=N)
# estimators: 12 samples, 3 features, 3 classes
XE = np.concatenate([R.normal(loc=c, scale=0.6, size=(4, 3)) for c in (0.0, 2.0, 4.0)])
yE = np.repeat([0, 1, 2], 4)
yE_reg = XE @ np.array([1.0, -2.0, 0.5]) + R.normal(scale=0.1, size=12)


# ---- scikit-learn metrics ------------------------------------------------------------------

def _metrics() -> list[Case]:
    import sklearn.metrics as m
    import sklearn.metrics.pairwise as pw

    out: list[Case] = []

    def add(name: str, fn: Callable[..., Any], *args: np.ndarray, **kw: Any) -> None:
        out.append(Case("scikit-learn", name,
                        lambda to: fn(*(to(a) for a in args),
                                      **{k: to(v) if isinstance(v, np.ndarray) else v
                                         for k, v in kw.items()})))

    labels = {"binary": (y_bin, p_bin), "multiclass": (y_mc, p_mc),
              "multilabel": (y_ml, p_ml)}
    by_kind = {  # the kinds of targets each takes: b(inary), (multi)c(lass), m(ultilabel)
        "accuracy_score": "bcm", "balanced_accuracy_score": "bc", "cohen_kappa_score": "bc",
        "confusion_matrix": "bc", "f1_score": "bcm", "fbeta_score": "bcm",
        "jaccard_score": "bcm", "multilabel_confusion_matrix": "bcm",
        "precision_score": "bcm", "recall_score": "bcm", "zero_one_loss": "bcm",
        "hamming_loss": "bcm",
    }
    for name, kinds in by_kind.items():
        fn = getattr(m, name)
        for kind in ("binary", "multiclass", "multilabel"):
            if {"binary": "b", "multiclass": "c", "multilabel": "m"}[kind] not in kinds:
                continue
            kw: dict[str, Any] = {}
            if name in ("f1_score", "fbeta_score", "jaccard_score", "precision_score",
                        "recall_score") and kind != "binary":
                kw["average"] = "macro"
            if name == "fbeta_score":
                kw["beta"] = 0.5
            t, p = labels[kind]
            add(f"{name}[{kind}]", fn, t, p, **kw)
            if name in ("accuracy_score", "zero_one_loss", "hamming_loss", "f1_score"):
                add(f"{name}[{kind},weighted]", fn, t, p, sample_weight=w, **kw)
    add("average_precision_score[binary]", m.average_precision_score, y_bin, prob_bin)
    add("average_precision_score[multilabel]", m.average_precision_score, y_ml, prob_ml)
    add("roc_curve[binary]", m.roc_curve, y_bin, prob_bin)
    add("det_curve[binary]", m.det_curve, y_bin, prob_bin)
    add("precision_recall_curve[binary]", m.precision_recall_curve, y_bin, prob_bin)
    for name in ("brier_score_loss", "log_loss", "d2_brier_score", "d2_log_loss_score"):
        fn = getattr(m, name)
        add(f"{name}[binary]", fn, y_bin, prob_bin)
        add(f"{name}[multiclass]", fn, np.array([0, 1, 2, 3, 2, 1, 0]), prob_mc)
    for name in ("r2_score", "explained_variance_score", "mean_absolute_error",
                 "mean_pinball_loss", "mean_squared_error", "mean_squared_log_error",
                 "median_absolute_error", "d2_absolute_error_score", "d2_pinball_score",
                 "mean_absolute_percentage_error", "root_mean_squared_error",
                 "root_mean_squared_log_error"):
        fn = getattr(m, name)
        add(name, fn, y_reg, p_reg)
        add(f"{name}[multioutput]", fn, y_reg2, p_reg2)
        if name != "median_absolute_error":
            add(f"{name}[weighted]", fn, y_reg, p_reg, sample_weight=w)
    for name in ("mean_poisson_deviance", "mean_gamma_deviance", "max_error",
                 "d2_tweedie_score", "mean_tweedie_deviance"):
        add(name, getattr(m, name), y_reg, p_reg)
    add("mean_tweedie_deviance[power=1.5]", functools.partial(m.mean_tweedie_deviance,
                                                             power=1.5), y_reg, p_reg)
    add("d2_pinball_score[alpha=0.9]", functools.partial(m.d2_pinball_score, alpha=0.9),
        y_reg, p_reg)
    for name in ("cosine_similarity", "additive_chi2_kernel", "chi2_kernel",
                 "cosine_distances", "euclidean_distances", "manhattan_distances",
                 "linear_kernel", "laplacian_kernel", "polynomial_kernel", "rbf_kernel",
                 "sigmoid_kernel", "pairwise_kernels", "pairwise_distances",
                 "pairwise_distances_argmin"):
        add(name, getattr(pw, name), X, Y)
    import sklearn.metrics.cluster as mc
    add("cluster.contingency_matrix", mc.contingency_matrix, y_mc, p_mc)
    add("pairwise_distances_argmin_min", pw.pairwise_distances_argmin_min, X, Y)
    for name in ("paired_cosine_distances", "paired_euclidean_distances",
                 "paired_manhattan_distances"):
        add(name, getattr(pw, name), X, Xp)
    return out


# ---- scikit-learn estimators ---------------------------------------------------------------

def _fitted(est: Any) -> dict[str, Any]:
    """The fitted array attributes of ``est`` (``name_``), NumPy's or global."""
    out = {}
    for k in sorted(vars(est)):
        if k.endswith("_") and not k.startswith("_"):
            v = getattr(est, k)
            if hasattr(v, "__array_namespace__") or isinstance(v, (np.ndarray, float, int)):
                out[k] = v
    return out


def _estimator(make: Callable[[], Any], X: np.ndarray, y: np.ndarray | None,
               methods: tuple[str, ...], skip: tuple[str, ...] = ()) -> Callable[[Conv], Any]:
    def run(to: Conv) -> Any:
        est = make()
        Xg = to(X)
        if y is None:
            est.fit(Xg)
        else:
            est.fit(Xg, to(y))
        res = {k: v for k, v in _fitted(est).items() if k not in skip}
        for meth in methods:
            res[meth] = getattr(est, meth)(Xg)
        return res
    return run


def _estimators() -> list[Case]:
    from sklearn.decomposition import PCA
    from sklearn.discriminant_analysis import LinearDiscriminantAnalysis
    from sklearn.kernel_approximation import Nystroem
    from sklearn.linear_model import (
        LogisticRegression,
        PoissonRegressor,
        Ridge,
        RidgeClassifierCV,
        RidgeCV,
    )
    from sklearn.mixture import GaussianMixture
    from sklearn.naive_bayes import GaussianNB
    from sklearn.preprocessing import (
        Binarizer,
        KernelCenterer,
        LabelEncoder,
        MaxAbsScaler,
        MinMaxScaler,
        Normalizer,
        PolynomialFeatures,
        StandardScaler,
    )

    pos = np.abs(XE) + 0.1
    K = XE @ XE.T
    cases = [
        ("Binarizer", lambda: Binarizer(threshold=1.0), XE, None, ("transform",)),
        ("GaussianNB", GaussianNB, XE, yE, ("predict", "predict_proba")),
        ("KernelCenterer", KernelCenterer, K, None, ("transform",)),
        ("LinearDiscriminantAnalysis", LinearDiscriminantAnalysis, XE, yE,
         ("predict", "predict_proba", "transform")),
        ("LogisticRegression", LogisticRegression, XE, yE, ("predict", "predict_proba")),
        ("MaxAbsScaler", MaxAbsScaler, XE, None, ("transform",)),
        ("MinMaxScaler", MinMaxScaler, XE, None, ("transform",)),
        ("Normalizer", Normalizer, XE, None, ("transform",)),
        ("Nystroem", lambda: Nystroem(n_components=5, random_state=0), XE, None,
         ("transform",)),
        ("PCA", lambda: PCA(n_components=2, svd_solver="full"), XE, None, ("transform",)),
        ("PCA[covariance_eigh]", lambda: PCA(n_components=2, svd_solver="covariance_eigh"),
         XE, None, ("transform",)),
        ("PCA[randomized]", lambda: PCA(n_components=2, svd_solver="randomized",
                                        random_state=0), XE, None, ("transform",)),
        ("PoissonRegressor", PoissonRegressor, XE, np.abs(yE_reg), ("predict",)),
        ("PolynomialFeatures", PolynomialFeatures, XE, None, ("transform",)),
        ("Ridge", Ridge, XE, yE_reg, ("predict",)),
        ("Ridge[svd]", lambda: Ridge(solver="svd"), XE, yE_reg, ("predict",)),
        ("RidgeCV", RidgeCV, XE, yE_reg, ("predict",)),
        ("RidgeClassifierCV", RidgeClassifierCV, XE, yE, ("predict", "decision_function")),
        ("StandardScaler", StandardScaler, XE, None, ("transform",)),
    ]
    out = [Case("scikit-learn", name, _estimator(make, Xd, yd, methods), rtol=1e-7,
                atol=1e-9) for name, make, Xd, yd, methods in cases]
    out.append(Case("scikit-learn", "LabelEncoder",
                    lambda to: (LabelEncoder().fit(to(yE)).transform(to(yE)),)))
    for cov in ("full", "tied", "diag", "spherical"):
        out.append(Case("scikit-learn", f"GaussianMixture[{cov}]", _estimator(
            functools.partial(GaussianMixture, n_components=2, covariance_type=cov,
                              init_params="random_from_data", random_state=0, max_iter=5),
            pos, None, ("predict", "predict_proba", "score_samples")), rtol=1e-7, atol=1e-9))
    return out


# ---- SciPy -----------------------------------------------------------------------------------

def _scipy() -> list[Case]:
    import scipy.cluster.vq as vq
    import scipy.fft as sfft
    import scipy.integrate as si
    import scipy.signal as ss
    import scipy.special as sp
    import scipy.stats as st

    out: list[Case] = []
    a = R.uniform(0.2, 0.8, size=N)
    b = R.uniform(0.2, 0.8, size=N)
    c = R.uniform(1.5, 4.0, size=N)
    M = R.uniform(0.2, 0.8, size=(N, 3))

    def add(name: str, fn: Callable[..., Any], *args: Any, **kw: Any) -> None:
        out.append(Case("SciPy", name, lambda to: fn(
            *(to(x) if isinstance(x, np.ndarray) else x for x in args),
            **{k: to(v) if isinstance(v, np.ndarray) else v for k, v in kw.items()})))

    for name in ("erf", "erfc", "erfinv", "erfcx", "expit", "logit", "ndtr", "ndtri",
                 "log_ndtr", "gammaln", "gamma", "psi", "entr", "i0", "i0e", "i1", "j0",
                 "y0", "k0", "cbrt", "exp2", "exp10", "spence", "rgamma", "zetac", "cosm1",
                 "exprel"):
        add(f"special.{name}", getattr(sp, name), a)
    for name in ("xlogy", "xlog1py", "rel_entr", "kl_div", "gammainc", "gammaincc",
                 "betaln", "binom", "poch", "huber", "pseudo_huber", "boxcox", "boxcox1p"):
        add(f"special.{name}", getattr(sp, name), a, b)
    add("special.betainc", sp.betainc, c, c, a)
    add("special.logsumexp", sp.logsumexp, a)
    add("special.logsumexp[axis=1]", sp.logsumexp, M, axis=1)
    add("special.logsumexp[axis=0,b]", sp.logsumexp, M, axis=0, b=M)
    add("special.softmax", sp.softmax, M, axis=1)
    add("special.log_softmax", sp.log_softmax, M, axis=0)
    for name in ("zscore", "gzscore", "skew", "kurtosis", "moment", "variation", "gmean",
                 "hmean", "sem", "iqr", "tmean", "tvar", "tstd", "tmin", "tmax", "gstd",
                 "median_abs_deviation", "entropy", "differential_entropy", "kstat",
                 "kstatvar", "circmean", "circvar", "circstd", "jarque_bera",
                 "rankdata", "describe"):
        if hasattr(st, name):
            add(f"stats.{name}", getattr(st, name), a)
    add("stats.skew[axis=0]", st.skew, M, axis=0)
    add("stats.zscore[axis=0]", st.zscore, M, axis=0)
    add("stats.pmean", st.pmean, a, 2.0)
    add("stats.ttest_1samp", st.ttest_1samp, a, 0.5)
    add("stats.ttest_ind", st.ttest_ind, a, b)
    add("stats.ttest_rel", st.ttest_rel, a, b)
    add("stats.pearsonr", st.pearsonr, a, b)
    add("stats.entropy[qk]", st.entropy, a, b)
    add("stats.chisquare", st.chisquare, a * 10, a.sum() * 10 / N + 0 * a)
    add("stats.power_divergence", st.power_divergence, a * 10, a.sum() * 10 / N + 0 * a)
    add("stats.f_oneway", st.f_oneway, a, b)
    add("stats.bartlett", st.bartlett, a, b)
    add("stats.levene", st.levene, a, b)
    add("stats.quantile", st.quantile, a, 0.3)
    add("stats.combine_pvalues", st.combine_pvalues, a)
    add("stats.false_discovery_control", st.false_discovery_control, a)
    add("fft.fft", sfft.fft, a)
    add("fft.rfft", sfft.rfft, a)
    add("fft.dct", sfft.dct, a)
    add("fft.fftn", sfft.fftn, M)
    add("fft.fftshift", sfft.fftshift, a)
    add("integrate.trapezoid", si.trapezoid, a)
    add("integrate.cumulative_trapezoid", si.cumulative_trapezoid, a)
    add("integrate.simpson", si.simpson, a)
    add("cluster.vq.whiten", vq.whiten, M)
    add("signal.lfilter", ss.lfilter, np.array([0.5, 0.25]), np.array([1.0, -0.2]), a)
    add("signal.convolve", ss.convolve, a, b)
    add("signal.correlate", ss.correlate, a, b)
    add("signal.fftconvolve", ss.fftconvolve, a, b)
    add("signal.detrend", ss.detrend, a)
    add("signal.hilbert", ss.hilbert, a)
    add("signal.savgol_filter", ss.savgol_filter, a, 5, 2)
    add("signal.windows.hann", lambda n: ss.windows.hann(n), 7)
    return out


# ---- array-api-extra -------------------------------------------------------------------------

def _xpx() -> list[Case]:
    import array_api_extra as xpx

    out: list[Case] = []
    a = R.uniform(-1.0, 1.0, size=N)
    ints = np.array([3, 1, 2, 3, 0, 1, 4])
    M = R.uniform(-1.0, 1.0, size=(N, 3))
    nanM = M.copy()
    nanM[1, 2] = nanM[4, 0] = np.nan
    b7 = R.uniform(-1.0, 1.0, size=N)

    def add(name: str, fn: Callable[..., Any], *args: Any, **kw: Any) -> None:
        out.append(Case("array-api-extra", name, lambda to: fn(
            *(to(x) if isinstance(x, np.ndarray) else x for x in args), **kw)))

    def ns(to: Conv) -> Any:
        """The namespace of the run (NumPy or sbpmpi.array_api)."""
        import array_api_compat

        return array_api_compat.array_namespace(to(np.zeros(1)))

    add("atleast_nd", lambda x: xpx.atleast_nd(x, ndim=3), a)
    add("cov", xpx.cov, M.T.copy())
    add("create_diagonal", xpx.create_diagonal, a)
    add("expand_dims", lambda x: xpx.expand_dims(x, axis=(0, 2)), a)
    add("isclose", xpx.isclose, a, a + 1e-9)
    add("kron", xpx.kron, M, np.eye(2))
    add("nunique", xpx.nunique, ints)
    add("pad", lambda x: xpx.pad(x, 2), a)
    add("sinc", xpx.sinc, a)
    add("setdiff1d", lambda x, y: xpx.setdiff1d(x, y, assume_unique=False), ints,
        np.array([1, 4]))
    add("union1d", xpx.union1d, ints, np.array([7, 1, 9]))
    add("isin", xpx.isin, ints, np.array([1, 4]))
    add("nan_to_num", xpx.nan_to_num, nanM)
    add("nansum", lambda x: xpx.nansum(x, axis=0), nanM)
    add("nanmean", lambda x: xpx.nanmean(x, axis=1), nanM)
    add("nanmax", lambda x: xpx.nanmax(x, axis=0), nanM)
    add("nanmin", lambda x: xpx.nanmin(x, axis=1), nanM)
    add("partition", lambda x: xpx.partition(x, 3), a)
    add("argpartition", lambda x: xpx.argpartition(x, 3)[3], a)  # the kth: values differ
    add("one_hot", lambda x: xpx.one_hot(x, 5), ints)
    add("angle", xpx.angle, a)
    add("deg2rad", xpx.deg2rad, a)
    add("rad2deg", xpx.rad2deg, a)
    add("searchsorted", xpx.searchsorted, np.sort(a), a)
    add("apply_where", lambda x: xpx.apply_where(x > 0, x, lambda v: v * 2, fill_value=-1.0),
        a)
    add("at.set", lambda x: xpx.at(x)[1:3].set(5.0), a)
    add("at.add", lambda x: xpx.at(x)[x > 0].add(1.0), a)
    add("at.multiply", lambda x: xpx.at(x, (slice(None), 1)).multiply(2.0), M)
    add("at.add[mask,v]", lambda x, v: xpx.at(x)[x > 0].add(v[x > 0]), a, b7)
    add("at.add[mask 2d]", lambda x: xpx.at(x)[x > 0].add(1.0), M)
    add("at.add[row mask]", lambda x, m: xpx.at(x)[m].add(1.0), M, M[:, 0] > 0)
    add("lazy_apply[as_numpy]", lambda x: xpx.lazy_apply(
        lambda v: np.cumsum(v, axis=0), x, as_numpy=True), M)
    add("lazy_apply[as_numpy,shape]", lambda x: xpx.lazy_apply(
        lambda v: v.T @ v, x, shape=(3, 3), dtype=x.dtype, as_numpy=True), M)
    add("broadcast_shapes", lambda: xpx.broadcast_shapes((N, 1), (1, 3)))
    out.append(Case("array-api-extra", "tril_indices",
                    lambda to: xpx.tril_indices(4, xp=ns(to))))
    out.append(Case("array-api-extra", "triu_indices",
                    lambda to: xpx.triu_indices(4, offset=1, xp=ns(to))))
    out.append(Case("array-api-extra", "diag_indices",
                    lambda to: xpx.diag_indices(3, xp=ns(to))))
    out.append(Case("array-api-extra", "unravel_index",
                    lambda to: xpx.unravel_index(to(ints), (2, 3))))
    out.append(Case("array-api-extra", "default_dtype",
                    lambda to: str(xpx.default_dtype(ns(to)))))
    return out


# ---- einops --------------------------------------------------------------------------------

def _einops() -> list[Case]:
    import einops

    out: list[Case] = []
    T4 = R.uniform(-1.0, 1.0, size=(N, 4, 6))
    A = R.uniform(-1.0, 1.0, size=(N, 3))
    B = R.uniform(-1.0, 1.0, size=(3, 5))

    def add(name: str, fn: Callable[..., Any], *args: np.ndarray) -> None:
        out.append(Case("einops", name, lambda to: fn(*(to(x) for x in args))))

    add("rearrange[transpose]", lambda t: einops.rearrange(t, "b h w -> b w h"), T4)
    add("rearrange[merge]", lambda t: einops.rearrange(t, "b h w -> b (h w)"), T4)
    add("rearrange[split]", lambda t: einops.rearrange(t, "b h (w c) -> b c h w", c=2), T4)
    add("rearrange[merge dim 0]", lambda t: einops.rearrange(t, "b h w -> (b h) w"), T4)
    add("rearrange[list]", lambda t: einops.rearrange([t, t], "n b h w -> b n h w"), T4)
    for red in ("sum", "mean", "max", "min", "prod"):
        add(f"reduce[{red}]", lambda t, r=red: einops.reduce(t, "b h w -> b h", r), T4)
    add("reduce[pool]", lambda t: einops.reduce(t, "b h (w 2) -> b h w", "max"), T4)
    add("reduce[over b]", lambda t: einops.reduce(t, "b h w -> h w", "mean"), T4)
    add("repeat", lambda t: einops.repeat(t, "b h w -> b h w c", c=2), T4)
    add("repeat[new dim 0]", lambda t: einops.repeat(t, "b h -> r b h", r=2), A)
    add("einsum[matmul]", lambda a, b: einops.einsum(a, b, "n k, k m -> n m"), A, B)
    add("einsum[trace-free]", lambda t: einops.einsum(t, "b h w -> b"), T4)
    add("einsum[outer]", lambda a: einops.einsum(a, a, "n k, n j -> n k j"), A)
    add("einsum[diagonal]", lambda t: einops.einsum(t, "b h h -> b h"), T4[:, :, :4].copy())
    add("pack", lambda a, t: einops.pack([a, t[:, :, 0]], "b *")[0], A, T4)
    add("unpack", lambda t: einops.unpack(t, [[2], [4]], "b h *")[1], T4)
    add("parse_shape", lambda t: einops.parse_shape(t, "b h w"), T4)
    return out


def cases() -> list[Case]:
    """Every case, in a fixed order (the same on every rank)."""
    return _metrics() + _estimators() + _scipy() + _xpx() + _einops()
