"""GlobalTensor: one rank's shard plus the layout that places it in the global tensor."""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from .core.keywords import ALIASES, accepting_aliases
from .core.layout import Layout
from .core.modes import current_modes
from .core.placement import Placement
from .core.sbp import SBP, NdSbp
from .env import get_rank
from .errors import CopyWriteError
from .runtime import halo as _halo
from .runtime.consistency import check_collective

__all__ = ["GlobalTensor", "CopySource", "bind_layers_above", "bind_array_api"]

class _LayersAbove:
    """The modules GlobalTensor's methods delegate to: the layers above (the ops for
    operators and methods, autograd for backward, the NumPy protocols, the Array API
    namespace's loader, called on first use so that importing sbpmpi does not import the
    namespace), and beside this one the tape (requires_grad, grad, the record of
    x.to_global) and conversion (x.to_global, x.numpy). They import this module, so
    ``sbpmpi/__init__`` binds them here at import (:func:`bind_layers_above`,
    :func:`bind_array_api`) instead of this module importing them."""

    __slots__ = ("ops", "autograd", "protocols", "conversion", "tape", "array_api_loader")

    def __init__(self) -> None:
        self.ops: Any = None
        self.autograd: Any = None
        self.protocols: Any = None
        self.conversion: Any = None
        self.tape: Any = None
        self.array_api_loader: Any = None


_ABOVE = _LayersAbove()


def bind_layers_above(ops: Any, autograd: Any, protocols: Any, conversion: Any,
                      tape: Any) -> None:
    """Bind the modules GlobalTensor's methods delegate to (called once by ``sbpmpi``)."""
    _ABOVE.ops, _ABOVE.autograd, _ABOVE.protocols = ops, autograd, protocols
    _ABOVE.conversion, _ABOVE.tape = conversion, tape


def bind_array_api(loader: Any) -> None:
    """Bind the loader of ``sbpmpi.array_api`` (called once by ``sbpmpi``)."""
    _ABOVE.array_api_loader = loader


def _xp() -> Any:
    return _ABOVE.array_api_loader()


class CopySource(NamedTuple):
    """Where a write-through copy came from: it is ``base[key]`` (basic indexing)."""

    base: GlobalTensor
    key: Any


class GlobalTensor:
    """A tensor whose value is spread over the ranks of a placement as described by its SBP.

    Build one with the creation functions (``sm.randn``, ``sm.tensor``, ...) or
    ``sm.to_global``; never from the constructor.
    """

    __slots__ = ("_local", "_layout", "_dtype", "_requires_grad", "_grad", "_node",
                 "_base", "_copy_note", "_copy_of", "__weakref__")
    __array_priority__ = 1000  # NumPy defers binary operators to us

    def __init__(self, local: Any, layout: Layout, dtype: np.dtype) -> None:
        self._local = local
        self._layout = layout
        self._dtype = dtype if isinstance(dtype, np.dtype) else np.dtype(dtype)
        self._requires_grad = False  # autograd state: see the block "autograd" below
        self._grad: GlobalTensor | None = None
        self._node: Any = None
        # views and copies (see the block "views and copies" below)
        self._base: GlobalTensor | None = None
        self._copy_note: str | None = None
        self._copy_of: CopySource | None = None

    # -- the writers of the shard, the gradient and the tape node ---------------------
    # The only code that assigns ``_local``, ``_layout``, ``_grad`` and ``_node`` after
    # construction (tests/test_layers.py checks it): the layers that change a tensor in
    # place (setitem, in-place operators, the optimizers, ZeRO's gathers and frees, the
    # gradient buckets, the tape) call these.
    def _set_data(self, local: Any, layout: Layout | None = None) -> None:
        """Replace this rank's shard (and the layout, when given) in place: ``x[k] = v``,
        ``x += y``, a ZeRO parameter gathered or freed. The value's dtype is unchanged."""
        self._local = local
        if layout is not None:
            self._layout = layout

    def _write_data(self, local: Any) -> None:
        """Write ``local`` (this rank's new shard: the same layout, dtype and shape) into
        this tensor in place: ``x[k] = v``, ``x += y``, ``np.add(a, b, out=x)``. The values
        go into the existing buffer, so every view that shares it (``x[k]`` of basic
        indexing, or the tensor this one views) sees the write, as in NumPy. A buffer that
        nothing else references (and a read-only one) is replaced instead: no one can
        tell, and it saves a copy."""
        dst = self._local
        if dst is local:
            return
        # getrefcount counts the slot, ``dst`` and its own argument: 3 means that no view,
        # detached twin or caller holds the buffer (NumPy's resize(refcheck=True) asks the
        # same question the same way). A view writes in place whatever the count.
        flags = getattr(dst, "flags", None)
        if (self._base is None and sys.getrefcount(dst) <= 3) or (
                flags is not None and not flags.writeable):
            self._local = local
        else:
            dst[...] = local

    def _mark_view(self, base: GlobalTensor) -> None:
        """Record that this tensor's shard views the shard of ``base`` (basic indexing that
        moved nothing): writes into either reach the other. A view of a copy is refused
        writes as the copy is."""
        self._base = base._base if base._base is not None else base
        self._copy_note = base._copy_note
        if base._copy_of is not None:  # writes into it would miss the copy's source
            self._copy_note = (f"a view of the copy x[{base._copy_of.key!r}], whose writes "
                               f"are forwarded to x only when made into it directly")

    def _mark_copy(self, note: str) -> None:
        """Record that this tensor is a copy where NumPy would give a view (``note``: what
        made it, for the message): :meth:`_check_writable` refuses writes into it."""
        self._base = None
        self._copy_note = note
        self._copy_of = None

    def _mark_write_through(self, base: GlobalTensor, key: Any) -> None:
        """Record that this tensor is the copy ``base[key]`` whose writes the indexing
        door forwards to ``base`` (``x[key]`` that had to move data): a write into it is
        made on the current value of ``base[key]`` and written back there, so ``base``
        sees it as it would through NumPy's view."""
        self._base = None
        self._copy_note = None
        self._copy_of = CopySource(base, key)

    def _check_writable(self, what: str) -> None:
        """Raise unless a write into this tensor keeps NumPy's meaning (before any
        communication: the facts are metadata, the same on every rank).

        Raises
        ------
        CopyWriteError
            When this tensor is a copy where NumPy would give a view (the write would not
            reach the tensor it was taken from).
        RuntimeError
            When this tensor views a tensor that requires grad (as torch: the write would
            not be recorded by autograd).
        """
        if self._copy_note is not None:
            raise CopyWriteError(
                f"{what}: this tensor is a copy ({self._copy_note}), where NumPy would give "
                f"a view: the write would not reach the tensor it was taken from. Write into "
                f"that tensor itself (x[key] = value, or x[key] += value), or make the copy "
                f"explicit and writable with .copy() (y = x[key].copy())")
        base = self._base
        if base is not None and base._requires_grad:
            raise RuntimeError(
                f"{what}: this tensor is a view of a tensor that requires grad; writes into "
                f"it are not recorded by autograd (as torch: a view of a leaf that requires "
                f"grad cannot be written in place). Compute a new tensor instead (where, "
                f"or arithmetic)")

    def _set_grad(self, grad: GlobalTensor | None) -> None:
        """Store ``grad`` as ``.grad`` without the user-facing checks of the ``grad``
        setter: the engine and the data-parallel reducers have made it in the leaf's
        layout, or in the layout their stage keeps it in (ZeRO 1: unreduced)."""
        # a step being captured as a graph (sm.graph)
        if (recorder := current_modes().recorder) is not None:
            recorder.set_grad(self, grad)
        self._grad = grad

    def _set_node(self, node: Any) -> None:
        """Attach the tape node that computed this tensor (it then requires grad); None
        cuts it from the tape and keeps ``requires_grad`` as it is."""
        self._node = node
        if node is not None:
            self._requires_grad = True

    # -- metadata ---------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        """Global shape."""
        return self._layout.shape

    @property
    def dtype(self) -> np.dtype:
        return self._dtype

    @property
    def placement(self) -> Placement:
        return self._layout.placement

    @property
    def sbp(self) -> NdSbp:
        """One SBP per mesh axis."""
        return self._layout.sbp

    @property
    def layout(self) -> Layout:
        return self._layout

    @property
    def ndim(self) -> int:
        return len(self._layout.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self._layout.shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        return self.size * self._dtype.itemsize

    @property
    def is_global(self) -> bool:
        return True

    @property
    def is_local_member(self) -> bool:
        """True when this rank is in the placement."""
        return get_rank() in self._layout.placement

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d global tensor")
        return self.shape[0]

    def __iter__(self) -> Iterator[GlobalTensor]:
        """The sub-tensors along dim 0, as NumPy iterates (``x[0]``, ``x[1]``, ...): views
        where dim 0 is not split; where it is, its rows are gathered once (collective, on
        the first step) and each item is a write-through copy of ``x[i]`` (its writes are
        written back into ``x``, as a view's would be)."""
        if not self.shape:
            raise TypeError("iteration over a 0-d global tensor")
        return _ABOVE.protocols.iterate(self)  # type: ignore[no-any-return]

    # -- views and copies ---------------------------------------------------------------
    # Basic indexing that moves no data (``x[k]`` with ints, slices, None and ``...`` on
    # dims the layout keeps whole) returns a view: its shard is a view of this one's, so a
    # write into either reaches the other, as in NumPy. Where the key crosses a split the
    # result is a copy. ``x[key]`` makes it a write-through copy (a write into it is made
    # on the current ``x[key]`` and written back into ``x``: :meth:`_mark_write_through`);
    # any other copy where NumPy gives a view (a view of a write-through copy,
    # ``sm.ops.getitem`` called directly) refuses writes (:meth:`_check_writable`), so no
    # write is silently lost.
    @property
    def base(self) -> GlobalTensor | None:
        """The tensor this one is a view of (NumPy's ``ndarray.base``); None otherwise."""
        return self._base

    @property
    def is_view_copy(self) -> bool:
        """True when this tensor is a copy where NumPy would give a view: writes into it
        are refused, or (``x[key]`` that moved data) forwarded to the tensor it was taken
        from. :meth:`copy` gives an independent, writable one."""
        return self._copy_note is not None or self._copy_of is not None

    def copy(self) -> GlobalTensor:
        """A new tensor with this one's value and layout, in its own memory (writable;
        recorded by autograd like any op). NumPy's ``ndarray.copy``."""
        return self._op("astype", self, self._dtype)  # type: ignore[no-any-return]

    # -- data -------------------------------------------------------------------
    def to_local(self) -> Any:
        """This rank's shard itself (no copy); an empty array outside the placement."""
        return self._local

    def numpy(self) -> np.ndarray:
        """The whole global value as a NumPy array, on every rank (collective)."""
        return _ABOVE.conversion.gather_global(  # type: ignore[no-any-return]
            self, agreed=check_collective("x.numpy", (self,)))

    def halo(self, depth: Any, boundary: Any = "none", value: Any = 0.0) -> _halo.Halo:
        """Start the halo exchange of this rank's shard; ``wait()`` on the handle gives the
        shard padded by ``depth`` along every axis with its neighbours' data.

        Non-blocking: the messages (to and from neighbours only) are posted here, so the
        interior can be computed before ``wait()``. ``depth`` is an int, one int per axis
        or ``{axis: depth}``; ``boundary`` is ``"none"``, ``"periodic"``, ``"reflect"``
        (``np.pad``'s ``"symmetric"``, as Dask), ``"nearest"`` or ``"constant"`` (with
        ``value``), or one per axis. The padded shard equals the window of
        ``np.pad(whole, depth, mode)`` around this rank's block (with ``"none"``, no
        padding beyond the global edges). Collective over the tensor's placement; a
        partial tensor is refused. See ``docs/stencils.md`` and ``sm.map_overlap``.
        """
        d = _halo.normalize_depth(depth, self.ndim, "halo")
        b = _halo.normalize_boundary(boundary, self.ndim, "halo")
        _halo.check_layout(self._layout, d, b, "halo")
        check_collective("halo", (self, d, b, value))
        return _halo.start_halo(self._local, self._layout, d, b, value, get_rank())

    def to_global(
        self, placement: Placement | None = None, sbp: SBP | Sequence[SBP] | None = None, *,
        grad_sbp: SBP | Sequence[SBP] | None = None
    ) -> GlobalTensor:
        """Convert to another placement and/or SBP (collective); unchanged parts keep theirs.

        Parameters
        ----------
        placement : Placement, optional
            The result's placement (default: this tensor's).
        sbp : SBP or sequence of SBP, optional
            The result's SBP, one per mesh axis of ``placement`` (default: this tensor's).
        grad_sbp : SBP or sequence of SBP, optional
            The SBP, one per mesh axis of *this* tensor's placement, of the gradient this
            conversion passes back to this tensor in backward (OneFlow's ``grad_sbp``):
            split, broadcast or partial_sum (gradients are summed).
            None: the conjugate of this tensor's SBP (``broadcast`` -> ``partial_sum``,
            partial -> ``broadcast``, split stays split). Megatron's "f" operator is
            ``h.to_global(sbp=broadcast, grad_sbp=broadcast)`` before a column-parallel
            linear: the gradient is all-reduced there, and everything before ``h`` sees
            a broadcast gradient. Only the layout changes, never the value.
        """
        out = _ABOVE.conversion.convert(self, placement, sbp, grad_sbp)
        if self._requires_grad:  # a differentiable step (sbpmpi.autograd)
            grad = None if grad_sbp is None else _ABOVE.conversion.grad_destination(self, grad_sbp)
            out = _ABOVE.tape.record_conversion(self, out, grad)
        return out

    def item(self) -> Any:
        """The value of a one-element tensor as a Python scalar (collective)."""
        if self.size != 1:
            raise ValueError(f"item() needs a tensor of one element, got shape {self.shape}")
        return self.numpy().reshape(()).item()

    # -- Python and NumPy protocols (sbpmpi.protocols; collective where they read data) ----
    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return _ABOVE.protocols.array(self, dtype, copy)

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        return _ABOVE.protocols.array_ufunc(ufunc, method, *inputs, **kwargs)

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        return _ABOVE.protocols.array_function(func, types, args, kwargs)

    def __bool__(self) -> bool:
        return _ABOVE.protocols.to_bool(self)

    def __float__(self) -> float:
        return _ABOVE.protocols.to_scalar(self, float)  # type: ignore[no-any-return]

    def __int__(self) -> int:
        return _ABOVE.protocols.to_scalar(self, int)  # type: ignore[no-any-return]

    def __complex__(self) -> complex:
        return _ABOVE.protocols.to_scalar(self, complex)  # type: ignore[no-any-return]

    def __index__(self) -> int:
        return _ABOVE.protocols.to_index(self)

    def __repr__(self) -> str:
        sbp = ", ".join(repr(s) for s in self.sbp)
        return (
            f"GlobalTensor(shape={self.shape}, dtype={self._dtype}, "
            f"placement={self.placement!r}, sbp=({sbp}{',' if len(self.sbp) == 1 else ''}))"
        )

    # -- autograd (sbpmpi.autograd) ------------------------------------------------
    @property
    def requires_grad(self) -> bool:
        """Whether ops on this tensor are recorded for backward."""
        return self._requires_grad

    @requires_grad.setter
    def requires_grad(self, flag: bool) -> None:
        self.requires_grad_(flag)

    def requires_grad_(self, requires_grad: bool = True) -> GlobalTensor:
        """Set ``requires_grad`` on a leaf (floating dtypes only); returns ``self``."""
        self._requires_grad = _ABOVE.tape.check_requires_grad(self, requires_grad)
        return self

    @property
    def grad(self) -> GlobalTensor | None:
        """Accumulated gradient, in this tensor's placement and SBP; None until a backward."""
        return self._grad

    @grad.setter
    def grad(self, value: GlobalTensor | None) -> None:
        self._set_grad(_ABOVE.tape.check_grad_value(self, value))

    @property
    def is_leaf(self) -> bool:
        """True unless the tensor is the recorded result of an op."""
        return self._node is None

    @property
    def grad_fn(self) -> Any:
        """The tape node that made this tensor (None for a leaf)."""
        return self._node

    def detach(self) -> GlobalTensor:
        """Same data and layout (shared, no copy), cut from the tape."""
        out = GlobalTensor(self._local, self._layout, self._dtype)
        # a copy's twin is refused writes as it is (a write-through one's writes would
        # reach the copy and miss its source)
        out._copy_note = self._copy_note if self._copy_of is None else (
            f"detached from the copy x[{self._copy_of.key!r}]")
        return out

    def backward(self, gradient: GlobalTensor | None = None) -> None:
        """Accumulate gradients into the ``.grad`` of the leaves (collective)."""
        _ABOVE.autograd.backward(self, gradient)

    # -- operators: installed from the op registry -------------------------------------
    # ``sbpmpi.ops.operators.install`` sets every operator method (+ - * / // % ** @ & | ^
    # << >>, their reflected and in-place forms, comparisons, -x +x ~x abs(x), x[k],
    # x[k] = v) from ``sbpmpi.ops.registry`` when sbpmpi is imported; the declarations
    # below are for type checkers only (tests/test_registry.py checks they match).
    __hash__ = None  # type: ignore[assignment]  # __eq__ is elementwise

    if TYPE_CHECKING:
        def __add__(self, o: Any) -> Any: ...
        def __radd__(self, o: Any) -> Any: ...
        def __iadd__(self, o: Any) -> Any: ...
        def __sub__(self, o: Any) -> Any: ...
        def __rsub__(self, o: Any) -> Any: ...
        def __isub__(self, o: Any) -> Any: ...
        def __mul__(self, o: Any) -> Any: ...
        def __rmul__(self, o: Any) -> Any: ...
        def __imul__(self, o: Any) -> Any: ...
        def __truediv__(self, o: Any) -> Any: ...
        def __rtruediv__(self, o: Any) -> Any: ...
        def __itruediv__(self, o: Any) -> Any: ...
        def __floordiv__(self, o: Any) -> Any: ...
        def __rfloordiv__(self, o: Any) -> Any: ...
        def __ifloordiv__(self, o: Any) -> Any: ...
        def __mod__(self, o: Any) -> Any: ...
        def __rmod__(self, o: Any) -> Any: ...
        def __imod__(self, o: Any) -> Any: ...
        def __pow__(self, o: Any) -> Any: ...
        def __rpow__(self, o: Any) -> Any: ...
        def __ipow__(self, o: Any) -> Any: ...
        def __matmul__(self, o: Any) -> Any: ...
        def __rmatmul__(self, o: Any) -> Any: ...
        def __imatmul__(self, o: Any) -> Any: ...
        def __and__(self, o: Any) -> Any: ...
        def __rand__(self, o: Any) -> Any: ...
        def __iand__(self, o: Any) -> Any: ...
        def __or__(self, o: Any) -> Any: ...
        def __ror__(self, o: Any) -> Any: ...
        def __ior__(self, o: Any) -> Any: ...
        def __xor__(self, o: Any) -> Any: ...
        def __rxor__(self, o: Any) -> Any: ...
        def __ixor__(self, o: Any) -> Any: ...
        def __lshift__(self, o: Any) -> Any: ...
        def __rlshift__(self, o: Any) -> Any: ...
        def __ilshift__(self, o: Any) -> Any: ...
        def __rshift__(self, o: Any) -> Any: ...
        def __rrshift__(self, o: Any) -> Any: ...
        def __irshift__(self, o: Any) -> Any: ...
        def __lt__(self, o: Any) -> Any: ...
        def __le__(self, o: Any) -> Any: ...
        def __gt__(self, o: Any) -> Any: ...
        def __ge__(self, o: Any) -> Any: ...
        def __eq__(self, o: Any) -> Any: ...  # type: ignore[override]
        def __ne__(self, o: Any) -> Any: ...  # type: ignore[override]
        def __neg__(self) -> Any: ...
        def __pos__(self) -> Any: ...
        def __invert__(self) -> Any: ...
        def __abs__(self) -> Any: ...
        def __getitem__(self, key: Any) -> Any: ...
        def __setitem__(self, key: Any, value: Any) -> None: ...

    # -- methods: computed by sbpmpi.ops ---------------------------------------------------
    def _op(self, name: str, *args: Any, **kw: Any) -> Any:
        return getattr(_ABOVE.ops, name)(*args, **kw)

    @property
    def T(self) -> Any:
        return self._op("transpose", self)

    def transpose(self, *axes: Any) -> Any: return self._op("transpose", self, *axes)
    def reshape(self, *shape: Any) -> Any: return self._op("reshape", self, *shape)
    def astype(self, dtype: Any) -> Any: return self._op("astype", self, dtype)
    def sum(self, dim: Any = None, keepdim: bool = False) -> Any:
        return self._op("sum", self, dim, keepdim=keepdim)
    def mean(self, dim: Any = None, keepdim: bool = False) -> Any:
        return self._op("mean", self, dim, keepdim=keepdim)
    def max(self, dim: Any = None, keepdim: bool = False) -> Any:
        return self._op("max", self, dim, keepdim=keepdim)
    def min(self, dim: Any = None, keepdim: bool = False) -> Any:
        return self._op("min", self, dim, keepdim=keepdim)
    def matmul(self, o: Any) -> Any: return self._op("matmul", self, o)
    def exp(self) -> Any: return self._op("exp", self)
    def log(self) -> Any: return self._op("log", self)
    def sqrt(self) -> Any: return self._op("sqrt", self)
    def tanh(self) -> Any: return self._op("tanh", self)
    def relu(self) -> Any: return self._op("relu", self)
    def sigmoid(self) -> Any: return self._op("sigmoid", self)
    def softmax(self, dim: int = -1) -> Any: return self._op("softmax", self, dim)
    def log_softmax(self, dim: int = -1) -> Any: return self._op("log_softmax", self, dim)

    # -- the Array API (sbpmpi.array_api) --------------------------------------------
    def __array_namespace__(self, *, api_version: str | None = None) -> Any:
        """The namespace ``sbpmpi.array_api`` (ValueError for a revision it does not
        implement)."""
        return _xp().namespace_for(api_version)

    @property
    def device(self) -> Placement:
        """The Array API's device: the placement."""
        return self._layout.placement

    def to_device(self, device: Placement, /, *, stream: Any = None) -> GlobalTensor:
        """This array on another placement (collective when it moves)."""
        return _xp().to_device(self, device, stream)  # type: ignore[no-any-return]

    def __dlpack__(self, *, stream: Any = None, max_version: Any = None, dl_device: Any = None,
                   copy: Any = None) -> Any:
        """A DLPack capsule: this rank's shard where it is the whole array, else a gathered
        copy (collective; ``BufferError`` with ``copy=False``)."""
        return _xp().array_dlpack(self, stream=stream, max_version=max_version,
                                  dl_device=dl_device, copy=copy)

    def __dlpack_device__(self) -> tuple[Any, int]:
        """The DLPack device of this rank's shard: ``(1, 0)`` on CPU."""
        return _xp().array_dlpack_device(self)  # type: ignore[no-any-return]

    def argmax(self, axis: int | None = None, keepdims: bool = False) -> Any:
        """Index of the largest element (along ``axis``): NumPy's method, the array API's
        ``argmax``."""
        return _xp().argmax(self, axis=axis, keepdims=keepdims)

    def argmin(self, axis: int | None = None, keepdims: bool = False) -> Any:
        """Index of the smallest element (along ``axis``): NumPy's method, the array API's
        ``argmin``."""
        return _xp().argmin(self, axis=axis, keepdims=keepdims)

    @property
    def mT(self) -> Any:
        """The last two axes swapped."""
        return _xp().matrix_transpose(self)


def _accept_keyword_aliases(cls: type) -> None:
    """Give each method of ``cls`` with a ``dim``/``keepdim`` (or ``axis``/``keepdims``)
    parameter the other spelling too (:mod:`sbpmpi.core.keywords`): ``x.mean(axis=0)``,
    ``x.sum(0, keepdims=True)`` and ``x.argmax(dim=1)`` as in PyTorch."""
    for name, fn in list(vars(cls).items()):
        code = getattr(fn, "__code__", None)
        if code is not None and not ALIASES.keys().isdisjoint(code.co_varnames):
            setattr(cls, name, accepting_aliases(fn))


_accept_keyword_aliases(GlobalTensor)
