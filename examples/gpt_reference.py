"""The one-process NumPy reference of ``train_gpt.py``: the same character-level GPT,
its gradients written by hand, and the same AdamW, gradient clipping and schedule.

Nothing here knows sbpmpi: parameters are plain arrays under the example's names and
shapes (attention weights per head: ``qkv_w`` ``(H, D, 3 * hd)``, ``proj_w``
``(H, hd, D)``), so ``train_gpt.py --check`` copies the initial weights in and compares
every step's loss. Dropout is not modelled (the check runs with ``--dropout 0``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import numpy as np

__all__ = ["NumpyGPT", "decays"]

_ERF = np.frompyfunc(math.erf, 1, 1)


def decays(name: str, shape: tuple[int, ...]) -> bool:
    """Whether a parameter gets weight decay: matrices do, biases and norms do not."""
    return len(shape) >= 2 and not name.endswith("_b")


def _layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float
                ) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]:
    mu = x.mean(-1, keepdims=True)
    c = x - mu
    rstd = 1.0 / np.sqrt((c * c).mean(-1, keepdims=True) + eps)
    xhat = c * rstd
    return xhat * w + b, (xhat, rstd)


def _layer_norm_back(dy: np.ndarray, w: np.ndarray, cache: tuple[np.ndarray, np.ndarray]
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    xhat, rstd = cache
    dxhat = dy * w
    dx = (dxhat - dxhat.mean(-1, keepdims=True)
          - xhat * (dxhat * xhat).mean(-1, keepdims=True)) * rstd
    lead = tuple(range(dy.ndim - 1))
    return dx, (dy * xhat).sum(lead), dy.sum(lead)


def _gelu(u: np.ndarray, approximate: str) -> tuple[np.ndarray, np.ndarray]:
    """GELU (``"none"``: exact, through erf; ``"tanh"``: its tanh form) and its derivative."""
    if approximate == "tanh":
        c, k = math.sqrt(2.0 / math.pi), 0.044715
        th = np.tanh(c * (u + k * u * u * u))
        return 0.5 * u * (1.0 + th), 0.5 * (1.0 + th) + 0.5 * u * (1.0 - th * th) * c * (
            1.0 + 3.0 * k * u * u)
    phi = 0.5 * (1.0 + _ERF(u * math.sqrt(0.5)).astype(u.dtype))
    return u * phi, phi + u * np.exp(-0.5 * u * u) / math.sqrt(2.0 * math.pi)


class NumpyGPT:
    """The model, its backward pass and AdamW on float arrays in one process.

    Parameters
    ----------
    params : mapping of name to array
        The initial weights, by the example's parameter names.
    heads, eps : int, float
    lr_at : callable
        The learning rate of step ``t`` (0-based).
    betas, adam_eps, weight_decay, clip : float
        AdamW's options and the gradient-norm bound (0: no clipping).
    gelu : str
        ``"none"`` (exact) or ``"tanh"``, as ``sm.nn.gelu``'s ``approximate``.
    """

    def __init__(self, params: Mapping[str, np.ndarray], heads: int, eps: float,
                 lr_at: Callable[[int], float], betas: tuple[float, float], adam_eps: float,
                 weight_decay: float, clip: float, gelu: str = "none") -> None:
        self.p = {k: np.array(v, copy=True) for k, v in params.items()}
        self.heads, self.eps, self.lr_at = heads, eps, lr_at
        self.betas, self.adam_eps, self.wd, self.clip = betas, adam_eps, weight_decay, clip
        self.gelu = gelu
        self.layers = sum(1 for k in self.p if k.endswith(".ln1.weight"))
        self.m = {k: np.zeros_like(v) for k, v in self.p.items()}
        self.v = {k: np.zeros_like(v) for k, v in self.p.items()}
        self.t = 0

    def _mask(self, t: int) -> np.ndarray:
        dtype = self.p["wte"].dtype
        return np.triu(np.full((t, t), -np.inf, dtype=dtype), 1)

    def logits(self, ids: np.ndarray) -> np.ndarray:
        """The forward pass only: logits of shape ``ids.shape + (V,)``."""
        return self._forward(ids)[0]

    def _forward(self, ids: np.ndarray) -> tuple[np.ndarray, list[dict[str, np.ndarray]]]:
        p, eps = self.p, self.eps
        t = ids.shape[1]
        x = p["wte"][ids] + p["wpe"][:t]
        mask = self._mask(t)
        caches = []
        for i in range(self.layers):
            q_ = f"blocks.{i}."
            c: dict[str, np.ndarray] = {"x0": x}
            h, c["ln1"] = _layer_norm(x, p[q_ + "ln1.weight"], p[q_ + "ln1.bias"], eps)
            c["h"] = h
            qkv = h[:, None] @ p[q_ + "attn.qkv_w"] + p[q_ + "attn.qkv_b"]  # (B, H, T, 3hd)
            hd = qkv.shape[-1] // 3
            q, k, v = qkv[..., :hd], qkv[..., hd:2 * hd], qkv[..., 2 * hd:]
            s = (q @ np.swapaxes(k, -1, -2)) * (1.0 / math.sqrt(hd)) + mask
            s = s - s.max(-1, keepdims=True)
            a = np.exp(s)
            a /= a.sum(-1, keepdims=True)
            y = a @ v
            x = x + (y @ p[q_ + "attn.proj_w"]).sum(1) + p[q_ + "attn.proj_b"]
            c.update(q=q, k=k, v=v, a=a, y=y, x1=x)
            h2, c["ln2"] = _layer_norm(x, p[q_ + "ln2.weight"], p[q_ + "ln2.bias"], eps)
            u = h2 @ p[q_ + "mlp.fc1.weight"] + p[q_ + "mlp.fc1.bias"]
            g, dg = _gelu(u, self.gelu)
            x = x + g @ p[q_ + "mlp.fc2.weight"] + p[q_ + "mlp.fc2.bias"]
            c.update(h2=h2, g=g, dg=dg)
            caches.append(c)
        hf, lnf = _layer_norm(x, p["lnf.weight"], p["lnf.bias"], eps)
        caches.append({"hf": hf, "lnf": lnf})
        return hf @ p["wte"].T, caches

    def step(self, ids: np.ndarray, targets: np.ndarray) -> float:
        """One training step on a batch; returns the loss before the update."""
        p = self.p
        logits, caches = self._forward(ids)
        b, t = ids.shape
        n = b * t
        z = logits.reshape(n, -1)
        zs = z - z.max(1, keepdims=True)
        logp = zs - np.log(np.exp(zs).sum(1, keepdims=True))
        rows = np.arange(n)
        y = targets.reshape(n)
        loss = -logp[rows, y].sum() / n
        dz = np.exp(logp)
        dz[rows, y] -= 1
        dz /= n
        dlogits = dz.reshape(logits.shape)
        g: dict[str, np.ndarray] = {}
        last = caches[-1]
        g["wte"] = np.einsum("btv,btd->vd", dlogits, last["hf"])
        dx, g["lnf.weight"], g["lnf.bias"] = _layer_norm_back(dlogits @ p["wte"], p["lnf.weight"],
                                                              last["lnf"])
        for i in reversed(range(self.layers)):
            q_, c = f"blocks.{i}.", caches[i]
            # MLP: x2 = x1 + gelu(ln2(x1) @ W1 + c1) @ W2 + c2
            g[q_ + "mlp.fc2.bias"] = dx.sum((0, 1))
            g[q_ + "mlp.fc2.weight"] = np.einsum("btf,btd->fd", c["g"], dx)
            du = (dx @ p[q_ + "mlp.fc2.weight"].T) * c["dg"]
            g[q_ + "mlp.fc1.bias"] = du.sum((0, 1))
            g[q_ + "mlp.fc1.weight"] = np.einsum("btd,btf->df", c["h2"], du)
            dh2 = du @ p[q_ + "mlp.fc1.weight"].T
            d, g[q_ + "ln2.weight"], g[q_ + "ln2.bias"] = _layer_norm_back(
                dh2, p[q_ + "ln2.weight"], c["ln2"])
            dx = dx + d
            # attention: x1 = x0 + sum_h (softmax(q k^T / sqrt(hd) + mask) v)_h @ Wp_h + bp
            g[q_ + "attn.proj_b"] = dx.sum((0, 1))
            g[q_ + "attn.proj_w"] = np.einsum("bhte,btd->hed", c["y"], dx)
            dy = dx[:, None] @ np.swapaxes(p[q_ + "attn.proj_w"], -1, -2)  # (B, H, T, hd)
            hd = dy.shape[-1]
            a = c["a"]
            da = dy @ np.swapaxes(c["v"], -1, -2)
            dv = np.swapaxes(a, -1, -2) @ dy
            ds = a * (da - (da * a).sum(-1, keepdims=True)) * (1.0 / math.sqrt(hd))
            dq = ds @ c["k"]
            dk = np.swapaxes(ds, -1, -2) @ c["q"]
            dqkv = np.concatenate([dq, dk, dv], -1)
            g[q_ + "attn.qkv_b"] = dqkv.sum((0, 2), keepdims=True)[0]
            g[q_ + "attn.qkv_w"] = np.einsum("btd,bhte->hde", c["h"], dqkv)
            dh = np.einsum("bhte,hde->btd", dqkv, p[q_ + "attn.qkv_w"])
            d, g[q_ + "ln1.weight"], g[q_ + "ln1.bias"] = _layer_norm_back(
                dh, p[q_ + "ln1.weight"], c["ln1"])
            dx = dx + d
        # embeddings: x = wte[ids] + wpe[:t]; wte also gets the tied output's gradient
        np.add.at(g["wte"], ids.reshape(-1), dx.reshape(n, -1))
        g["wpe"] = np.zeros_like(p["wpe"])
        g["wpe"][:t] = dx.sum(0)
        self._update(g)
        return float(loss)

    def _update(self, g: dict[str, np.ndarray]) -> None:
        if self.clip:
            total = math.sqrt(sum(float((v.astype(np.float64) ** 2).sum()) for v in g.values()))
            coef = self.clip / (total + 1e-6)
            if coef < 1:
                g = {k: v * v.dtype.type(coef) for k, v in g.items()}
        lr = self.lr_at(self.t)
        self.t += 1
        b1, b2 = self.betas
        for k, w in self.p.items():
            if self.wd and decays(k, w.shape):
                w *= 1 - lr * self.wd
            m, v = self.m[k], self.v[k]
            m *= b1
            m += (1 - b1) * g[k]
            v *= b2
            v += (1 - b2) * (g[k] * g[k])
            denom = np.sqrt(v) / math.sqrt(1 - b2 ** self.t) + self.adam_eps
            w -= (lr / (1 - b1 ** self.t)) * (m / denom)
