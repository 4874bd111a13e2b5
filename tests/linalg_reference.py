"""NumPy's factors turned to the phases sbpmpi's size-of-the-data paths choose, for tests.

QR and SVD are unique only up to a unit scalar per column of Q (per singular pair of U and
V): the TSQR paths make R's diagonal real non-negative, and each row of V^H's entry of
largest magnitude real positive. The helpers below scale NumPy's factors by the phases
that map them onto the ones given (read from the results, one scalar per column), so a
test then compares every entry with NumPy's.
"""

from __future__ import annotations

import numpy as np


def _unit(ratio: np.ndarray) -> np.ndarray:
    mag = np.abs(ratio)
    return np.where(mag == 0, 1, ratio / np.where(mag == 0, 1, mag))


def qr_like(q: np.ndarray, r: np.ndarray, got_r: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """NumPy's ``(q, r)`` with row ``i`` of ``r`` (column ``i`` of ``q``) scaled so that
    ``r[i, i]`` has the phase of ``got_r[i, i]``."""
    k = min(r.shape[-2:])
    d = np.diagonal(r, axis1=-2, axis2=-1)[..., :k]
    g = np.diagonal(got_r, axis1=-2, axis2=-1)[..., :k]
    ph = _unit(g * np.conj(d))
    r2 = r.copy()
    r2[..., :k, :] = ph[..., :, None] * r[..., :k, :]
    q2 = q.copy()
    q2[..., :, :k] = q[..., :, :k] * np.conj(ph)[..., None, :]
    return q2.astype(q.dtype), r2.astype(r.dtype)


def svd_like(u: np.ndarray, vh: np.ndarray, got_vh: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """NumPy's ``(u, vh)`` with each singular pair scaled by the phase that maps row ``j``
    of ``vh`` onto row ``j`` of ``got_vh`` (read at the entry of largest magnitude)."""
    k = got_vh.shape[-2]
    top = np.argmax(np.abs(vh[..., :k, :]), axis=-1)
    at = np.take_along_axis(vh[..., :k, :], top[..., None], axis=-1)[..., 0]
    got = np.take_along_axis(got_vh, top[..., None], axis=-1)[..., 0]
    ph = _unit(got * np.conj(at))
    vh2 = vh.copy()
    vh2[..., :k, :] = ph[..., :, None] * vh[..., :k, :]
    u2 = u.copy()
    u2[..., :, :k] = u[..., :, :k] * np.conj(ph)[..., None, :]
    return u2.astype(u.dtype), vh2.astype(vh.dtype)
