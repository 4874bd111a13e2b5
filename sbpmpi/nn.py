"""A small neural-network toolkit on global tensors: modules and containers, Linear,
Embedding, LayerNorm, Dropout, relu, cross_entropy, gradient clipping.

Layouts are the user's choice, per parameter: data parallelism keeps weights broadcast
and splits the batch, tensor parallelism splits ``Linear.weight`` (shape ``(in, out)``,
``y = x @ weight + bias``) by columns (``split(1)``: the output is split) or rows
(``split(0)``: the output is a partial sum, reduced where an op needs it), and an N-d
placement combines them per mesh axis. Backward gives each parameter its gradient in
its own layout, so any :mod:`sbpmpi.optim` optimizer updates it locally.
"""

from __future__ import annotations

import math
import os
import weakref
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from . import backend, ops
from .autograd import buckets, losses
from .autograd.mode import no_grad
from .core.layout import Layout
from .core.placement import Placement
from .core.sbp import PARTIALS, SBP, Broadcast, Partial, Split, broadcast, split
from .creation import arange, ones, rand, randn, tensor, zeros
from .env import get_rank
from .ops.call import check_eps
from .ops.reduction import reduced
from .tensor import GlobalTensor

__all__ = ["Module", "ModuleList", "Sequential", "Linear", "Embedding", "LayerNorm", "Dropout",
           "relu", "gelu", "softmax", "log_softmax", "cross_entropy", "embedding", "layer_norm",
           "dropout", "clip_grad_norm_", "DataParallel", "no_sync", "shard",
           "save_training_state", "load_training_state"]


class Module:
    """Base class: parameters are the GlobalTensor attributes that require grad, found
    recursively through attributes that are modules (or lists/tuples of modules).

    ``training`` (True until :meth:`eval`) switches layers such as :class:`Dropout`;
    :meth:`train` and :meth:`eval` set it on the module and every submodule.
    """

    #: whether the module is in training mode (a class default: subclasses need not call
    #: ``super().__init__()``)
    training: bool = True

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward(*args, **kwargs)

    def _members(self) -> Iterator[tuple[str, Any]]:
        """``(name, value)`` of the attributes that may hold parameters or submodules."""
        return iter(vars(self).items())

    def named_children(self) -> Iterator[tuple[str, Module]]:
        """``(name, submodule)`` of the direct submodules, in attribute order (an entry
        of a list attribute ``blocks`` is named ``blocks.0``, ``blocks.1``, ...)."""
        for k, v in self._members():
            if isinstance(v, Module):
                yield k, v
            elif isinstance(v, (list, tuple)):
                for i, m in enumerate(v):
                    if isinstance(m, Module):
                        yield f"{k}.{i}", m

    def children(self) -> Iterator[Module]:
        """The direct submodules."""
        for _, m in self.named_children():
            yield m

    def modules(self) -> Iterator[Module]:
        """This module and every submodule, each once, parents first."""
        seen: set[int] = set()
        stack: list[Module] = [self]
        while stack:
            m = stack.pop()
            if id(m) in seen:
                continue
            seen.add(id(m))
            yield m
            stack.extend(reversed(list(m.children())))

    def train(self, mode: bool = True) -> Module:
        """Set training mode on this module and every submodule; returns ``self``."""
        if not isinstance(mode, (bool, np.bool_)):
            raise TypeError(f"train: mode must be a bool, got {type(mode).__name__} {mode!r}")
        for m in self.modules():
            m.training = bool(mode)
        return self

    def eval(self) -> Module:
        """Set evaluation mode (``train(False)``); returns ``self``."""
        return self.train(False)

    def named_parameters(self, prefix: str = "", remove_duplicate: bool = True
                         ) -> Iterator[tuple[str, GlobalTensor]]:
        """``(dotted name, parameter)`` in attribute order.

        A parameter reachable under several names (a tied weight) is listed once, under
        its first name, unless ``remove_duplicate`` is False.
        """
        return self._named_parameters(prefix, set() if remove_duplicate else None)

    def _named_parameters(self, prefix: str, seen: set[int] | None
                          ) -> Iterator[tuple[str, GlobalTensor]]:
        for k, v in self._members():
            if isinstance(v, GlobalTensor) and v.requires_grad:
                if seen is not None:
                    if id(v) in seen:
                        continue
                    seen.add(id(v))
                yield prefix + k, v
            elif isinstance(v, Module):
                yield from v._named_parameters(f"{prefix}{k}.", seen)
            elif isinstance(v, (list, tuple)):
                for i, m in enumerate(v):
                    if isinstance(m, Module):
                        yield from m._named_parameters(f"{prefix}{k}.{i}.", seen)

    def parameters(self) -> list[GlobalTensor]:
        """The parameters, in attribute order (give them to an optimizer)."""
        return [p for _, p in self.named_parameters()]

    def zero_grad(self) -> None:
        for p in self.parameters():
            p._grad = None

    def state_dict(self) -> dict[str, GlobalTensor]:
        """Parameters by dotted name (save with ``sm.save_state``)."""
        return dict(self.named_parameters())

    def load_state_dict(self, state: Mapping[str, GlobalTensor]) -> None:
        """Copy values into the parameters, boxed to each one's layout (collective).

        The parameter objects stay the same, so an optimizer holding them keeps working.
        """
        params = dict(self.named_parameters())
        missing = sorted(set(params) - set(state))
        if missing:
            raise KeyError(f"load_state_dict: state lacks {missing}")
        for k, p in params.items():
            v = state[k]
            if not isinstance(v, GlobalTensor) or v.shape != p.shape:
                raise ValueError(f"load_state_dict: {k!r} must be a GlobalTensor of shape "
                                 f"{p.shape}, got {getattr(v, 'shape', type(v).__name__)}")
        for k, p in params.items():
            with no_grad():
                v = state[k].astype(p.dtype) if state[k].dtype != p.dtype else state[k]
                v = v.to_global(placement=p.placement, sbp=p.sbp)
            local = p.to_local()
            if local.size:
                local[...] = v.to_local()


def _bias_sbp(weight_sbp: Sequence[SBP]) -> tuple[SBP, ...]:
    """Bias (shape ``(out,)``) follows the weight's output dim: split where it is split(1)."""
    return tuple(split(0) if isinstance(s, Split) and s.dim == 1 else broadcast
                 for s in weight_sbp)


class Linear(Module):
    """``y = x @ weight + bias`` with ``weight`` of shape ``(in_features, out_features)``.

    Weights and bias start uniform in ``[-1/sqrt(in), 1/sqrt(in)]`` (as torch), drawn by
    ``sm.rand``: the values depend on the seed only, not on the layout or world size.

    Parameters
    ----------
    in_features, out_features : int
    bias : bool
    placement : Placement
        Where the parameters live.
    sbp : SBP or sequence of SBP
        The weight's SBP (default broadcast on every mesh axis): ``split(1)`` splits
        the outputs (column parallel), ``split(0)`` the inputs (row parallel).
    bias_sbp : optional
        Default: ``split(0)`` on the mesh axes where the weight is ``split(1)``,
        broadcast elsewhere.
    dtype : default float32
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *,
                 placement: Placement | None = None, sbp: SBP | Sequence[SBP] | None = None,
                 bias_sbp: SBP | Sequence[SBP] | None = None, dtype: Any = np.float32) -> None:
        for name, n in (("in_features", in_features), ("out_features", out_features)):
            if isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer)) or n < 1:
                raise ValueError(f"Linear: {name} must be a positive int, got {n!r}")
        wsbp = _param_sbp("Linear", placement, sbp, what="weight sbp")
        self.in_features, self.out_features = int(in_features), int(out_features)
        k = 1.0 / math.sqrt(self.in_features)
        with no_grad():
            w = rand(self.in_features, self.out_features, placement=placement, sbp=wsbp,
                     dtype=dtype) * (2 * k) - k
        self.weight = w.detach().requires_grad_()
        self.bias: GlobalTensor | None = None
        if bias:
            bsbp = _bias_sbp(wsbp) if bias_sbp is None else bias_sbp
            with no_grad():
                b = rand(self.out_features, placement=placement, sbp=bsbp,
                         dtype=dtype) * (2 * k) - k
            self.bias = b.detach().requires_grad_()

    def forward(self, x: GlobalTensor) -> GlobalTensor:
        y = ops.matmul(x, self.weight)
        return y if self.bias is None else ops.add(y, self.bias)

    def __repr__(self) -> str:
        return (f"Linear({self.in_features}, {self.out_features}, bias={self.bias is not None},"
                f" sbp={tuple(self.weight.sbp)})")


def relu(x: GlobalTensor) -> GlobalTensor:
    """``max(x, 0)`` elementwise."""
    return ops.relu(x)  # type: ignore[no-any-return]


def gelu(x: GlobalTensor, approximate: str = "none") -> GlobalTensor:
    """GELU, ``x * Phi(x)`` (``approximate="none"``, through erf) or its tanh form."""
    return ops.gelu(x, approximate=approximate)  # type: ignore[no-any-return]


def softmax(x: GlobalTensor, dim: int = -1) -> GlobalTensor:
    """``sm.softmax``: a split ``dim`` costs two all-reduces of the reduced shape."""
    return ops.softmax(x, dim)  # type: ignore[no-any-return]


def log_softmax(x: GlobalTensor, dim: int = -1) -> GlobalTensor:
    """``sm.log_softmax``: a split ``dim`` costs two all-reduces of the reduced shape."""
    return ops.log_softmax(x, dim)  # type: ignore[no-any-return]


def cross_entropy(logits: GlobalTensor, labels: Any, ignore_index: int = -100) -> GlobalTensor:
    """Mean over the batch of ``-log_softmax(logits)[i, labels[i]]`` (a 0-d tensor).

    ``logits`` has shape ``(N, C)`` in any layout: a split batch gives a partial-sum
    loss, reduced when read; split classes (vocab parallel, ``split(1)``) are never
    gathered: two all-reduces of shapes ``(N, 1)`` and ``(N, 2)`` forward, none backward.
    ``labels`` holds ``N`` integer classes in ``[0, C)``: a GlobalTensor, or an array made
    global here with the batch's split of ``logits``. Rows labelled ``ignore_index``
    contribute nothing and the mean is over the others (NaN when none is left, as
    torch). Other labels outside ``[0, C)`` add 0 to the sum but count in the mean (they
    are not checked: that would need communication).
    """
    if not isinstance(logits, GlobalTensor) or logits.ndim != 2:
        raise ValueError(f"cross_entropy: logits must be a 2-D GlobalTensor (batch, classes), "
                         f"got {getattr(logits, 'shape', type(logits).__name__)}")
    if isinstance(ignore_index, (bool, np.bool_)) or not isinstance(ignore_index,
                                                                    (int, np.integer)):
        raise TypeError(f"cross_entropy: ignore_index must be an int, got "
                        f"{type(ignore_index).__name__} {ignore_index!r}")
    ignore = int(ignore_index)
    n, c = logits.shape
    count: Any = None
    if not isinstance(labels, GlobalTensor):
        arr = np.asarray(labels)
        if arr.dtype.kind not in "iu":
            raise TypeError(f"cross_entropy: labels must be integers, got dtype {arr.dtype}")
        if arr.shape == (n,):
            count = int(np.count_nonzero(arr != ignore))  # the whole array is on every rank
        sbp = tuple(s if isinstance(s, Split) and s.dim == 0 else broadcast for s in logits.sbp)
        labels = tensor(arr, placement=logits.placement, sbp=sbp)
    if labels.dtype.kind not in "iu":
        raise TypeError(f"cross_entropy: labels must be integers, got dtype {labels.dtype}")
    if labels.shape != (n,):
        raise ValueError(f"cross_entropy: labels have shape {labels.shape}, expected ({n},) "
                         f"for logits of shape {logits.shape}")
    if logits.dtype.kind != "f":
        raise TypeError(f"cross_entropy: logits must have a floating dtype, got {logits.dtype}")
    if count is not None:
        scale = 1.0 / count if count else float("nan")
        return losses.cross_entropy_loss(logits, labels, ignore, scale)
    total = losses.cross_entropy_loss(logits, labels, ignore, 1.0)
    counted = ops.astype(ops.sum(ops.ne(labels, ignore)), logits.dtype)
    return ops.div(total, counted)  # type: ignore[no-any-return]


# ---- data parallelism with gradient buckets ----------------------------------------------------

no_sync = buckets.no_sync


class DataParallel(Module):
    """Data parallelism whose gradient all-reduces overlap backward (as torch's DDP).

    ``DataParallel(model)`` wraps a module whose parameters are broadcast along the
    data-parallel mesh axis ``axis`` (the axis the batch is split along): their gradients
    arrive ``partial_sum`` there and are reduced in flat buckets, each started as soon as
    backward has produced all its gradients, while backward computes the earlier layers
    (see :mod:`sbpmpi.autograd.buckets`). Parameters split along ``axis`` keep the
    unbucketed path. ``.grad`` is set, in the parameter's layout, before ``backward``
    returns; its local shard is a view into its bucket. The results equal the unbucketed
    ones (bit for bit, as each gradient all-reduced on its own).

    Use :meth:`no_sync` (or :func:`sbpmpi.nn.no_sync` for every DataParallel) to
    accumulate gradients over several backwards and reduce the sum once.

    Parameters
    ----------
    module : Module
        The model; ``forward`` calls it, ``parameters()`` are its parameters (named
        ``"module.<name>"``, as torch's DDP names them).
    axis : int
        The data-parallel mesh axis of the parameters' placement (default 0).
    bucket_cap_mb, first_bucket_mb : float
        Bucket sizes in MiB, counted over whole gradients in reverse parameter order:
        PyTorch DDP's 25 and 1 by default (the first bucket small, to start early).
    """

    def __init__(self, module: Module, *, axis: int = 0, bucket_cap_mb: float = 25.0,
                 first_bucket_mb: float = 1.0) -> None:
        if not isinstance(module, Module):
            raise TypeError(f"DataParallel: module must be an sm.nn.Module, got "
                            f"{type(module).__name__}")
        caps = []
        for name, v in (("bucket_cap_mb", bucket_cap_mb), ("first_bucket_mb", first_bucket_mb)):
            if isinstance(v, (bool, np.bool_)) or not isinstance(
                    v, (int, float, np.integer, np.floating)) or not v >= 0 or math.isinf(v):
                raise ValueError(f"DataParallel: {name} must be a non-negative number of MiB, "
                                 f"got {v!r}")
            caps.append(int(v * buckets.MIB))
        self.module = module
        self.reducer = buckets.Reducer(module.parameters(), axis, caps[0], caps[1])
        weakref.finalize(self, self.reducer.close)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    def no_sync(self) -> Any:
        """``with model.no_sync():`` backward accumulates this model's gradients without
        reducing them; the next backward outside reduces the sum."""
        return self.reducer.no_sync()

    def __repr__(self) -> str:
        return f"DataParallel({self.module!r}, buckets={self.reducer.layout()})"


def shard(module: Module, optimizer: Any, *, stage: int, axis: int = 0,
          bucketed: bool = True, prefetch: bool = True) -> tuple[Any, Any]:
    """ZeRO on the data-parallel mesh axis ``axis``: ``model, opt = sm.nn.shard(model, opt,
    stage=1)`` splits the optimizer state over that axis, ``stage=2`` the gradients too
    (reduce-scattered into the split), ``stage=3`` the parameters too (each layer's
    all-gathered around its forward and backward, in one call when ``bucketed``, the next
    layer's started early when ``prefetch``). Use the
    returned pair from then on. See :mod:`sbpmpi.zero`."""
    from .zero import shard as shard_layouts

    if not isinstance(module, Module):
        raise TypeError(f"shard: module must be an sm.nn.Module, got {type(module).__name__}")
    return shard_layouts(module, optimizer, stage=stage, axis=axis, bucketed=bucketed,
                         prefetch=prefetch)


# ---- training state ---------------------------------------------------------------------------

def _training_state(module: Module, optimizer: Any) -> dict[str, GlobalTensor]:
    out = {f"model.{k}": v for k, v in module.state_dict().items()}
    if optimizer is not None:
        out.update({f"optim.{k}": v for k, v in optimizer.state_dict().items()})
    return out


def save_training_state(directory: str | os.PathLike[str], module: Module,
                        optimizer: Any = None) -> None:
    """``sm.save_state`` of the module's parameters and the optimizer's state (collective)."""
    from .checkpoint import save_state

    save_state(_training_state(module, optimizer), directory)


def load_training_state(directory: str | os.PathLike[str], module: Module,
                        optimizer: Any = None) -> None:
    """Restore what :func:`save_training_state` wrote, into the current layouts.

    Each tensor is read straight into the layout of the parameter (or state tensor) it
    belongs to, so the world size, placement and SBPs may differ from the saving run.
    """
    from .checkpoint import load_state

    want = _training_state(module, optimizer)
    state = load_state(directory, placement={k: v.placement for k, v in want.items()},
                       sbp={k: v.sbp for k, v in want.items()})
    module.load_state_dict({k[6:]: v for k, v in state.items() if k.startswith("model.")})
    if optimizer is not None:
        optimizer.load_state_dict({k[6:]: v for k, v in state.items()
                                   if k.startswith("optim.")})


# ---- containers -------------------------------------------------------------------------------

def _module_items(owner: str, modules: Iterable[Any]) -> list[Module]:
    items = list(modules)
    for i, m in enumerate(items):
        if not isinstance(m, Module):
            raise TypeError(f"{owner}: entry {i} must be an sm.nn.Module, got "
                            f"{type(m).__name__}")
    return items


class ModuleList(Module):
    """A list of modules whose parameters are named ``0.weight``, ``1.bias``, ... (as torch).

    Index it, iterate it, ``append``/``extend`` it; it has no ``forward``.
    """

    def __init__(self, modules: Iterable[Module] | None = None) -> None:
        self._items = _module_items("ModuleList", modules or ())

    def _members(self) -> Iterator[tuple[str, Any]]:
        return ((str(i), m) for i, m in enumerate(self._items))

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._items)

    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            return type(self)(self._items[index])
        return self._items[index]

    def __setitem__(self, index: int, module: Module) -> None:
        self._items[index] = _module_items(type(self).__name__, [module])[0]

    def append(self, module: Module) -> ModuleList:
        """Add ``module`` at the end; returns ``self``."""
        self._items += _module_items(type(self).__name__, [module])
        return self

    def extend(self, modules: Iterable[Module]) -> ModuleList:
        """Add ``modules`` at the end; returns ``self``."""
        self._items += _module_items(type(self).__name__, modules)
        return self

    def __repr__(self) -> str:
        inner = "".join(f"\n  ({i}): {m!r}" for i, m in enumerate(self._items))
        return f"{type(self).__name__}({inner}{chr(10) if inner else ''})"


class Sequential(ModuleList):
    """Modules applied in order: ``Sequential(a, b)(x) == b(a(x))``; parameters are named
    by position (``0.weight``), as torch."""

    def __init__(self, *modules: Module) -> None:
        super().__init__(_module_items("Sequential", modules))

    def forward(self, x: Any) -> Any:
        for m in self._items:
            x = m(x)
        return x


# ---- layers -----------------------------------------------------------------------------------

def _param_sbp(owner: str, placement: Any, sbp: SBP | Sequence[SBP] | None,
               what: str = "sbp") -> tuple[SBP, ...]:
    """A parameter's SBP: broadcast by default, never partial (``what`` names it in the
    error)."""
    if not isinstance(placement, Placement):
        raise TypeError(f"{owner}: placement= must be an sm.placement, got "
                        f"{type(placement).__name__}")
    out = (broadcast,) * placement.ndim if sbp is None else \
        ((sbp,) if isinstance(sbp, (Split, Broadcast, Partial)) else tuple(sbp))
    if any(isinstance(s, Partial) for s in out):
        raise ValueError(f"{owner}: {what} {out} is partial; use broadcast or split")
    return out


def _positive(owner: str, name: str, n: Any) -> int:
    if isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"{owner}: {name} must be a positive int, got {n!r}")
    return int(n)


def _rows_of(weight: GlobalTensor) -> GlobalTensor:
    """``arange(V)`` laid out like ``weight``'s rows: split(0) where the weight is split on
    dim 0, broadcast elsewhere (it tells each rank which rows its shard holds)."""
    sbp = tuple(s if isinstance(s, Split) and s.dim == 0 else broadcast for s in weight.sbp)
    return arange(weight.shape[0], placement=weight.placement, sbp=sbp)


def embedding(ids: GlobalTensor, weight: GlobalTensor) -> GlobalTensor:
    """Rows of ``weight`` (shape ``(num_embeddings, embedding_dim)``) at integer ``ids``.

    ``ids`` is a GlobalTensor of integers of any shape and layout; the result has shape
    ``ids.shape + (embedding_dim,)``. The weight may be broadcast, split on the
    embedding dim (``split(1)``: the result is split on its last dim) or on the
    vocabulary (``split(0)``: each rank looks up the ids it owns and the result is
    ``partial_sum``). Its gradient is a scatter-add of the output's gradient into the
    rows each rank owns: it arrives in the weight's layout, the weight is never gathered.
    Ids outside ``[0, num_embeddings)`` raise IndexError (on the ranks that hold them).
    """
    if not isinstance(weight, GlobalTensor) or weight.ndim != 2:
        raise ValueError(f"embedding: weight must be a 2-D GlobalTensor (num_embeddings, "
                         f"embedding_dim), got {getattr(weight, 'shape', type(weight).__name__)}")
    if not isinstance(ids, GlobalTensor) or ids.dtype.kind not in "iu":
        raise TypeError(f"embedding: ids must be a GlobalTensor of integers, got "
                        f"{getattr(ids, 'dtype', type(ids).__name__)}")
    return ops.embedding(ids, weight, _rows_of(weight))  # type: ignore[no-any-return]


class Embedding(Module):
    """A lookup table: ``Embedding(V, D)(ids) == embedding(ids, weight)``, ``weight`` of
    shape ``(V, D)`` drawn from N(0, 1) (as torch) by ``sm.randn``.

    ``sbp`` is the weight's SBP (default broadcast): ``split(0)`` for a vocabulary-parallel
    table, ``split(1)`` to split the embedding dim.
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, *,
                 placement: Placement | None = None, sbp: SBP | Sequence[SBP] | None = None,
                 dtype: Any = np.float32) -> None:
        self.num_embeddings = _positive("Embedding", "num_embeddings", num_embeddings)
        self.embedding_dim = _positive("Embedding", "embedding_dim", embedding_dim)
        wsbp = _param_sbp("Embedding", placement, sbp)
        self.weight = randn(self.num_embeddings, self.embedding_dim, placement=placement,
                            sbp=wsbp, dtype=dtype).requires_grad_()

    def forward(self, ids: GlobalTensor) -> GlobalTensor:
        return embedding(ids, self.weight)

    def __repr__(self) -> str:
        return (f"Embedding({self.num_embeddings}, {self.embedding_dim}, "
                f"sbp={tuple(self.weight.sbp)})")


def layer_norm(x: GlobalTensor, weight: GlobalTensor | None = None,
               bias: GlobalTensor | None = None, eps: float = 1e-5) -> GlobalTensor:
    """Normalize over the last dim: ``(x - mean) / sqrt(var + eps) * weight + bias``.

    ``var`` is the biased variance (as torch). Where no mesh axis splits ``x``'s last
    dim (every rank holds whole rows: broadcast, or a split batch or sequence dim), the
    normalization is one op, :func:`sbpmpi.ops.normalize`, with its own backward (a
    partial ``x`` is all-reduced first). Where the last dim is split, it is written with
    global ops: the mean and the variance are partial sums that each take one all-reduce
    of the reduced shape (``x.shape[:-1] + (1,)``), never a gather of ``x``. ``weight``
    and ``bias`` have shape ``(x.shape[-1],)`` (or are None).
    """
    if not isinstance(x, GlobalTensor) or x.ndim < 1 or x.dtype.kind != "f":
        raise TypeError(f"layer_norm: x must be a floating GlobalTensor of at least 1 dim, "
                        f"got {getattr(x, 'dtype', type(x).__name__)} of shape "
                        f"{getattr(x, 'shape', None)}")
    for what, t in (("weight", weight), ("bias", bias)):
        if t is not None and (not isinstance(t, GlobalTensor) or t.shape != x.shape[-1:]):
            raise ValueError(f"layer_norm: {what} must be None or a GlobalTensor of shape "
                             f"{x.shape[-1:]}, got {getattr(t, 'shape', type(t).__name__)}")
    eps = check_eps("layer_norm", eps)
    last = x.ndim - 1
    if not any(isinstance(s, Split) and s.dim == last for s in x.sbp):
        y = ops.normalize(x, eps)
    else:
        # the moments reduced here rather than left to inference: a partial mean could
        # also be consumed by making x partial too (free), which would then box
        # full-size tensors instead of the small moments
        centered = ops.sub(x, reduced(ops.mean(x, -1, keepdim=True)))
        var = reduced(ops.mean(ops.mul(centered, centered), -1, keepdim=True))
        # the reciprocal on the small reduced shape, then a product: a full-size div
        # costs more forward and three more full-size passes backward
        y = ops.mul(centered, ops.div(1.0, ops.sqrt(ops.add(var, eps))))
    if weight is not None:
        y = ops.mul(y, weight)
    if bias is not None:
        y = ops.add(y, bias)
    return y  # type: ignore[no-any-return]


class LayerNorm(Module):
    """:func:`layer_norm` over the last dim, of size ``dim``, with a learned ``weight``
    (ones) and ``bias`` (zeros, unless ``bias=False``); ``sbp`` is theirs (default
    broadcast; ``split(0)`` matches activations split on their last dim)."""

    def __init__(self, dim: int, eps: float = 1e-5, bias: bool = True, *,
                 placement: Placement | None = None, sbp: SBP | Sequence[SBP] | None = None,
                 dtype: Any = np.float32) -> None:
        self.dim = _positive("LayerNorm", "dim", dim)
        self.eps = float(eps)
        psbp = _param_sbp("LayerNorm", placement, sbp)
        self.weight = ones(self.dim, placement=placement, sbp=psbp, dtype=dtype).requires_grad_()
        self.bias: GlobalTensor | None = None
        if bias:
            self.bias = zeros(self.dim, placement=placement, sbp=psbp,
                              dtype=dtype).requires_grad_()

    def forward(self, x: GlobalTensor) -> GlobalTensor:
        return layer_norm(x, self.weight, self.bias, self.eps)

    def __repr__(self) -> str:
        return f"LayerNorm({self.dim}, eps={self.eps}, bias={self.bias is not None})"


def dropout(x: GlobalTensor, p: float = 0.5, training: bool = True) -> GlobalTensor:
    """Zero each element with probability ``p`` and scale the others by ``1 / (1 - p)``.

    The mask is drawn like ``sm.rand`` (one random stream per call, on every rank): it
    depends on the seed, the call number and the global index only, so it is the same
    whatever the layout of ``x`` and the world size. ``training=False`` (or ``p == 0``)
    returns ``x`` itself.
    """
    if not isinstance(x, GlobalTensor):
        raise TypeError(f"dropout: x must be a GlobalTensor, got {type(x).__name__}")
    if isinstance(p, (bool, np.bool_)) or not isinstance(p, (int, float, np.floating)) \
            or not 0 <= p <= 1:
        raise ValueError(f"dropout: p must be a probability in [0, 1], got {p!r}")
    if not isinstance(training, (bool, np.bool_)):
        raise TypeError(f"dropout: training must be a bool, got {type(training).__name__}")
    if not training or p == 0:
        return x
    # a partial x takes a broadcast mask: the product stays a partial of x * mask
    sbp = tuple(broadcast if isinstance(s, Partial) else s for s in x.sbp)
    with no_grad():
        u = rand(x.shape, placement=x.placement, sbp=sbp, dtype=np.float64)
        keep = ops.astype(ops.lt(u, 1.0 - float(p)), x.dtype)
        mask = ops.div(keep, 1.0 - float(p)) if p < 1 else keep
    return ops.mul(x, mask)  # type: ignore[no-any-return]


class Dropout(Module):
    """:func:`dropout` with probability ``p`` while ``training`` (see :meth:`Module.eval`)."""

    def __init__(self, p: float = 0.5) -> None:
        if isinstance(p, (bool, np.bool_)) or not isinstance(p, (int, float, np.floating)) \
                or not 0 <= p <= 1:
            raise ValueError(f"Dropout: p must be a probability in [0, 1], got {p!r}")
        self.p = float(p)

    def forward(self, x: GlobalTensor) -> GlobalTensor:
        return dropout(x, self.p, self.training)

    def __repr__(self) -> str:
        return f"Dropout(p={self.p})"


# ---- gradient clipping ------------------------------------------------------------------------

def clip_grad_norm_(parameters: GlobalTensor | Iterable[GlobalTensor], max_norm: float,
                    norm_type: float = 2.0, error_if_nonfinite: bool = False) -> GlobalTensor:
    """Scale every gradient by ``max_norm / (total_norm + 1e-6)`` when that is below 1.

    ``total_norm`` is the ``norm_type`` norm of all gradients together (``inf``: the
    largest absolute value), returned as a 0-d broadcast tensor on the parameters'
    placement (when they have several, a 1-D placement of all their ranks). It costs one all-reduce for all parameters: each rank adds up its shards'
    terms, counting a shard held on several ranks of a broadcast mesh axis once (on the
    axis's first rank), and one reduction sums (or, for ``inf``, takes the max of) the
    ranks' terms. A partial gradient is reduced first (its shards' terms are not terms of
    the sum). Gradients are replaced by scaled copies, never scaled in place (a gradient
    tensor may be shared by several leaves). Collective.
    """
    params = [parameters] if isinstance(parameters, GlobalTensor) else list(parameters)
    for i, p in enumerate(params):
        if not isinstance(p, GlobalTensor):
            raise TypeError(f"clip_grad_norm_: parameters[{i}] must be a GlobalTensor, got "
                            f"{type(p).__name__}")
    if not params:
        raise ValueError("clip_grad_norm_: got no parameters")
    for name, v in (("max_norm", max_norm), ("norm_type", norm_type)):
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer,
                                                                np.floating)) or not v > 0:
            raise ValueError(f"clip_grad_norm_: {name} must be a positive number, got {v!r}")
    kinds = {p.placement.type for p in params}
    if len(kinds) > 1:
        raise ValueError(f"clip_grad_norm_: parameters live on several device types "
                         f"{sorted(kinds)}")
    norm_type = float(norm_type)
    grads = []
    for p in params:
        grads.append(None if p.grad is None else reduced(p.grad))
    present = [g for g in grads if g is not None]
    dtype = np.result_type(*[g.dtype for g in present]) if present else params[0].dtype
    places = {p.placement for p in params}
    where = places.pop() if len(places) == 1 else Placement(
        params[0].placement.type, sorted({r for p in params for r in p.placement.rank_list}))
    total = _norm_of(present, norm_type, where, np.dtype(dtype))
    value = float(total.item())
    if error_if_nonfinite and not math.isfinite(value):
        raise RuntimeError(f"clip_grad_norm_: the total norm of order {norm_type} of the "
                           f"gradients is {value}")
    coef = float(max_norm) / (value + 1e-6)
    if coef < 1:
        for p, g in zip(params, grads):
            if g is not None:
                with no_grad():
                    p.grad = ops.mul(g, np.asarray(coef, dtype=g.dtype)[()]).to_global(
                        sbp=p.sbp)
    return total


def _norm_of(grads: Sequence[GlobalTensor], norm_type: float, placement: Placement,
             dtype: np.dtype) -> GlobalTensor:
    """The ``norm_type`` norm of all ``grads`` (no partial ones) by one all-reduce."""
    me = get_rank()
    term = 0.0
    for g in grads:
        coord = g.placement.coord_of(me)
        if coord is None or any(isinstance(s, Broadcast) and c != 0
                                for s, c in zip(g.sbp, coord)):
            continue  # not held here, or a copy counted on the axis's first rank
        local = g.to_local()
        if not local.size:
            continue
        a = backend.get_xp(g.placement.type).abs(local.astype(np.float64))
        if norm_type == math.inf:
            term = max(term, float(a.max()))
        else:
            term += float((a ** norm_type).sum())
    kind = "max" if norm_type == math.inf else "sum"
    layout = Layout.make((), placement, (PARTIALS[kind],) * placement.ndim)
    # the local term on the placement's ranks (a partial value), reduced by one all-reduce
    local_term = backend.get_xp(placement.type).asarray(term, dtype=np.float64) \
        if me in placement else np.empty((), dtype=np.float64)
    reduced = GlobalTensor(local_term, layout, np.dtype(np.float64)).to_global(
        sbp=(broadcast,) * placement.ndim)
    with no_grad():
        out = reduced if norm_type in (1.0, math.inf) else ops.pow(reduced, 1.0 / norm_type)
        return out.astype(dtype) if dtype != np.float64 else out  # type: ignore[no-any-return]
