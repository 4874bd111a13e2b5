"""Which algorithm a linear-algebra function takes at which layout: the one rule.

``path_of(function, x)`` decides, from global metadata only (so every rank decides the
same), and :func:`sbpmpi.explain` prints it (``sm.explain(xp.linalg.qr, x)``):

==========  ===================================================================================
path        when
==========  ===================================================================================
local       a stack whose matrix dims are whole (batch dims split or broadcast), or a
            broadcast matrix: each rank factors the matrices it holds, no communication
gathered    a stack with a split matrix dim, a square matrix, a matrix with an empty dim, a
            function outside the size-of-the-data set, or a full ``Q``/``U``/``V`` of at most
            :data:`GATHERED_FACTOR_BYTES`: the matrices are gathered (``runtime.redistribute``)
tall        a split (or partial) 2-D matrix with M > N, for ``qr``, ``svd``, ``svdvals``,
            ``matrix_norm`` (2, -2, ``"nuc"``), ``matrix_rank``, ``pinv``, ``lstsq`` and
            ``svd_randomized``: laid out by rows on every mesh axis, then TSQR
            (:mod:`sbpmpi.linalg.tsqr`)
wide        the same with N > M: laid out by columns, TSQR of the conjugate transpose
refused     ``qr(mode="complete")`` or ``svd(full_matrices=True)`` of a split non-square matrix
            whose square factor exceeds :data:`GATHERED_FACTOR_BYTES`: a ValueError says so
==========  ===================================================================================
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from ..core.sbp import Broadcast, Split
from ..tensor import GlobalTensor

__all__ = ["LinalgPath", "path_of", "SIZE_OF_DATA", "GATHERED_FACTOR_BYTES", "explains",
           "explainer_of"]

#: The functions that factor a split non-square matrix where it lies (the tall and wide paths).
SIZE_OF_DATA = frozenset({"qr", "svd", "svdvals", "matrix_norm", "matrix_rank", "pinv",
                          "lstsq", "svd_randomized"})

#: ``qr(mode="complete")`` and ``svd(full_matrices=True)`` of a split non-square matrix make
#: a square factor of the long dim; up to this many bytes it is computed whole (gathered),
#: beyond it the call is refused.
GATHERED_FACTOR_BYTES = 128 << 20


class LinalgPath(NamedTuple):
    """The path a call takes: ``kind`` (local, gathered, tall, wide, refused), the SBP the
    input is converted to first (None: none), and why."""

    function: str
    kind: str
    layout: str
    sbp: tuple[Any, ...] | None
    why: str

    def __str__(self) -> str:
        sbp = "-" if self.sbp is None else "(" + ", ".join(str(s) for s in self.sbp) + ")"
        rows = [("function", f"linalg.{self.function}"), ("input", self.layout),
                ("path", self.kind), ("converted to", sbp), ("why", self.why)]
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def _matrix_dims_split(x: GlobalTensor) -> bool:
    """Whether any mesh axis splits a matrix dim or holds partial values."""
    last = {x.ndim - 2, x.ndim - 1}
    return any((isinstance(s, Split) and s.dim in last) or
               not isinstance(s, (Split, Broadcast)) for s in x.sbp)


def path_of(function: str, x: GlobalTensor, *, square_factor: bool = False) -> LinalgPath:
    """The path of ``linalg.<function>`` on ``x``; ``square_factor``: the call makes the
    square factor of the long dim (``qr`` complete, ``svd`` with ``full_matrices``)."""
    text = str(x.layout)
    if not _matrix_dims_split(x):
        return LinalgPath(function, "local", text, None,
                          "the matrix dims are whole on every rank: each rank factors its own "
                          "matrices")
    if x.ndim != 2:
        return LinalgPath(function, "gathered", text, None,
                          "a stack with a split matrix dim: the matrices are gathered")
    m, n = x.shape
    if function not in SIZE_OF_DATA:
        return LinalgPath(function, "gathered", text, None,
                          "a split matrix is gathered for this function")
    if m == n or min(m, n) == 0:
        return LinalgPath(function, "gathered", text, None,
                          "a square or empty matrix is gathered")
    if square_factor:
        size = max(m, n) ** 2 * x.dtype.itemsize
        if size <= GATHERED_FACTOR_BYTES:
            return LinalgPath(function, "gathered", text, None,
                              f"the full {max(m, n)} x {max(m, n)} factor ({size} bytes) fits "
                              f"in {GATHERED_FACTOR_BYTES} bytes: the matrix is gathered")
        return LinalgPath(function, "refused", text, None,
                          f"the full {max(m, n)} x {max(m, n)} factor would take {size} bytes "
                          f"on every rank (more than {GATHERED_FACTOR_BYTES}); ask for the "
                          f"reduced one (qr mode='reduced', svd full_matrices=False)")
    dim = 0 if m > n else 1
    sbp = (Split(dim),) * x.placement.ndim
    kind = "tall" if dim == 0 else "wide"
    how = ("TSQR of the row blocks" if dim == 0 else
           "TSQR of the conjugate transpose's row blocks (the column blocks)")
    return LinalgPath(function, kind, text, sbp,
                      f"a split {m} x {n} matrix, laid out along its long dim: {how}; "
                      f"the small factors are computed once and broadcast")


_EXPLAINERS: dict[Any, Callable[..., LinalgPath]] = {}


def explains(explainer: Callable[..., LinalgPath]) -> Callable[[Any], Any]:
    """Decorator: ``explainer(*args, **kwargs)`` tells the path of a call of the decorated
    function (what :func:`sbpmpi.explain` prints for it)."""

    def mark(fn: Any) -> Any:
        _EXPLAINERS[fn] = explainer
        return fn

    return mark


def explainer_of(fn: Any) -> Callable[..., LinalgPath] | None:
    """The explainer registered for ``fn`` (None if it has none)."""
    try:
        return _EXPLAINERS.get(fn)
    except TypeError:  # unhashable
        return None
