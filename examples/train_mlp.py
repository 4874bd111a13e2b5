"""Train a two-layer MLP classifier on global tensors, in three layouts, and check it
against the same training done by NumPy in one process.

Data: scikit-learn's bundled digits (8x8 images, 10 classes; no download), or a
seeded synthetic set of 10 Gaussian blobs when scikit-learn is missing.

Layouts (``--layout``):

* ``dp``: data parallel. The batch is split by rows (``split(0)``), the weights are
  broadcast; backward gives each weight a partial-sum gradient that is all-reduced
  into ``w.grad`` (one all-reduce per parameter: synchronous SGD).
* ``tp``: tensor parallel (Megatron-style). ``W1`` is split by columns (``split(1)``)
  and ``W2`` by rows (``split(0)``): the hidden layer stays split, the logits are a
  partial sum that is reduced once; the gradients come out split, like the weights.
* ``2d``: both on a (world / 2) x 2 mesh: data parallel along mesh axis 0, tensor
  parallel along axis 1.

Every step's loss must match the NumPy reference (same initial weights, batches and
optimizer): float64 within 1e-8 relative, float32 within 1e-4.

    mpiexec -n 2 python examples/train_mlp.py --layout dp
    mpiexec -n 4 python examples/train_mlp.py --layout 2d --optim adam
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

import sbpmpi as sm

S, B = sm.sbp.split, sm.sbp.broadcast


def load_data(kind: str, seed: int) -> tuple[np.ndarray, np.ndarray, str]:
    """Features scaled to [0, 1] (float64) and integer labels; the name of the source."""
    if kind in ("digits", "auto"):
        try:
            from sklearn.datasets import load_digits
        except ImportError:
            if kind == "digits":
                raise
        else:
            d = load_digits()
            return d.data / 16.0, d.target.astype(np.int64), "digits"
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((10, 64))
    y = rng.integers(0, 10, size=1000)
    x = centers[y] + 0.8 * rng.standard_normal((1000, 64))
    return (x - x.min()) / (x.max() - x.min()), y.astype(np.int64), "synthetic"


def layouts(kind: str) -> dict[str, Any]:
    """Placement and SBPs of the batch, the weights and the biases for a layout."""
    n = sm.env.get_world_size()
    if kind == "2d":
        if n < 4 or n % 2:
            raise SystemExit(f"--layout 2d needs an even world of at least 4 ranks, got {n}")
        pl = sm.placement("cpu", np.arange(n).reshape(n // 2, 2).tolist())
        return dict(placement=pl, x=(S(0), B), w1=(B, S(1)), w2=(B, S(0)))
    pl = sm.placement("cpu", list(range(n)))
    if kind == "dp":
        return dict(placement=pl, x=(S(0),), w1=(B,), w2=(B,))
    if kind == "tp":
        return dict(placement=pl, x=(B,), w1=(S(1),), w2=(S(0),))
    raise SystemExit(f"unknown layout {kind!r}")


class MLP(sm.nn.Module):
    def __init__(self, d_in: int, d_hid: int, d_out: int, lay: dict[str, Any], dtype: Any):
        pl = lay["placement"]
        self.fc1 = sm.nn.Linear(d_in, d_hid, placement=pl, sbp=lay["w1"], dtype=dtype)
        self.fc2 = sm.nn.Linear(d_hid, d_out, placement=pl, sbp=lay["w2"], dtype=dtype)

    def forward(self, x: sm.GlobalTensor) -> sm.GlobalTensor:
        return self.fc2(sm.nn.relu(self.fc1(x)))


def batches(n: int, batch: int, epoch: int, seed: int) -> list[np.ndarray]:
    order = np.random.default_rng([seed, epoch]).permutation(n)
    return [order[i:i + batch] for i in range(0, n, batch)]


class NumpyMLP:
    """The reference: the same model, loss, gradients and optimizer in NumPy."""

    def __init__(self, params: list[np.ndarray], optim: str, lr: float, dtype: Any):
        self.p = [a.astype(dtype) for a in params]
        self.optim, self.lr, self.t = optim, lr, 0
        self.m = [np.zeros_like(a) for a in self.p]
        self.v = [np.zeros_like(a) for a in self.p]

    def logits(self, x: np.ndarray) -> np.ndarray:
        w1, b1, w2, b2 = self.p
        return np.maximum(x @ w1 + b1, 0) @ w2 + b2

    def step(self, x: np.ndarray, y: np.ndarray) -> float:
        w1, b1, w2, b2 = self.p
        a = x @ w1 + b1
        h = np.maximum(a, 0)
        z = h @ w2 + b2
        zs = z - z.max(1, keepdims=True)
        logp = zs - np.log(np.exp(zs).sum(1, keepdims=True))
        n = len(y)
        loss = -logp[np.arange(n), y].sum() / n
        dz = np.exp(logp)
        dz[np.arange(n), y] -= 1
        dz /= n
        dh = (dz @ w2.T) * (a > 0)
        grads = [x.T @ dh, dh.sum(0), h.T @ dz, dz.sum(0)]
        self.t += 1
        for i, g in enumerate(grads):
            if self.optim == "sgd":  # momentum 0.9
                self.m[i] = 0.9 * self.m[i] + g
                self.p[i] -= self.lr * self.m[i]
            else:  # Adam, default betas and eps
                self.m[i] = 0.9 * self.m[i] + 0.1 * g
                self.v[i] = 0.999 * self.v[i] + 0.001 * g * g
                den = np.sqrt(self.v[i] / (1 - 0.999 ** self.t)) + 1e-8
                self.p[i] -= (self.lr / (1 - 0.9 ** self.t)) * (self.m[i] / den)
        return float(loss)


def make_optimizer(name: str, params: list[sm.GlobalTensor], lr: float) -> Any:
    if name == "sgd":
        return sm.optim.SGD(params, lr=lr, momentum=0.9)
    return sm.optim.Adam(params, lr=lr)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layout", default="dp", choices=["dp", "tp", "2d"])
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch", type=int, default=64, help="global batch size")
    ap.add_argument("--hidden", type=int, default=32)
    ap.add_argument("--optim", default="sgd", choices=["sgd", "adam"])
    ap.add_argument("--lr", type=float, default=None, help="default: 0.1 (sgd), 0.01 (adam)")
    ap.add_argument("--dtype", default="float64", choices=["float64", "float32"])
    ap.add_argument("--data", default="auto", choices=["auto", "digits", "synthetic"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--graph", action="store_true",
                    help="capture the step as a graph (sm.graph) and replay it")
    args = ap.parse_args()
    # a note when run without mpiexec; the 2-D mesh needs 4 ranks
    sm.launch.expect_world(4 if args.layout == "2d" else 2,
                           minimum=4 if args.layout == "2d" else 1, what="train_mlp")
    rank = sm.env.get_rank()
    dtype = np.dtype(args.dtype)
    lr = args.lr if args.lr is not None else (0.1 if args.optim == "sgd" else 0.01)

    x_all, y_all, source = load_data(args.data, args.seed)
    perm = np.random.default_rng(args.seed).permutation(len(y_all))
    n_test = len(y_all) // 5
    test, train = perm[:n_test], perm[n_test:]
    lay = layouts(args.layout)
    pl = lay["placement"]
    sm.manual_seed(args.seed)
    model = MLP(x_all.shape[1], args.hidden, 10, lay, dtype)
    opt = make_optimizer(args.optim, model.parameters(), lr)
    ref = NumpyMLP([p.numpy() for p in model.parameters()], args.optim, lr, dtype)
    rtol = 1e-8 if dtype == np.float64 else 1e-4

    y_sbp = tuple(s if isinstance(s, sm.sbp.Split) else B for s in lay["x"])
    if rank == 0:
        print(f"train_mlp: {source} data, {len(train)} train / {len(test)} test, layout "
              f"{args.layout} on {pl.ranks.tolist()}, {args.optim}, {dtype}")
        for name, p in model.named_parameters():
            print(f"  {name:11s} {str(p.shape):9s} sbp {tuple(str(s) for s in p.sbp)}")
    def train_step(x: sm.GlobalTensor, y: sm.GlobalTensor) -> sm.GlobalTensor:
        opt.zero_grad()
        loss = sm.nn.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    step = sm.graph(train_step) if args.graph else train_step
    worst = 0.0
    for epoch in range(args.epochs):
        losses = []
        for idx in batches(len(train), args.batch, epoch, args.seed):
            xb, yb = x_all[train[idx]].astype(dtype), y_all[train[idx]]
            x = sm.tensor(xb, placement=pl, sbp=lay["x"])
            y = sm.tensor(yb, placement=pl, sbp=y_sbp)
            loss = step(x, y)
            got, want = loss.item(), ref.step(xb, yb)
            worst = max(worst, abs(got - want) / abs(want))
            losses.append(got)
        if rank == 0:
            print(f"epoch {epoch + 1}: loss {np.mean(losses):.6f} (max relative difference "
                  f"from the NumPy reference so far {worst:.2e})")
    xt = sm.tensor(x_all[test].astype(dtype), placement=pl, sbp=lay["x"])
    with sm.no_grad():
        logits = model(xt).numpy()
    acc = float(np.mean(logits.argmax(1) == y_all[test]))
    acc_ref = float(np.mean(ref.logits(x_all[test].astype(dtype)).argmax(1) == y_all[test]))
    if rank == 0:
        print(f"test accuracy {acc:.4f} (NumPy reference {acc_ref:.4f})")
    assert worst <= rtol, f"loss differs from the NumPy reference by {worst:.3e} > {rtol}"
    # float32 rounding may move a sample that sits on a decision boundary
    assert abs(acc - acc_ref) <= (0 if dtype == np.float64 else 1.5 / len(test)), (acc, acc_ref)
    if rank == 0:
        print("TRAIN_MLP OK")


if __name__ == "__main__":
    main()
