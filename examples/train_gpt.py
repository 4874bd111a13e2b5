"""Train a character-level GPT on global tensors in four layouts, and check every step's
loss against a one-process NumPy reference (``gpt_reference.py``).

The model: token and position embeddings, ``--layers`` blocks of pre-norm causal
self-attention and a GELU MLP (each added to the residual stream), a final layer norm
and an output projection tied to the token embedding. The text is read at run time
from a few modules of the Python standard library; the vocabulary is fixed: newline,
the 95 printable ASCII characters and one "other" symbol (97 tokens, which divides by
neither 2, 3 nor 4, so the vocabulary-parallel splits are uneven).

Layouts (``--layout``), as the SBPs of the table in :func:`gpt_layout`:

* ``dp``: data parallel. The batch is split (``split(0)``), every weight broadcast;
  backward all-reduces the gradients in buckets that overlap its compute
  (``sm.nn.DataParallel``; ``--buckets off``: one all-reduce per weight at its leaf).
* ``tp``: tensor parallel, Megatron style. Attention weights are kept per head
  (``qkv_w`` of shape ``(heads, dim, 3 * head_dim)``, ``proj_w`` ``(heads, head_dim,
  dim)``): both are split on their heads dim, so q, k, v and the attention are split by
  heads (column parallel) and the output projection's per-head products are summed into
  a ``partial_sum`` (row parallel). The MLP's first linear is split by columns
  (``split(1)``), its second by rows (``split(0)``: a ``partial_sum`` output). The token
  embedding is split on the vocabulary (its lookup is a ``partial_sum``; the tied
  logits come out split on the vocabulary and the loss is vocab-parallel). Each
  ``partial_sum`` is made broadcast where it joins the residual stream: one all-reduce.
  Backward, the layer norms' outputs pass their gradient back in the stream's layout
  (``grad_sbp``, :func:`mixer_input`): the column-parallel inputs' partial gradients are
  all-reduced there (Megatron's "f"), and nothing else is reduced.
* ``sp``: ``tp`` with the residual stream split on the sequence dim between blocks
  (layer norm and dropout are local): activations are all-gathered before attention and
  the MLP, and the ``partial_sum`` outputs are reduce-scattered back to the sequence
  split.
* ``2d``: a ``(world / 2) x 2`` mesh: data parallel on axis 0 (gradient buckets, as
  ``dp``), ``tp`` on axis 1.

``--check`` compares every step's loss with the NumPy reference (``--dropout 0``;
float64 within 1e-10 relative); ``--compare-dp`` trains a ``dp`` copy in the same
program and compares the losses (dropout on: the masks depend on the seed and the
global indices only, not on the layout). A sample drawn from the trained model closes.

    mpiexec -n 2 python examples/train_gpt.py --layout tp --check --steps 50
    mpiexec -n 4 python examples/train_gpt.py --layout 2d --dropout 0.1 --compare-dp
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import sbpmpi as sm

S, B = sm.sbp.split, sm.sbp.broadcast
SBPs = tuple[Any, ...]

# ---- data ---------------------------------------------------------------------------------

#: standard-library modules whose source is the corpus (present in every CPython 3)
CORPUS_MODULES = ("textwrap", "string", "fnmatch", "glob", "shlex")
#: newline, printable ASCII, and one symbol for every other character: 97 tokens
VOCAB = "\n" + "".join(chr(c) for c in range(32, 127)) + "\x00"
OTHER = len(VOCAB) - 1


def load_corpus() -> np.ndarray:
    """The corpus as token ids (int64), the same on every rank."""
    text = []
    for name in CORPUS_MODULES:
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None:
            raise SystemExit(f"train_gpt: cannot find the source of the module {name!r}")
        text.append(Path(spec.origin).read_text(encoding="utf-8"))
    index = {ch: i for i, ch in enumerate(VOCAB[:-1])}
    return np.array([index.get(ch, OTHER) for ch in "\n".join(text)], dtype=np.int64)


def batch_at(data: np.ndarray, step: int, batch: int, seq: int, seed: int
             ) -> tuple[np.ndarray, np.ndarray]:
    """Inputs and next-character targets, ``(batch, seq)`` each, drawn from the seed."""
    starts = np.random.default_rng([seed, step]).integers(0, len(data) - seq - 1, size=batch)
    x = np.stack([data[s:s + seq] for s in starts])
    y = np.stack([data[s + 1:s + seq + 1] for s in starts])
    return x, y


# ---- layouts ------------------------------------------------------------------------------

@dataclass(frozen=True)
class GPTLayout:
    """Where every tensor of the model lives: one SBP per mesh axis.

    Attributes
    ----------
    placement : Placement
    ids : token ids and targets ``(batch, seq)``
    stream : the residual stream ``(batch, seq, dim)`` between sub-blocks
    mixer_in : what attention and the MLP read (the layer norm's output, gathered)
    wte : token embedding ``(vocab, dim)``, tied to the output projection
    wpe : position embedding ``(seq, dim)``
    qkv : ``qkv_w`` ``(heads, dim, 3 * head_dim)`` and ``qkv_b`` ``(heads, 1, 3 * head_dim)``
    proj : ``proj_w`` ``(heads, head_dim, dim)``
    fc1, fc2 : the MLP's ``Linear`` weights ``(dim, 4 dim)`` and ``(4 dim, dim)``
    vector : layer norms' weights and biases, ``proj_b`` and ``fc2``'s bias ``(dim,)``
    """

    placement: sm.Placement
    ids: SBPs
    stream: SBPs
    mixer_in: SBPs
    wte: SBPs
    wpe: SBPs
    qkv: SBPs
    proj: SBPs
    fc1: SBPs
    fc2: SBPs
    vector: SBPs


def gpt_layout(kind: str, device: str = "cpu") -> GPTLayout:
    """The SBPs of a layout (``dp``, ``tp``, ``sp`` or ``2d``) on this world."""
    n = sm.env.get_world_size()
    line = sm.placement(device, list(range(n)))
    if kind == "dp":
        return GPTLayout(line, ids=(S(0),), stream=(S(0),), mixer_in=(S(0),), wte=(B,),
                         wpe=(B,), qkv=(B,), proj=(B,), fc1=(B,), fc2=(B,), vector=(B,))
    if kind == "tp":
        return GPTLayout(line, ids=(B,), stream=(B,), mixer_in=(B,),
                         wte=(S(0),),  # vocabulary parallel
                         wpe=(B,),
                         qkv=(S(0),),  # heads: column parallel
                         proj=(S(0),),  # heads: row parallel, partial_sum output
                         fc1=(S(1),),  # column parallel
                         fc2=(S(0),),  # row parallel, partial_sum output
                         vector=(B,))
    if kind == "sp":
        return GPTLayout(line, ids=(B,),
                         stream=(S(1),),  # the sequence dim, between sub-blocks
                         mixer_in=(B,),  # all-gathered before attention and the MLP
                         wte=(S(0),), wpe=(S(0),),  # positions follow the sequence split
                         qkv=(S(0),), proj=(S(0),), fc1=(S(1),), fc2=(S(0),), vector=(B,))
    if kind == "2d":
        if n % 2:
            raise SystemExit(f"train_gpt: --layout 2d needs an even number of ranks, got {n}")
        mesh = sm.placement(device, np.arange(n).reshape(n // 2, 2).tolist())
        # axis 0: data parallel; axis 1: tensor parallel (as tp)
        return GPTLayout(mesh, ids=(S(0), B), stream=(S(0), B), mixer_in=(S(0), B),
                         wte=(B, S(0)), wpe=(B, B), qkv=(B, S(0)), proj=(B, S(0)),
                         fc1=(B, S(1)), fc2=(B, S(0)), vector=(B, B))
    raise SystemExit(f"train_gpt: unknown layout {kind!r}")


# ---- the model ----------------------------------------------------------------------------

def param(shape: tuple[int, ...], sbp: SBPs, lay: GPTLayout, dtype: Any,
          std: float = 0.0, value: float = 0.0) -> sm.GlobalTensor:
    """A parameter drawn from N(0, std^2) (or filled with ``value`` when std is 0)."""
    with sm.no_grad():
        if std:
            t = sm.randn(*shape, placement=lay.placement, sbp=sbp, dtype=dtype) * std
        else:
            t = sm.full(shape, value, placement=lay.placement, sbp=sbp, dtype=dtype)
    return t.detach().requires_grad_()


def mixer_input(h: sm.GlobalTensor, lay: GPTLayout) -> sm.GlobalTensor:
    """A layer norm's output ``h`` (in the stream's layout) as the input of attention, the
    MLP or the output head: gathered in ``sp``; its gradient goes back in the stream's
    layout. In ``tp`` that is Megatron's "f": the column-parallel layers' partial input
    gradients are all-reduced here, so the layer norms, the residual stream and the
    embeddings see broadcast gradients (in ``sp``, reduce-scattered to the sequence split)."""
    return h.to_global(sbp=lay.mixer_in, grad_sbp=lay.stream)


class Attention(sm.nn.Module):
    """Causal self-attention with per-head weights (the heads dim can be split)."""

    def __init__(self, dim: int, heads: int, dropout: float, lay: GPTLayout, dtype: Any):
        hd = dim // heads
        self.lay, self.head_dim = lay, hd
        self.qkv_w = param((heads, dim, 3 * hd), lay.qkv, lay, dtype, std=0.02)
        self.qkv_b = param((heads, 1, 3 * hd), lay.qkv, lay, dtype)
        self.proj_w = param((heads, hd, dim), lay.proj, lay, dtype, std=0.02)
        self.proj_b = param((dim,), lay.vector, lay, dtype)
        self.drop = sm.nn.Dropout(dropout)

    def forward(self, h: sm.GlobalTensor, mask: sm.GlobalTensor) -> sm.GlobalTensor:
        b, t, d = h.shape
        hd = self.head_dim
        qkv = sm.matmul(h.reshape(b, 1, t, d), self.qkv_w) + self.qkv_b  # (b, heads, t, 3hd)
        q, k, v = qkv[..., :hd], qkv[..., hd:2 * hd], qkv[..., 2 * hd:]
        # the scale on q (t x head_dim) rather than on the scores (t x t): a smaller pass
        # forward and backward
        scores = sm.matmul(q * (1.0 / math.sqrt(hd)), k.transpose(0, 1, 3, 2)) + mask
        y = sm.matmul(sm.softmax(scores, -1), v)  # (b, heads, t, hd)
        out = sm.matmul(y, self.proj_w).sum(1) + self.proj_b  # tp: partial_sum over heads
        return self.drop(out.to_global(sbp=self.lay.stream))  # tp: all-reduce; sp: reduce-scatter


class MLP(sm.nn.Module):
    def __init__(self, dim: int, dropout: float, gelu: str, lay: GPTLayout, dtype: Any):
        self.lay, self.gelu = lay, gelu
        self.fc1 = sm.nn.Linear(dim, 4 * dim, placement=lay.placement, sbp=lay.fc1, dtype=dtype)
        self.fc2 = sm.nn.Linear(4 * dim, dim, placement=lay.placement, sbp=lay.fc2,
                                bias_sbp=lay.vector, dtype=dtype)
        self.drop = sm.nn.Dropout(dropout)

    def forward(self, h: sm.GlobalTensor) -> sm.GlobalTensor:
        out = self.fc2(sm.nn.gelu(self.fc1(h), self.gelu))  # tp: split(2), then partial_sum
        return self.drop(out.to_global(sbp=self.lay.stream))


class Block(sm.nn.Module):
    """``x + attn(ln1(x))``, then ``x + mlp(ln2(x))``."""

    def __init__(self, dim: int, heads: int, dropout: float, gelu: str, lay: GPTLayout,
                 dtype: Any):
        self.lay = lay
        norm = dict(placement=lay.placement, sbp=lay.vector, dtype=dtype)
        self.ln1 = sm.nn.LayerNorm(dim, **norm)
        self.attn = Attention(dim, heads, dropout, lay, dtype)
        self.ln2 = sm.nn.LayerNorm(dim, **norm)
        self.mlp = MLP(dim, dropout, gelu, lay, dtype)

    def forward(self, x: sm.GlobalTensor, mask: sm.GlobalTensor) -> sm.GlobalTensor:
        x = x + self.attn(mixer_input(self.ln1(x), self.lay), mask)
        return x + self.mlp(mixer_input(self.ln2(x), self.lay))


class GPT(sm.nn.Module):
    def __init__(self, vocab: int, seq: int, dim: int, heads: int, layers: int,
                 dropout: float, gelu: str, lay: GPTLayout, dtype: Any):
        if dim % heads:
            raise SystemExit(f"train_gpt: --dim {dim} must divide by --heads {heads}")
        self.lay, self.seq = lay, seq
        self.wte = param((vocab, dim), lay.wte, lay, dtype, std=0.02)
        self.wpe = param((seq, dim), lay.wpe, lay, dtype, std=0.02)
        self.drop = sm.nn.Dropout(dropout)
        self.blocks = sm.nn.ModuleList([Block(dim, heads, dropout, gelu, lay, dtype)
                                        for _ in range(layers)])
        self.lnf = sm.nn.LayerNorm(dim, placement=lay.placement, sbp=lay.vector, dtype=dtype)
        causal = np.triu(np.full((seq, seq), -np.inf, dtype=dtype), 1)
        self.mask = sm.tensor(causal, placement=lay.placement, sbp=(B,) * lay.placement.ndim)
        self.recompute = "none"  # --recompute: each block's activations recomputed in backward

    def forward(self, ids: sm.GlobalTensor) -> sm.GlobalTensor:
        """Logits ``(batch, seq, vocab)``; tp/sp: split on the vocabulary."""
        tok = sm.nn.embedding(ids, self.wte)  # tp: partial_sum (each rank its vocab rows)
        x = self.drop(tok.to_global(sbp=self.lay.stream) + self.wpe)
        for block in self.blocks:
            x = block(x, self.mask) if self.recompute == "none" else \
                sm.nn.checkpoint(block, x, self.mask, policy=self.recompute)
        h = mixer_input(self.lnf(x), self.lay)
        return sm.matmul(h, self.wte.transpose(1, 0))  # tied: (dim, vocab), tp: split(1)


def loss_of(model: GPT, ids: np.ndarray, targets: np.ndarray,
            net: sm.nn.Module | None = None) -> sm.GlobalTensor:
    """Mean cross-entropy of the next character (vocab-parallel where the logits are
    split); forward through ``net`` (the model or its DataParallel) when given."""
    lay = model.lay
    x = sm.tensor(ids, placement=lay.placement, sbp=lay.ids)
    logits = (net or model)(x)
    b, t, v = logits.shape
    return sm.nn.cross_entropy(logits.reshape(b * t, v), targets.reshape(b * t))


def lr_factor(steps: int, warmup: int) -> Any:
    """Linear warmup over ``warmup`` steps, then a cosine decay to 0 at ``steps``."""
    def factor(t: int) -> float:
        if t < warmup:
            return (t + 1) / warmup
        return 0.5 * (1.0 + math.cos(math.pi * (t - warmup) / max(1, steps - warmup)))
    return factor


@dataclass(frozen=True)
class Trainer:
    """The model, its optimizer and schedule; ``net`` is what forward calls: the model,
    or its ``sm.nn.DataParallel`` (gradient buckets) under ``--buckets on``."""

    model: GPT
    optimizer: Any
    scheduler: Any
    clip: float
    net: sm.nn.Module
    #: --dtype bfloat16/float16: the forward under sm.autocast of it (float32 weights)
    low: Any = None
    #: --dtype float16: the loss scaler
    scaler: Any = None

    def loss(self, ids: np.ndarray, targets: np.ndarray) -> sm.GlobalTensor:
        with sm.autocast(dtype=self.low or sm.bfloat16, enabled=self.low is not None):
            return loss_of(self.model, ids, targets, self.net)

    def step(self, ids: np.ndarray, targets: np.ndarray) -> float:
        self.optimizer.zero_grad()
        loss = self.loss(ids, targets)
        if self.scaler is None:
            loss.backward()
        else:
            self.scaler.scale(loss).backward()
            self.scaler.unscale_(self.optimizer)  # clip the true gradients
        if self.clip:
            sm.nn.clip_grad_norm_(self.model.parameters(), self.clip)
        if self.scaler is None:
            self.optimizer.step()
        else:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        self.scheduler.step()
        return float(loss.item())

    def graph_step(self) -> Any:
        """The step (without clipping: it reads the norm on the host) captured as a graph
        (``sm.graph``): it returns the loss tensor, replayed without op dispatch."""
        def step(ids: np.ndarray, targets: np.ndarray) -> sm.GlobalTensor:
            self.optimizer.zero_grad()
            loss = self.loss(ids, targets)
            loss.backward()
            self.optimizer.step()
            self.scheduler.step()
            return loss
        return sm.graph(step)


def build(args: argparse.Namespace, layout: str, vocab: int = len(VOCAB)) -> Trainer:
    """The model in ``layout``, its AdamW (no decay for biases and norms) and schedule;
    in ``dp`` and ``2d``, its ``sm.nn.DataParallel`` on the data axis (``--buckets on``)."""
    from gpt_reference import decays

    sm.manual_seed(args.seed)  # the same initial weights whatever the layout
    lay = gpt_layout(layout, args.device)
    low = HALF_DTYPES.get(args.dtype)  # half width: float32 masters, autocast forward
    model = GPT(vocab, args.seq, args.dim, args.heads, args.layers, args.dropout, args.gelu,
                lay, np.dtype(np.float32 if low is not None else args.dtype))
    model.recompute = getattr(args, "recompute", "none")
    named = list(model.named_parameters())
    groups = [{"params": [p for k, p in named if decays(k, p.shape)]},
              {"params": [p for k, p in named if not decays(k, p.shape)], "weight_decay": 0.0}]
    opt = sm.optim.AdamW(groups, lr=args.lr, weight_decay=args.weight_decay)
    sched = sm.optim.lr_scheduler.LambdaLR(opt, lr_factor(args.steps, args.warmup))
    data_parallel = layout in ("dp", "2d") and args.buckets == "on"
    rd = grad_reduce_dtype(args)  # float32 masters' buckets reduced in half width
    mp = None if rd is None else sm.nn.MixedPrecision(
        param_dtype=low if low is not None else sm.float32, reduce_dtype=rd)
    net = sm.nn.DataParallel(model, axis=0, mixed_precision=mp) if data_parallel else model
    scaler = sm.amp.GradScaler(init_scale=2.0**10) if args.dtype == "float16" else None
    return Trainer(model, opt, sched, args.clip, net, low, scaler)


#: --dtype values that train in half width (with float32 master weights).
HALF_DTYPES = {"bfloat16": sm.bfloat16, "float16": sm.float16}


def grad_reduce_dtype(args: argparse.Namespace) -> Any:
    """The half width the data-parallel buckets reduce in (``--reduce-dtype``), or None
    for the gradients' own dtype. ``auto``: bfloat16 under ``--dtype bfloat16`` (half the
    bytes of float32, float32 sums inside); float16 keeps float32 (its loss-scaled
    gradients would overflow float16's range more often: torch's ``fp16_compress_hook``
    is opt-in too)."""
    r = getattr(args, "reduce_dtype", "auto")
    if r == "auto":
        r = "bfloat16" if args.dtype == "bfloat16" else "float32"
    return HALF_DTYPES.get(r)


def generate(model: GPT, prompt: np.ndarray, length: int, seed: int) -> str:
    """A continuation of ``prompt`` (``seq`` token ids), each character drawn from the
    model's distribution by a generator seeded with ``seed``: the same on every rank,
    which all read the same global logits."""
    lay = model.lay
    model.eval()
    window = list(prompt[-model.seq:])
    rng = np.random.default_rng(seed)
    out = []
    with sm.no_grad():
        for _ in range(length):
            ids = sm.tensor(np.array([window], dtype=np.int64), placement=lay.placement,
                            sbp=lay.ids)
            logits = model(ids).numpy()  # the global array, on every rank
            last = logits[0, -1].astype(np.float64)
            p = np.exp(last - last.max())
            nxt = int(rng.choice(len(p), p=p / p.sum()))
            out.append(VOCAB[nxt] if nxt != OTHER else "?")
            window = window[1:] + [nxt]
    model.train()
    return "".join(out)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--layout", default="dp", choices=["dp", "tp", "sp", "2d", "pp", "3d"],
                    help="pp, 3d: pipeline stages on a dp x pp x tp mesh (gpt_pipeline.py)")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--dim", type=int, default=32)
    ap.add_argument("--seq", type=int, default=32)
    ap.add_argument("--batch", type=int, default=8, help="global batch size")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--dropout", type=float, default=0.0)
    ap.add_argument("--gelu", default="none", choices=["none", "tanh"],
                    help="exact GELU (through erf) or its tanh form (GPT-2's)")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--clip", type=float, default=1.0, help="gradient-norm bound (0: none)")
    ap.add_argument("--buckets", default="on", choices=["on", "off"],
                    help="dp and 2d: reduce the gradients in buckets that overlap backward "
                         "(sm.nn.DataParallel), or one all-reduce per parameter")
    ap.add_argument("--dtype", default="float64",
                    choices=["float64", "float32", "bfloat16", "float16"],
                    help="bfloat16/float16: float32 weights, the forward under sm.autocast "
                         "(float16 with sm.amp.GradScaler)")
    ap.add_argument("--reduce-dtype", default="auto",
                    choices=["auto", "float32", "bfloat16", "float16"],
                    help="dp and 2d (buckets on): the dtype the gradient buckets are "
                         "reduced in (sm.nn.MixedPrecision's reduce_dtype); auto: bfloat16 "
                         "under --dtype bfloat16, else the gradients' own dtype")
    ap.add_argument("--recompute", default="none", choices=["none", "full", "selective"],
                    help="recompute each block's activations in backward (sm.nn.checkpoint)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sample", type=int, default=60, help="characters to generate")
    ap.add_argument("--graph", action="store_true",
                    help="capture the step as a graph (sm.graph) and replay it; needs "
                         "--clip 0 and --dropout 0")
    ap.add_argument("--check", action="store_true",
                    help="compare every loss with the NumPy reference (needs --dropout 0)")
    ap.add_argument("--compare-dp", action="store_true",
                    help="train a dp copy too and compare every loss")
    ap.add_argument("--pp", type=int, default=2, help="pp, 3d: pipeline placements")
    ap.add_argument("--tp", type=int, default=1, help="3d: the tensor-parallel axis's size")
    ap.add_argument("--microbatches", type=int, default=4, help="pp, 3d: micro-batches")
    ap.add_argument("--schedule", default="1f1b", choices=["gpipe", "1f1b", "interleaved"])
    ap.add_argument("--virtual", type=int, default=2,
                    help="interleaved: stages per pipeline placement")
    return ap.parse_args(argv)


@dataclass(frozen=True)
class Run:
    """What :func:`train` measured: each step's loss, the largest relative difference
    from the reference (or the ``dp`` copy; 0 without either) and the sample."""

    losses: list[float]
    worst: float
    sample: str


def train(args: argparse.Namespace, verbose: bool = False) -> Run:
    """Train as the command line says; compare with the reference and/or a ``dp`` copy."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # gpt_reference.py
    if args.layout in ("pp", "3d"):  # pipeline stages: gpt_pipeline.py
        import gpt_pipeline
        return gpt_pipeline.train(args, verbose)
    from gpt_reference import NumpyGPT

    if args.check and args.dropout:
        raise SystemExit("train_gpt: --check compares with a reference without dropout: "
                         "use --dropout 0 (or --compare-dp)")
    rank = sm.env.get_rank()
    data = load_corpus()
    trainer = build(args, args.layout)
    model, lay = trainer.model, trainer.model.lay
    ref = NumpyGPT({k: p.numpy() for k, p in model.named_parameters()}, args.heads, 1e-5,
                   lambda t: args.lr * lr_factor(args.steps, args.warmup)(t), (0.9, 0.999),
                   1e-8, args.weight_decay, args.clip, args.gelu) if args.check else None
    other = build(args, "dp") if args.compare_dp else None
    if verbose and rank == 0:
        print(f"train_gpt: {len(data)} characters of {', '.join(CORPUS_MODULES)}, vocabulary "
              f"{len(VOCAB)}; layout {args.layout} on {lay.placement.ranks.tolist()}, "
              f"{args.dtype}, dropout {args.dropout}")
        for name, p in list(model.named_parameters())[:14]:
            print(f"  {name:24s} {str(p.shape):14s} sbp {tuple(str(s) for s in p.sbp)}")
    if args.graph and (args.clip or args.dropout):
        raise SystemExit("train_gpt: --graph needs --clip 0 (clipping reads the norm on the "
                         "host) and --dropout 0 (masks from a Python counter)")
    captured = trainer.graph_step() if args.graph else None
    worst, losses = 0.0, []
    for step in range(args.steps):
        ids, targets = batch_at(data, step, args.batch, args.seq, args.seed)
        masks = args.seed * 1_000_003 + step + 1  # the seed of this step's dropout masks
        sm.manual_seed(masks)
        got = trainer.step(ids, targets) if captured is None else float(
            captured(ids, targets).item())
        wants = [ref.step(ids, targets)] if ref else []
        if other:
            sm.manual_seed(masks)  # the same masks as the layout under test
            wants.append(other.step(ids, targets))
        for want in wants:
            worst = max(worst, abs(got - want) / abs(want))
        losses.append(got)
        if verbose and rank == 0 and (step % 10 == 0 or step == args.steps - 1):
            note = f" (max relative difference so far {worst:.2e})" if wants else ""
            print(f"step {step:4d}: loss {got:.6f}{note}")
    sample = generate(model, data[:args.seq], args.sample, args.seed)
    return Run(losses, worst, sample)


def main() -> None:
    args = parse()
    sm.launch.expect_world(2, minimum=1, what="train_gpt")
    run = train(args, verbose=True)
    rtol = {"float64": 1e-10, "float32": 1e-3}.get(args.dtype, 2e-2)  # half: 2% of float64
    assert run.worst <= rtol, f"loss differs from the reference by {run.worst:.3e} > {rtol}"
    samples = sm.comm.all_gather_object(run.sample)
    assert all(s == run.sample for s in samples), f"the samples differ between ranks: {samples}"
    if sm.env.get_rank() == 0:
        print(f"sample: {run.sample!r}")
        print("TRAIN_GPT OK")


if __name__ == "__main__":
    main()
