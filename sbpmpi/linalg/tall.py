"""QR, SVD, singular values and pseudo-inverses of split 2-D matrices, at the size of the data.

A non-square matrix split along either dim is first laid out along its long dim on every
mesh axis (:func:`tall_view`: one ``x.to_global``, a local slice when it was
broadcast, an all-to-all when it was split along the short dim). A tall matrix (M > N)
is then factored by TSQR (:mod:`.tsqr`); a wide one (N > M) through its conjugate
transpose, which is tall and split by rows. What is computed from the small R runs once,
on the tree's root:

- ``qr``: R with a non-negative real diagonal (the unique R of a full-rank matrix: NumPy's
  up to the sign of each row), ``Q = Q_i W_i`` block by block. A wide matrix's Q is that
  of its left M x M block (gathered: M is the short dim) and ``R = Q^H A`` column block
  by column block, exactly as Householder QR makes it.
- ``svd``: ``R = U_R S V^H`` with each row of ``V^H`` scaled so that its entry of largest
  magnitude is real and positive; ``U = Q U_R`` block by block.
- ``svdvals`` and ``matrix_rank``: R alone (:func:`.blocks.r_factor`, no Q).
- ``pinv``: ``pinv(A)^H = Q U_R S^+ V^H``, block by block.

Each rank holds its block, its share of the result and O(N^2 log p) more; the results
split along the long dim are laid out like the converted input, the small ones are
broadcast and equal bit for bit on every rank.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any, NamedTuple

import numpy as np

from .. import backend, comm
from ..core.layout import Layout
from ..core.sbp import Split, broadcast
from ..env import get_rank
from ..runtime.consistency import check_collective
from ..tensor import GlobalTensor
from . import blocks
from .tsqr import Leaf, Root, Team, real_dtype, reduce_r, team_of

__all__ = ["TallView", "tall_view", "made", "check", "tree", "orthonormal", "qr", "svd",
           "svdvals", "matrix_rank", "pinv", "phases", "signed_svd", "solve_with_r"]


class TallView(NamedTuple):
    """A split 2-D matrix seen as a tall one: the input laid out along its long dim, and
    this rank's block of the tall matrix (the input's, or its conjugate transpose's)."""

    x: GlobalTensor  # the input, split along its long dim on every mesh axis
    wide: bool  # N > M: the tall matrix is x^H
    team: Team
    block: Any  # this rank's rows of the tall matrix (a view); None outside the placement
    xp: ModuleType

    @property
    def long(self) -> int:
        return max(self.x.shape)

    @property
    def short(self) -> int:
        return min(self.x.shape)


def tall_view(x: GlobalTensor) -> TallView:
    """``x`` (2-D, M != N) laid out along its long dim on every mesh axis (one conversion
    through ``runtime.redistribute`` when it is not already), seen as a tall matrix."""
    m, n = x.shape
    wide = n > m
    dim = 1 if wide else 0
    target = (Split(dim),) * x.placement.ndim
    if tuple(x.sbp) != target:
        x = x.to_global(sbp=target)
    me = get_rank()
    team = team_of(x.layout, dim, me)
    xp = backend.get_xp(x.placement.type)
    block = None
    if team.me is not None:
        local = x.to_local()
        block = blocks.conj_t(xp, local) if wide else local
    return TallView(x, wide, team, block, xp)


def made(xp: ModuleType, local: Any, shape: tuple[int, ...], like: GlobalTensor,
         sbp: Any, dtype: Any) -> GlobalTensor:
    """A global tensor of ``shape`` on ``like``'s placement with ``sbp`` (one per mesh
    axis), whose shard on this rank is ``local`` (ignored outside the placement)."""
    layout = Layout.make(shape, like.placement, sbp)
    dt = np.dtype(dtype)
    me = get_rank()
    if me not in like.placement:
        return GlobalTensor(np.empty(layout.local_shape(me), dtype=dt), layout, dt)
    return GlobalTensor(local, layout, dt)


def _along(view: TallView, dim: int) -> tuple[Any, ...]:
    """The SBP of a result split like the long dim of ``view``'s input, along ``dim``."""
    return (Split(dim),) * view.x.placement.ndim


def _whole(view: TallView) -> tuple[Any, ...]:
    return (broadcast,) * view.x.placement.ndim


def phases(xp: ModuleType, d: Any) -> Any:
    """``d / |d|`` (1 where ``d`` is 0): the unit scalars that make ``d`` real non-negative
    when divided out."""
    mag = xp.abs(d)
    safe = xp.where(mag == 0, xp.ones((), dtype=mag.dtype), mag)
    return xp.where(mag == 0, xp.ones((), dtype=d.dtype), d / safe)


def signed_svd(xp: ModuleType, r: Any) -> tuple[Any, Any, Any]:
    """``r = u @ diag(s) @ vh`` with each row of ``vh`` scaled so that its entry of largest
    magnitude (the first of equals) is real and positive; ``u`` scaled to match."""
    u, s, vh = xp.linalg.svd(r, full_matrices=False)
    if vh.shape[0] == 0:
        return u, s, vh
    top = xp.argmax(xp.abs(vh), axis=1)
    ph = phases(xp, vh[xp.arange(vh.shape[0]), top])
    return u * ph[None, :], s, xp.conj(ph)[:, None] * vh


def _local_factors(view: TallView, want_q: bool) -> blocks.BlockQR:
    if want_q:
        return blocks.qr_block(view.xp, view.block)
    return blocks.BlockQR(None, blocks.r_factor(view.xp, view.block))


def tree(name: str, xp: ModuleType, r: Any, team: Team, n: int,
         at_root: Callable[[Any], Root], *, payload_size: int, columns: int,
         want_w: bool) -> Leaf:
    """:func:`.tsqr.reduce_r` with a failure of ``at_root`` (LinAlgError: an SVD that did
    not converge on NaN input) raised on every rank: the payload carries a flag first."""
    dtype = r.dtype

    def flagged(whole_r: Any) -> Root:
        try:
            root = at_root(whole_r)
        except np.linalg.LinAlgError:
            t = xp.zeros((whole_r.shape[0], columns), dtype=dtype) if want_w else None
            return Root(xp.concatenate([xp.ones((1,), dtype=dtype),
                                        xp.zeros((payload_size,), dtype=dtype)]), t)
        return Root(xp.concatenate([xp.zeros((1,), dtype=dtype),
                                    xp.reshape(root.payload, (-1,)).astype(dtype)]),
                    root.transform)

    leaf = reduce_r(xp, r, team, n, flagged, payload_size=payload_size + 1, columns=columns,
                    want_w=want_w)
    if bool(leaf.payload[0] != 0):
        raise np.linalg.LinAlgError(f"linalg.{name}: the SVD of the R factor did not converge")
    return Leaf(leaf.payload[1:], leaf.w)


def _tree(name: str, view: TallView, r: Any, at_root: Callable[[Any], Root],
          payload_size: int, columns: int, want_w: bool) -> Leaf:
    return tree(name, view.xp, r, view.team, view.short, at_root, payload_size=payload_size,
                columns=columns, want_w=want_w)


def orthonormal(name: str, xp: ModuleType, block: Any, team: Team,
                overwrite: bool = False) -> Any:
    """This rank's rows of Q of the tall matrix whose row blocks the team holds (``block``
    here, overwritten when ``overwrite``), R's diagonal made non-negative (so Q is unique
    for a full-rank matrix)."""
    n = block.shape[1]
    factors = blocks.qr_block(xp, block, overwrite)

    def at_root(r: Any) -> Root:
        return Root(xp.zeros((0,), dtype=r.dtype), xp.diag(phases(xp, xp.diagonal(r))))

    leaf = tree(name, xp, factors.r, team, n, at_root, payload_size=0, columns=n,
                want_w=True)
    return blocks.times_in_place(xp, factors.q, leaf.w)


def check(name: str, x: GlobalTensor, *meta: Any) -> None:
    """The cross-rank check of a call (every rank called the same, before any message)."""
    check_collective(f"linalg.{name}", (x, *meta))


# -- qr ----------------------------------------------------------------------------------------

def qr(x: GlobalTensor, mode: str) -> tuple[GlobalTensor | None, GlobalTensor]:
    """``(Q, R)`` of a split non-square matrix (``Q`` None for ``mode="r"``); R with a
    non-negative real diagonal."""
    check("qr", x, mode)
    view = tall_view(x)
    if view.wide:
        return _qr_wide(view, mode)
    xp, n, m = view.xp, view.short, view.long
    want_q = mode != "r"
    q_local = r_out = None
    if view.team.me is not None:
        factors = _local_factors(view, want_q)

        def at_root(r: Any) -> Root:
            d = phases(xp, xp.diagonal(r))
            fixed = xp.conj(d)[:, None] * r
            return Root(fixed, xp.diag(d) if want_q else None)

        leaf = _tree("qr", view, factors.r, at_root, n * n, n, want_q)
        r_out = xp.reshape(leaf.payload, (n, n))
        if want_q:
            q_local = blocks.times_in_place(xp, factors.q, leaf.w)
    r_glob = made(xp, r_out, (n, n), view.x, _whole(view), x.dtype)
    if not want_q:
        return None, r_glob
    return made(xp, q_local, (m, n), view.x, _along(view, 0), x.dtype), r_glob


def _qr_wide(view: TallView, mode: str) -> tuple[GlobalTensor | None, GlobalTensor]:
    """Q of the left M x M block (gathered to the team's first rank, factored there,
    broadcast), then ``R = Q^H A`` on each column block, its columns left of M taken
    from the block's own R (exactly triangular)."""
    xp, m, n = view.xp, view.short, view.long
    x = view.x
    q = r_local = None
    team = view.team
    if team.me is not None:
        local = x.to_local()  # M x n_i
        ranges = x.layout.local_ranges(get_rank())
        assert ranges is not None
        c0, c1 = ranges[1]
        left = xp.zeros((m, m), dtype=x.dtype)
        if c0 < m:
            left[:, c0:min(c1, m)] = local[:, :min(c1, m) - c0]
        packed = xp.empty((2 * m, m), dtype=x.dtype)
        group = comm.get_group(team.ranks) if team.size > 1 else None
        if group is not None:
            comm.reduce(left, dst=team.ranks[0], group=group)
        if team.me == 0:
            q0, r0 = xp.linalg.qr(left, mode="reduced")
            d = phases(xp, xp.diagonal(r0))
            packed[:m] = q0 * d[None, :]
            packed[m:] = xp.conj(d)[:, None] * r0
        if group is not None:
            comm.broadcast(packed, src=team.ranks[0], group=group)
        q, r_left = packed[:m], packed[m:]
        r_local = blocks.conj_t(xp, q) @ local
        if c0 < m:
            r_local[:, :min(c1, m) - c0] = r_left[:, c0:min(c1, m)]
    r_glob = made(xp, r_local, (m, n), x, _along(view, 1), x.dtype)
    if mode == "r":
        return None, r_glob
    return made(xp, q, (m, m), x, _whole(view), x.dtype), r_glob


# -- svd, svdvals ---------------------------------------------------------------------------------

def svd(x: GlobalTensor) -> tuple[GlobalTensor, GlobalTensor, GlobalTensor]:
    """``(U, S, Vh)`` of a split non-square matrix, ``full_matrices=False``."""
    check("svd", x)
    view = tall_view(x)
    xp, n, m = view.xp, view.short, view.long
    real = real_dtype(x.dtype)
    u_local = s = vh = None
    if view.team.me is not None:
        factors = _local_factors(view, True)

        def at_root(r: Any) -> Root:
            u_r, s_r, vh_r = signed_svd(xp, r)
            return Root(xp.concatenate([s_r.astype(x.dtype), xp.reshape(vh_r, (-1,))]), u_r)

        leaf = _tree("svd", view, factors.r, at_root, n + n * n, n, True)
        s = xp.real(leaf.payload[:n]).astype(real)
        vh = xp.reshape(leaf.payload[n:], (n, n))
        u_local = blocks.times_in_place(xp, factors.q, leaf.w)  # the tall matrix's U
    if not view.wide:
        return (made(xp, u_local, (m, n), view.x, _along(view, 0), x.dtype),
                made(xp, s, (n,), view.x, _whole(view), real),
                made(xp, vh, (n, n), view.x, _whole(view), x.dtype))
    # x^H = U' S V'^H, so x = V' S U'^H: U is V' (small), Vh is U'^H (split by columns)
    u = None if vh is None else blocks.conj_t(xp, vh)
    vh_local = None if u_local is None else blocks.conj_t(xp, u_local)
    return (made(xp, u, (n, n), view.x, _whole(view), x.dtype),
            made(xp, s, (n,), view.x, _whole(view), real),
            made(xp, vh_local, (n, m), view.x, _along(view, 1), x.dtype))


def svdvals(x: GlobalTensor) -> GlobalTensor:
    """The singular values of a split non-square matrix (descending), from R alone."""
    check("svdvals", x)
    view = tall_view(x)
    xp, n = view.xp, view.short
    real = real_dtype(x.dtype)
    s = None
    if view.team.me is not None:
        factors = _local_factors(view, False)

        def at_root(r: Any) -> Root:
            return Root(xp.linalg.svd(r, compute_uv=False), None)

        leaf = _tree("svdvals", view, factors.r, at_root, n, 0, False)
        s = xp.real(leaf.payload).astype(real)
    return made(xp, s, (n,), view.x, _whole(view), real)


def matrix_rank(x: GlobalTensor, rtol: float | None) -> GlobalTensor:
    """The rank of a split non-square matrix: its singular values above ``rtol`` times the
    largest (default ``max(M, N) * eps``), a broadcast 0-d int64."""
    s = svdvals(x)
    tol = max(x.shape) * float(np.finfo(x.dtype).eps) if rtol is None else float(rtol)
    xp = backend.get_xp(x.placement.type)
    count = None
    if get_rank() in s.placement:
        local = s.to_local()
        count = xp.asarray((local > tol * local.max()).sum(), dtype=np.int64)
    return made(xp, count, (), s, s.sbp, np.int64)


# -- pinv ------------------------------------------------------------------------------------------

def pinv(x: GlobalTensor, rtol: float | None) -> GlobalTensor:
    """The pseudo-inverse of a split non-square matrix: singular values at or below
    ``rtol`` times the largest dropped (default ``max(M, N) * eps``). Its long dim (the
    input's long dim, now the other one) stays split."""
    check("pinv", x, rtol)
    view = tall_view(x)
    xp, n, m = view.xp, view.short, view.long
    tol = m * float(np.finfo(x.dtype).eps) if rtol is None else float(rtol)
    p_local = None
    if view.team.me is not None:
        factors = _local_factors(view, True)

        def at_root(r: Any) -> Root:
            u_r, s_r, vh_r = signed_svd(xp, r)
            keep = s_r > tol * (s_r.max() if s_r.shape[0] else 0)
            inv = xp.where(keep, 1 / xp.where(keep, s_r, xp.ones((), dtype=s_r.dtype)), 0)
            return Root(xp.zeros((0,), dtype=x.dtype), (u_r * inv[None, :]) @ vh_r)

        leaf = _tree("pinv", view, factors.r, at_root, 0, n, True)
        # pinv(T)^H = Q U_R S^+ V^H for the tall matrix T
        p_local = blocks.times_in_place(xp, factors.q, leaf.w)
    if view.wide:  # pinv(x) = pinv(x^H)^H = P: split along its rows, like x's columns
        return made(xp, p_local, (m, n), view.x, _along(view, 0), x.dtype)
    out = None if p_local is None else blocks.conj_t(xp, p_local)
    return made(xp, out, (n, m), view.x, _along(view, 1), x.dtype)


# -- least squares through R ---------------------------------------------------------------------

def solve_with_r(xp: ModuleType, r: Any, c: Any, rcond: float) -> tuple[Any, Any, int]:
    """``(x, s, rank)``: the minimum-norm solution of ``r @ x = c`` (``r`` square upper
    triangular) through the SVD of ``r``, singular values at or below ``rcond`` times the
    largest counted as zero."""
    u, s, vh = xp.linalg.svd(r, full_matrices=False)
    keep = s > rcond * (s.max() if s.shape[0] else 0)
    inv = xp.where(keep, 1 / xp.where(keep, s, xp.ones((), dtype=s.dtype)), 0)
    sol = xp.conj(vh).T @ (inv[:, None] * (xp.conj(u).T @ c))
    return sol, s, int(keep.sum())
