"""Consistency checks and collective decisions: every rank takes the same branch.

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

``SBPMPI_CHECK=0`` turns the checks off (benchmarks); ``SBPMPI_DEBUG=1`` adds
:func:`check_broadcast_shards`, which verifies that the shards along broadcast
mesh axes are really identical.

:func:`raise_if_any` and :class:`collective_errors` combine a verdict that depends on
local data (a shard's shape, a file's state) across ranks before acting, so that a
failure on one rank raises the same error on all of them instead of leaving the
others waiting in the next collective.

These exchanges carry metadata only (fingerprints, flags, short strings), never
tensor data; they are not recorded by ``sm.trace``.
"""

from __future__ import annotations

import collections
import functools
import hashlib
import importlib
import os
import sys
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any, TypeVar

import numpy as np
from mpi4py import MPI

from ..core.layout import Layout
from ..core.placement import Placement
from ..core.sbp import Broadcast, Partial, Split
from ..errors import CollectiveMismatchError
from . import exit_agreement, watchdog
from .exit_agreement import group_lines

__all__ = [
    "CHECK_ENV",
    "DEBUG_ENV",
    "check_enabled",
    "debug_enabled",
    "describe",
    "fingerprint",
    "check_collective",
    "note_step",
    "note_step_digest",
    "step_digest",
    "check_broadcast_shards",
    "all_ok",
    "raise_if_any",
    "decide_on_root",
    "collective_errors",
    "stats",
]

CHECK_ENV = "SBPMPI_CHECK"
DEBUG_ENV = "SBPMPI_DEBUG"
_OFF = ("0", "false", "no", "off")
_ON = ("1", "true", "yes", "on")
_MASK63 = (1 << 63) - 1
T = TypeVar("T")
_stats = {"checks": 0, "exchanges": 0, "shard_checks": 0}


_KEYS = {name: os.environ.encodekey(name) for name in (CHECK_ENV, DEBUG_ENV)}


def _flag(name: str, default: bool) -> bool:
    # read at every call (a run may change it) straight from os.environ's own store:
    # os.environ.get costs microseconds when the variable is unset (a caught KeyError),
    # and every op reads these flags
    raw = os.environ._data.get(_KEYS[name])  # type: ignore[attr-defined]
    if raw is None:
        return default
    value = os.environ.decodevalue(raw).strip().lower()
    if value in _ON:
        return True
    if value in _OFF:
        return False
    return default


def check_enabled() -> bool:
    """True unless ``SBPMPI_CHECK=0`` (read at every call, so it can be changed at run time)."""
    return _flag(CHECK_ENV, True)


def debug_enabled() -> bool:
    """True when ``SBPMPI_DEBUG=1``: also check that broadcast shards are identical."""
    return _flag(DEBUG_ENV, False)


def stats() -> dict[str, int]:
    """Counters: ``checks`` (calls of check_collective while on), ``exchanges`` (those that
    communicated), ``shard_checks`` (calls of check_broadcast_shards in debug mode)."""
    return dict(_stats)


# -- descriptions and fingerprints ------------------------------------------------------------

def describe(obj: Any) -> str:
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
        inner = ", ".join(describe(o) for o in obj)
        return f"({inner}{',' if len(obj) == 1 else ''})"
    if isinstance(obj, list):
        return "[" + ", ".join(describe(o) for o in obj) + "]"
    if isinstance(obj, Mapping):
        items = sorted((describe(k), describe(v)) for k, v in obj.items())
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
    """A 63-bit non-negative integer hash of ``describe(meta)``, equal across processes."""
    digest = hashlib.blake2b(describe(meta).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & _MASK63


def _comm_of(group: Any) -> Any:
    """The MPI communicator of ``group`` (a comm.Group, or None for the world)."""
    if group is None:
        return MPI.COMM_WORLD
    return group.comm


def _ranks_of(group: Any, size: int) -> tuple[int, ...]:
    return tuple(group.ranks) if group is not None else tuple(range(size))


def _step_text(what: str, meta: Any) -> str:
    args = meta if isinstance(meta, tuple) else (meta,)
    return f"{what}({', '.join(describe(a) for a in args)})"


_NO_STEPS = bytes(8)
_pending = _NO_STEPS  # running hash of the local steps noted since the last world check
_recent: collections.deque[str] = collections.deque(maxlen=6)
_pending_n = 0


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
    text = _step_text(what, meta)
    note_step_digest(step_digest(text), text)


def step_digest(text: str) -> bytes:
    """The 8-byte fingerprint of a step's text, as :func:`note_step` folds it."""
    return hashlib.blake2b(text.encode(), digest_size=8).digest()


def note_step_digest(digest: bytes, text: str) -> None:
    """Fold a local step whose text (``what(description of meta)``) and
    :func:`step_digest` the caller made once and cached (the ops' dispatch fast path);
    the caller checks that checking is on and debug mode off. Same effect as
    :func:`note_step` with that text."""
    global _pending, _pending_n
    _pending = hashlib.blake2b(_pending + digest, digest_size=8).digest()
    _recent.append(text)
    _pending_n += 1


def _reset_pending() -> None:
    global _pending, _pending_n
    _pending, _pending_n = _NO_STEPS, 0
    _recent.clear()


def check_collective(what: str, meta: Any = (), group: Any = None) -> None:
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

    Raises
    ------
    CollectiveMismatchError
        On every rank of the group, naming what each rank called.
    """
    if not check_enabled():
        return
    _stats["checks"] += 1
    comm = _comm_of(group)
    if comm is None or comm.Get_size() == 1:
        return
    text = _step_text(what, meta)
    world = comm.Get_size() == MPI.COMM_WORLD.Get_size()  # every rank takes part
    seed = _pending if world else _NO_STEPS
    digest = hashlib.blake2b(seed + text.encode(), digest_size=8).digest()
    fp = int.from_bytes(digest, "little") & _MASK63
    buf = np.array([fp, -fp], dtype=np.int64)
    ranks = _ranks_of(group, comm.Get_size())
    _stats["exchanges"] += 1
    with watchdog.watch(f"consistency check before {what}", peers=ranks):
        # non-blocking, so that a peer that reached the end of the program is noticed
        failed = exit_agreement.wait(comm.Iallreduce(MPI.IN_PLACE, buf, op=MPI.MAX), ranks, text)
        if failed is not None:
            raise CollectiveMismatchError(failed)
        if int(buf[0]) == -int(buf[1]):
            if world:
                _reset_pending()
            return
        local = ""
        if world and _pending_n:
            local = (f" (after {_pending_n} local step{'s' if _pending_n > 1 else ''}"
                     f"{', the last: ' if _pending_n > len(_recent) else ': '}"
                     + ", ".join(_recent) + ")")
        texts = comm.allgather(text + local)
    if world:
        _reset_pending()
    lines = group_lines(texts, ranks)
    raise CollectiveMismatchError(
        "ranks disagree on a collective step:\n" + "\n".join(lines) + "\nEvery rank must call "
        "the same operations, on tensors of the same shape, dtype, SBP and placement, in the "
        "same order."
    )


def _shard_hash(local: Any) -> int:
    from .. import backend

    a = np.ascontiguousarray(backend.asnumpy(local))
    h = hashlib.blake2b(digest_size=8)
    h.update(str((a.shape, a.dtype.str)).encode())
    h.update(a.view(np.uint8).reshape(-1).data if a.size else b"")
    return int.from_bytes(h.digest(), "little") & _MASK63


def check_broadcast_shards(x: Any, what: str = "tensor") -> None:
    """In debug mode, raise on every rank unless shards along broadcast mesh axes are identical.

    Collective over the world (every rank calls it, members of ``x.placement`` or not);
    a no-op unless ``SBPMPI_DEBUG=1``. Compares a hash of each shard, not the data.
    """
    if not debug_enabled():
        return
    _stats["shard_checks"] += 1
    pl = x.placement
    axes = [a for a, s in enumerate(x.sbp) if isinstance(s, Broadcast) and pl.hierarchy[a] > 1]
    if not axes:
        return
    world = MPI.COMM_WORLD
    me = world.Get_rank()
    coord = pl.coord_of(me)
    mine = None if coord is None else (coord, _shard_hash(x.to_local()))
    with watchdog.watch(f"SBPMPI_DEBUG shard check of {what}"):
        entries = world.allgather(mine)
    coords = {r: tuple(e[0]) for r, e in enumerate(entries) if e is not None}
    problems = []
    for a in axes:
        seen: dict[tuple[int, ...], int] = {}
        for r, c in sorted(coords.items(), key=lambda rc: rc[1]):
            key = c[:a] + c[a + 1:]
            first = seen.setdefault(key, r)
            if first != r and entries[first][1] != entries[r][1]:
                problems.append(f"  mesh axis {a}: rank {first} (coord {coords[first]}) and "
                                f"rank {r} (coord {c}) hold different data")
    if problems:
        raise CollectiveMismatchError(
            f"{DEBUG_ENV}: {what} is broadcast along mesh "
            f"ax{'is' if len(axes) == 1 else 'es'} {axes} but its shards differ:\n"
            + "\n".join(problems[:8])
            + "\nA broadcast shard was modified on some ranks only, or computed from "
              "rank-dependent data."
        )


# -- collective decisions ---------------------------------------------------------------------

def all_ok(ok: bool, group: Any = None) -> bool:
    """True on every rank iff ``ok`` is true on every rank of ``group`` (one small all-reduce)."""
    comm = _comm_of(group)
    if comm is None:
        raise ValueError(f"this rank is not a member of {group!r}")
    if comm.Get_size() == 1:
        return bool(ok)
    with watchdog.watch("collective decision", peers=_ranks_of(group, comm.Get_size())):
        return bool(comm.allreduce(bool(ok), op=MPI.LAND))


def _error_class(module: str, qualname: str) -> type[BaseException] | None:
    mod = sys.modules.get(module)
    if mod is None and module.startswith("sbpmpi"):
        try:
            mod = importlib.import_module(module)
        except Exception:
            mod = None
    obj: Any = mod
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    if isinstance(obj, type) and issubclass(obj, Exception):
        return obj
    return None


def raise_if_any(error: BaseException | None, what: str, group: Any = None) -> None:
    """Collective: if any rank of ``group`` passes an error, raise one on every rank.

    Every rank raises the same type (that of the lowest failing rank, when it can be built
    from a message; RuntimeError otherwise) with the same message
    ``"<what>: rank R: <message>"``, chained to the local error where there is one.
    """
    if all_ok(error is None, group):
        return
    comm = _comm_of(group)
    info = None if error is None else (type(error).__module__, type(error).__qualname__,
                                       str(error))
    with watchdog.watch(f"collective decision of {what}"):
        infos = comm.allgather(info)
    ranks = _ranks_of(group, comm.Get_size())
    failed = [(r, i) for r, i in zip(ranks, infos) if i is not None]
    r0, (mod, qual, msg) = failed[0]
    text = f"{what}: rank {r0}: {msg}"
    others = [r for r, i in failed[1:]]
    if others:
        same = all(i[2] == msg for _, i in failed[1:])
        text += (f" (and the same on rank{'s' if len(others) > 1 else ''} "
                 f"{', '.join(map(str, others))})" if same else
                 "".join(f"\n{what}: rank {r}: {i[2]}" for r, i in failed[1:4]))
    exc = _build_error(mod, qual, text)
    if error is not None:
        raise exc from error
    raise exc


def _build_error(mod: str, qual: str, text: str) -> BaseException:
    cls = _error_class(mod, qual)
    try:
        return cls(text) if cls is not None else RuntimeError(f"{qual}: {text}")
    except Exception:
        return RuntimeError(f"{qual}: {text}")


def decide_on_root(fn: Callable[[], T], what: str, root: int = 0, group: Any = None) -> T:
    """Collective: run ``fn`` on world rank ``root`` only; return its result on every rank.

    If ``fn`` raises, every rank raises the same type with the message
    ``"<what>: <message>"``. For checks only one rank should make (a file's header, a
    directory's state) so that all ranks take the same branch. The result must pickle.
    """
    comm = _comm_of(group)
    if comm is None:
        raise ValueError(f"this rank is not a member of {group!r}")
    me = MPI.COMM_WORLD.Get_rank()
    local_error: BaseException | None = None
    verdict: Any = None
    if me == root:
        try:
            verdict = ("ok", fn())
        except Exception as e:
            local_error = e
            verdict = ("error", type(e).__module__, type(e).__qualname__, str(e))
    if comm.Get_size() > 1:
        root_in_group = root if group is None else group.group_rank(root)
        with watchdog.watch(f"{what}: waiting for rank {root}'s verdict"):
            verdict = comm.bcast(verdict, root=root_in_group)
    if verdict[0] == "ok":
        return verdict[1]  # type: ignore[no-any-return]
    exc = _build_error(verdict[1], verdict[2], f"{what}: {verdict[3]}")
    if local_error is not None:
        raise exc from local_error
    raise exc


class collective_errors:
    """Context manager: an exception inside the block on any rank raises on every rank.

    Every rank of ``group`` must enter and leave the block; leaving it is collective
    (one small all-reduce). Use it around local work that can fail on some ranks only
    (reading a file, checking a shard) before the next collective.

        with consistency.collective_errors("sm.load"):
            header = read_header(path) if rank == 0 else None
    """

    def __init__(self, what: str, group: Any = None) -> None:
        self.what = what
        self.group = group

    def __enter__(self) -> collective_errors:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc is not None and not isinstance(exc, Exception):
            return  # KeyboardInterrupt, SystemExit: propagate without communicating
        raise_if_any(exc, self.what, self.group)
