"""Pipeline schedules: tokens/s, measured bubble fraction and activations held per stage,
sbpmpi's ``sm.pipeline`` and, in the same run, ``torch.distributed.pipelining`` (gloo, CPU)
on the same model, micro-batches and schedule.

    mpiexec -n 2 python scripts/bench_pipeline.py --pp 2
    mpiexec -n 4 python scripts/bench_pipeline.py --pp 4
    mpiexec -n 4 python scripts/bench_pipeline.py --pp 2 --dp 2 --no-torch
        [--blocks 8 --dim 256 --seq 16 --batch 64 --microbatches 8 --steps 5]
        [--picture docs/pipeline-1f1b.png] [--json out.json]

The model: ``--blocks`` blocks of ``x + tanh(x @ W + b)`` (float32, width ``--dim``) on
``(batch, seq, dim)`` inputs, a mean-square loss; the blocks are cut into ``pp`` stages
(``2 pp`` for the interleaved schedule), stage ``s`` on placement ``s mod pp``; with
``--dp``, each placement is ``dp`` ranks and the batch is split over them (sbpmpi only:
the torch side is pipeline-only). A step is one ``schedule.step`` (forward and backward
of the batch in ``--microbatches`` micro-batches, no optimizer). Reported: the median
step's tokens/s (batch x seq per second, slowest rank), the bubble fraction measured
from the step's ``sm.trace`` intervals (the mean over placements of the time they do not
compute forward or backward, over the step's span) beside the schedule's theory
``(p - 1) / (M + p - 1)`` (interleaved: ``(p - 1) / (v M + p - 1)``), the most
micro-batches a stage held at once, and the bytes of the stage's boundary activations
held then (per stage, on its ranks). The consistency check is off (``check=False``), as
in every benchmark. ``--picture`` draws the 1F1B step (one row per stage).
"""

from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_v] = "1"

import argparse  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

import sbpmpi as sm  # noqa: E402

S, B = sm.sbp.split, sm.sbp.broadcast
SCHEDULES = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B",
             "interleaved": "ScheduleInterleaved1F1B"}


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--pp", type=int, default=2)
    ap.add_argument("--dp", type=int, default=1)
    ap.add_argument("--blocks", type=int, default=8)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--seq", type=int, default=16)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--schedules", default="gpipe,1f1b,interleaved")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--picture", default="")
    ap.add_argument("--json", default="")
    return ap.parse_args()


def theory(schedule: str, p: int, m: int, v: int) -> float:
    return (p - 1) / ((v if schedule == "interleaved" else 1) * m + p - 1)


# ---- sbpmpi ---------------------------------------------------------------------------------

class Blocks(sm.nn.Module):
    def __init__(self, n: int, dim: int, pl: sm.Placement) -> None:
        self.ws = [sm.nn.Linear(dim, dim, placement=pl, sbp=(B, B), dtype=np.float32)
                   for _ in range(n)]

    def forward(self, x: sm.GlobalTensor) -> sm.GlobalTensor:
        for lin in self.ws:
            x = x + sm.tanh(lin(x))
        return x


def mse(y: sm.GlobalTensor, t: sm.GlobalTensor) -> sm.GlobalTensor:
    return (y * y).mean()


def sbpmpi_run(a: argparse.Namespace, schedule: str) -> dict[str, Any]:
    n = sm.env.get_world_size()
    mesh = np.arange(n).reshape(a.pp, a.dp)
    pls = [sm.placement("cpu", [mesh[s].tolist()]) for s in range(a.pp)]  # 1 x dp
    v = 2 if schedule == "interleaved" else 1
    counts = [len(c) for c in np.array_split(np.arange(a.blocks), a.pp * v)]
    stages = [sm.pipeline.PipelineStage(Blocks(c, a.dim, pls[s % a.pp]), s, a.pp * v,
                                        pls[s % a.pp]) for s, c in enumerate(counts)]
    sched = getattr(sm.pipeline, SCHEDULES[schedule])(stages, a.microbatches, mse)
    rng = np.random.default_rng(0)
    x = sm.tensor(rng.normal(size=(a.batch, a.seq, a.dim)).astype(np.float32),
                  placement=pls[0], sbp=(B, S(0)))
    times = []
    for _ in range(a.steps + 1):
        sm.comm.barrier()
        t0 = time.perf_counter()
        with sm.trace() as tr:
            sched.step(x)
        times.append(time.perf_counter() - t0)
    every = [iv for ivs in sm.comm.all_gather_object(tr.intervals) for iv in ivs]

    def row_of(iv: Any) -> int:  # one row per placement
        return int(iv.stage % a.pp)

    bubble = sm.pipeline.bubble_fraction(every, row_of)
    if a.picture and schedule == "1f1b" and sm.env.get_rank() == 0:
        sm.pipeline.plot_schedule(every, a.picture, f"sbpmpi 1F1B, {a.pp} stages, "
                                  f"{a.microbatches} micro-batches", row_of)
    held = sm.comm.all_gather_object([(s.stage_index, s.peak_held, s.peak_held_bytes)
                                      for s in stages if s.is_member])
    per_stage: dict[int, tuple[int, int]] = {}
    for rows in held:
        for s, h, b in rows:
            per_stage[s] = (max(h, per_stage.get(s, (0, 0))[0]),
                            max(b, per_stage.get(s, (0, 0))[1]))
    step = max(sm.comm.all_gather_object(float(np.median(times[1:]))))
    return {"impl": "sbpmpi", "schedule": schedule, "seconds": step,
            "tokens_per_s": a.batch * a.seq / step, "bubble": bubble,
            "theory": theory(schedule, a.pp, a.microbatches, v),
            "held": [per_stage[s][0] for s in sorted(per_stage)],
            "held_bytes": [per_stage[s][1] for s in sorted(per_stage)]}


# ---- torch.distributed.pipelining -----------------------------------------------------------

def torch_run(a: argparse.Namespace, schedule: str) -> dict[str, Any]:
    import torch
    import torch.distributed as dist
    from torch.distributed import pipelining as tp

    torch.set_num_threads(1)
    rank, n = sm.env.get_rank(), sm.env.get_world_size()

    class TBlocks(torch.nn.Module):
        def __init__(self, k: int) -> None:
            super().__init__()
            self.ws = torch.nn.ModuleList([torch.nn.Linear(a.dim, a.dim) for _ in range(k)])

        def forward(self, x: Any) -> Any:
            for lin in self.ws:
                x = x + torch.tanh(lin(x))
            return x

    v = 2 if schedule == "interleaved" else 1
    counts = [len(c) for c in np.array_split(np.arange(a.blocks), a.pp * v)]
    mine = [s for s in range(a.pp * v) if s % a.pp == rank]
    stages = [tp.PipelineStage(TBlocks(counts[s]), s, a.pp * v, torch.device("cpu"))
              for s in mine]

    def loss_fn(y: Any, t: Any) -> Any:
        return (y * y).mean()

    cls = getattr(tp, SCHEDULES[schedule])
    sched = cls(stages if v > 1 else stages[0], n_microbatches=a.microbatches,
                loss_fn=loss_fn)
    x = torch.from_numpy(np.random.default_rng(0).normal(
        size=(a.batch, a.seq, a.dim)).astype(np.float32))
    target = torch.zeros(a.batch, a.seq, a.dim)
    times = []
    for _ in range(a.steps + 1):
        dist.barrier()
        t0 = time.perf_counter()
        if rank == 0:
            sched.step(x, target=target if n == 1 else None)
        elif rank == a.pp - 1 and v == 1:
            sched.step(target=target)
        else:
            sched.step(target=target) if v > 1 else sched.step()
        times.append(time.perf_counter() - t0)
    step = max(sm.comm.all_gather_object(float(np.median(times[1:]))))
    return {"impl": "torch", "schedule": schedule, "seconds": step,
            "tokens_per_s": a.batch * a.seq / step, "bubble": None,
            "theory": theory(schedule, a.pp, a.microbatches, v), "held": None,
            "held_bytes": None}


def main() -> None:
    a = parse()
    n = sm.env.get_world_size()
    if a.pp * a.dp != n:
        raise SystemExit(f"bench_pipeline: pp {a.pp} x dp {a.dp} must be the world size {n}")
    if a.picture and importlib.util.find_spec("matplotlib") is None:  # alike on every rank
        raise SystemExit("bench_pipeline: --picture needs matplotlib: pip install 'sbpmpi[plot]'")
    sm.config.update(check=False)
    rows = []
    torch_ok = not a.no_torch and a.dp == 1
    if torch_ok:
        import torch.distributed as dist
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(29500 + sm.comm.broadcast_object(
            int(np.random.default_rng().integers(1, 2000)))))
        dist.init_process_group("gloo", rank=sm.env.get_rank(), world_size=n)
    for schedule in a.schedules.split(","):
        rows.append(sbpmpi_run(a, schedule))
        if torch_ok:
            rows.append(torch_run(a, schedule))
    if sm.env.get_rank() == 0:
        print(f"n={n} pp={a.pp} dp={a.dp} blocks={a.blocks} dim={a.dim} batch={a.batch} "
              f"seq={a.seq} M={a.microbatches} float32")
        print("| impl | schedule | tokens/s | bubble (measured) | theory | micro-batches held "
              "per stage | boundary activation bytes held per stage |")
        print("|---|---|---|---|---|---|---|")
        for r in rows:
            bub = "-" if r["bubble"] is None else f"{r['bubble']:.2f}"
            held = "-" if r["held"] is None else " / ".join(map(str, r["held"]))
            hb = "-" if r["held_bytes"] is None else " / ".join(
                f"{b / 2**20:.1f} MiB" for b in r["held_bytes"])
            print(f"| {r['impl']} | {r['schedule']} | {r['tokens_per_s']:.0f} | {bub} | "
                  f"{r['theory']:.2f} | {held} | {hb} |")
        if a.json:
            with open(a.json, "w") as f:
                json.dump(rows, f, indent=1)
    if torch_ok:
        import torch.distributed as dist
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
