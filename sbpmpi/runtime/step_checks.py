"""What a step's consistency check describes: its readable text, the 63-bit fingerprint
the check compares and the digest a local step folds in (:class:`StepCheck`), made once
per step and cached for repeated steps (:func:`step_check`; :func:`conversion_check` for
``x.to_global``, whose SBP is normalised against the tensor and the mesh first,
:func:`conversion_meta`). Pure functions of metadata: :mod:`.consistency` decides when
and over which ranks they are compared.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np

from ..comm import agreement
from ..core.layout import Layout
from ..core.placement import Placement
from ..core.sbp import Broadcast, Partial, Split, normalize_nd_sbp

__all__ = [
    "meta_text",
    "fingerprint",
    "StepCheck",
    "step_check",
    "conversion_check",
    "clear_step_checks",
    "conversion_meta",
    "ConversionMeta",
    "TO_GLOBAL",
]


def meta_text(obj: Any) -> str:
    """A readable description of ``obj`` that is the same string on every rank for equal values.

    Global tensors are described by their metadata (shape, dtype, placement, SBP), local
    arrays by shape and dtype; never by their data. Objects whose ``repr`` holds a memory
    address are described by their type name only.
    """
    if obj is None or isinstance(obj, (bool, int, float, complex, str, bytes, slice)):
        return repr(obj)
    layout = getattr(obj, "layout", None)
    if isinstance(layout, Layout) and not isinstance(obj, type):  # a GlobalTensor
        return _describe_tensor(layout, obj.dtype)
    if isinstance(obj, (Split, Broadcast, Partial)):
        return str(obj)
    if isinstance(obj, Placement):
        return _describe_placement(obj)
    if isinstance(obj, Layout):
        return _describe_layout(obj)
    if isinstance(obj, np.dtype):
        return str(obj)
    if isinstance(obj, type) and issubclass(obj, np.generic):
        return str(np.dtype(obj))
    if isinstance(obj, np.generic):
        return repr(obj.item())
    if isinstance(obj, tuple):
        inner = ", ".join(meta_text(o) for o in obj)
        return f"({inner}{',' if len(obj) == 1 else ''})"
    if isinstance(obj, list):
        return "[" + ", ".join(meta_text(o) for o in obj) + "]"
    if isinstance(obj, Mapping):
        items = sorted((meta_text(k), meta_text(v)) for k, v in obj.items())
        return "{" + ", ".join(f"{k}: {v}" for k, v in items) + "}"
    if obj is Ellipsis:
        return "..."
    if hasattr(obj, "shape") and hasattr(obj, "dtype"):
        return f"array(shape={tuple(int(n) for n in obj.shape)}, dtype={np.dtype(obj.dtype)})"
    if isinstance(obj, type):
        return obj.__qualname__
    text = repr(obj)
    if " at 0x" in text:
        return f"<{type(obj).__qualname__}>"
    return text


@functools.lru_cache(maxsize=256)
def _describe_placement(pl: Placement) -> str:
    return f"{pl.type}{pl.ranks.tolist()}"


@functools.lru_cache(maxsize=256)
def _describe_layout(layout: Layout) -> str:
    sbp = ", ".join(str(s) for s in layout.sbp)
    return f"layout({layout.shape}, sbp=({sbp}), placement={_describe_placement(layout.placement)})"


@functools.lru_cache(maxsize=256)
def _describe_tensor(layout: Layout, dtype: np.dtype) -> str:
    sbp = ", ".join(str(s) for s in layout.sbp)
    return (f"tensor({layout.shape}, {dtype}, sbp=({sbp}), "
            f"placement={_describe_placement(layout.placement)})")


def fingerprint(meta: Any) -> int:
    """A 63-bit non-negative integer hash of ``meta_text(meta)``, equal across processes
    (:func:`sbpmpi.comm.agreement.fingerprint_of`)."""
    return agreement.fingerprint_of(meta_text(meta))


class StepCheck(NamedTuple):
    """A step as the consistency check describes it, made once per distinct step."""

    #: ``what(meta_text of each argument)``, the text a mismatch message shows
    text: str
    #: the fingerprint the check compares when no local steps are pending
    fingerprint: int
    #: the 8-byte digest a local step folds into the running hash (:func:`note_step`)
    digest: bytes


def _new_check(what: str, meta: Any) -> StepCheck:
    args = meta if isinstance(meta, tuple) else (meta,)
    text = f"{what}({', '.join(meta_text(a) for a in args)})"
    digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
    # the fingerprint of ``text`` with an empty seed (agreement.fingerprint_of), from its digest
    return StepCheck(text, int.from_bytes(digest, "little") & agreement.MASK63, digest)


# A repeated step (x.to_global in a loop, an op on the same layouts) reuses its check:
# describing and hashing cost tens of microseconds once a large conversion has evicted the
# caches. The one cache of step checks; keys from _text_key only.
_CACHE_SIZE = 4096
_CHECKS: dict[tuple[Any, ...], StepCheck] = {}
_SBP_TYPES = (Split, Broadcast, Partial)
_PLAIN = (str, Placement, Layout, *_SBP_TYPES)
_CONVERSION = object()  # keys conversion_check's entries apart from step_check's


def _cached_check(key: tuple[Any, ...] | None, what: str, meta: Any) -> StepCheck:
    if key is not None:
        hit = _CHECKS.get(key)
        if hit is not None:
            return hit
    check = _new_check(what, meta)
    if key is not None:
        if len(_CHECKS) >= _CACHE_SIZE:
            _CHECKS.clear()
        _CHECKS[key] = check
    return check


def step_check(what: str, meta: Any = ()) -> StepCheck:
    """The :class:`StepCheck` of the step ``(what, meta)``, as :func:`check_collective`
    describes it (no communication; cached where the arguments allow)."""
    args = meta if isinstance(meta, tuple) else (meta,)
    return _cached_check(_text_key(what, args), what, meta)


def conversion_check(x: Any, placement: Any, sbp: Any) -> StepCheck:
    """The :class:`StepCheck` of ``x.to_global(placement, sbp)``: its metadata as
    :func:`conversion_meta` normalises it (no communication; cached for repeated
    arguments)."""
    # the key of _text_key, made directly (this runs on every x.to_global)
    t = type(sbp)
    if t is list or t is tuple:
        keyed = all(type(s) in _SBP_TYPES for s in sbp)
        if keyed:
            sbp = tuple(sbp)  # a list is the same request as the tuple, described alike
    else:
        keyed = sbp is None or t in _SBP_TYPES
    layout = getattr(x, "layout", None)
    key = None
    if keyed and (placement is None or type(placement) is Placement) \
            and isinstance(layout, Layout) and not isinstance(x, type):
        key = (_CONVERSION, layout, x.dtype, placement, sbp)
        hit = _CHECKS.get(key)
        if hit is not None:
            return hit
    return _cached_check(key, TO_GLOBAL, conversion_meta(x, placement, sbp))


def clear_step_checks() -> None:
    """Forget the cached step checks (they are described again on their next use).

    A test hook as much as anything: a fresh description must equal the cached one.
    """
    _CHECKS.clear()


#: What the consistency check of ``x.to_global`` calls the step.
TO_GLOBAL = "x.to_global"


def _text_key(what: str, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """A key under which ``args`` always describe alike, or None (then nothing is cached).

    Only values whose equality implies an equal description take part: global tensors
    (by layout and dtype), placements, layouts, SBPs (alone or in a tuple), strings and
    None. Anything else (numbers, where ``1 == True`` but ``"1" != "True"``) is described
    afresh.
    """
    key: list[Any] = [what]
    for a in args:
        layout = getattr(a, "layout", None)
        if isinstance(layout, Layout) and not isinstance(a, type):
            key.append((Layout, layout, a.dtype))
        elif a is None or type(a) in _PLAIN:
            key.append((type(a), a))
        elif type(a) is tuple and all(type(s) in _SBP_TYPES for s in a):
            key.append((tuple, a))
        else:
            return None
    return tuple(key)


class ConversionMeta(NamedTuple):
    """The arguments of ``x.to_global`` as its check describes them (a tuple, so that the
    check describes each in turn)."""

    x: Any
    placement: Any
    sbp: Any


def conversion_meta(x: Any, placement: Any, sbp: Any) -> ConversionMeta:
    """The :class:`ConversionMeta` of ``x.to_global(placement, sbp)``.

    The SBP is normalised against ``x``'s ndim and the mesh (one entry per mesh axis,
    split dims made non-negative), so ranks that pass ``split(-1)`` and ``split(1)`` for a
    2-d tensor (or ``split(0)`` and ``[split(0)]``) describe the same conversion alike, as
    comm's checked mode, which compares the layouts, does. An SBP that does not normalise
    is described as given: the conversion refuses it later, on every rank.
    """
    if sbp is None:
        return ConversionMeta(x, placement, sbp)
    pl = placement if placement is not None else x.placement
    try:
        key = tuple(sbp) if isinstance(sbp, list) else sbp
        return ConversionMeta(x, placement, _normalized(key, pl.ndim, x.ndim))
    except (TypeError, ValueError, AttributeError):
        return ConversionMeta(x, placement, sbp)


@functools.lru_cache(maxsize=256)
def _normalized(sbp: Any, mesh_ndim: int, ndim: int) -> tuple[Any, ...]:
    return normalize_nd_sbp(sbp, mesh_ndim, ndim)
