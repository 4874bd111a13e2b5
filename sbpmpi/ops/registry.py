"""The op registry: every op once, with every door it can be called by.

One :class:`OpEntry` per op (like JAX's one operator table and PyTorch's op lists): its
name, its :class:`~sbpmpi.ops.op.GlobalOp` (builder, local kernel, signature table), its
kind, the NumPy ufuncs (NEP 13) and functions (NEP 18) it answers to, its names in the
array API standard, the Python operators of ``GlobalTensor`` it implements, whether it is
public as ``sm.<name>`` and whether it has a gradient. Everything else is derived from
:data:`REGISTRY`: ``sm.ops.OPS`` and ``sm.ops.__all__``, the ``sm.<name>`` table, the
NumPy protocols' tables (:mod:`sbpmpi.protocols`), ``GlobalTensor``'s operators
(:mod:`.operators`), the array API's elementwise functions and ``sm.explain``.

Backward rules live above ops, in :mod:`sbpmpi.autograd.rules`, which attaches each to
its entry once at import (:func:`attach_backward`, refusing a second one); an entry's
:attr:`~OpEntry.backward` reads it.

Where a new op goes: its builder and table next to its kind (a pointwise op is a row of
``elementwise.POINTWISE``, which makes its entry); a line in :func:`_entries` for any
other; its backward rule in ``autograd/rules.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

import numpy as np

from . import elementwise, linalg, losses, reduction, shape, triangle
from .activation import gelu, gelu_backward
from .array_index import getitem_arrays
from .embedding import embedding, embedding_backward
from .normalization import normalize, normalize_backward
from .op import GlobalOp
from .setitem import setitem
from .signature import Signature

__all__ = ["Kind", "KINDS", "OpEntry", "REGISTRY", "OPS", "PUBLIC", "OperatorMethod",
           "OPERATOR_METHODS", "attach_backward", "backward_rule", "entry_for_ufunc",
           "entry_for_function", "entry_for_array_api", "entry_for_dunder"]

Kind = Literal["pointwise", "reduction", "linalg", "shape", "index", "normalization",
               "embedding", "loss", "gradient", "step"]
#: What each kind holds.
KINDS: dict[str, str] = {
    "pointwise": "elementwise ops of one or more operands, broadcast together",
    "reduction": "reductions over dims (sum, mean, max, min, var) and softmax",
    "linalg": "matrix products",
    "shape": "ops that move or select elements (transpose, reshape, cat, astype, tril)",
    "index": "indexing: getitem with basic or array keys, setitem, scatter",
    "normalization": "normalization over the last dim",
    "embedding": "embedding lookup",
    "loss": "fused losses",
    "gradient": "the backward kernels of fused ops (recorded by no rule of their own)",
    "step": "steps of an op that runs as several (softmax and cross-entropy on a split dim)",
}


class OperatorMethod(NamedTuple):
    """How a Python operator method of ``GlobalTensor`` calls its op."""

    form: Literal["forward", "reflected", "inplace", "unary", "getitem", "setitem"]
    symbol: str  # for messages: "+", "//", "@", ...


def _operator_methods() -> dict[str, OperatorMethod]:
    """Python's data model: operator method name -> how it calls its op."""
    binary = {"+": "add", "-": "sub", "*": "mul", "/": "truediv", "//": "floordiv",
              "%": "mod", "**": "pow", "@": "matmul", "&": "and", "|": "or", "^": "xor",
              "<<": "lshift", ">>": "rshift"}
    out: dict[str, OperatorMethod] = {}
    for sym, stem in binary.items():
        out[f"__{stem}__"] = OperatorMethod("forward", sym)
        out[f"__r{stem}__"] = OperatorMethod("reflected", sym)
        out[f"__i{stem}__"] = OperatorMethod("inplace", sym)
    for sym, stem in {"==": "eq", "!=": "ne", "<": "lt", "<=": "le", ">": "gt",
                      ">=": "ge"}.items():
        out[f"__{stem}__"] = OperatorMethod("forward", sym)  # Python reflects them itself
    for sym, stem in {"-": "neg", "+": "pos", "~": "invert", "abs": "abs"}.items():
        out[f"__{stem}__"] = OperatorMethod("unary", sym)
    out["__getitem__"] = OperatorMethod("getitem", "[]")
    out["__setitem__"] = OperatorMethod("setitem", "[]=")
    return out


#: Every operator method of Python's data model an op may implement.
OPERATOR_METHODS: dict[str, OperatorMethod] = _operator_methods()


def _dunders(symbol: str | None, arity: int) -> tuple[str, ...]:
    """The operator methods of ``symbol`` for an op of ``arity`` operands."""
    if symbol is None:
        return ()
    forms = ("unary",) if arity == 1 else ("forward", "reflected", "inplace")
    return tuple(name for name, m in OPERATOR_METHODS.items()
                 if m.symbol == symbol and m.form in forms)


@dataclass(frozen=True)
class OpEntry:
    """One op and every door it can be called by.

    Attributes
    ----------
    name : str
        ``sm.ops.<name>``; also ``sm.<name>`` when ``public``.
    op : GlobalOp
        Builder, local kernel and signature table (``op.table``).
    kind : Kind
        Its family (:data:`KINDS`).
    ufuncs, functions : tuple of str
        The NumPy ufuncs (``np.<name>``, NEP 13) and functions (NEP 18) it answers to.
    array_api : tuple of str
        Its names in ``sm.array_api``.
    dunders : tuple of str
        The ``GlobalTensor`` operator methods it implements (:data:`OPERATOR_METHODS`).
    public : bool
        Whether it is ``sm.<name>``.
    differentiable : bool
        Whether it has a backward rule (``autograd`` attaches it; a test checks both ways).
    """

    name: str
    op: GlobalOp
    kind: Kind
    ufuncs: tuple[str, ...] = ()
    functions: tuple[str, ...] = ()
    array_api: tuple[str, ...] = ()
    dunders: tuple[str, ...] = ()
    public: bool = True
    differentiable: bool = True

    def __post_init__(self) -> None:
        if self.op.name != self.name:
            raise ValueError(f"op registry: entry {self.name!r} holds the op {self.op.name!r}")
        if self.kind not in KINDS:
            raise ValueError(f"op registry: {self.name}: kind {self.kind!r} is not one of "
                             f"{sorted(KINDS)}")
        for u in self.ufuncs:
            if not isinstance(getattr(np, u, None), np.ufunc):
                raise ValueError(f"op registry: {self.name}: np.{u} is not a NumPy ufunc")
        unknown = [d for d in self.dunders if d not in OPERATOR_METHODS]
        if unknown:
            raise ValueError(f"op registry: {self.name}: {unknown} are not operator methods")

    @property
    def table(self) -> tuple[Signature, ...]:
        """The op's signature table (``op.table``)."""
        return self.op.table  # type: ignore[no-any-return]

    @property
    def backward(self) -> Callable[..., Any] | None:
        """The backward rule autograd attached, None before (or for none)."""
        return _BACKWARD.get(self.name)


def _numpy_doors(name: str | None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(ufuncs, functions): ``np.<name>`` on the side it is, none if NumPy lacks it."""
    if name is None or not hasattr(np, name):
        return (), ()
    return ((name,), ()) if isinstance(getattr(np, name), np.ufunc) else ((), (name,))


def _pointwise_entries() -> Iterable[OpEntry]:
    for name, row in elementwise.POINTWISE.items():
        ufuncs, functions = _numpy_doors(row.numpy)
        arity = elementwise.LINEARITY[row.family].arity
        yield OpEntry(name, elementwise.POINTWISE_OPS[name], "pointwise", ufuncs, functions,
                      (row.array_api,) if row.array_api else (),
                      _dunders(row.operator, arity), differentiable=row.grad)


def _has(*names: str) -> tuple[str, ...]:
    """The NumPy functions of ``names`` this NumPy has (``np.concat``: NumPy >= 2.0)."""
    return tuple(n for n in names if hasattr(np, n))


def _entries() -> Iterable[OpEntry]:
    """Every op but the pointwise ones (those come from ``elementwise.POINTWISE``)."""
    r = reduction
    yield from _pointwise_entries()
    yield OpEntry("clip", elementwise.clip, "pointwise", array_api=("clip",))
    # -- reductions
    yield OpEntry("sum", r.sum_, "reduction", functions=("sum",))
    yield OpEntry("mean", r.mean, "reduction", functions=("mean",))
    yield OpEntry("max", r.max_, "reduction", functions=_has("max", "amax"))
    yield OpEntry("min", r.min_, "reduction", functions=_has("min", "amin"))
    yield OpEntry("var", r.var, "reduction", functions=("var",))
    yield OpEntry("softmax", r.softmax, "reduction")
    yield OpEntry("log_softmax", r.log_softmax, "reduction")
    yield OpEntry("sum_exp", r.sum_exp, "step", public=False, differentiable=False)
    yield OpEntry("softmax_finish", r.softmax_finish, "step", public=False,
                  differentiable=False)
    # -- matrix products
    yield OpEntry("matmul", linalg.matmul, "linalg", ufuncs=("matmul",),
                  dunders=_dunders("@", 2))
    yield OpEntry("matmul_tn", linalg.matmul_tn, "linalg", public=False, differentiable=False)
    yield OpEntry("matmul_nt", linalg.matmul_nt, "linalg", public=False, differentiable=False)
    # -- moving and selecting elements
    yield OpEntry("transpose", shape.transpose, "shape", functions=("transpose",))
    yield OpEntry("reshape", shape.reshape, "shape", functions=("reshape",))
    yield OpEntry("astype", shape.astype, "shape", functions=_has("astype"))
    yield OpEntry("cat", shape.cat, "shape", functions=_has("concatenate", "concat"))
    yield OpEntry("tril", triangle.tril, "shape")
    yield OpEntry("triu", triangle.triu, "shape")
    # -- indexing
    yield OpEntry("getitem", shape.getitem, "index", dunders=("__getitem__",), public=False)
    yield OpEntry("getitem_arrays", getitem_arrays, "index", public=False,
                  differentiable=False)
    yield OpEntry("setitem", setitem, "index", dunders=("__setitem__",), public=False,
                  differentiable=False)
    yield OpEntry("scatter", shape.scatter, "index", public=False, differentiable=False)
    # -- layers' fused cores and their gradients
    yield OpEntry("gelu", gelu, "pointwise", public=False)
    yield OpEntry("gelu_backward", gelu_backward, "gradient", public=False,
                  differentiable=False)
    yield OpEntry("normalize", normalize, "normalization", public=False)
    yield OpEntry("normalize_backward", normalize_backward, "gradient",
                  public=False, differentiable=False)
    yield OpEntry("embedding", embedding, "embedding", public=False)
    yield OpEntry("embedding_backward", embedding_backward, "gradient",
                  public=False, differentiable=False)
    # -- losses (sm.nn.cross_entropy checks the arguments and picks the path)
    yield OpEntry("cross_entropy", losses.cross_entropy, "loss", public=False)
    yield OpEntry("cross_entropy_grad", losses.cross_entropy_grad, "gradient", public=False,
                  differentiable=False)
    yield OpEntry("vocab_stats", losses.vocab_stats, "step", public=False,
                  differentiable=False)
    yield OpEntry("vocab_loss", losses.vocab_loss, "step", public=False, differentiable=False)
    yield OpEntry("vocab_grad", losses.vocab_grad, "gradient", public=False,
                  differentiable=False)


def _registry(entries: Iterable[OpEntry]) -> dict[str, OpEntry]:
    """The entries by name; an op registered twice, or a door (a NumPy name, an array API
    name, an operator method) claimed by two ops, is an error."""
    out: dict[str, OpEntry] = {}
    doors: dict[tuple[str, str], str] = {}
    for e in entries:
        if e.name in out:
            raise ValueError(f"op registry: {e.name!r} is registered twice")
        out[e.name] = e
        for kind, names in (("ufunc", e.ufuncs), ("function", e.functions),
                            ("array_api", e.array_api), ("dunder", e.dunders)):
            for n in names:
                other = doors.setdefault((kind, n), e.name)
                if other != e.name:
                    raise ValueError(f"op registry: {kind} {n!r} is claimed by {other!r} and "
                                     f"{e.name!r}")
    return out


#: Every op by name, with its doors.
REGISTRY: Mapping[str, OpEntry] = _registry(_entries())
#: Every op by name: ``name -> GlobalOp`` (the registry's ops).
OPS: dict[str, GlobalOp] = {name: e.op for name, e in REGISTRY.items()}
#: The ops that are ``sm.<name>``.
PUBLIC: tuple[str, ...] = tuple(name for name, e in REGISTRY.items() if e.public)

_UFUNC = {u: e for e in REGISTRY.values() for u in e.ufuncs}
_FUNCTION = {f: e for e in REGISTRY.values() for f in e.functions}
_ARRAY_API = {a: e for e in REGISTRY.values() for a in e.array_api}
_DUNDER = {d: e for e in REGISTRY.values() for d in e.dunders}


def entry_for_ufunc(name: str) -> OpEntry | None:
    """The entry answering ``np.<name>`` (a ufunc), if any."""
    return _UFUNC.get(name)


def entry_for_function(name: str) -> OpEntry | None:
    """The entry answering ``np.<name>`` (a function, NEP 18), if any."""
    return _FUNCTION.get(name)


def entry_for_array_api(name: str) -> OpEntry | None:
    """The entry of the array API's ``<name>``, if any."""
    return _ARRAY_API.get(name)


def entry_for_dunder(name: str) -> OpEntry | None:
    """The entry implementing ``GlobalTensor.<name>``, if any."""
    return _DUNDER.get(name)


# ---- backward rules, attached from above ------------------------------------------------------

_BACKWARD: dict[str, Callable[..., Any]] = {}


def attach_backward(name: str, rule: Callable[..., Any]) -> None:
    """Attach the backward rule of op ``name`` (autograd does, once at import).

    Raises
    ------
    ValueError
        When ``name`` is not a registered op, is registered without a gradient, or already
        has another rule.
    """
    entry = REGISTRY.get(name)
    if entry is None:
        raise ValueError(f"attach_backward: {name!r} is not a registered op (a tape node that "
                         f"is not an op has its rule in autograd.rules.TAPE_ONLY_RULES)")
    if not entry.differentiable:
        raise ValueError(f"attach_backward: op {name!r} is registered as not differentiable")
    old = _BACKWARD.get(name)
    if old is not None and old is not rule:
        raise ValueError(f"attach_backward: op {name!r} already has a backward rule")
    _BACKWARD[name] = rule


def backward_rule(name: str) -> Callable[..., Any] | None:
    """The backward rule attached to op ``name`` (None if none)."""
    return _BACKWARD.get(name)
