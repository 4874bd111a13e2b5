"""AutoTest-style checks of global ops against NumPy on the whole arrays (scenario S13).

    from sbpmpi.testing import Input, check_op
    check_op(sm.matmul, np.matmul, [Input((3, 4)), Input((4, 5))])

For every placement (1-D over 1..world ranks, reversed, a subset, a 2x2 mesh when the
world has 4 ranks or more) and every combination of input SBPs, :func:`check_op` builds
the inputs from one seeded global value, runs the op, and compares ``numpy()`` of the
result with the reference on the whole arrays (shape, dtype, values with a tolerance set
per dtype). Partial inputs are made of random operands whose reduction is the value
(not the value on one rank and identities elsewhere), so an op that mishandles a
partial input fails. Run it on every rank (it communicates); failures are gathered
and raised on every rank.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import backend, comm
from .core.dtypes import as_dtype, eps, is_bfloat16
from .core.layout import Layout, balanced_range
from .core.placement import Placement
from .core.reduction import REDUCTIONS
from .core.sbp import PARTIALS, Broadcast, NdSbp, Partial, Split, broadcast
from .env import get_rank, get_world_size
from .tensor import GlobalTensor

__all__ = ["Input", "CheckReport", "check_op", "check_grad", "numeric_grad",
           "default_placements", "input_sbps", "sbp_combos", "tolerance", "make_shards",
           "make_input", "assert_close", "metadata_tensor", "signature_search_cases",
           "SMALL_SEARCH"]


@dataclass(frozen=True)
class Input:
    """A generated input: ``shape``, ``dtype`` and the value range.

    Floats are multiples of 1/8 in ``[low, high]`` (so sums and products of small
    tensors are exact), integers lie in ``[low, high]``, bools are random.
    """

    shape: tuple[int, ...]
    dtype: Any = np.float64
    low: float = -2.0
    high: float = 2.0

    def make(self, rng: np.random.Generator) -> np.ndarray:
        dt = np.dtype(self.dtype)
        if dt.kind == "b":
            return rng.random(self.shape) < 0.5
        if dt.kind in "iu":
            return rng.integers(int(self.low), int(self.high) + 1, size=self.shape).astype(dt)
        v = rng.integers(int(np.ceil(self.low * 8)), int(np.floor(self.high * 8)) + 1,
                         size=self.shape) / 8.0
        if dt.kind == "c":
            v = v + 1j * rng.integers(-16, 17, size=self.shape) / 8.0
        return np.asarray(v).astype(dt)


def tolerance(dtype: Any) -> tuple[float, float]:
    """``(rtol, atol)`` for comparing results of ``dtype``; exact for integers and bools."""
    dt = as_dtype(dtype)
    if is_bfloat16(dt):
        return 4 * eps(dt), 4 * eps(dt)
    if dt.kind not in "fc":
        return 0.0, 0.0
    size = dt.itemsize // (2 if dt.kind == "c" else 1)
    return {2: (1e-2, 1e-3), 4: (1e-5, 1e-6)}.get(size, (1e-12, 1e-12))


def default_placements(device_type: str = "cpu", world_size: int | None = None
                       ) -> list[Placement]:
    """1-D over ranks 0..k-1 for k = 1..n, all ranks reversed, ranks 1..n-1, and the 2x2 mesh
    ``[[0, 1], [2, 3]]`` when ``n >= 4``."""
    n = get_world_size() if world_size is None else world_size
    out = [Placement(device_type, list(range(k)), world_size=n) for k in range(1, n + 1)]
    if n > 1:
        out.append(Placement(device_type, list(range(n))[::-1], world_size=n))
    if n > 2:
        out.append(Placement(device_type, list(range(1, n)), world_size=n))
    if n >= 4:
        out.append(Placement(device_type, [[0, 1], [2, 3]], world_size=n))
    return out


def input_sbps(placement: Placement, ndim: int, dtype: Any = np.float64) -> list[NdSbp]:
    """Every ND-SBP of a tensor of ``ndim`` dims on ``placement``.

    Per mesh axis: broadcast, partial_sum, partial_max and partial_min (not for complex
    dtypes, which have no order), split of each dim.
    """
    one: list[Any] = [broadcast]
    one += [PARTIALS[n] for n, r in REDUCTIONS.items() if r.defined_for(dtype)]
    one += [Split(d) for d in range(ndim)]
    return list(itertools.product(one, repeat=placement.ndim))


def sbp_combos(options: Sequence[Sequence[NdSbp]], max_combos: int | None = None,
               seed: int = 0) -> list[tuple[NdSbp, ...]]:
    """All combinations of one SBP per input, or ``max_combos`` of them.

    A sample of at least as many combinations as the longest option list keeps every
    option of every input at least once and fills up with a seeded random choice; a
    smaller one is a seeded random part of that cover. The order of the full product
    is kept.
    """
    sizes = [len(o) for o in options]
    total = int(np.prod(sizes, dtype=np.int64)) if sizes else 1
    if max_combos is None or total <= max_combos:
        return list(itertools.product(*options))
    rng = np.random.default_rng(seed)
    cover = sorted({tuple(k % s for s in sizes) for k in range(max(sizes))})
    if max_combos < len(cover):
        pick = rng.permutation(len(cover))[:max_combos]
        keep = {cover[int(i)] for i in pick}
    else:
        keep = set(cover)
    while len(keep) < max_combos:
        keep.add(tuple(int(rng.integers(s)) for s in sizes))
    return [tuple(options[i][k] for i, k in enumerate(idx)) for idx in sorted(keep)]


def _decompose(v: np.ndarray, op: str, n: int, rng: np.random.Generator) -> list[np.ndarray]:
    """``n`` random operands whose reduction by ``op`` is ``v`` exactly."""
    if n == 1:
        return [v.copy()]
    dt = v.dtype
    owner = rng.integers(n, size=v.shape)
    if dt.kind == "b":
        noise = [rng.random(v.shape) < 0.5 for _ in range(n)]
        if op == "min":  # and: every False has one False owner
            return [np.where(owner == k, v, v | noise[k]) for k in range(n)]
        return [np.where(owner == k, v, v & noise[k]) for k in range(n)]  # or / max
    if op == "sum":
        if dt.kind in "iu":
            rest = [rng.integers(0, 4, size=v.shape).astype(dt) for _ in range(n - 1)]
        else:
            rest = [(rng.integers(-8, 9, size=v.shape) / 8.0).astype(dt) for _ in range(n - 1)]
        first = v.copy()
        for r in rest:
            first = first - r
        return [first, *rest]
    if dt.kind in "iu":
        gap = [rng.integers(0, 4, size=v.shape).astype(dt) for _ in range(n)]
        if dt.kind == "u" and op == "max":
            gap = [np.minimum(g, v) for g in gap]
    else:
        gap = [(rng.integers(0, 9, size=v.shape) / 8.0).astype(dt) for _ in range(n)]
    sign = -1 if op == "max" else 1
    return [np.where(owner == k, v, v + sign * gap[k]).astype(dt) for k in range(n)]


def make_shards(value: np.ndarray, layout: Layout, rng: np.random.Generator
                ) -> dict[int, np.ndarray]:
    """Every rank's shard of ``value`` under ``layout`` (world rank -> array), no MPI.

    Mirrors ``boxing.reference.assemble``: mesh axis 0 is outermost; a partial axis
    gets random operands (see :func:`_decompose`); the copies along a broadcast axis
    are identical, operands included. Identical on every rank for the same ``rng``
    state.
    """
    pl = layout.placement

    def rec(axis: int, v: np.ndarray) -> dict[tuple[int, ...], np.ndarray]:
        """Shards of the sub-mesh below ``axis``, keyed by their coordinates there."""
        if axis == pl.ndim:
            return {(): np.ascontiguousarray(v)}
        s = layout.sbp[axis]
        n = pl.hierarchy[axis]
        if isinstance(s, Broadcast):
            sub = rec(axis + 1, v)
            return {(i, *k): a for i in range(n) for k, a in sub.items()}
        if isinstance(s, Split):
            parts = []
            for i in range(n):
                a, b = balanced_range(v.shape[s.dim], n, i)
                idx = [slice(None)] * v.ndim
                idx[s.dim] = slice(a, b)
                parts.append(v[tuple(idx)])
        else:
            assert isinstance(s, Partial)
            parts = _decompose(v, s.op, n, rng)
        out: dict[tuple[int, ...], np.ndarray] = {}
        for i, part in enumerate(parts):
            out.update({(i, *k): a for k, a in rec(axis + 1, part).items()})
        return out

    return {pl.rank_at(c): a for c, a in rec(0, np.asarray(value)).items()}


def make_input(value: np.ndarray, placement: Placement, sbp: Any,
               rng: np.random.Generator) -> GlobalTensor:
    """A global tensor of ``value`` with random partial operands (no communication)."""
    layout = Layout.make(value.shape, placement, sbp)
    shards = make_shards(value, layout, rng)
    me = get_rank()
    if me not in placement:
        return GlobalTensor(np.empty(layout.local_shape(me), dtype=value.dtype), layout,
                            value.dtype)
    xp = backend.get_xp(placement.type)
    return GlobalTensor(xp.asarray(shards[me]), layout, value.dtype)


def assert_close(got: np.ndarray, expected: np.ndarray, what: str = "") -> None:
    """Shape, dtype and values (tolerance by dtype, NaNs equal) of ``got`` against ``expected``."""
    if got.shape != expected.shape:
        raise AssertionError(f"{what}: shape {got.shape} != expected {expected.shape}")
    if got.dtype != expected.dtype:
        raise AssertionError(f"{what}: dtype {got.dtype} != expected {expected.dtype}")
    rtol, atol = tolerance(expected.dtype)
    if rtol == 0 and atol == 0:
        np.testing.assert_array_equal(got, expected, err_msg=what)
    else:
        np.testing.assert_allclose(got, expected, rtol=rtol, atol=atol, equal_nan=True,
                                   err_msg=what)


@dataclass
class CheckReport:
    """What :func:`check_op` ran: the number of cases and the output SBPs produced."""

    name: str
    cases: int = 0
    outputs: Counter[str] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        outs = ", ".join(f"{k}: {v}" for k, v in sorted(self.outputs.items()))
        return f"{self.name}: {self.cases} cases, {len(self.failures)} failed; outputs {outs}"


def _cases(values: Sequence[Any], pls: Sequence[Placement],
           sbps: Sequence[Sequence[Any] | None] | None, max_combos: int | None, seed: int,
           report: CheckReport, label: str) -> Iterator[tuple[list[Any], str]]:
    """Per placement and sampled combination of input SBPs: the arguments (arrays
    made global tensors with random partial operands, scalars as they are) and a description;
    counts the cases in ``report``."""
    is_t = [isinstance(v, np.ndarray) for v in values]
    for pl in pls:
        options = []
        k = 0
        for v, t in zip(values, is_t):
            if not t:
                continue
            given = None if sbps is None else sbps[k]
            options.append(input_sbps(pl, v.ndim, v.dtype) if given is None else
                           [Layout.make(v.shape, pl, s).sbp for s in given])
            k += 1
        for combo in sbp_combos(options, max_combos, seed):
            case_rng = np.random.default_rng([seed, report.cases])
            args: list[Any] = []
            it = iter(combo)
            for v, t in zip(values, is_t):
                args.append(make_input(v, pl, next(it), case_rng) if t else v)
            report.cases += 1
            yield args, (f"{label} on {pl.ranks.tolist()} with inputs "
                         + ", ".join("(" + ", ".join(str(x) for x in nd) + ")" for nd in combo))


def _finish(report: CheckReport, max_failures: int, kind: str) -> CheckReport:
    """Gather every rank's failures; raise them on every rank, or return ``report``."""
    gathered = comm.all_gather_object(report.failures)
    fails: list[str] = []
    for lst in gathered:
        fails += [m for m in lst if m not in fails]
    if fails:
        report.failures = fails
        raise AssertionError(f"{report.name}: {len(fails)} {kind} in {report.cases} cases:\n"
                             + "\n".join(fails[:max_failures]))
    return report


def check_op(op: Callable[..., Any], reference: Callable[..., Any], inputs: Sequence[Any], *,
             kwargs: dict[str, Any] | None = None, placements: Sequence[Placement] | None = None,
             device_type: str = "cpu", sbps: Sequence[Sequence[Any] | None] | None = None,
             max_combos: int | None = None, seed: int = 0, name: str | None = None,
             max_failures: int = 20) -> CheckReport:
    """Check ``op`` on global tensors against ``reference`` on NumPy arrays (collective).

    Parameters
    ----------
    op, reference
        ``op(*tensors, **kwargs)`` on GlobalTensors and ``reference(*arrays, **kwargs)``
        on the whole NumPy values.
    inputs
        One per operand: an :class:`Input` (generated from ``seed``), a NumPy array
        (used as is), or a scalar (passed unchanged to both; not enumerated).
    placements
        Placements to run on (default :func:`default_placements`); all tensor inputs
        of a case share one placement.
    sbps
        Per tensor input, the SBPs to try (None: every SBP, :func:`input_sbps`).
    max_combos
        Cap on the SBP combinations per placement (see :func:`sbp_combos`).

    Returns
    -------
    CheckReport
        Raises AssertionError on every rank if any comparison failed. An exception from
        ``op`` itself is raised at once, naming the case (argument errors are raised
        alike on every rank).
    """
    kwargs = dict(kwargs or {})
    name = name or str(getattr(op, "__name__", repr(op)))
    rng = np.random.default_rng(seed)
    values: list[Any] = []
    for x in inputs:
        if isinstance(x, Input):
            values.append(x.make(rng))
        elif isinstance(x, np.ndarray):
            values.append(x)
        else:
            values.append(x)
    expected = np.asarray(reference(*values, **kwargs))
    pls = default_placements(device_type) if placements is None else list(placements)
    report = CheckReport(name)
    me = get_rank()
    for args, what in _cases(values, pls, sbps, max_combos, seed, report, name):
        try:  # every rank makes the same collective calls whatever the checks find
            out = op(*args, **kwargs)
            if not isinstance(out, GlobalTensor):
                raise TypeError(f"returned {type(out).__name__}, not a GlobalTensor")
            got = out.numpy()
        except Exception as e:
            raise AssertionError(f"{what}: {type(e).__name__}: {e}") from e
        problems: list[str] = []
        try:
            assert_close(got, expected, what)
        except AssertionError as e:
            problems.append(str(e))
        lay = out.layout
        if tuple(out.to_local().shape) != lay.local_shape(me):
            problems.append(f"{what}: rank {me} shard has shape "
                            f"{tuple(out.to_local().shape)}, layout {lay} says "
                            f"{lay.local_shape(me)}")
        elif me in lay.placement and not lay.partial_axes():
            # every rank's shard, broadcast copies included, is its slice of the value
            sl = lay.local_slice(me)
            assert sl is not None
            try:
                assert_close(backend.asnumpy(out.to_local()), expected[sl],
                             f"{what}: rank {me} shard")
            except AssertionError as e:
                problems.append(str(e))
        report.outputs["(" + ", ".join(str(s) for s in out.sbp) + ")"] += 1
        report.failures += problems[:max(0, max_failures - len(report.failures))]
    return _finish(report, max_failures, "failure(s)")


# ---- gradients --------------------------------------------------------------------------------

def numeric_grad(reference: Callable[..., Any], values: Sequence[Any], weight: np.ndarray,
                 wrt: Sequence[int], eps: float = 1e-6,
                 kwargs: dict[str, Any] | None = None) -> list[np.ndarray]:
    """Central finite differences (float64) of ``sum(reference(*values) * weight)``.

    One gradient per index in ``wrt`` (the positions of the float arrays to vary).
    """
    kwargs = kwargs or {}
    vals = [np.array(v, dtype=np.float64) if i in wrt else v for i, v in enumerate(values)]

    def loss() -> float:
        return float(np.sum(np.asarray(reference(*vals, **kwargs), dtype=np.float64) * weight))

    out = []
    for i in wrt:
        x = vals[i]
        g = np.zeros_like(x)
        for idx in np.ndindex(x.shape):
            old = x[idx]
            x[idx] = old + eps
            up = loss()
            x[idx] = old - eps
            down = loss()
            x[idx] = old
            g[idx] = (up - down) / (2 * eps)
        out.append(g)
    return out


def check_grad(op: Callable[..., Any], reference: Callable[..., Any],
               inputs: Sequence[Any], *, grad_reference: Callable[..., Any] | None = None,
               kwargs: dict[str, Any] | None = None,
               placements: Sequence[Placement] | None = None, device_type: str = "cpu",
               sbps: Sequence[Sequence[Any] | None] | None = None,
               max_combos: int | None = None, seed: int = 0, name: str | None = None,
               eps: float = 1e-6, rtol: float = 1e-6, atol: float = 1e-7,
               max_failures: int = 20) -> CheckReport:
    """Check the gradients of ``op`` on global tensors against NumPy (collective).

    For each placement and combination of input SBPs (as :func:`check_op`, partial
    inputs made of random operands), the floating tensor inputs are made leaves that
    require grad, ``y = op(*tensors)`` runs, and ``y.backward(w)`` with a seeded random
    weight ``w`` of y's shape (``y.backward()`` for a one-element ``y``, with ``w = 1``)
    accumulates ``d sum(y * w) / d x`` into each ``x.grad``. Each ``x.grad`` must have x's
    placement and SBP and match the expected gradient: ``grad_reference(w, *arrays)``
    (analytic, a list with one array per floating input) when given, else central
    finite differences of ``reference`` in float64 (:func:`numeric_grad`).

    Inputs must avoid points where the op is not differentiable (ties of max, zeros
    of relu/abs), where finite differences and any rule disagree. Returns the
    :class:`CheckReport`; raises AssertionError on every rank if a gradient is wrong.
    """
    from .creation import tensor as make_tensor
    from .tape import differentiable

    kwargs = dict(kwargs or {})
    name = name or str(getattr(op, "__name__", repr(op)))
    rng = np.random.default_rng(seed)
    values: list[Any] = [x.make(rng) if isinstance(x, Input) else x for x in inputs]
    is_t = [isinstance(v, np.ndarray) for v in values]
    wrt = [i for i, v in enumerate(values) if is_t[i] and differentiable(v.dtype)]
    if not wrt:
        raise ValueError(f"check_grad {name}: no floating tensor input to differentiate")
    out_shape = np.shape(np.asarray(reference(*values, **kwargs)))
    single = int(np.prod(out_shape, dtype=np.int64)) == 1
    w = np.ones(out_shape) if single else \
        np.random.default_rng([seed, 7]).integers(-8, 9, size=out_shape) / 8.0
    if grad_reference is not None:
        expected = [np.asarray(g, dtype=np.float64) for g in grad_reference(w, *values)]
    else:
        expected = numeric_grad(reference, values, w, wrt, eps, kwargs)
    pls = default_placements(device_type) if placements is None else list(placements)
    report = CheckReport(name)
    for args, what in _cases(values, pls, sbps, max_combos, seed, report, f"grad of {name}"):
        for i in wrt:
            args[i].requires_grad_(True)
        try:
            y = op(*args, **kwargs)
            if not isinstance(y, GlobalTensor):
                raise TypeError(f"returned {type(y).__name__}, not a GlobalTensor")
            if single:
                y.backward()
            else:
                y.backward(make_tensor(w.astype(y.dtype), placement=y.placement,
                                       sbp=[broadcast] * y.placement.ndim))
            grads = [args[i].grad for i in wrt]
            got = [None if g is None else g.numpy() for g in grads]
        except Exception as e:
            raise AssertionError(f"{what}: {type(e).__name__}: {e}") from e
        problems: list[str] = []
        for i, g, arr, exp in zip(wrt, grads, got, expected):
            x = args[i]
            lab = f"{what}: d/d input {i}"
            if g is None or arr is None:
                problems.append(f"{lab}: grad is None")
                continue
            if g.layout != x.layout:
                problems.append(f"{lab}: grad has layout {g.layout}, the input {x.layout}")
            if g.dtype != x.dtype:
                problems.append(f"{lab}: grad has dtype {g.dtype}, the input {x.dtype}")
            try:
                np.testing.assert_allclose(arr, exp.astype(arr.dtype), rtol=rtol, atol=atol,
                                           err_msg=lab)
            except AssertionError as e:
                problems.append(str(e))
        report.outputs["(" + ", ".join(str(s) for s in y.sbp) + ")"] += 1
        report.failures += problems[:max(0, max_failures - len(report.failures))]
    return _finish(report, max_failures, "gradient failure(s)")


# -- signature searches on metadata alone ---------------------------------------------------------

def metadata_tensor(shape: Sequence[int], sbp: Any, mesh: Any, dtype: Any = np.float64,
                    world_size: int = 8) -> GlobalTensor:
    """A GlobalTensor with a layout and no data, to infer or explain an op on any mesh of
    ranks below ``world_size`` without MPI (its shard is empty on every rank)."""
    lay = Layout.make(shape, Placement("cpu", mesh, world_size=world_size), sbp)
    return GlobalTensor(np.empty(0, dtype=dtype), lay, np.dtype(dtype))


#: The name of the one small search among :func:`signature_search_cases`.
SMALL_SEARCH = "add 2-D on (2,2)"


def signature_search_cases() -> dict[str, Callable[[], Any]]:
    """Op calls (``op.build``, not run) on metadata tensors whose signature search is large
    (3-D meshes: hundreds of combinations) and one small one (:data:`SMALL_SEARCH`)."""
    from . import ops

    s, b, p = Split, Broadcast(), PARTIALS["sum"]
    m = metadata_tensor
    m212 = [[[0, 1]], [[2, 3]]]
    m222 = [[[0, 1], [2, 3]], [[4, 5], [6, 7]]]
    m22 = [[0, 1], [2, 3]]
    t4 = (4, 4, 4, 4)
    return {
        "add 4-D on (2,1,2)": lambda: ops.add.build(m(t4, (s(0), b, s(1)), m212),
                                                    m(t4, (b, s(2), p), m212)),
        "where 4-D on (2,2,2)": lambda: ops.where.build(
            m(t4, (s(0), b, s(1)), m222, np.bool_), m(t4, (b, s(2), s(3)), m222),
            m(t4, (s(3), s(0), b), m222)),
        "matmul 4-D on (2,2,2)": lambda: ops.matmul.build(m(t4, (s(0), b, s(3)), m222),
                                                          m(t4, (b, s(2), s(1)), m222)),
        SMALL_SEARCH: lambda: ops.add.build(m((4, 4), (s(0), b), m22),
                                            m((4, 4), (b, s(1)), m22)),
    }
