"""The bad input matrix (bad_input.py) stays one matrix across the test files of its subjects.

Its rows live beside the tests of what they call (core/, tensor/, comm/, checkpoint/,
ops/); read here from every test file with ``ast``, together they must still cover the
public API (at least 30 rows) with distinct ids.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def row_ids() -> list[str]:
    """The id of every ``Row("id", ...)`` in the test files, file by file."""
    ids = []
    for path in sorted(TESTS.rglob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id == "Row" and node.args
                    and isinstance(node.args[0], ast.Constant)):
                ids.append(node.args[0].value)
    return ids


def test_the_table_is_big_enough():
    ids = row_ids()
    assert len(ids) >= 30
    assert len(set(ids)) == len(ids)
