"""The import graph of ``sbpmpi`` follows the layer order, walked with ``ast``.

Data flows one way: API -> ops -> runtime.redistribute -> comm -> MPI. A module may import
modules of its own layer or of a layer below, never above (every ``import``/``from``
statement counts, also those inside functions, and ``importlib.import_module`` of an
``sbpmpi`` name written as a string). Only ``comm/`` and ``tools/`` import mpi4py, except
the modules named in :data:`MPI_OUTSIDE_COMM`, each with its reason. ``docs/architecture.md``
describes the same order.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

PKG = pathlib.Path(__file__).resolve().parents[1] / "sbpmpi"

#: Layers from the bottom up: (name, module prefixes). The longest matching prefix wins.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("core", ("sbpmpi._version", "sbpmpi.errors", "sbpmpi.config", "sbpmpi.core")),
    ("boxing", ("sbpmpi.boxing",)),
    ("platform", ("sbpmpi.env", "sbpmpi.backend")),
    ("comm", ("sbpmpi.comm",)),
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

#: Modules outside comm/ and tools/ that import mpi4py, and why.
MPI_OUTSIDE_COMM: dict[str, str] = {
    "sbpmpi.env": "the process's place in the world (rank, size, node split) is read at "
                  "import, before comm exists; backend binds a GPU from it",
}


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


def _resolve(module: str, path: pathlib.Path, node: ast.ImportFrom) -> list[str]:
    if node.level:
        base = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        base = base[:len(base) - (node.level - 1)]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    if not target.startswith("sbpmpi"):
        return [target]
    names = [f"{target}.{a.name}" for a in node.names]
    return [n if n in MODULES else target for n in names]  # `from . import sub` imports sub


def imports_of(module: str) -> list[tuple[str, int]]:
    """(imported module, line) for every import in ``module``, nested ones included."""
    path = MODULES[module]
    return imports_in(module, path, path.read_text())


def imports_in(module: str, path: pathlib.Path, source: str) -> list[tuple[str, int]]:
    """:func:`imports_of` for ``source`` standing as ``module`` at ``path``."""
    found = []
    for node in ast.walk(ast.parse(source, str(path))):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            found += [(t, node.lineno) for t in _resolve(module, path, node)]
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "import_module" and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
              and node.args[0].value.startswith("sbpmpi")):
            found.append((node.args[0].value, node.lineno))
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
              and module in ("sbpmpi", "sbpmpi.boxing") and node.value in MODULES):
            # the lazy public-name tables of sbpmpi/__init__ and boxing/__init__
            found.append((node.value, node.lineno))
    return found


def _owner(target: str) -> str:
    """The sbpmpi module that ``target`` names (a module, or a name inside one)."""
    while target not in MODULES and "." in target:
        target = target.rsplit(".", 1)[0]
    return target


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
    """An exception that no longer imports mpi4py (or goes up) is removed from the list."""
    for m in MPI_OUTSIDE_COMM:
        assert any(t.startswith("mpi4py") for t, _ in imports_of(m)), m
    for a, b in UPWARD_ALLOWED:
        assert any(_owner(t) == b for t, _ in imports_of(a)), (a, b)


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
