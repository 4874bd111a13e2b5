"""Per-rank memory and bytes sent by data parallelism and the ZeRO stages (sm.nn.shard).

    mpiexec -n 2 python scripts/bench_zero.py [--batch 1024 --features 512 --hidden 512]
        [--reps 5] [--json out.json]

The MLP of ``bench_train.py`` (``relu(x @ W1 + b1) @ W2 + b2``, float64, Adam) trained
as plain data parallelism (parameters broadcast, gradients all-reduced), DP with
gradient buckets (``sm.nn.DataParallel``), ZeRO stage 1 (Adam state split over the ranks)
and stage 3 (parameters split too, gathered at each forward). Per layout: the median
step time (slowest rank), the bytes this rank holds in parameters, gradients and
optimizer state (counted from the live local shards after a step), the process's peak
RSS so far (the layouts run one after the other in one process), and the bytes this
rank hands to MPI per step (``sm.trace``: a collective's input buffer, so an all-reduce
counts P where a ring puts 2P (N-1)/N on the wire; a large reduce-scatter sends only
the other ranks' blocks), next to the formulas (P = parameter bytes, N ranks): DP holds
P + P + 2P (Adam), stage 1 P + P + 2P/N, stage 3 P/N + P/N + 2P/N between steps; the
wire bytes of DP and stage 3 (an all-gather and a reduce-scatter of the parameters) are
2P (N-1)/N, stage 1 adds the all-gather of the updated slices, P (N-1)/N.
"""

from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_v] = "1"

import argparse  # noqa: E402
import json  # noqa: E402
import resource  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

import sbpmpi as sm  # noqa: E402

world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
S = sm.sbp.split
N_CLASSES = 16


class MLP(sm.nn.Module):
    def __init__(self, pl: sm.Placement, d_in: int, d_hid: int) -> None:
        sm.manual_seed(0)
        self.l1 = sm.nn.Linear(d_in, d_hid, placement=pl, dtype=np.float64)
        self.l2 = sm.nn.Linear(d_hid, N_CLASSES, placement=pl, dtype=np.float64)

    def forward(self, x: sm.GlobalTensor) -> sm.GlobalTensor:
        return self.l2(sm.nn.relu(self.l1(x)))


def held(tensors: list[sm.GlobalTensor]) -> int:
    """Bytes of this rank's local shards."""
    return sum(int(t.to_local().nbytes) for t in tensors if t is not None)


def run(kind: str, pl: sm.Placement, x: np.ndarray, y: np.ndarray, hidden: int, reps: int
        ) -> dict[str, Any]:
    model: Any = MLP(pl, x.shape[1], hidden)
    opt: Any = sm.optim.Adam(model.parameters(), lr=1e-3)
    if kind == "DP, buckets":
        model = sm.nn.DataParallel(model)
    elif kind.startswith("ZeRO"):
        model, opt = sm.nn.shard(model, opt, stage=int(kind[-1]))
    xt = sm.tensor(x, placement=pl, sbp=S(0))

    def step() -> None:
        opt.zero_grad()
        sm.nn.cross_entropy(model(xt), y).backward()
        opt.step()

    step()
    with sm.trace() as t:
        step()
    times = []
    for _ in range(reps):
        world.Barrier()
        t0 = time.perf_counter()
        step()
        times.append(world.allreduce(time.perf_counter() - t0, op=MPI.MAX))
    inner = opt.optimizer if hasattr(opt, "optimizer") else opt
    params = model.parameters()
    state = [v for s in inner.state for v in s.values()]
    return dict(layout=kind, step_ms=statistics.median(times) * 1e3,
                param_bytes=held(params), grad_bytes=held([p.grad for p in params]),
                state_bytes=held(state), sent_bytes=t.nbytes(),
                peak_rss_mib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--features", type=int, default=512)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    pl = sm.placement("cpu", list(range(size)))
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((a.batch, a.features)), rng.integers(0, N_CLASSES, a.batch)
    rows = [run(k, pl, x, y, a.hidden, a.reps) for k in ("DP", "DP, buckets", "ZeRO 1", "ZeRO 3")]
    p = rows[0]["param_bytes"]
    formula = {"DP": (p, p, 2 * p), "DP, buckets": (p, p, 2 * p),
               "ZeRO 1": (p, p, 2 * p / size), "ZeRO 3": (p / size, p / size, 2 * p / size)}
    for r in rows:
        want = formula[r["layout"]]
        r["formula_bytes"] = dict(zip(("param", "grad", "state"), want))
        got = (r["param_bytes"], r["grad_bytes"], r["state_bytes"])
        r["vs_formula"] = max(abs(g / w - 1) for g, w in zip(got, want))
        wire = 2 * p * (size - 1) / size
        r["sent_formula_bytes"] = wire * 1.5 if r["layout"] == "ZeRO 1" else wire
    table = world.gather(rows, root=0)
    if rank != 0:
        return
    print(f"bench_zero: {size} ranks, float64, Adam; bytes per rank (rank 0), sent per step")
    head = ["layout", "step ms", "params B", "grads B", "state B", "max off formula",
            "sent B (trace)", "wire formula", "peak RSS MiB"]
    out = [head] + [[r["layout"], f"{r['step_ms']:.1f}", str(r["param_bytes"]),
                     str(r["grad_bytes"]), str(r["state_bytes"]), f"{r['vs_formula']:.1%}",
                     str(r["sent_bytes"]), f"{r['sent_formula_bytes']:.0f}",
                     f"{r['peak_rss_mib']:.0f}"] for r in table[0]]
    widths = [max(len(row[j]) for row in out) for j in range(len(head))]
    for row in out:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"ranks": size, "results": table}, fh, indent=1)


if __name__ == "__main__":
    main()
