"""Per-rank memory, bytes sent and step time of data parallelism, the ZeRO stages
(sm.nn.shard) and, in the same run, torch DDP and torch FSDP2 (gloo, CPU).

    mpiexec -n 2 python scripts/bench_zero.py [--batch 1024 --features 512 --hidden 512]
        [--reps 5] [--json out.json] [--no-torch]

The MLP of ``bench_train.py`` (``relu(x @ W1 + b1) @ W2 + b2``, float64, Adam, the batch
split over the ranks) trained as plain data parallelism (parameters broadcast, gradients
all-reduced), DP with gradient buckets (``sm.nn.DataParallel``), ZeRO stage 1 (Adam
state split over the ranks; the whole gradients, unreduced, reduce-scattered by the
step), stage 2 (gradients reduce-scattered in backward and held split) and stage 3
(parameters split, each layer gathered around its forward and backward); then
``torch.nn.parallel.DistributedDataParallel`` and FSDP2 (``fully_shard`` on each layer
and the model) on the same model, batch and optimizer. Per layout: the median step time
(slowest rank, layouts interleaved rep by rep so that a noisy machine hits them alike),
the bytes this rank holds in parameters, gradients and optimizer state (counted from the
live local shards after a step), the peak parameter bytes during a step (stage 3: the
shards plus the gathered layers, counted by the module), the process's peak RSS so far
(the layouts share one process, so it only grows), and the bytes this rank hands to MPI
per step (``sm.trace``; torch's gloo traffic is not traced). Formulas (P = parameter
bytes, N ranks, Adam's state 2P): DP holds P + P + 2P; stage 1 P + P + 2P/N; stage 2
P + P/N + 2P/N; stage 3 P/N + P/N + 2P/N between steps, with a peak of P/N plus the
largest layer's P_l without prefetch, plus the two layers gathered at once with it (for
this two-layer MLP: the whole P). FSDP2's peak is estimated the same way (one layer). Bytes moved per step: about 2P for DP and stages 1-2 (an
all-reduce, or a reduce-scatter and an all-gather), 3P for stage 3 (two all-gathers and a
reduce-scatter) in the limit of many ranks: a rank sends 2P (N-1)/N and 3P (N-1)/N in ring
algorithms ("wire formula"). The traced count is each call's input buffer (an all-reduce
counts P, an all-gather its P/N slice, a large reduce-scatter the P (N-1)/N it sends);
"wire" turns each traced call into the bytes a ring algorithm sends (``WIRE``).
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
from collections.abc import Callable  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

import sbpmpi as sm  # noqa: E402
from sbpmpi.parallel.zero import ZeroModule  # noqa: E402

world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
S = sm.sbp.split
N_CLASSES = 16
SBPMPI_LAYOUTS = ("DP", "DP, buckets", "ZeRO 1", "ZeRO 2", "ZeRO 3", "ZeRO 3, no prefetch")
TORCH_LAYOUTS = ("torch DDP", "torch FSDP2")
# bytes a rank puts on the wire per byte of a traced call's input, in a ring (or pairwise)
# algorithm; the traced all-to-all and large reduce-scatter inputs already leave out the
# rank's own block
WIRE = {"all_reduce": 2 * (size - 1) / size, "all_gather": size - 1,
        "reduce_scatter": (size - 1) / size, "all_to_all": 1.0}


class MLP(sm.nn.Module):
    def __init__(self, pl: sm.Placement, d_in: int, d_hid: int) -> None:
        sm.manual_seed(0)
        self.l1 = sm.nn.Linear(d_in, d_hid, placement=pl, dtype=np.float64)
        self.l2 = sm.nn.Linear(d_hid, N_CLASSES, placement=pl, dtype=np.float64)

    def forward(self, x: sm.GlobalTensor) -> sm.GlobalTensor:
        return self.l2(sm.nn.relu(self.l1(x)))


@dataclass
class Run:
    """One layout ready to step, and how to count what it holds."""

    step: Callable[[], None]
    held: Callable[[], dict[str, int]]  # param, grad, state, param_peak bytes
    traced: bool = True


def nbytes(arrays: list[Any]) -> int:
    return sum(int(a.nbytes) for a in arrays if a is not None)


def sbpmpi_run(kind: str, pl: sm.Placement, x: np.ndarray, y: np.ndarray, hidden: int) -> Run:
    model: Any = MLP(pl, x.shape[1], hidden)
    opt: Any = sm.optim.Adam(model.parameters(), lr=1e-3)
    if kind == "DP, buckets":
        model = sm.nn.DataParallel(model)
    elif kind.startswith("ZeRO"):
        model, opt = sm.nn.shard(model, opt, stage=int(kind[5]), prefetch="no prefetch" not in kind)
    xt = sm.tensor(x, placement=pl, sbp=S(0))
    sharded = model if isinstance(model, ZeroModule) else None

    def step() -> None:
        if sharded is not None:
            sharded.reset_peak()
        opt.zero_grad()
        sm.nn.cross_entropy(model(xt), y).backward()
        opt.step()

    def held() -> dict[str, int]:
        inner = getattr(opt, "optimizer", opt)
        params = model.parameters()
        whole = sharded.held_parameters() if sharded is not None else params
        p = nbytes([t.to_local() for t in whole])
        return dict(param=p, grad=nbytes([q.grad.to_local() for q in params if q.grad is not None]),
                    state=nbytes([v.to_local() for s in inner.state for v in s.values()]),
                    param_peak=p + (sharded.peak_gathered_bytes if sharded is not None else 0))

    return Run(step, held)


def torch_run(kind: str, x: np.ndarray, y: np.ndarray, hidden: int) -> Run:
    import torch
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(x.shape[1], hidden), torch.nn.ReLU(),
                              torch.nn.Linear(hidden, N_CLASSES)).double()
    model: Any
    if kind == "torch DDP":
        model = torch.nn.parallel.DistributedDataParallel(net)
    else:
        for layer in (net[0], net[2]):
            fully_shard(layer)
        model = fully_shard(net)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    rows = np.array_split(np.arange(len(x)), size)[rank]
    xt, yt = torch.from_numpy(x[rows]), torch.from_numpy(y[rows])

    def step() -> None:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(xt), yt).backward()
        opt.step()

    def local(t: Any) -> Any:
        return t.to_local() if hasattr(t, "to_local") else t

    def held() -> dict[str, int]:
        ps = list(model.parameters())
        p = sum(local(q).nbytes for q in ps)
        full = sum(q.numel() * q.element_size() for q in ps)  # FSDP2 gathers layer by layer
        return dict(param=p, grad=sum(local(q.grad).nbytes for q in ps if q.grad is not None),
                    state=sum(local(v).nbytes for s in opt.state.values() for v in s.values()
                              if hasattr(v, "nbytes") and local(v).dim() > 0),
                    param_peak=p if kind == "torch DDP" else p + max(
                        sum(q.numel() * q.element_size() for q in layer.parameters())
                        for layer in (net[0], net[2])) if full else p)

    return Run(step, held, traced=False)


def formula(kind: str, p: int, largest_layer: int) -> dict[str, float]:
    n = size
    if kind.startswith("ZeRO 3") or kind == "torch FSDP2":
        # gathered during a step: one layer, or two with the next one prefetched (here the
        # two layers are the whole model)
        gathered = p if kind == "ZeRO 3" else largest_layer
        return dict(param=p / n, grad=p / n, state=2 * p / n, param_peak=p / n + gathered,
                    moved=3 * p)
    grad = p / n if kind == "ZeRO 2" else p
    state = 2 * p / n if kind in ("ZeRO 1", "ZeRO 2") else 2 * p
    return dict(param=p, grad=grad, state=state, param_peak=p, moved=2 * p)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--features", type=int, default=512)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json", default="")
    ap.add_argument("--no-torch", action="store_true", help="skip torch DDP and FSDP2")
    a = ap.parse_args()
    pl = sm.placement("cpu", list(range(size)))
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((a.batch, a.features)), rng.integers(0, N_CLASSES, a.batch)
    runs = {k: sbpmpi_run(k, pl, x, y, a.hidden) for k in SBPMPI_LAYOUTS}
    torch_error = ""
    if not a.no_torch:
        try:
            import torch
            import torch.distributed as dist

            torch.set_num_threads(1)
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            os.environ.setdefault("MASTER_PORT", str(29500 + world.bcast(
                int(np.random.default_rng().integers(0, 2000)), root=0)))
            dist.init_process_group("gloo", rank=rank, world_size=size)
            runs.update({k: torch_run(k, x, y, a.hidden) for k in TORCH_LAYOUTS})
        except Exception as e:  # reported in the table, the sbpmpi rows still run
            torch_error = f"{type(e).__name__}: {e}"
    sent: dict[str, int] = {}
    wire: dict[str, float] = {}
    for k, r in runs.items():
        r.step()  # warm-up
        if r.traced:
            with sm.trace() as t:
                r.step()
            sent[k] = t.nbytes()
            wire[k] = sum(r.nbytes * WIRE.get(r.op.removesuffix("_v"), 1.0) for r in t)
    times: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(a.reps):
        for k, r in runs.items():
            world.Barrier()
            t0 = time.perf_counter()
            r.step()
            times[k].append(world.allreduce(time.perf_counter() - t0, op=MPI.MAX))
    p = (a.features * a.hidden + a.hidden + a.hidden * N_CLASSES + N_CLASSES) * 8
    largest = (a.features * a.hidden + a.hidden) * 8
    dp_ms = statistics.median(times["DP"]) * 1e3
    rows = []
    for k, r in runs.items():
        got, want = r.held(), formula(k, p, largest)
        ms = statistics.median(times[k]) * 1e3
        rows.append(dict(layout=k, step_ms=ms, vs_dp=ms / dp_ms,
                         **{f"{n}_bytes": v for n, v in got.items()},
                         formula_bytes=want,
                         vs_formula=max(abs(got[n] / want[n] - 1) for n in got),
                         sent_bytes=sent.get(k), wire_bytes=wire.get(k),
                         wire_formula_bytes=want["moved"] * (size - 1) / size,
                         peak_rss_mib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024))
    if not a.no_torch and not torch_error:
        import torch.distributed as dist

        dist.destroy_process_group()
    table = world.gather(rows, root=0)
    if rank != 0:
        return
    print(f"bench_zero: {size} ranks, float64, Adam, batch {a.batch}, MLP {a.features}x"
          f"{a.hidden}x{N_CLASSES} (P = {p} B); bytes held by rank 0, median of {a.reps}")
    head = ["layout", "step ms", "vs DP", "params B", "param peak B", "grads B", "state B",
            "max off formula", "traced B", "wire B", "wire formula B", "peak RSS MiB"]
    out = [head] + [[r["layout"], f"{r['step_ms']:.1f}", f"{r['vs_dp']:.2f}",
                     str(r["param_bytes"]), str(r["param_peak_bytes"]), str(r["grad_bytes"]),
                     str(r["state_bytes"]), f"{r['vs_formula']:.1%}",
                     "-" if r["sent_bytes"] is None else str(r["sent_bytes"]),
                     "-" if r["wire_bytes"] is None else f"{r['wire_bytes']:.0f}",
                     f"{r['wire_formula_bytes']:.0f}", f"{r['peak_rss_mib']:.0f}"]
                    for r in table[0]]
    widths = [max(len(row[j]) for row in out) for j in range(len(head))]
    for row in out:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
    if torch_error:
        print(f"torch rows skipped: {torch_error}")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"ranks": size, "param_bytes": p, "torch_error": torch_error,
                       "results": table}, fh, indent=1)


if __name__ == "__main__":
    main()
