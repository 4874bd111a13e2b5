"""Consistency checks and collective decisions: every rank takes the same branch.

This module is the policy (when to check, over which ranks, folding local steps into the
next check, statistics, error texts); what a check describes is :mod:`.step_checks`'s; the exchanges themselves are
:mod:`sbpmpi.comm.agreement`'s, the one mechanism that comm's checked mode uses too.

Ops and conversions on global tensors are collective: every rank must call the
same one, on tensors of the same shape, dtype, SBP and placement, at the same
step. :func:`check_collective` verifies that before any data moves: each rank
hashes a readable description of the step to a 63-bit fingerprint, and one
all-reduce of two integers (max of ``fp`` and of ``-fp``) tells every rank whether
all agree. Only when they do not are the descriptions gathered, and every rank
raises the same :class:`~sbpmpi.errors.CollectiveMismatchError` naming each side.

Steps that do not communicate (elementwise ops on matching layouts) need no exchange
of their own: :func:`note_step` folds their fingerprint into a running hash of their
group that the next check on that group compares, so a divergence surfaces at the next
step of the group that communicates, with the recent local steps of each rank in the
message.

Checks are scoped to a step's group (:func:`step_ranks`: the ranks of the placements it
touches, an op's operands, their converted layouts and its output; a conversion's source
and destination). The members agree over the group's communicator (``comm.get_group``,
made by the members alone, ``MPI_Comm_create_group``) and fold their local steps into the
group's own running hash; a rank outside the group makes no exchange and folds nothing
(:func:`is_outside`), so a rank pays nothing for the ops of placements it does not
belong to. Checks of the whole world (``x.numpy()``, a pipeline's transfers, the
end-of-program agreement) stay world-wide and compare the world's running hash.

The setting ``check`` (``SBPMPI_CHECK=0``) turns the checks off (benchmarks); ``debug``
(``SBPMPI_DEBUG=1``) adds :func:`check_broadcast_shards`, which verifies that the shards
along broadcast mesh axes are really identical. ``sm.config.update(check=..., debug=...)``
changes them at run time (on every rank alike); see :mod:`sbpmpi.config`.

A conversion's SBP is described after normalising it against the tensor's ndim and the
mesh (:func:`.step_checks.conversion_meta`), so ``split(-1)`` and ``split(1)`` of a 2-d tensor agree.

:func:`.step_checks.step_check` describes a step once: its text, the fingerprint the check
compares and the digest a local step folds in, cached for repeated steps (one cache,
keyed only by values whose equality implies an equal text); :func:`.step_checks.conversion_check`
does the same for ``x.to_global``. :func:`agree_on_conversion` is comm's checked mode's
own agreement on a conversion, made by :func:`sbpmpi.runtime.redistribute` when no
consistency check covered it. The mismatch message itself is
:func:`sbpmpi.comm.agreement.mismatch.mismatch_message`'s.

The collective decisions on local verdicts (``all_ok``, ``raise_if_any``,
``decide_on_root``, ``collective_errors``) are :mod:`sbpmpi.comm.agreement`'s.

These exchanges carry metadata only (fingerprints, flags, short strings), never
tensor data; ``sm.trace`` keeps them apart from the comm calls, in ``Trace.agreements``.
"""

from __future__ import annotations

import collections
import functools
import hashlib
from typing import Any, NamedTuple

import numpy as np

from .. import config
from ..comm import agreement
from ..comm.agreement.mismatch import SAME_CALLS, mismatch_message
from ..comm.group import WORLD, Group, get_group
from ..core.layout import Layout
from ..core.placement import Placement
from ..core.sbp import Broadcast
from ..errors import CollectiveMismatchError
from .step_checks import StepCheck, step_check

__all__ = [
    "check_enabled",
    "debug_enabled",
    "ConversionSig",
    "ShardDigest",
    "check_collective",
    "check_step",
    "step_ranks",
    "step_group",
    "is_outside",
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


def _fingerprint(check: StepCheck, seed: bytes) -> int:
    """The fingerprint of ``check``'s text after the local steps hashed into ``seed``."""
    return check.fingerprint if seed == _NO_STEPS else \
        agreement.fingerprint_of(check.text, seed)


#: The ranks of a step's group: sorted world ranks, or None for the whole world.
Ranks = tuple[int, ...] | None


@functools.lru_cache(maxsize=1024)
def _union(placements: tuple[Placement, ...], world: int) -> Ranks:
    ranks = sorted({int(r) for pl in placements for r in pl.rank_list})
    return None if len(ranks) == world else tuple(ranks)


def step_ranks(*placements: Placement) -> Ranks:
    """The group of a step on ``placements``: the sorted world ranks of their union, or
    None when that is the whole world (no communication; cached)."""
    return _union(placements, len(WORLD.ranks))


def step_group(ranks: Ranks) -> Group | None:
    """The group over ``ranks`` (None: the world); on first use collective over its
    members only (``MPI_Comm_create_group``), so ranks outside never call it."""
    return None if ranks is None else get_group(ranks)


def is_outside(ranks: Ranks) -> bool:
    """True on a rank outside the step group ``ranks``: it makes no check for the step."""
    return ranks is not None and WORLD.rank not in ranks


_NO_STEPS = bytes(8)


class _Pending:
    """The local steps a group's members noted since the group's last check: their
    running hash, their number and the last few texts (for the mismatch message)."""

    __slots__ = ("digest", "count", "recent")

    def __init__(self) -> None:
        self.digest = _NO_STEPS
        self.count = 0
        self.recent: collections.deque[str] = collections.deque(maxlen=6)

    def fold(self, step: StepCheck) -> None:
        self.digest = hashlib.blake2b(self.digest + step.digest, digest_size=8).digest()
        self.recent.append(step.text)
        self.count += 1

    def reset(self) -> None:
        self.digest, self.count = _NO_STEPS, 0
        self.recent.clear()


# per group (None: the world); a rank holds the groups it is a member of only
_PENDING: dict[Ranks, _Pending] = {None: _Pending()}


def _pending_of(ranks: Ranks) -> _Pending:
    p = _PENDING.get(ranks)
    if p is None:
        p = _PENDING[ranks] = _Pending()
    return p


def note_step(what: str, meta: Any = (), ranks: Ranks = None) -> None:
    """Record a step that does not communicate; the next check on its group verifies it.

    For ops that run on local shards only: they cannot deadlock, but ranks that disagree
    would compute different values. Instead of an exchange per op, the step's fingerprint
    is folded into the running hash of its group ``ranks`` (:func:`step_ranks`; None: the
    world) that the next :func:`check_collective` on that group compares, so a
    divergence is reported at the next step of the group that communicates, naming the
    recent local steps of each rank. Costs a few microseconds, no communication; with
    ``SBPMPI_DEBUG=1`` it is a full :func:`check_collective` on the group (collective).
    Call it on the members of the group only.
    """
    if not check_enabled():
        return
    if debug_enabled():  # strict: every step is checked at once
        check_collective(what, meta, step_group(ranks))
        return
    note_known_step(step_check(what, meta), ranks)


def note_known_step(step: StepCheck, ranks: Ranks = None) -> None:
    """Fold a local step whose :func:`.step_checks.step_check` the caller made once and kept (the ops'
    dispatch fast path) into the running hash of its group ``ranks``; the caller checks
    that checking is on and debug mode off. Same effect as :func:`note_step` with that
    step."""
    p = _PENDING.get(ranks)
    if p is None:
        p = _pending_of(ranks)
    p.fold(step)


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
        ranks: Ranks = None
    elif group.comm is None:
        return False
    else:
        ranks = None if agreement.covers_world(group) else tuple(sorted(group.ranks))
    pending = _pending_of(ranks)
    if len(WORLD.ranks if group is None else group.ranks) == 1:
        pending.reset()  # nobody to disagree with: its local steps are checked
        return True
    step = step_check(what, meta)
    return _agree(what, step.text, _fingerprint(step, pending.digest), group, pending)


def check_step(what: str, step: StepCheck, ranks: Ranks = None) -> bool:
    """:func:`check_collective` on the step group ``ranks`` (None: the world; call it on
    its members only) for a step whose :func:`step_check` (or :func:`.step_checks.conversion_check`)
    the caller made: the same exchange and result, without describing the step again."""
    if not _CHECK.value:
        return False
    _stats["checks"] += 1
    pending = _PENDING.get(ranks) or _pending_of(ranks)
    if len(WORLD.ranks) == 1 or (ranks is not None and len(ranks) == 1):
        pending.reset()
        return True
    return _agree(what, step.text, _fingerprint(step, pending.digest), step_group(ranks),
                  pending)


def _agree(what: str, text: str, fp: int, group: Group | None, pending: _Pending) -> bool:
    """The exchange of :func:`check_collective`: True when the ranks of ``group`` agree
    (``pending``: the group's local steps, which the exchange compared)."""
    _stats["exchanges"] += 1
    texts = agreement.agree(fp, what, text, lambda: (text + _local_steps(pending), None),
                            group)
    pending.reset()
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
    """Comm's checked mode: every rank of the conversion's group (:func:`step_ranks` of
    both placements) must ask for the same conversion (one agreement exchange), for a
    conversion no consistency check covered; a rank outside the group does nothing.

    Raises
    ------
    ValueError
        On every rank, naming the conversion of rank 0 and of the first rank that differs.
    CollectiveMismatchError
        On every rank, when some rank is in another kind of step.
    """
    ranks = step_ranks(src.placement, dst.placement)
    if is_outside(ranks):
        return
    group = step_group(ranks)
    sig = ConversionSig(str(src), str(dst), dtype.str)
    text = f"box({sig.src} -> {sig.dst}, {dtype})"
    sigs = agreement.agree(agreement.fingerprint_of(repr(sig)), "box", text,
                           lambda: (text, sig), group)
    if sigs is None:
        return
    texts = [t for t, _ in sigs]
    details = [d for _, d in sigs]
    members = agreement.members(group)[1]
    if not all(isinstance(d, ConversionSig) for d in details):  # another kind of step
        raise CollectiveMismatchError(mismatch_message(texts, members))
    first = details[0]
    for r, s in zip(members, details):
        if s != first:
            raise ValueError(f"box: ranks disagree on the conversion: rank {members[0]} "
                             f"converts "
                             f"{first.src} to {first.dst} ({np.dtype(first.dtype)}) but rank "
                             f"{r} converts {s.src} to {s.dst} ({np.dtype(s.dtype)})")


def _local_steps(pending: _Pending) -> str:
    """`` (after N local steps: ...)``, what this rank did in the group since its last
    check."""
    n = pending.count
    if not n:
        return ""
    return (f" (after {n} local step{'s' if n > 1 else ''}"
            f"{', the last: ' if n > len(pending.recent) else ': '}"
            + ", ".join(pending.recent) + ")")


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


def check_broadcast_shards(x: Any, what: str = "tensor", ranks: Ranks = None) -> None:
    """In debug mode, raise on every rank unless shards along broadcast mesh axes are identical.

    Collective over the step group ``ranks`` (None: the world; every rank of it calls
    it, members of ``x.placement`` or not); a no-op unless ``SBPMPI_DEBUG=1``. Compares a
    hash of each shard, not the data.
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
    group = step_group(ranks)
    entries = agreement.gather(mine, f"SBPMPI_DEBUG shard check of {what}", group)
    held = {r: e for r, e in zip(agreement.members(group)[1], entries) if e is not None}
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
