"""A small neural-network toolkit on global tensors: modules, Linear, relu, cross_entropy.

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
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from . import ops
from .autograd import buckets, losses
from .autograd.mode import no_grad
from .core.placement import Placement
from .core.sbp import SBP, Broadcast, Partial, Split, broadcast, split
from .creation import rand, tensor
from .tensor import GlobalTensor

__all__ = ["Module", "Linear", "relu", "cross_entropy", "save_training_state",
           "load_training_state", "DataParallel", "no_sync", "shard"]


class Module:
    """Base class: parameters are the GlobalTensor attributes that require grad, found
    recursively through attributes that are modules (or lists/tuples of modules)."""

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward(*args, **kwargs)

    def named_parameters(self, prefix: str = "") -> Iterator[tuple[str, GlobalTensor]]:
        """``(dotted name, parameter)`` in attribute order."""
        for k, v in vars(self).items():
            if isinstance(v, GlobalTensor) and v.requires_grad:
                yield prefix + k, v
            elif isinstance(v, Module):
                yield from v.named_parameters(f"{prefix}{k}.")
            elif isinstance(v, (list, tuple)):
                for i, m in enumerate(v):
                    if isinstance(m, Module):
                        yield from m.named_parameters(f"{prefix}{k}.{i}.")

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

    Weights and bias start uniform in ``[-1/sqrt(in), 1/sqrt(in)]`` (as torch), drawn by
    ``sm.rand``: the values depend on the seed only, not on the layout or world size.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *,
                 placement: Placement | None = None, sbp: SBP | Sequence[SBP] | None = None,
                 bias_sbp: SBP | Sequence[SBP] | None = None, dtype: Any = np.float32) -> None:
        for name, n in (("in_features", in_features), ("out_features", out_features)):
            if isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer)) or n < 1:
                raise ValueError(f"Linear: {name} must be a positive int, got {n!r}")
        if not isinstance(placement, Placement):
            raise TypeError(f"Linear: placement= must be an sm.placement, got "
                            f"{type(placement).__name__}")
        wsbp = (broadcast,) * placement.ndim if sbp is None else \
            ((sbp,) if isinstance(sbp, (Split, Broadcast, Partial)) else tuple(sbp))
        if any(isinstance(s, Partial) for s in wsbp):
            raise ValueError(f"Linear: weight sbp {wsbp} is partial; use broadcast or split")
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


def cross_entropy(logits: GlobalTensor, labels: Any) -> GlobalTensor:
    """Mean over the batch of ``-log_softmax(logits)[i, labels[i]]`` (a 0-d tensor).

    ``logits`` has shape ``(N, C)`` in any layout (a split batch gives a partial-sum
    loss, reduced when read); ``labels`` holds ``N`` integer classes in ``[0, C)``: a
    GlobalTensor, or an array made global here with the batch's split of ``logits``.
    Labels outside ``[0, C)`` contribute nothing (they are not checked: that would need
    communication).
    """
    if not isinstance(logits, GlobalTensor) or logits.ndim != 2:
        raise ValueError(f"cross_entropy: logits must be a 2-D GlobalTensor (batch, classes), "
                         f"got {getattr(logits, 'shape', type(logits).__name__)}")
    n, c = logits.shape
    if not isinstance(labels, GlobalTensor):
        arr = np.asarray(labels)
        if arr.dtype.kind not in "iu":
            raise TypeError(f"cross_entropy: labels must be integers, got dtype {arr.dtype}")
        sbp = tuple(s if isinstance(s, Split) and s.dim == 0 else broadcast for s in logits.sbp)
        labels = tensor(arr, placement=logits.placement, sbp=sbp)
    if labels.dtype.kind not in "iu":
        raise TypeError(f"cross_entropy: labels must be integers, got dtype {labels.dtype}")
    if labels.shape != (n,):
        raise ValueError(f"cross_entropy: labels have shape {labels.shape}, expected ({n},) "
                         f"for logits of shape {logits.shape}")
    if logits.dtype.kind != "f":
        raise TypeError(f"cross_entropy: logits must have a floating dtype, got {logits.dtype}")
    return losses.cross_entropy(logits, labels)  # type: ignore[no-any-return]


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

    Use :meth:`no_sync` (or :func:`sbpmpi.nn.no_sync` for every DataParallel) to
    accumulate gradients over several backwards and reduce the sum once.
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


def shard(module: Module, optimizer: Any, *, stage: int, axis: int = 0) -> tuple[Any, Any]:
    """ZeRO on the data-parallel mesh axis ``axis``: ``model, opt = sm.nn.shard(model, opt,
    stage=1)`` splits the optimizer state over that axis, ``stage=3`` the parameters too
    (all-gathered at each forward; gradients reduce-scattered into the split). Use the
    returned pair from then on. See :mod:`sbpmpi.zero`."""
    from .zero import shard as shard_layouts

    return shard_layouts(module, optimizer, stage=stage, axis=axis)


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
