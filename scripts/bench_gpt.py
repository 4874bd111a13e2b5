"""Benchmark training the GPT of examples/train_gpt.py: tokens per second per layout,
against the one-process run and against PyTorch on the same model.

    python scripts/bench_gpt.py --ranks 2 [--runs 3] [--json out.json]   # the driver
    mpiexec -n 2 python scripts/bench_gpt.py --worker                    # one run

The driver (not an MPI program) starts ``--runs`` times each of: the one-process run
(``mpiexec -n 1``) and the ``--ranks`` run, and reports the median of the runs' median
step times as tokens per second. A run times, per layout (``dp``, ``tp``, ``sp``; ``2d``
on 4 or more even ranks), one training step of the example (forward, vocab-parallel
cross-entropy, backward, AdamW; no gradient clipping; ``dp`` and ``2d`` with the
example's default ``--buckets on``, ``sm.nn.DataParallel``: pass ``--buckets off`` for one
all-reduce per parameter), the slowest rank's time, and the
same model in PyTorch: plain in one process, ``DistributedDataParallel`` for ``dp``,
DTensor ``parallelize_module`` with ``ColwiseParallel``/``RowwiseParallel`` (and
``SequenceParallel`` for ``sp``) and ``loss_parallel`` for ``tp``/``sp`` (gloo, CPU).
float32, dropout 0, one BLAS/torch thread per rank (set before NumPy loads).

``--dtype bfloat16`` (or ``float16``) and ``--recompute full`` (or ``selective``) are
passed to the example (float32 weights, the forward under ``sm.autocast``; each block
under ``sm.nn.checkpoint``); torch then runs under ``torch.autocast("cpu", torch.bfloat16)``
and ``torch.utils.checkpoint`` (``use_reentrant=False``) alike. For each sbpmpi layout
the run also reports the bytes handed to MPI in one step (``sm.trace``) and the bytes the
tape holds at the end of forward (``sbpmpi.tape.held_bytes``): these hold on any device,
where CPU half-width arithmetic may be slower than float32.

``--graph`` adds, per layout, the same step captured as a graph (``sm.graph``,
``Trainer.graph_step``). ``--compile`` adds torch's model under ``torch.compile``
(inductor's C++ kernels on CPU; the first steps compile, minutes): in one process, and
under ``DistributedDataParallel`` for ``dp`` (DTensor's tensor and sequence parallelism
are not compiled: not what ``torch.compile`` supports on CPU with gloo here). The
optimizer step runs eagerly in both.
"""

from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_v] = "1"

import argparse  # noqa: E402
import functools  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
# no gradient clipping: torch's clip_grad_norm_ refuses a mix of DTensor and plain
# parameters; GELU's tanh form (GPT-2's): NumPy has no erf, sbpmpi's series costs more than
# the rest of the step
SIZE = ["--layers", "2", "--heads", "8", "--dim", "256", "--seq", "128", "--batch", "16",
        "--clip", "0", "--gelu", "tanh"]


# ---- one run (under mpiexec) ----------------------------------------------------------------

def worker(argv: list[str]) -> None:
    from mpi4py import MPI

    sys.path.insert(0, str(ROOT / "examples"))
    import train_gpt  # imports sbpmpi

    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json", default="")
    ap.add_argument("--torch", action="store_true")
    ap.add_argument("--graph", action="store_true")
    ap.add_argument("--compile", action="store_true")
    own, rest = ap.parse_known_args(argv)
    args = train_gpt.parse(["--dtype", "float32", "--dropout", "0", *rest])
    data = train_gpt.load_corpus()
    ids, targets = train_gpt.batch_at(data, 0, args.batch, args.seq, args.seed)
    tokens = args.batch * args.seq

    def median_step(fn: Callable[[], Any], warmup: int = 2) -> float:
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(own.reps):
            world.Barrier()
            t0 = time.perf_counter()
            fn()
            times.append(world.allreduce(time.perf_counter() - t0, op=MPI.MAX))
        return statistics.median(times)

    layouts = ["dp"] if size == 1 else ["dp", "tp", "sp"] + (
        ["2d"] if size >= 4 and size % 2 == 0 else [])
    rows: dict[str, float] = {}
    from sbpmpi.tape import held_bytes
    for layout in layouts:
        args.layout = layout
        trainer = train_gpt.build(args, layout)
        name = f"sbpmpi {layout}" if size > 1 else "sbpmpi"
        rows[name] = tokens / median_step(functools.partial(trainer.step, ids, targets))
        with train_gpt.sm.trace() as t:  # bytes handed to MPI in one step, this rank
            trainer.step(ids, targets)
        loss = trainer.loss(ids, targets)  # the tape at the end of forward, this rank
        rows[f"wire bytes {name}"] = float(world.allreduce(t.nbytes(), op=MPI.MAX))
        rows[f"tape bytes {name}"] = float(world.allreduce(held_bytes(loss), op=MPI.MAX))
        loss.backward()  # the buckets' round ends (DataParallel)
        if own.graph:  # the same step captured as a graph (sm.graph)
            captured = train_gpt.build(args, layout).graph_step()
            rows[f"sbpmpi graph {layout}" if size > 1 else "sbpmpi graph"] = tokens / \
                median_step(functools.partial(captured, ids, targets), warmup=3)
    if own.torch:
        torch_setup(rank, size, world)
        kinds = ["plain"] if size == 1 else ["ddp", "tp", "sp"]
        for kind in kinds:
            step = torch_step(kind, args, ids, targets)
            rows["torch" if kind == "plain" else f"torch {kind}"] = tokens / median_step(step)
        for kind in kinds[:1] if own.compile else []:  # plain or ddp
            step = torch_step(kind, args, ids, targets, compiled=True)
            rows["torch compile" if kind == "plain" else f"torch compile {kind}"] = \
                tokens / median_step(step, warmup=3)
    if rank == 0:
        print(json.dumps(rows))
        if own.json:
            Path(own.json).write_text(json.dumps(rows))


# ---- the same model in PyTorch -----------------------------------------------------------------

def torch_setup(rank: int, size: int, world: Any) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(world.bcast(29500 + os.getpid() % 1000)))
        dist.init_process_group("gloo", rank=rank, world_size=size)


def torch_gpt(vocab: int, args: argparse.Namespace) -> Any:
    """The example's GPT in torch: q, k, v, proj as ``nn.Linear`` (heads in the columns)."""
    import torch
    import torch.utils.checkpoint
    from torch import nn

    d, h = args.dim, args.heads

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.attn = nn.ModuleDict({k: nn.Linear(d, d) for k in ("q", "k", "v", "proj")})
            self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

        def forward(self, x: Any, mask: Any) -> Any:
            b, t, _ = x.shape
            a = self.ln1(x)
            # -1: the local heads when q, k, v are column parallel
            q, k, v = (self.attn[n](a).view(b, a.shape[1], -1, d // h).transpose(1, 2)
                       for n in "qkv")
            s = (q * (1.0 / math.sqrt(d // h))) @ k.transpose(-1, -2) + mask  # as the example
            y = (torch.softmax(s, -1) @ v).transpose(1, 2).reshape(b, a.shape[1], -1)
            x = x + self.attn["proj"](y)
            return x + self.fc2(nn.functional.gelu(self.fc1(self.ln2(x)), approximate=args.gelu))

    class GPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.wte = nn.Embedding(vocab, d)
            self.wpe = nn.Parameter(torch.randn(args.seq, d) * 0.02)
            self.blocks = nn.ModuleList([Block() for _ in range(args.layers)])
            self.lnf = nn.LayerNorm(d)
            self.head = nn.Linear(d, vocab, bias=False)
            self.head.weight = self.wte.weight
            self.pos = slice(None)  # sp: this rank's positions

        def forward(self, ids: Any) -> Any:
            x = self.wte(ids)
            x = x + self.wpe[self.pos]
            t = ids.shape[1]
            mask = torch.triu(torch.full((t, t), float("-inf")), 1)
            for blk in self.blocks:
                if args.recompute == "none":
                    x = blk(x, mask)
                else:  # --recompute: torch's non-reentrant checkpoint of each block
                    x = torch.utils.checkpoint.checkpoint(blk, x, mask, use_reentrant=False)
            return self.head(self.lnf(x))

    return GPT()


def torch_step(kind: str, args: argparse.Namespace, ids: Any, targets: Any,
               compiled: bool = False) -> Callable[[], Any]:
    """One training step of the torch GPT: ``plain``, ``ddp``, ``tp`` or ``sp``
    (``compiled``: the model under ``torch.compile``)."""
    import contextlib

    import torch
    import torch.distributed as dist
    from torch.nn import functional

    sys.path.insert(0, str(ROOT / "examples"))
    import train_gpt

    torch.manual_seed(args.seed)
    model = torch_gpt(len(train_gpt.VOCAB), args)
    low = {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(args.dtype)
    rank, size = dist.get_rank(), dist.get_world_size()
    x, y = torch.from_numpy(ids), torch.from_numpy(targets)
    ctx: Callable[[], Any] = contextlib.nullcontext
    if kind == "ddp":
        lo, hi = rank * len(x) // size, (rank + 1) * len(x) // size
        x, y = x[lo:hi], y[lo:hi]
        model = torch.nn.parallel.DistributedDataParallel(model)
    elif kind in ("tp", "sp"):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Replicate, Shard
        from torch.distributed.tensor.parallel import (
            ColwiseParallel,
            RowwiseParallel,
            SequenceParallel,
            loss_parallel,
            parallelize_module,
        )

        mesh = init_device_mesh("cpu", (size,))
        sp = kind == "sp"
        seq = Shard(1) if sp else Replicate()
        for blk in model.blocks:
            plan: dict[str, Any] = {
                "attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(),
                "attn.v": ColwiseParallel(), "attn.proj": RowwiseParallel(output_layouts=seq),
                "fc1": ColwiseParallel(), "fc2": RowwiseParallel(output_layouts=seq)}
            if sp:
                plan.update({"ln1": SequenceParallel(), "ln2": SequenceParallel(),
                             "attn.q": ColwiseParallel(input_layouts=Shard(1)),
                             "attn.k": ColwiseParallel(input_layouts=Shard(1)),
                             "attn.v": ColwiseParallel(input_layouts=Shard(1)),
                             "fc1": ColwiseParallel(input_layouts=Shard(1))})
            parallelize_module(blk, mesh, plan)
        top: dict[str, Any] = {
            "wte": RowwiseParallel(input_layouts=Replicate(), output_layouts=seq),
            "head": ColwiseParallel(input_layouts=seq, output_layouts=Shard(-1),
                                    use_local_output=False)}
        if sp:
            top["lnf"] = SequenceParallel()
            t = args.seq
            model.pos = slice(rank * t // size, (rank + 1) * t // size)
        parallelize_module(model, mesh, top)
        model.head.weight = model.wte.weight  # tied again, both Shard(0)
        ctx = loss_parallel
    if compiled:
        model = torch.compile(model)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay,
                            foreach=False)

    def step() -> Any:
        opt.zero_grad()
        with ctx(), torch.autocast("cpu", low or torch.bfloat16, enabled=low is not None):
            logits = model(x)
            loss = functional.cross_entropy(logits.flatten(0, 1), y.flatten(0, 1))
            loss.backward()
        if kind == "sp":  # each rank's positions: the gradient of the whole table
            wpe = model.wpe
            dist.all_reduce(wpe.grad)
        opt.step()
        return loss

    return step


# ---- the driver -------------------------------------------------------------------------------

def clean_env() -> dict[str, str]:
    """This environment without a surrounding MPI job's variables."""
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("PMI_", "PMIX_", "HYDRA_", "MPIR_", "OMPI_"))}


def one_run(ranks: int, rest: list[str], torch: bool) -> dict[str, float]:
    exe = shutil.which("mpiexec") or "mpiexec"
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "run.json"
        cmd = [exe, "-n", str(ranks), sys.executable, str(Path(__file__).resolve()),
               "--worker", "--json", str(out), *(["--torch"] if torch else []), *rest]
        r = subprocess.run(cmd, env=clean_env(), capture_output=True, text=True, timeout=1800)
        if r.returncode:
            raise SystemExit(f"bench_gpt: {' '.join(cmd)} failed:\n{r.stdout[-2000:]}\n"
                             f"{r.stderr[-3000:]}")
        return dict(json.loads(out.read_text()))


def driver(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", default="", help="also write the results here")
    ap.add_argument("--no-torch", action="store_true")
    a, rest = ap.parse_known_args(argv)
    compiled = "--compile" in rest
    rest = SIZE + rest
    try:
        import torch  # noqa: F401
        torch_ok = not a.no_torch
    except ImportError:
        torch_ok = False
    runs: list[dict[str, float]] = []
    for _ in range(a.runs):
        row = one_run(1, rest, torch_ok)
        row.update(one_run(a.ranks, rest, torch_ok))
        runs.append(row)
    every = list(runs[0])
    med = {k: statistics.median(r[k] for r in runs) for k in every}
    names = [k for k in every if not k.startswith(("wire bytes ", "tape bytes "))]
    sizes = [k for k in every if k.startswith("wire bytes ")]
    single = med["sbpmpi"]
    torch_for = {"dp": "torch ddp", "tp": "torch tp", "sp": "torch sp", "2d": None}
    compile_for = {"": "torch compile", "dp": "torch compile ddp"}
    table = []
    for k in names:
        layout = k.split()[-1] if k.startswith("sbpmpi ") else ""
        ref = "torch" if k in ("sbpmpi", "sbpmpi graph") else torch_for.get(layout)
        cref = compile_for.get("" if layout == "graph" else layout) \
            if k.startswith("sbpmpi") else None  # "sbpmpi graph": the one-process run
        table.append(dict(name=k, tokens_per_s=med[k], runs=[r[k] for r in runs],
                          vs_one_process=med[k] / single,
                          vs_torch=(med[k] / med[ref]) if ref and ref in med else None,
                          vs_compile=(med[k] / med[cref]) if cref and cref in med else None))
    print(f"bench_gpt: {a.ranks} ranks, {' '.join(rest)}, one thread per rank; "
          f"medians of {a.runs} runs")
    print(f"{'run':20s} {'tokens/s':>10s} {'x 1-process':>12s} {'x torch':>8s}"
          + (f" {'x compile':>10s}" if compiled else ""))
    for t in table:
        vs = "-" if t["vs_torch"] is None else f"{t['vs_torch']:.2f}"
        vc = "-" if t["vs_compile"] is None else f"{t['vs_compile']:.2f}"
        print(f"{t['name']:20s} {t['tokens_per_s']:10.0f} {t['vs_one_process']:12.2f} {vs:>8s}"
              + (f" {vc:>10s}" if compiled else ""))
    print(f"{'run':18s} {'wire bytes/step':>16s} {'tape bytes':>12s}  (largest rank)")
    memory = {}
    for k in sizes:
        run = k[len("wire bytes "):]
        memory[run] = {"wire_bytes": med[k], "tape_bytes": med[f"tape bytes {run}"]}
        print(f"{run:18s} {med[k]:16.0f} {med[f'tape bytes {run}']:12.0f}")
    if a.json:
        Path(a.json).write_text(json.dumps({"ranks": a.ranks, "size": rest, "runs": a.runs,
                                            "results": table, "memory": memory}, indent=1))


if __name__ == "__main__":
    if "--worker" in sys.argv:
        sys.argv.remove("--worker")
        worker(sys.argv[1:])
    else:
        driver(sys.argv[1:])
