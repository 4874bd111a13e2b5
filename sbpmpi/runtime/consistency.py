"""Consistency checks and collective decisions: every rank takes the same branch.

This module is the policy (what to describe, when to check, folding local steps into the
next check, statistics, error texts); the exchanges themselves are
:mod:`sbpmpi.comm.agreement`'s, the one mechanism that comm's checked mode uses too.

Ops and conversions on global tensors are collective: every rank must call the
same one, on tensors of the same shape, dtype, SBP and placement, at the same
step. :func:`check_collective` verifies that before any data moves: each rank
hashes a readable description of the step to a 63-bit fingerprint, and one
all-reduce of two integers (max of ``fp`` and of ``-fp``) tells every rank whether
all agree. Only when they do not are the descriptions gathered, and every rank
raises the same :class:`~sbpmpi.errors.CollectiveMismatchError` naming each side.

Steps that do not communicate (elementwise ops on matching layouts) need no exchange
of their own: :func:`note_step` folds their fingerprint into a running hash that the
next check on the world compares, so a divergence surfaces at the next step that
communicates, with the recent local steps of each rank in the message.

The setting ``check`` (``SBPMPI_CHECK=0``) turns the checks off (benchmarks); ``debug``
(``SBPMPI_DEBUG=1``) adds :func:`check_broadcast_shards`, which verifies that the shards
along broadcast mesh axes are really identical. ``sm.config.update(check=..., debug=...)``
changes them at run time (on every rank alike); see :mod:`sbpmpi.config`.

A conversion's SBP is described after normalising it against the tensor's ndim and the
mesh (:func:`conversion_meta`), so ``split(-1)`` and ``split(1)`` of a 2-d tensor agree.

:func:`step_check` describes a step once: its text, the fingerprint the check
compares and the digest a local step folds in, cached for repeated steps (one cache,
keyed only by values whose equality implies an equal text); :func:`conversion_check`
does the same for ``x.to_global``. :func:`agree_on_conversion` is comm's checked mode's
own agreement on a conversion, made by :func:`sbpmpi.runtime.redistribute` when no
consistency check covered it. The mismatch message itself is
:func:`sbpmpi.comm.mismatch.mismatch_message`'s.

The collective decisions on local verdicts (``all_ok``, ``raise_if_any``,
``decide_on_root``, ``collective_errors``) are :mod:`sbpmpi.comm.agreement`'s.

These exchanges carry metadata only (fingerprints, flags, short strings), never
tensor data; ``sm.trace`` keeps them apart from the comm calls, in ``Trace.agreements``.
"""

from __future__ import annotations

import collections
import functools
import hashlib
from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np

from .. import config
from ..comm import agreement
from ..comm.group import WORLD, Group
from ..comm.mismatch import SAME_CALLS, mismatch_message
from ..core.layout import Layout
from ..core.placement import Placement
from ..core.sbp import Broadcast, Partial, Split, normalize_nd_sbp
from ..errors import CollectiveMismatchError

__all__ = [
    "check_enabled",
    "debug_enabled",
    "meta_text",
    "fingerprint",
    "StepCheck",
    "step_check",
    "conversion_check",
    "clear_step_checks",
    "conversion_meta",
    "ConversionMeta",
    "ConversionSig",
    "ShardDigest",
    "check_collective",
    "check_step",
    "note_step",
    "note_known_step",
    "agree_on_conversion",
    "check_broadcast_shards",
    "stats",
]

_stats = {"checks": 0, "exchanges": 0, "shard_checks": 0}
_CHECK, _DEBUG = config.check, config.debug  # read on every step


def check_enabled() -> bool:
    """True unless the checks are off (the setting ``check``, ``SBPMPI_CHECK=0``)."""
    return _CHECK.value


def debug_enabled() -> bool:
    """True in debug mode (the setting ``debug``, ``SBPMPI_DEBUG=1``): also check that
    broadcast shards are identical."""
    return _DEBUG.value


def stats() -> dict[str, int]:
    """Counters: ``checks`` (calls of check_collective while on), ``exchanges`` (those that
    communicated), ``shard_checks`` (calls of check_broadcast_shards in debug mode)."""
    return dict(_stats)


# -- descriptions and fingerprints ------------------------------------------------------------

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


def _fingerprint(check: StepCheck, seed: bytes) -> int:
    """The fingerprint of ``check``'s text after the local steps hashed into ``seed``."""
    return check.fingerprint if seed == _NO_STEPS else \
        agreement.fingerprint_of(check.text, seed)


_NO_STEPS = bytes(8)


class _Pending:
    """The local steps noted since the last world check: their running hash and number
    (the texts of the last few are in ``_recent``)."""

    __slots__ = ("digest", "count")

    def __init__(self) -> None:
        self.digest = _NO_STEPS
        self.count = 0


_PENDING = _Pending()
_recent: collections.deque[str] = collections.deque(maxlen=6)


def note_step(what: str, meta: Any = ()) -> None:
    """Record a step that does not communicate; the next world check verifies it too.

    For ops that run on local shards only: they cannot deadlock, but ranks that disagree
    would compute different values. Instead of an exchange per op, the step's fingerprint
    is folded into a running hash that the next :func:`check_collective` on the world
    compares, so a divergence is reported at the next step that communicates, naming
    the recent local steps of each rank. Costs a few microseconds, no communication;
    with ``SBPMPI_DEBUG=1`` it is a full :func:`check_collective` (collective).
    """
    if not check_enabled():
        return
    if debug_enabled():  # strict: every step is checked at once
        check_collective(what, meta)
        return
    note_known_step(step_check(what, meta))


def note_known_step(step: StepCheck) -> None:
    """Fold a local step whose :func:`step_check` the caller made once and kept (the ops'
    dispatch fast path); the caller checks that checking is on and debug mode off. Same
    effect as :func:`note_step` with that step."""
    p = _PENDING
    p.digest = hashlib.blake2b(p.digest + step.digest, digest_size=8).digest()
    _recent.append(step.text)
    p.count += 1


def _reset_pending() -> None:
    _PENDING.digest, _PENDING.count = _NO_STEPS, 0
    _recent.clear()


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


def check_collective(what: str, meta: Any = (), group: Group | None = None,
                     force: bool = False) -> bool:
    """Raise the same error on every rank of ``group`` unless all passed equal ``(what, meta)``.

    Parameters
    ----------
    what : str
        The step, e.g. ``"to_global"``, ``"matmul"``, ``"box"``.
    meta : object
        Its global metadata (tensors, placements, SBPs, shapes, dtypes, scalars); it must be
        equal on every rank in a correct program, so no local shard shapes.
    group : comm.Group, optional
        The ranks that take part (the world by default). Ranks outside do nothing.
    force : bool
        Check even when ``SBPMPI_CHECK=0`` (comm's checked mode checks a conversion as a
        whole).

    Returns
    -------
    bool
        True when the ranks of the group agreed (checked, or a group of one rank); False
        when the check is off or this rank is outside the group.

    Raises
    ------
    CollectiveMismatchError
        On every rank of the group, naming what each rank called.
    """
    if not (_CHECK.value or force):
        return False
    _stats["checks"] += 1
    if group is None:
        world, n = True, len(WORLD.ranks)
    elif group.comm is None:
        return False
    else:
        world, n = agreement.covers_world(group), len(group.ranks)
    if n == 1:
        return True
    step = step_check(what, meta)
    return _agree(what, step.text, _fingerprint(step, _PENDING.digest if world else _NO_STEPS),
                  group, world)


def check_step(what: str, step: StepCheck) -> bool:
    """:func:`check_collective` on the world for a step whose :func:`step_check` (or
    :func:`conversion_check`) the caller made: the same exchange and result, without
    describing the step again."""
    if not _CHECK.value:
        return False
    _stats["checks"] += 1
    if len(WORLD.ranks) == 1:
        return True
    return _agree(what, step.text, _fingerprint(step, _PENDING.digest), None, True)


def _agree(what: str, text: str, fp: int, group: Group | None, world: bool) -> bool:
    """The exchange of :func:`check_collective`: True when the ranks of ``group`` agree."""
    _stats["exchanges"] += 1
    texts = agreement.agree(fp, what, text, lambda: (text + _local_steps(world), None), group)
    if world:
        _reset_pending()
    if texts is None:
        return True
    raise CollectiveMismatchError(
        mismatch_message([t for t, _ in texts], agreement.members(group)[1], SAME_CALLS))


class ConversionSig(NamedTuple):
    """What checked mode compares of a conversion: the layouts' texts and the dtype's."""

    src: str
    dst: str
    dtype: str


def agree_on_conversion(src: Layout, dst: Layout, dtype: np.dtype) -> None:
    """Comm's checked mode: every rank of the world must ask for the same conversion (one
    agreement exchange), for a conversion no consistency check covered.

    Raises
    ------
    ValueError
        On every rank, naming the conversion of rank 0 and of the first rank that differs.
    CollectiveMismatchError
        On every rank, when some rank is in another kind of step.
    """
    sig = ConversionSig(str(src), str(dst), dtype.str)
    text = f"box({sig.src} -> {sig.dst}, {dtype})"
    sigs = agreement.agree(agreement.fingerprint_of(repr(sig)), "box", text,
                           lambda: (text, sig))
    if sigs is None:
        return
    texts = [t for t, _ in sigs]
    details = [d for _, d in sigs]
    if not all(isinstance(d, ConversionSig) for d in details):  # another kind of step
        raise CollectiveMismatchError(mismatch_message(texts, agreement.members(None)[1]))
    first = details[0]
    for r, s in enumerate(details):
        if s != first:
            raise ValueError(f"box: ranks disagree on the conversion: rank 0 converts "
                             f"{first.src} to {first.dst} ({np.dtype(first.dtype)}) but rank "
                             f"{r} converts {s.src} to {s.dst} ({np.dtype(s.dtype)})")


def _local_steps(world: bool) -> str:
    """`` (after N local steps: ...)``, what this rank did since the last world check."""
    if not (world and _PENDING.count):
        return ""
    n = _PENDING.count
    return (f" (after {n} local step{'s' if n > 1 else ''}"
            f"{', the last: ' if n > len(_recent) else ': '}"
            + ", ".join(_recent) + ")")


def _shard_hash(local: Any) -> int:
    from .. import backend

    a = np.ascontiguousarray(backend.asnumpy(local))
    h = hashlib.blake2b(digest_size=8)
    h.update(str((a.shape, a.dtype.str)).encode())
    h.update(a.view(np.uint8).reshape(-1).data if a.size else b"")
    return int.from_bytes(h.digest(), "little") & agreement.MASK63


class ShardDigest(NamedTuple):
    """What a rank reports in the debug shard check: its mesh coordinate, its shard's hash."""

    coord: tuple[int, ...]
    digest: int


def check_broadcast_shards(x: Any, what: str = "tensor") -> None:
    """In debug mode, raise on every rank unless shards along broadcast mesh axes are identical.

    Collective over the world (every rank calls it, members of ``x.placement`` or not);
    a no-op unless ``SBPMPI_DEBUG=1``. Compares a hash of each shard, not the data.
    """
    if not _DEBUG.value:
        return
    _stats["shard_checks"] += 1
    pl = x.placement
    axes = [a for a, s in enumerate(x.sbp) if isinstance(s, Broadcast) and pl.hierarchy[a] > 1]
    if not axes:
        return
    coord = pl.coord_of(WORLD.rank)
    mine = None if coord is None else ShardDigest(coord, _shard_hash(x.to_local()))
    entries = agreement.gather(mine, f"SBPMPI_DEBUG shard check of {what}")
    held = {r: e for r, e in enumerate(entries) if e is not None}
    coords = {r: tuple(e.coord) for r, e in held.items()}
    problems = []
    for a in axes:
        seen: dict[tuple[int, ...], int] = {}
        for r, c in sorted(coords.items(), key=lambda item: item[1]):
            key = c[:a] + c[a + 1:]
            first = seen.setdefault(key, r)
            if first != r and held[first].digest != held[r].digest:
                problems.append(f"  mesh axis {a}: rank {first} (coord {coords[first]}) and "
                                f"rank {r} (coord {c}) hold different data")
    if problems:
        raise CollectiveMismatchError(
            f"{_DEBUG.env}: {what} is broadcast along mesh "
            f"ax{'is' if len(axes) == 1 else 'es'} {axes} but its shards differ:\n"
            + "\n".join(problems[:8])
            + "\nA broadcast shard was modified on some ranks only, or computed from "
              "rank-dependent data."
        )
