"""The GPT of ``train_gpt.py`` in pipeline stages (``--layout pp`` and ``--layout 3d``).

The job's ranks form a ``dp x pp x tp`` mesh; stage ``s`` lives on the slice
``mesh[:, s % pp, :]`` (a ``dp x tp`` placement: data parallel on its axis 0, Megatron
tensor parallel on its axis 1, as ``train_gpt``'s ``2d`` layout). ``--layout pp`` is the
mesh with ``tp = 1``. The model's ``--layers`` blocks are cut into ``pp`` stages
(``pp * virtual`` under ``--schedule interleaved``) as ``np.array_split`` cuts, so the
counts may be uneven (3 blocks on 2 stages: 2 and 1); the first stage also holds the
embeddings, the last the final norm and the output projection. The output projection is
tied to the token embedding: the last stage holds a copy of it, and after backward the
two copies' gradients are summed (each then gets the sum), so the optimizer keeps them
equal, as one tied weight.

Every step runs ``sm.pipeline``'s schedule (``--schedule gpipe|1f1b|interleaved``) over
``--microbatches`` micro-batches; its loss is the mean of the micro-batch losses, which
for micro-batches of equal size is the batch's loss, so ``--check`` compares it with the
one-process NumPy reference like any layout.

    mpiexec -n 4 python examples/train_gpt.py --layout pp --pp 4 --microbatches 8 --check
    mpiexec -n 4 python examples/train_gpt.py --layout 3d --pp 2 --tp 2 --check
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np

import sbpmpi as sm

sys.path.insert(0, str(Path(__file__).resolve().parent))
import train_gpt as tg  # noqa: E402
from gpt_reference import NumpyGPT, decays  # noqa: E402

S, B = sm.sbp.split, sm.sbp.broadcast
SCHEDULES = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B",
             "interleaved": "ScheduleInterleaved1F1B"}


def mesh_shape(args: argparse.Namespace) -> tuple[int, int, int]:
    """``(dp, pp, tp)`` of this world for ``--layout``, ``--pp`` and ``--tp``."""
    n = sm.env.get_world_size()
    tp = args.tp if args.layout == "3d" else 1
    if args.pp < 1 or tp < 1 or n % (args.pp * tp):
        raise SystemExit(f"train_gpt: {n} ranks do not form a dp x pp x tp mesh with "
                         f"pp={args.pp}, tp={tp}")
    return n // (args.pp * tp), args.pp, tp


def stage_layout(placement: sm.Placement) -> tg.GPTLayout:
    """A stage's layout on its ``dp x tp`` placement: ``train_gpt``'s ``2d`` SBPs."""
    return tg.GPTLayout(placement, ids=(S(0), B), stream=(S(0), B), mixer_in=(S(0), B),
                        wte=(B, S(0)), wpe=(B, B), qkv=(B, S(0)), proj=(B, S(0)),
                        fc1=(B, S(1)), fc2=(B, S(0)), vector=(B, B))


class GPTStage(sm.nn.Module):
    """Blocks ``first_block ..`` of the GPT; the embeddings on the first stage, the final
    norm and the (tied) output projection on the last."""

    def __init__(self, args: argparse.Namespace, lay: tg.GPTLayout, first_block: int,
                 blocks: int, first: bool, last: bool, vocab: int, dtype: Any) -> None:
        self.lay, self.first_block = lay, first_block
        if first:
            self.wte = tg.param((vocab, args.dim), lay.wte, lay, dtype, std=0.02)
            self.wpe = tg.param((args.seq, args.dim), lay.wpe, lay, dtype, std=0.02)
            self.drop = sm.nn.Dropout(args.dropout)
        self.blocks = sm.nn.ModuleList([
            tg.Block(args.dim, args.heads, args.dropout, args.gelu, lay, dtype)
            for _ in range(blocks)])
        if last:
            self.lnf = sm.nn.LayerNorm(args.dim, placement=lay.placement, sbp=lay.vector,
                                       dtype=dtype)
        causal = np.triu(np.full((args.seq, args.seq), -np.inf, dtype=dtype), 1)
        self.mask = sm.tensor(causal, placement=lay.placement, sbp=(B, B))
        self.first, self.last = first, last

    def forward(self, x: sm.GlobalTensor) -> sm.GlobalTensor:
        if self.first:
            tok = sm.nn.embedding(x, self.wte)
            x = self.drop(tok.to_global(sbp=self.lay.stream) + self.wpe)
        for block in self.blocks:
            x = block(x, self.mask)
        if self.last:
            h = tg.mixer_input(self.lnf(x), self.lay)
            x = sm.matmul(h, self.head.transpose(1, 0))
        return x


class PipelinedGPT:
    """The stages, the schedule, the tied weight's two copies and the names of the
    one-process model's parameters."""

    def __init__(self, args: argparse.Namespace, vocab: int = len(tg.VOCAB)) -> None:
        dp, pp, tp = mesh_shape(args)
        n = dp * pp * tp
        mesh = np.arange(n).reshape(dp, pp, tp)
        self.placements = [sm.placement(args.device, mesh[:, s, :].tolist()) for s in range(pp)]
        virtual = args.virtual if args.schedule == "interleaved" else 1
        nstages = pp * virtual
        counts = [len(c) for c in np.array_split(np.arange(args.layers), nstages)]
        dtype = np.dtype(args.dtype)
        sm.manual_seed(args.seed)  # draws in the one-process model's order: the same weights
        self.modules: list[GPTStage] = []
        for s in range(nstages):
            lay = stage_layout(self.placements[s % pp])
            self.modules.append(GPTStage(args, lay, sum(counts[:s]), counts[s], s == 0,
                                         s == nstages - 1, vocab, dtype))
        first, last = self.modules[0], self.modules[-1]
        with sm.no_grad():
            head = first.wte.to_global(placement=last.lay.placement, sbp=last.lay.wte)
        last.head = head.detach().requires_grad_()
        self.stages = [sm.pipeline.PipelineStage(m, s, nstages, m.lay.placement)
                       for s, m in enumerate(self.modules)]
        schedule = getattr(sm.pipeline, SCHEDULES[args.schedule])
        self.schedule = schedule(self.stages, args.microbatches, self.loss)

    @staticmethod
    def loss(logits: sm.GlobalTensor, targets: np.ndarray) -> sm.GlobalTensor:
        b, t, v = logits.shape
        return sm.nn.cross_entropy(logits.reshape(b * t, v), targets.reshape(b * t))

    def named_parameters(self) -> list[tuple[str, sm.GlobalTensor]]:
        """The one-process model's names (``blocks.i`` numbered globally); not the copy."""
        out = []
        for m in self.modules:
            for name, p in m.named_parameters():
                if name == "head":
                    continue
                if name.startswith("blocks."):
                    i, rest = name[len("blocks."):].split(".", 1)
                    name = f"blocks.{m.first_block + int(i)}.{rest}"
                out.append((name, p))
        return out

    def tie_gradients(self) -> None:
        """The sum of the tied weight's two gradients, on both copies."""
        wte, head = self.modules[0].wte, self.modules[-1].head
        with sm.no_grad():
            g = wte.grad + head.grad.to_global(placement=wte.placement, sbp=wte.sbp)
        wte.grad = g
        self.copy_gradient()

    def copy_gradient(self) -> None:
        wte, head = self.modules[0].wte, self.modules[-1].head
        with sm.no_grad():
            head.grad = wte.grad.to_global(placement=head.placement, sbp=head.sbp)

    def logits(self, ids: sm.GlobalTensor) -> sm.GlobalTensor:
        """The whole model's forward, stage after stage (no schedule: inference)."""
        x = ids
        for s, m in enumerate(self.modules):
            if s:
                x = x.to_global(placement=m.lay.placement, sbp=m.lay.stream)
            x = m(x)
        return x


class PipeTrainer:
    """``train_gpt.Trainer``'s step for a pipelined model."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.model = PipelinedGPT(args)
        self.clip = args.clip
        named = self.model.named_parameters()
        head = self.model.modules[-1].head
        groups = [{"params": [p for k, p in named if decays(k, p.shape)] + [head]},
                  {"params": [p for k, p in named if not decays(k, p.shape)],
                   "weight_decay": 0.0}]
        self.optimizer = sm.optim.AdamW(groups, lr=args.lr, weight_decay=args.weight_decay)
        self.scheduler = sm.optim.lr_scheduler.LambdaLR(
            self.optimizer, tg.lr_factor(args.steps, args.warmup))

    def step(self, ids: np.ndarray, targets: np.ndarray) -> float:
        m = self.model
        self.optimizer.zero_grad()
        x = sm.tensor(ids, placement=m.placements[0], sbp=m.modules[0].lay.ids)
        loss = m.schedule.step(x, target=targets)
        m.tie_gradients()
        if self.clip:
            sm.nn.clip_grad_norm_([p for _, p in m.named_parameters()], self.clip)
            m.copy_gradient()
        self.optimizer.step()
        self.scheduler.step()
        return float(loss.item())


def train(args: argparse.Namespace, verbose: bool = False) -> tg.Run:
    """``train_gpt.train`` for ``--layout pp`` and ``--layout 3d``."""
    if args.check and args.dropout:
        raise SystemExit("train_gpt: --check compares with a reference without dropout: "
                         "use --dropout 0")
    if args.compare_dp:
        raise SystemExit("train_gpt: --compare-dp is not available with --layout pp or 3d")
    if args.check and args.batch % args.microbatches:
        raise SystemExit(f"train_gpt: --check needs micro-batches of equal size (the mean "
                         f"of their losses is then the batch's): --batch {args.batch} does "
                         f"not divide by --microbatches {args.microbatches}")
    rank = sm.env.get_rank()
    data = tg.load_corpus()
    trainer = PipeTrainer(args)
    model = trainer.model
    ref = NumpyGPT({k: p.numpy() for k, p in model.named_parameters()}, args.heads, 1e-5,
                   lambda t: args.lr * tg.lr_factor(args.steps, args.warmup)(t),
                   (0.9, 0.999), 1e-8, args.weight_decay, args.clip,
                   args.gelu) if args.check else None
    if verbose and rank == 0:
        dp, pp, tp = mesh_shape(args)
        print(f"train_gpt: layout {args.layout}: dp {dp} x pp {pp} x tp {tp}; "
              f"{len(model.stages)} stages, blocks per stage "
              f"{[len(m.blocks) for m in model.modules]}; schedule {args.schedule}, "
              f"{args.microbatches} micro-batches; {args.dtype}, dropout {args.dropout}")
    worst, losses = 0.0, []
    for step in range(args.steps):
        ids, targets = tg.batch_at(data, step, args.batch, args.seq, args.seed)
        sm.manual_seed(args.seed * 1_000_003 + step + 1)
        got = trainer.step(ids, targets)
        if ref is not None:
            want = ref.step(ids, targets)
            worst = max(worst, abs(got - want) / abs(want))
        losses.append(got)
        if verbose and rank == 0 and (step % 10 == 0 or step == args.steps - 1):
            note = f" (max relative difference so far {worst:.2e})" if ref else ""
            print(f"step {step:4d}: loss {got:.6f}{note}")
    sample = generate(model, data[:args.seq], args.sample, args.seed)
    return tg.Run(losses, worst, sample)


def generate(model: PipelinedGPT, prompt: np.ndarray, length: int, seed: int) -> str:
    """``train_gpt.generate`` through the stages."""
    window = list(prompt[-len(prompt):])
    rng = np.random.default_rng(seed)
    out = []
    for m in model.modules:
        m.eval()
    with sm.no_grad():
        for _ in range(length):
            ids = sm.tensor(np.array([window], dtype=np.int64),
                            placement=model.placements[0], sbp=model.modules[0].lay.ids)
            last = model.logits(ids).numpy()[0, -1].astype(np.float64)
            p = np.exp(last - last.max())
            nxt = int(rng.choice(len(p), p=p / p.sum()))
            out.append(tg.VOCAB[nxt] if nxt != tg.OTHER else "?")
            window = window[1:] + [nxt]
    for m in model.modules:
        m.train()
    return "".join(out)
