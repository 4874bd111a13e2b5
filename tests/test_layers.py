"""The import graph of ``sbpmpi`` follows the layer order and has no circle, walked with ``ast``.

Data flows one way: API -> autograd -> ops -> tensor (and its tape) ->
runtime.redistribute -> comm -> MPI. A module may import
modules of its own layer or of a layer below, never above (every ``import``/``from``
statement counts, also those inside functions, and ``importlib.import_module`` of an
``sbpmpi`` name written as a string). Only ``comm/`` and ``tools/`` import mpi4py
(:data:`MPI_OUTSIDE_COMM` is empty and stays so). ``docs/architecture.md`` describes the
same order.

The packages above autograd are ordered too (:data:`LAYERS`, from ``functions`` to
``root``): each imports only packages of the layers below it. The packages of one layer
are independent of one another unless the layer says they are peers (``peers=True``:
one unit split in files, such as the tensor and its tape): an arrow between two
packages of a layer without peers is reported like an arrow up, since nothing says which
way it may run.

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
from typing import NamedTuple

import pytest

PKG = pathlib.Path(__file__).resolve().parents[1] / "sbpmpi"

#: The composition root: ``sbpmpi/__init__`` alone (its prefix matches no submodule).
ROOT = "sbpmpi"


class Layer(NamedTuple):
    """One layer: its name, the module prefixes it holds, and whether its packages may
    import one another (``peers``) or are independent."""

    name: str
    prefixes: tuple[str, ...]
    peers: bool = False


#: Layers from the bottom up. The longest matching prefix wins.
LAYERS: tuple[Layer, ...] = (
    # the pure base: errors, settings, the layout vocabulary, the names installed from above
    Layer("core", ("sbpmpi._version", "sbpmpi.errors", "sbpmpi.config", "sbpmpi.core",
                   "sbpmpi.names_from_above"), peers=True),
    Layer("boxing", ("sbpmpi.boxing",)),
    Layer("platform", ("sbpmpi.backend",)),
    Layer("comm", ("sbpmpi.comm", "sbpmpi.env"), peers=True),  # sm.env shows comm.world
    Layer("runtime", ("sbpmpi.runtime",)),
    # the tape and grad mode sit beside the tensor, under the ops that write to them
    Layer("tensor", ("sbpmpi.tensor", "sbpmpi.tape", "sbpmpi.grad_mode", "sbpmpi.creation",
                     "sbpmpi.conversion"), peers=True),
    Layer("ops", ("sbpmpi.ops",)),
    Layer("autograd", ("sbpmpi.autograd",)),
    # the top, in the order of its arrows: functions of tensors, each on its own
    Layer("functions", ("sbpmpi.linalg", "sbpmpi.amp", "sbpmpi.optim", "sbpmpi.capture",
                        "sbpmpi.checkpoint", "sbpmpi.stencil", "sbpmpi.testing",
                        "sbpmpi.visualize")),
    Layer("array_api", ("sbpmpi.array_api",)),  # its linalg extension is sm.linalg's face
    # faces over the namespace: NumPy's protocols, sm.einsum, sm.explain
    Layer("faces", ("sbpmpi.protocols", "sbpmpi.contraction", "sbpmpi.explain")),
    Layer("einops", ("sbpmpi.einops_backend",)),  # einops' einsum is sm.einsum
    Layer("nn", ("sbpmpi.nn",)),  # sm.nn.Graph is capture's, the moved names checkpoint's
    Layer("training", ("sbpmpi.parallel", "sbpmpi.pipeline")),  # both on nn modules
    Layer("aliases", ("sbpmpi.zero",)),  # sbpmpi.zero: parallel.zero's old name
    Layer("root", (ROOT,)),
    Layer("tools", ("sbpmpi.tools", "sbpmpi.__main__", "sbpmpi.launch", "sbpmpi.abort"),
          peers=True),  # the tools and their entry points
)

#: (importer, imported) pairs that go up the layers, or join two packages of a layer
#: without peers, on purpose, with the reason.
UPWARD_ALLOWED: dict[tuple[str, str], str] = {
    ("sbpmpi", "sbpmpi.launch"):
        "sm.launch is the public name of the launcher's functions (README: expect_world, "
        "find_mpiexec); imported only when a program touches sm.launch",
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
    for i, layer in enumerate(LAYERS):
        for p in layer.prefixes:
            if (module == p or (p != ROOT and module.startswith(p + "."))) and len(p) > best:
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
                bad.append(f"{m}:{line} ({LAYERS[layer_of(m)].name}) imports {t} "
                           f"({LAYERS[layer_of(t)].name})")
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


# ---- package-level arrows --------------------------------------------------------------------

def package_of(module: str) -> str:
    """The unit of the package-level picture: ``sbpmpi.<first part>`` (a subpackage or a
    top-level module); ``sbpmpi`` itself for its ``__init__``."""
    parts = module.split(".")
    return ".".join(parts[:2])


def package_graph(graph: dict[str, dict[str, int]]) -> dict[str, dict[str, str]]:
    """package -> {imported package: one 'module:line' that makes the arrow} of ``graph``,
    without the composition root ``sbpmpi`` (its ``__init__`` wires the layers together)."""
    out: dict[str, dict[str, str]] = {}
    for m, edges in graph.items():
        a = package_of(m)
        if a == "sbpmpi":
            continue
        for t, line in edges.items():
            b = package_of(t)
            if b != a and b != "sbpmpi":
                out.setdefault(a, {}).setdefault(b, f"{m}:{line}")
    return out


def arrows_up(pgraph: dict[str, dict[str, str]]) -> list[str]:
    """Package-level arrows from a lower layer to a higher one, or between two packages
    of a layer without peers, not in UPWARD_ALLOWED."""
    bad = []
    for a, edges in sorted(pgraph.items()):
        for b, where in sorted(edges.items()):
            la, lb = layer_of(a), layer_of(b)
            across = lb == la and not LAYERS[la].peers
            if (lb > la or across) and (a, b) not in UPWARD_ALLOWED:
                bad.append(f"{a} ({LAYERS[la].name}) -> {b} ({LAYERS[lb].name}) at {where}"
                           + (": the packages of this layer are not peers" if across else ""))
    return bad


def test_package_arrows_point_down() -> None:
    """Each package imports only packages of the layers below it, or of its own layer
    where that layer's packages are peers (ops never imports autograd: the tape sits under
    the ops; nn never imports the parallel wing), and the package-level graph has no
    circle (the lookups of UPWARD_ALLOWED aside)."""
    pgraph = package_graph(_package_graph())
    bad = arrows_up(pgraph)
    assert not bad, "package-level arrows that run back up:\n" + "\n".join(bad)
    as_lines = {a: {b: 0 for b in edges if (a, b) not in UPWARD_ALLOWED}
                for a, edges in pgraph.items()}
    for b in {b for edges in pgraph.values() for b in edges}:
        as_lines.setdefault(b, {})
    found = circles(as_lines)
    assert not found, "package-level circles: " + "; ".join(
        " <-> ".join(sorted(c)) for c in found)


def test_the_package_walk_sees_an_arrow_up() -> None:
    """The checker itself: an ops module importing the engine is an arrow up."""
    root = PKG / "ops"
    sources = {
        "sbpmpi.ops.x": (root / "x.py", "def f():\n    from ..autograd import engine\n"),
        "sbpmpi.autograd": (PKG / "autograd" / "__init__.py", ""),
        "sbpmpi.autograd.engine": (PKG / "autograd" / "engine.py", "from ..ops import x\n"),
    }
    pgraph = package_graph(import_graph(sources))
    assert pgraph == {"sbpmpi.ops": {"sbpmpi.autograd": "sbpmpi.ops.x:2"},
                      "sbpmpi.autograd": {"sbpmpi.ops": "sbpmpi.autograd.engine:1"}}
    assert arrows_up(pgraph) == ["sbpmpi.ops (ops) -> sbpmpi.autograd (autograd) at "
                                 "sbpmpi.ops.x:2"]


def test_the_package_walk_sees_the_order_of_the_top() -> None:
    """The checker itself, on the top: nn handing on the parallel wing's names (as
    nn/__init__ did) is an arrow up; optim reaching capture crosses a layer whose packages
    are independent; the tensor reaching its tape stays inside a layer of peers; the
    parallel wing building on nn points down."""
    sources = {
        "sbpmpi.nn": (PKG / "nn" / "__init__.py",
                      "def __getattr__(name):\n    from .. import parallel\n"),
        "sbpmpi.parallel": (PKG / "parallel" / "__init__.py", "from ..nn import Module\n"),
        "sbpmpi.optim": (PKG / "optim" / "__init__.py", "from ..capture import graph\n"),
        "sbpmpi.capture": (PKG / "capture" / "__init__.py", ""),
        "sbpmpi.tensor": (PKG / "tensor.py", "from . import tape\n"),
        "sbpmpi.tape": (PKG / "tape.py", ""),
    }
    pgraph = package_graph(import_graph(sources))
    assert arrows_up(pgraph) == [
        "sbpmpi.nn (nn) -> sbpmpi.parallel (training) at sbpmpi.nn:2",
        "sbpmpi.optim (functions) -> sbpmpi.capture (functions) at sbpmpi.optim:1: the "
        "packages of this layer are not peers"]
    assert layer_of("sbpmpi.parallel.zero.stage3") > layer_of("sbpmpi.nn.module") > \
        layer_of("sbpmpi.capture.replay") > layer_of("sbpmpi.autograd.engine")
    with pytest.raises(AssertionError, match="sbpmpi.made_up is in no layer"):
        layer_of("sbpmpi.made_up")  # the root's prefix holds its __init__ alone


# ---- GlobalTensor owns its fields -------------------------------------------------------------

#: The fields of GlobalTensor that only tensor.py assigns (others call its mutators:
#: ``_set_data``, ``_set_grad``, ``_set_node``).
TENSOR_FIELDS = frozenset({"_local", "_layout", "_dtype", "_grad", "_node", "_requires_grad",
                           "_base", "_copy_note", "_copy_of"})


def field_writes(path: pathlib.Path, source: str) -> list[str]:
    """``path:line .field`` for each assignment to a :data:`TENSOR_FIELDS` attribute of
    any object (plain, augmented, annotated, in a tuple target, or by ``setattr`` with the
    name as a string)."""
    found = []

    def targets(t: ast.AST) -> list[ast.AST]:
        if isinstance(t, (ast.Tuple, ast.List)):
            return [x for e in t.elts for x in targets(e)]
        if isinstance(t, ast.Starred):
            return targets(t.value)
        return [t]

    for node in ast.walk(ast.parse(source, str(path))):
        written: list[ast.AST] = []
        if isinstance(node, ast.Assign):
            written = [x for t in node.targets for x in targets(t)]
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            written = targets(node.target)
        elif (isinstance(node, ast.Call) and isinstance(node.func, (ast.Name, ast.Attribute))
              and getattr(node.func, "id", getattr(node.func, "attr", None)) in
              ("setattr", "__setattr__") and len(node.args) >= 2
              and isinstance(node.args[1], ast.Constant) and node.args[1].value in TENSOR_FIELDS):
            found.append(f"{path.name}:{node.lineno} .{node.args[1].value}")
        for t in written:
            if isinstance(t, ast.Attribute) and t.attr in TENSOR_FIELDS:
                found.append(f"{path.name}:{node.lineno} .{t.attr}")
    return found


def test_only_tensor_py_assigns_the_tensor_fields() -> None:
    bad = []
    for m, path in sorted(MODULES.items()):
        if m != "sbpmpi.tensor":
            bad += [f"{m}: {w}" for w in field_writes(path, path.read_text())]
    assert not bad, ("GlobalTensor fields assigned outside tensor.py (use x._set_data, "
                     "x._set_grad, x._set_node):\n" + "\n".join(bad))


def test_the_field_walk_sees_every_kind_of_write() -> None:
    src = ("def f(x, y, g):\n    x._local = 1\n    y._grad += g\n    a, x._node = 1, 2\n"
           "    setattr(x, '_layout', 3)\n    x.local = 4\n    x._local[0] = 5\n")
    found = field_writes(PKG / "made_up.py", src)
    assert found == ["made_up.py:2 ._local", "made_up.py:3 ._grad", "made_up.py:4 ._node",
                     "made_up.py:5 ._layout"], found


# ---- no private names across modules ----------------------------------------------------------

def private_imports(module: str, path: pathlib.Path, source: str,
                    modules: Collection[str] = MODULES) -> list[str]:
    """``module:line name`` for each ``from X import _name`` that takes a private name
    (one leading underscore, not a dunder) defined in another module. Private submodules
    (``from . import _sort``) may be imported by their own package."""
    found = []
    for node in ast.walk(ast.parse(source, str(path))):
        if not isinstance(node, ast.ImportFrom):
            continue
        for a in node.names:
            if not a.name.startswith("_") or a.name.startswith("__"):
                continue
            target = _resolve(module, path, ast.ImportFrom(module=node.module,
                                                           names=[a], level=node.level),
                              modules)[0]
            if target.endswith("." + a.name) and target in modules:
                parent = target.rsplit(".", 1)[0]
                own = module == parent or module.startswith(parent + ".")
                if own:
                    continue
            found.append(f"{module}:{node.lineno} {a.name}")
    return found


def test_no_private_name_is_imported_from_another_module() -> None:
    bad = []
    for m, path in sorted(MODULES.items()):
        bad += private_imports(m, path, path.read_text())
    assert not bad, ("private names imported from another module (make them public in "
                     "their module, or move the code):\n" + "\n".join(bad))


def test_the_private_walk_sees_a_private_name() -> None:
    mods = {"sbpmpi.ops", "sbpmpi.ops.shape", "sbpmpi.ops.setitem", "sbpmpi.array_api",
            "sbpmpi.array_api._sort"}
    root = PKG / "ops"
    assert private_imports("sbpmpi.ops.setitem", root / "setitem.py",
                           "from .shape import _index_key, index_key\n", mods) == \
        ["sbpmpi.ops.setitem:1 _index_key"]
    assert private_imports("sbpmpi.array_api", PKG / "array_api" / "__init__.py",
                           "from . import _sort\nfrom ._sort import sort\n", mods) == []
    assert private_imports("sbpmpi.ops.setitem", root / "setitem.py",
                           "from ..array_api import _sort\n", mods) == \
        ["sbpmpi.ops.setitem:1 _sort"]


# ---- the parallel wing keeps no state at module level ----------------------------------------

def module_level_state(path: pathlib.Path, source: str) -> list[str]:
    """``path:line name`` for each module-level name bound to a container that is filled
    at run time: a list or set (literal, comprehension or call), or an empty dict
    (``{}``, ``dict()``). Non-empty dict literals (tables written once, such as
    ``ZERO_BACKWARD_RULES``) and ``__all__`` are not state."""
    found = []
    for node in ast.parse(source, str(path)).body:
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        names = [t.id for t in targets if isinstance(t, ast.Name) and t.id != "__all__"]
        mutable = isinstance(value, (ast.List, ast.Set, ast.ListComp, ast.SetComp)) or (
            isinstance(value, ast.Dict) and not value.keys) or (
            isinstance(value, ast.Call) and isinstance(value.func, ast.Name)
            and value.func.id in ("list", "set", "dict", "deque", "defaultdict")
            and (value.func.id != "dict" or not (value.args or value.keywords)))
        if mutable:
            found += [f"{path.name}:{node.lineno} {n}" for n in names]
    return found


def test_the_parallel_wing_keeps_no_module_level_state() -> None:
    """Each DataParallel's reducer and each ZeRO module owns its state (the buckets' old
    ``_SLOTS``, ``_TOUCHED``, ``INFLIGHT``, ``_SYNC`` are gone for good)."""
    bad = []
    for m, path in sorted(MODULES.items()):
        if m == "sbpmpi.parallel" or m.startswith("sbpmpi.parallel."):
            bad += [f"{m}: {w}" for w in module_level_state(path, path.read_text())]
    assert not bad, "module-level state in the parallel wing:\n" + "\n".join(bad)


def test_the_state_walk_sees_lists_sets_and_empty_dicts() -> None:
    src = ("__all__ = ['a']\n_SLOTS: dict[int, int] = {}\n_TOUCHED = []\nINFLIGHT: list = list()\n"
           "_SYNC = [True]\nTABLE = {'a': 1}\nN = 3\nS = set()\nD = dict(a=1)\n")
    assert module_level_state(PKG / "made_up.py", src) == [
        "made_up.py:2 _SLOTS", "made_up.py:3 _TOUCHED", "made_up.py:4 INFLIGHT",
        "made_up.py:5 _SYNC", "made_up.py:8 S"]


@pytest.mark.parametrize("first", ["sbpmpi.parallel", "sbpmpi.parallel.zero",
                                   "sbpmpi.parallel.data_parallel", "sbpmpi.nn", "sbpmpi"])
def test_the_parallel_wing_imports_first_or_second(first: str) -> None:
    """sm.nn shows the wing's names, installed from above by sbpmpi/__init__ (the wing
    builds on nn.module): whichever a program imports first, both load and the names are
    the same objects, and importing sm.nn alone loads no module of the wing (a fresh
    interpreter each)."""
    import os
    import subprocess
    import sys

    alone = first in ("sbpmpi", "sbpmpi.nn")
    code = (f"import sys\nimport {first}\n"
            + ("assert not [m for m in sys.modules if m.startswith('sbpmpi.parallel')]\n"
               if alone else "")
            + "import sbpmpi.nn as nn\ndp, ns, sh = nn.DataParallel, nn.no_sync, nn.shard\n"
            "import sbpmpi.parallel as par\n"
            "assert dp is par.DataParallel and sh is par.shard and ns is par.no_sync\n"
            "from sbpmpi.nn import DataParallel\nassert DataParallel is dp\n"
            "assert {'DataParallel', 'no_sync', 'shard'} <= set(dir(nn))\n"
            "print('imports ok')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120, cwd=PKG.parent,
                       env={**os.environ, "PYTHONPATH": str(PKG.parent)})
    assert r.returncode == 0 and "imports ok" in r.stdout, r.stdout + r.stderr
