"""The conformance runner's own logic (scripts/array_api_conformance.py), without the suite:
the xfails file, the JUnit outcomes of one rank, and the table."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location(
    "array_api_conformance", ROOT / "scripts" / "array_api_conformance.py")
assert _spec is not None and _spec.loader is not None
conformance = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(conformance)


def test_every_line_of_the_xfails_file_has_a_reason():
    ids = conformance.read_xfails(conformance.XFAILS)
    assert ids and len(ids) == len(set(ids))
    assert all(i.startswith("array_api_tests/") and " " not in i for i in ids)


def test_an_xfail_without_a_reason_is_refused(tmp_path):
    f = tmp_path / "xfails.txt"
    f.write_text("# comment\n\narray_api_tests/test_a.py::test_x  # a reason\n")
    assert conformance.read_xfails(f) == ["array_api_tests/test_a.py::test_x"]
    f.write_text("array_api_tests/test_a.py::test_y\n")
    with pytest.raises(SystemExit, match="needs a reason"):
        conformance.read_xfails(f)


JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="array_api_tests.test_a" name="test_ok" />
<testcase classname="array_api_tests.test_a" name="test_bad"><failure message="x"/></testcase>
<testcase classname="array_api_tests.test_b.TestC" name="test_xf">
  <skipped type="pytest.xfail" message="reason"/></testcase>
<testcase classname="array_api_tests.test_b.TestC" name="test_skip">
  <skipped type="pytest.skip" message="no linalg"/></testcase>
</testsuite></testsuites>"""


def test_junit_outcomes_and_the_table(tmp_path):
    f = tmp_path / "rank0.xml"
    f.write_text(JUNIT)
    got = conformance.outcomes_of(f)
    assert got == {"array_api_tests.test_a::test_ok": "passed",
                   "array_api_tests.test_a::test_bad": "failed",
                   "array_api_tests.test_b.TestC::test_xf": "xfailed",
                   "array_api_tests.test_b.TestC::test_skip": "skipped"}
    table = conformance.table({2: got}).splitlines()
    assert "| 2 | test_a | 1 | 1 | 0 | 0 | 50.0% |" in table
    assert "| 2 | test_b | 0 | 0 | 1 | 1 | 0.0% |" in table
    assert "| 2 | **all** | 1 | 1 | 1 | 1 | 25.0% |" in table
