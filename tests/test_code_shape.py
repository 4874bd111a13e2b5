"""Two rules of the code's shape (issue 42), walked with ``ast``:

- no ``global`` statement in ``sbpmpi/comm/``: a module's state lives in one object it owns
  (a dataclass instance mutated through methods) or in a ``functools.cache``'d decision;
- no function of ``sbpmpi`` takes 8 or more parameters that can be passed positionally
  (``self``/``cls`` not counted): a longer list takes a named parameter object or
  keyword-only parameters (``*,``). :data:`LONG_POSITIONAL` would name any left (none).
"""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1] / "sbpmpi"
LIMIT = 8

#: Functions with LIMIT or more positional parameters, left to the developers who own their
#: files (issue 42): path relative to sbpmpi/ -> function names.
LONG_POSITIONAL: dict[str, set[str]] = {}


def global_statements(source: str) -> list[int]:
    """The lines of the ``global`` statements in ``source``."""
    return [n.lineno for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Global)]


def long_positional(source: str) -> list[tuple[str, int]]:
    """(name, count) of the functions in ``source`` with LIMIT or more parameters that can
    be passed positionally, ``self``/``cls`` not counted."""
    found = []
    for n in ast.walk(ast.parse(source)):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names = [a.arg for a in n.args.posonlyargs + n.args.args]
            if names and names[0] in ("self", "cls"):
                names = names[1:]
            if len(names) >= LIMIT:
                found.append((n.name, len(names)))
    return found


def test_comm_has_no_global_statement() -> None:
    bad = {str(p.relative_to(ROOT)): lines for p in sorted((ROOT / "comm").rglob("*.py"))
           if (lines := global_statements(p.read_text()))}
    assert not bad, f"global statements in comm/ (file: lines): {bad}"


def test_no_function_takes_eight_positional_parameters() -> None:
    bad = {}
    for p in sorted(ROOT.rglob("*.py")):
        rel = p.relative_to(ROOT).as_posix()
        found = [f"{name} ({count})" for name, count in long_positional(p.read_text())
                 if name not in LONG_POSITIONAL.get(rel, ())]
        if found:
            bad[rel] = found
    assert not bad, f"functions with {LIMIT}+ positional parameters: {bad}"


def test_the_named_exceptions_still_need_it() -> None:
    for rel, names in LONG_POSITIONAL.items():
        have = {name for name, _ in long_positional((ROOT / rel).read_text())}
        assert names <= have, f"{rel}: {sorted(names - have)} no longer need the exception"


def test_the_walks_see_what_they_look_for() -> None:
    assert global_statements("x = 0\ndef f():\n    global x\n    x = 1\n") == [3]
    assert global_statements("def f():\n    '''global x'''\n") == []
    src = ("def f(a, b, c, d, e, f, g, h): pass\n"
           "def g(a, b, c, d, e, f, g, *, h): pass\n"
           "class C:\n    def m(self, a, b, c, d, e, f, g): pass\n"
           "    def n(self, a, b, c, d, e, f, g, h=1): pass\n"
           "def p(a, b, c, d, /, e, f, g, h): pass\n")
    assert sorted(long_positional(src)) == [("f", 8), ("n", 8), ("p", 8)]
