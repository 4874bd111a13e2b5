"""The import graph of ``sbpmpi`` follows the layer order and has no circle, walked with ``ast``.

Data flows one way: API -> ops -> runtime.redistribute -> comm -> MPI. A module may import
modules of its own layer or of a layer below, never above (every ``import``/``from``
statement counts, also those inside functions, and ``importlib.import_module`` of an
``sbpmpi`` name written as a string). Only ``comm/`` and ``tools/`` import mpi4py
(:data:`MPI_OUTSIDE_COMM` is empty and stays so). ``docs/architecture.md`` describes the
same order.

No import circle: the graph whose nodes are the modules of ``sbpmpi`` (a package is its
``__init__``) and whose edges are every import the walk above finds has no strongly
connected component of two or more modules, except those in :data:`KNOWN_CIRCLES`. An
edge goes to the module the statement names: ``from p import name`` to ``p.name`` where
that is a module, else to ``p`` (its ``__init__``); ``import p.q.m`` and
``from p.q.m import x`` to ``p.q.m``. So a package ``__init__`` that re-exports its
submodules (``from .info import info``) has an edge to each, a submodule reaching a
sibling (``from . import route``, ``from .route import x``) has an edge to that sibling
only, and a submodule that takes a name defined in its own package's ``__init__``
(``from . import NAME``) closes a circle with it and is reported. Not counted: that
Python runs the ``__init__`` of ``p`` and ``p.q`` before ``p.q.m``; every module of a
package would otherwise depend on all that the package re-exports.
"""

from __future__ import annotations

import ast
import pathlib
from collections.abc import Collection

import pytest

PKG = pathlib.Path(__file__).resolve().parents[1] / "sbpmpi"

#: Layers from the bottom up: (name, module prefixes). The longest matching prefix wins.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("core", ("sbpmpi._version", "sbpmpi.errors", "sbpmpi.config", "sbpmpi.core")),
    ("boxing", ("sbpmpi.boxing",)),
    ("platform", ("sbpmpi.backend",)),
    ("comm", ("sbpmpi.comm", "sbpmpi.env")),  # sm.env shows comm.world's rank and size
    ("runtime", ("sbpmpi.runtime",)),
    ("tensor", ("sbpmpi.tensor", "sbpmpi.creation", "sbpmpi.conversion")),
    ("ops", ("sbpmpi.ops", "sbpmpi.autograd")),
    ("api", ("sbpmpi", "sbpmpi.protocols", "sbpmpi.explain", "sbpmpi.visualize",
             "sbpmpi.testing", "sbpmpi.checkpoint", "sbpmpi.nn", "sbpmpi.optim")),
    ("tools", ("sbpmpi.tools", "sbpmpi.__main__", "sbpmpi.launch", "sbpmpi.abort")),
)

#: (importer, imported) pairs that go up the layers on purpose, with the reason.
UPWARD_ALLOWED: dict[tuple[str, str], str] = {
    ("sbpmpi", "sbpmpi.launch"):
        "sm.launch is the public name of the launcher's functions (README: expect_world, "
        "find_mpiexec); imported only when a program touches sm.launch",
    ("sbpmpi.boxing", "sbpmpi.conversion"):
        "the public sm.boxing namespace keeps box/gather_global/plan_for/explain_conversion "
        "from before the split; boxing/__init__ looks them up on first attribute access and "
        "no boxing module calls them",
    ("sbpmpi.boxing", "sbpmpi.runtime"):
        "likewise for sm.boxing.calibrate/get_cost_table/set_cost_table/conversion_cost",
}

#: Modules outside comm/ and tools/ that import mpi4py, and why: none.
MPI_OUTSIDE_COMM: dict[str, str] = {}

#: Import circles (the modules of each) that another branch removes, with the reason.
KNOWN_CIRCLES: dict[frozenset[str], str] = {}


def _modules() -> dict[str, pathlib.Path]:
    out = {}
    for path in PKG.rglob("*.py"):
        parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def layer_of(module: str) -> int:
    best, level = -1, -1
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > best:
                best, level = len(p), i
    assert level >= 0, f"{module} is in no layer: add it to LAYERS"
    return level


def _resolve(module: str, path: pathlib.Path, node: ast.ImportFrom,
             modules: Collection[str]) -> list[str]:
    if node.level:
        base = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        base = base[:len(base) - (node.level - 1)]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    if not target.startswith("sbpmpi"):
        return [target]
    names = [f"{target}.{a.name}" for a in node.names]
    return [n if n in modules else target for n in names]  # `from . import sub` imports sub


def imports_of(module: str) -> list[tuple[str, int]]:
    """(imported module, line) for every import in ``module``, nested ones included."""
    path = MODULES[module]
    return imports_in(module, path, path.read_text())


def imports_in(module: str, path: pathlib.Path, source: str,
               modules: Collection[str] = MODULES) -> list[tuple[str, int]]:
    """:func:`imports_of` for ``source`` standing as ``module`` at ``path``, among ``modules``."""
    found = []
    for node in ast.walk(ast.parse(source, str(path))):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            found += [(t, node.lineno) for t in _resolve(module, path, node, modules)]
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "import_module" and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
              and node.args[0].value.startswith("sbpmpi")):
            found.append((node.args[0].value, node.lineno))
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
              and module in ("sbpmpi", "sbpmpi.boxing") and node.value in modules):
            # the lazy public-name tables of sbpmpi/__init__ and boxing/__init__
            found.append((node.value, node.lineno))
    return found


def _owner(target: str, modules: Collection[str] = MODULES) -> str:
    """The sbpmpi module that ``target`` names (a module, or a name inside one)."""
    while target not in modules and "." in target:
        target = target.rsplit(".", 1)[0]
    return target


def import_graph(sources: dict[str, tuple[pathlib.Path, str]]) -> dict[str, dict[str, int]]:
    """module -> {imported sbpmpi module: first line} for ``sources`` (module -> path, text)."""
    graph: dict[str, dict[str, int]] = {}
    for m, (path, text) in sources.items():
        edges = graph.setdefault(m, {})
        for target, line in imports_in(m, path, text, sources):
            t = _owner(target, sources)
            if t in sources and t != m:
                edges.setdefault(t, line)
    return graph


def circles(graph: dict[str, dict[str, int]]) -> list[frozenset[str]]:
    """The strongly connected components of two or more modules (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[frozenset[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = {stack.pop()}
            while v not in component:
                component.add(stack.pop())
            if len(component) > 1:
                found.append(frozenset(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def circle_path(graph: dict[str, dict[str, int]], component: frozenset[str]) -> str:
    """One circle through ``component``, each hop with its line: ``a:3 -> b:12 -> a``."""
    start = min(component)
    came_from: dict[str, str] = {}
    todo = [start]
    while todo:  # breadth first inside the component, back to start
        v = todo.pop(0)
        for w in sorted(graph[v]):
            if w not in component or w in came_from:
                continue
            came_from[w] = v
            if w == start:
                todo = []
                break
            todo.append(w)
    hops = [start]
    while hops[-1] != start or len(hops) == 1:
        hops.append(came_from[hops[-1]])
    hops.reverse()  # start, ..., start
    return " -> ".join(f"{a}:{graph[a][b]}" for a, b in zip(hops, hops[1:])) + f" -> {start}"


def _package_graph() -> dict[str, dict[str, int]]:
    return import_graph({m: (path, path.read_text()) for m, path in MODULES.items()})


def test_every_module_has_a_layer() -> None:
    for m in MODULES:
        layer_of(m)


def test_imports_follow_the_layer_order() -> None:
    bad = []
    for m in sorted(MODULES):
        for target, line in imports_of(m):
            if not target.startswith("sbpmpi"):
                continue
            t = _owner(target)
            if layer_of(t) > layer_of(m) and not any(
                    (m == a or m.startswith(a + ".")) and (t == b or t.startswith(b + "."))
                    for a, b in UPWARD_ALLOWED):
                bad.append(f"{m}:{line} ({LAYERS[layer_of(m)][0]}) imports {t} "
                           f"({LAYERS[layer_of(t)][0]})")
    assert not bad, "imports against the layer order:\n" + "\n".join(bad)


@pytest.mark.parametrize("forbidden", ["sbpmpi.tensor", "sbpmpi.creation", "sbpmpi.ops",
                                       "sbpmpi.comm", "sbpmpi.backend", "sbpmpi.runtime",
                                       "sbpmpi.env"])
def test_boxing_modules_are_pure(forbidden: str) -> None:
    """No module under boxing/ except its __init__'s public lookups imports these."""
    for m in MODULES:
        if m.startswith("sbpmpi.boxing."):
            for target, line in imports_of(m):
                assert not (target == forbidden or target.startswith(forbidden + ".")), \
                    f"{m}:{line} imports {target}"
    init = [t for t, _ in imports_of("sbpmpi.boxing") if t.startswith(forbidden)]
    assert all(t in ("sbpmpi.conversion", "sbpmpi.runtime") for t in init), init


def test_mpi4py_only_in_comm_and_tools() -> None:
    bad = []
    for m in sorted(MODULES):
        if m.startswith(("sbpmpi.comm", "sbpmpi.tools")) or m in MPI_OUTSIDE_COMM:
            continue
        bad += [f"{m}:{line} imports {t}" for t, line in imports_of(m)
                if t == "mpi4py" or t.startswith("mpi4py.")]
    assert not bad, "mpi4py outside comm/ and tools/:\n" + "\n".join(bad)


def test_the_named_exceptions_still_need_it() -> None:
    """An exception that no longer imports mpi4py, goes up, or closes a circle is removed
    from its list (MPI_OUTSIDE_COMM is empty: the loop guards against one coming back
    without need)."""
    for m in MPI_OUTSIDE_COMM:
        assert any(t.startswith("mpi4py") for t, _ in imports_of(m)), m
    for a, b in UPWARD_ALLOWED:
        assert any(_owner(t) == b for t, _ in imports_of(a)), (a, b)
    found = circles(_package_graph())
    for known in KNOWN_CIRCLES:
        assert any(known <= c for c in found), f"{sorted(known)} is no circle any more"


def test_no_import_circles() -> None:
    """No strongly connected component of two or more modules (see the module docstring)."""
    graph = _package_graph()
    bad = [circle_path(graph, c) for c in circles(graph)
           if not any(c == known for known in KNOWN_CIRCLES)]
    assert not bad, "import circles:\n" + "\n".join(bad)


def test_the_library_never_imports_tools() -> None:
    bad = []
    for m in MODULES:
        if layer_of(m) == len(LAYERS) - 1:
            continue
        bad += [f"{m}:{line} imports {t}" for t, line in imports_of(m)
                if (_owner(t).startswith("sbpmpi.tools") or _owner(t) in
                    ("sbpmpi.launch", "sbpmpi.abort")) and (m, _owner(t)) not in UPWARD_ALLOWED]
    assert not bad, "\n".join(bad)


def test_the_walk_sees_nested_and_dynamic_imports() -> None:
    """The checker itself: an upward import inside a function, and one by name, are found."""
    src = ("def f():\n    from ..ops import add\n    import importlib\n"
           "    importlib.import_module('sbpmpi.tensor')\n")
    found = [t for t, _ in imports_in("sbpmpi.core.x", PKG / "core" / "x.py", src)]
    assert found == ["sbpmpi.ops", "importlib", "sbpmpi.tensor"], found
    assert layer_of("sbpmpi.ops") > layer_of("sbpmpi.core.x")
    assert layer_of("sbpmpi.tensor") > layer_of("sbpmpi.core.x")


def test_the_circle_walk_sees_nested_dynamic_and_package_imports() -> None:
    """The circle finder itself, on a made-up package: a function-level import, one by
    name, and a submodule taking a name from its package's __init__ each close a circle;
    an __init__ re-exporting its submodules and a sibling import do not."""
    root = PKG / "made_up"
    sources = {
        "sbpmpi.made_up": (root / "__init__.py", "from .a import f\nfrom .b import g\nNAME = 1\n"),
        "sbpmpi.made_up.a": (root / "a.py", "from . import e\ndef f():\n    from .e import x\n"),
        "sbpmpi.made_up.e": (root / "e.py", "x = 1\n"),
        "sbpmpi.made_up.b": (root / "b.py", "def g():\n    from . import NAME\n"),
        "sbpmpi.made_up.c": (root / "c.py", "def h():\n    import importlib\n"
                             "    importlib.import_module('sbpmpi.made_up.d.k')\n"),
        "sbpmpi.made_up.d": (root / "d" / "__init__.py", ""),
        "sbpmpi.made_up.d.k": (root / "d" / "k.py", "def k():\n    from ...made_up.c import h\n"),
    }
    graph = import_graph(sources)
    assert graph["sbpmpi.made_up"] == {"sbpmpi.made_up.a": 1, "sbpmpi.made_up.b": 2}
    assert graph["sbpmpi.made_up.a"] == {"sbpmpi.made_up.e": 1}
    assert graph["sbpmpi.made_up.b"] == {"sbpmpi.made_up": 2}
    assert graph["sbpmpi.made_up.d.k"] == {"sbpmpi.made_up.c": 2}
    found = sorted(sorted(c) for c in circles(graph))
    assert found == [["sbpmpi.made_up", "sbpmpi.made_up.b"],
                     ["sbpmpi.made_up.c", "sbpmpi.made_up.d.k"]], found
    assert circle_path(graph, frozenset({"sbpmpi.made_up", "sbpmpi.made_up.b"})) == \
        "sbpmpi.made_up:2 -> sbpmpi.made_up.b:2 -> sbpmpi.made_up"
