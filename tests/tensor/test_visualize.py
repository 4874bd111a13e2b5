"""sm.visualize: the text grid names, for every block, exactly the ranks that hold it.

The reference cuts index arrays with np.array_split mesh axis by mesh axis, independently
of sbpmpi.core.layout; the rendered text is parsed back and compared cell by cell.
"""

from __future__ import annotations

import io
import itertools
import re

import numpy as np
import pytest

import sbpmpi as sm
from sbpmpi.core.layout import Layout
from sbpmpi.core.placement import Placement
from sbpmpi.visualize import render, visualize

S, B = sm.sbp.split, sm.sbp.broadcast
P, PMAX, PMIN = sm.sbp.partial_sum, sm.sbp.partial_max, sm.sbp.partial_min


def ref_ranges(shape, mesh, nd_sbp, coord):
    idx = [np.arange(n) for n in shape]
    for axis, s in enumerate(nd_sbp):
        if isinstance(s, sm.sbp.Split):
            idx[s.dim] = np.array_split(idx[s.dim], mesh[axis])[coord[axis]]
    return tuple((int(i[0]), int(i[-1]) + 1) if len(i) else None for i in idx)


def parse_grid(text):
    """{(row range, col range): set of ranks} from a rendered 1-D or 2-D grid (host
    boundaries, ``#`` and ``=``, read as the other borders)."""
    lines = text.splitlines()
    sep_rows = [i for i, line in enumerate(lines) if re.fullmatch(r"\s*\+[-=+]+\+", line)]
    header = lines[sep_rows[0] - 1]
    cols = [tuple(map(int, m.split(":"))) for m in re.findall(r"\d+:\d+", header)]
    cells = {}
    for i in sep_rows[:-1]:
        row = lines[i + 1]
        label, _, body = row.partition("|")
        m = re.search(r"(\d+):(\d+)", label)
        rr = (int(m.group(1)), int(m.group(2))) if m else None
        parts = re.split(r"[|#]", body.rstrip().rstrip("|"))
        assert len(parts) == len(cols), row
        for c, cell in zip(cols, parts):
            cells[(rr, c)] = cell.strip()
    return cells


def ranks_in(cell):
    return sorted(int(t) for t in re.findall(r"\d+", cell))


def layouts():
    """(shape, mesh ranks, sbp) covering 1-D/2-D tensors, uneven and empty blocks."""
    one_d = [S(0), B, P, PMAX]
    for n in (4, 5, 2):
        for p in (1, 2, 3, 4):
            for s in one_d:
                yield (n,), list(range(p)), (s,)
    for shape in ((4, 6), (5, 3), (2, 7)):
        for p in (2, 3):
            for s in (S(0), S(1), B, P, PMIN):
                yield shape, list(range(p)), (s,)
        for a, b in itertools.product((S(0), S(1), B, P), repeat=2):
            yield shape, [[0, 1], [2, 3]], (a, b)
        yield shape, [[3, 1, 0]], (S(0), S(1))
        yield shape, [[0], [1], [2]], (B, S(0))


@pytest.mark.parametrize("case", list(layouts()), ids=lambda c: f"{c[0]}-{c[1]}-{c[2]}")
def test_grid_names_the_holders_of_every_block(case):
    shape, ranks, sbp = case
    pl = Placement("cpu", ranks, world_size=4)
    layout = Layout.make(shape, pl, sbp)
    text = render(layout)
    mesh = pl.hierarchy
    expected: dict[tuple, set[int]] = {}
    empty = set()
    for r in pl.rank_list:
        rng = ref_ranges(shape, mesh, layout.sbp, pl.coord_of(r))
        if any(x is None for x in rng):
            empty.add(r)
            continue
        expected.setdefault(rng, set()).add(r)
    cells = parse_grid(text)
    got = {}
    for (rr, cr), cell in cells.items():
        key = (cr,) if len(shape) == 1 else (rr, cr)
        got[key] = set(ranks_in(cell))
    assert got == expected, text
    if empty:
        assert f"empty block: {','.join(str(r) for r in sorted(empty))}" in text, text
    else:
        assert "empty block" not in text
    sbp_kinds = {type(s) for s, h in zip(layout.sbp, mesh) if h > 1}
    has_sum = any(s == P and h > 1 for s, h in zip(layout.sbp, mesh))
    has_max = any(s == PMAX and h > 1 for s, h in zip(layout.sbp, mesh))
    body = "\n".join(v for v in cells.values())
    assert ("+" in body) == has_sum, text
    assert ("max(" in body) == has_max, text
    has_minmax = any(s in (PMAX, PMIN) and h > 1 for s, h in zip(layout.sbp, mesh))
    if not has_minmax:  # max(a,b) / min(a,b) also hold commas
        assert ("," in body) == (sm.sbp.Broadcast in sbp_kinds), text


def test_2x2_mesh_broadcast_split_picture():
    pl = Placement("cpu", [[0, 1], [2, 3]], world_size=4)
    text = render(Layout.make((4, 6), pl, (B, S(0))), np.float32)
    cells = parse_grid(text)
    assert {k: ranks_in(v) for k, v in cells.items()} == {
        ((0, 2), (0, 6)): [0, 2], ((2, 4), (0, 6)): [1, 3]}
    assert "(4, 6) float32" in text and "sbp=(B, S(0))" in text and "copies" in text


def test_partial_over_broadcast_expression():
    pl = Placement("cpu", [[0, 1], [2, 3]], world_size=4)
    assert "(0+1),(2+3)" in render(Layout.make((2, 2), pl, (B, P)))
    assert "(0,1)+(2,3)" in render(Layout.make((2, 2), pl, (P, B)))
    assert "max(0,2)" in render(Layout.make((2, 2), pl, (PMAX, S(1))))


def test_other_ranks_of_dims_are_listed_not_drawn():
    pl = Placement("cpu", [[0, 1], [2, 3]], world_size=4)
    text = render(Layout.make((2, 3, 4), pl, (S(0), S(2))))
    assert "[0:1, 0:3, 2:4]  held by 1" in text
    assert "[1:2, 0:3, 0:2]  held by 2" in text
    scalar = render(Layout.make((), Placement("cpu", [0, 1], world_size=2), B))
    assert "scalar held by 0,1" in scalar


def test_host_boundaries_are_marked():
    pl = Placement("cpu", [0, 1, 2, 3], world_size=4)
    text = render(Layout.make((10,), pl, S(0)), nodes=(0, 0, 1, 1))
    assert "hosts: node 0 ranks 0,1; node 1 ranks 2,3" in text
    assert "|  0  |  1  #  2  |  3   |" in text
    assert {k: ranks_in(v) for k, v in parse_grid(text).items()} == {
        (None, (0, 3)): [0], (None, (3, 6)): [1], (None, (6, 8)): [2], (None, (8, 10)): [3]}
    mesh = Placement("cpu", [[0, 1], [2, 3]], world_size=4)
    rows = render(Layout.make((4, 6), mesh, (S(0), S(1))), nodes=(0, 0, 1, 1)).splitlines()
    assert rows[rows.index(next(r for r in rows if r.lstrip().startswith("0:2"))) + 1] \
        .strip() == "+=====+=====+"
    cols = render(Layout.make((4, 6), mesh, (S(1), S(0))), nodes=(0, 0, 1, 1))
    assert "|  0  #  2  |" in cols and "|  1  #  3  |" in cols
    # copies on both hosts: no boundary between blocks held on the same hosts
    both = render(Layout.make((4, 6), mesh, (B, S(0))), nodes=(0, 0, 1, 1))
    grid = [r for r in both.splitlines()[2:] if r.lstrip().startswith(("+", "0:", "2:"))]
    assert grid and not any("#" in r or "=" in r for r in grid), both
    # one host, or no topology: nothing marked
    for nodes in ((0, 0, 0, 0), None):
        one = render(Layout.make((10,), pl, S(0)), nodes=nodes)
        assert "hosts:" not in one and "#" not in one


def test_visualize_checks_its_arguments():
    with pytest.raises(TypeError, match="GlobalTensor or a Layout, got ndarray"):
        visualize(np.zeros(3))
    pl = Placement("cpu", [0], world_size=1)
    with pytest.raises(TypeError, match="rank must be an int or None"):
        visualize(Layout.make((2,), pl, S(0)), rank="0")


def test_sm_visualize_works_even_after_its_module_was_imported():
    # importing the submodule sbpmpi.visualize binds sm.visualize to the module
    import sbpmpi.visualize  # noqa: F401

    layout = Layout.make((4,), Placement("cpu", [0, 1], world_size=2), S(0))
    buf = io.StringIO()
    assert sm.visualize(layout, rank=None, file=buf) == render(layout)
    assert buf.getvalue() == render(layout) + "\n"


@pytest.mark.mpi(min_size=1)
def test_visualize_prints_on_rank_0_only_and_communicates_nothing(device_type):
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    rank, p = world.Get_rank(), world.Get_size()
    pl = sm.placement(device_type, ranks=list(range(p)))
    x = sm.zeros(5, 3, placement=pl, sbp=S(0))
    buf = io.StringIO()
    with sm.trace() as t:
        text = sm.visualize(x, file=buf)
    assert len(t) == 0, "visualize must not communicate"
    assert buf.getvalue() == (text + "\n" if rank == 0 else "")
    texts = world.allgather(text)
    assert all(s == texts[0] for s in texts)
    cells = parse_grid(text)
    for r in range(p):
        rows = np.array_split(np.arange(5), p)[r]
        if len(rows):
            assert cells[((int(rows[0]), int(rows[-1]) + 1), (0, 3))].strip() == str(r)
    buf = io.StringIO()
    sm.visualize(x, rank=None, file=buf)
    assert buf.getvalue() == text + "\n"
