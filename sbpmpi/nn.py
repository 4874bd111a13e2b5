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
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from . import ops
from .autograd import losses
from .autograd.mode import no_grad
from .core.placement import Placement
from .core.sbp import SBP, Broadcast, Partial, Split, broadcast, split
from .creation import rand, tensor
from .tensor import GlobalTensor

__all__ = ["Module", "Linear", "relu", "gelu", "softmax", "log_softmax", "cross_entropy",
           "save_training_state", "load_training_state"]


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
