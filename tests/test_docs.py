"""The documentation: the API reference covers every public name of ``sm``, the README
stays a front page whose links lead somewhere, and the Sphinx site builds with warnings
as errors (skipped, saying why, where Sphinx is not installed).
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

import sbpmpi as sm

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
API_PAGE = DOCS / "api" / "sbpmpi.md"
README_MAX_LINES = 300

# a ``[`sm.comm`](comm.md)`` link in the submodule table of the API page
_SUBMODULE_LINK = re.compile(r"\[`sm\.(\w+)`\]\(([\w./-]+?\.md)(?:#[\w-]*)?\)")
# a Markdown link with a relative target (no scheme, not an anchor on the same page)
_RELATIVE_LINK = re.compile(r"\]\((?![a-z]+:|#)([^)\s]+?)(?:#[^)]*)?\)")


def autosummary_names(text: str) -> list[str]:
    """The entries of every ``.. autosummary::`` directive in ``text``, in order."""
    names: list[str] = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.strip() != ".. autosummary::":
            continue
        for entry in lines[i + 1:]:
            if not entry.strip():
                continue
            if not entry.startswith("   ") or entry.strip().startswith("```"):
                break
            if not entry.strip().startswith(":"):  # an option such as :toctree:
                names.append(entry.strip())
    return names


def submodule_pages() -> dict[str, Path]:
    """``sm.<name>`` -> the reference page the API page's submodule table links it to."""
    text = API_PAGE.read_text()
    return {name: API_PAGE.parent / target for name, target in _SUBMODULE_LINK.findall(text)}


def test_autosummary_names_reads_entries_and_skips_options():
    text = ("```{eval-rst}\n.. autosummary::\n   :toctree: generated\n   :nosignatures:\n\n"
            "   matmul\n   add\n```\n\ntext\n\n.. autosummary::\n\n   GlobalTensor\nafter\n")
    assert autosummary_names(text) == ["matmul", "add", "GlobalTensor"]


def test_api_reference_lists_every_public_name_of_sm():
    listed = autosummary_names(API_PAGE.read_text())
    modules = submodule_pages()
    assert len(listed) == len(set(listed)), f"listed twice: {sorted(n for n in listed if listed.count(n) > 1)}"
    documented = set(listed) | set(modules)
    public = set(sm.__all__)
    assert not public - documented, (
        f"public names of sm missing from {API_PAGE.relative_to(ROOT)}: {sorted(public - documented)}")
    assert not documented - public, (
        f"{API_PAGE.relative_to(ROOT)} documents names outside sm.__all__: "
        f"{sorted(documented - public)}")


def test_api_reference_lists_submodules_in_the_table_and_the_rest_in_autosummary():
    listed = set(autosummary_names(API_PAGE.read_text()))
    modules = set(submodule_pages())
    for name in sm.__all__:
        is_module = isinstance(getattr(sm, name), types.ModuleType)
        assert (name in modules) == is_module and (name in listed) != is_module, (
            f"sm.{name}: a module belongs in the submodule table, anything else in an "
            f"autosummary list")


@pytest.mark.parametrize("name", sorted(n for n in sm.__all__
                                        if isinstance(getattr(sm, n), types.ModuleType)))
def test_each_public_submodule_has_its_module_documented(name):
    page = submodule_pages()[name]
    module = getattr(sm, name).__name__
    assert page.is_file(), f"sm.{name} links to {page}, which does not exist"
    assert f".. automodule:: {module}\n" in page.read_text(), (
        f"{page.relative_to(ROOT)} has no '.. automodule:: {module}' for sm.{name}")


def test_readme_is_a_front_page():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines; at most {README_MAX_LINES}: move details to docs/")


def test_readme_shows_the_setup_and_test_commands():
    text = (ROOT / "README.md").read_text()
    for command in ('pip install -e ".[mpich]"', "mpiexec -n 4 python examples/s10_2d_sbp.py",
                    "python scripts/run_tests.py",
                    "sphinx-build -W -b html docs docs/_build/html"):
        assert command in text, command


@pytest.mark.parametrize("page", ["README.md", *sorted(
    str(p.relative_to(ROOT)) for p in DOCS.rglob("*.md") if "_build" not in p.parts)])
def test_relative_links_lead_to_files_that_exist(page):
    path = ROOT / page
    missing = [target for target in _RELATIVE_LINK.findall(path.read_text())
               if not (path.parent / target).exists()]
    assert not missing, f"{page} links to files that do not exist: {missing}"


def test_readme_links_every_user_guide_page():
    text = (ROOT / "README.md").read_text()
    pages = sorted(p.name for p in DOCS.glob("*.md") if p.name != "index.md")
    missing = [p for p in pages if f"(docs/{p})" not in text]
    assert not missing, f"README.md does not link these docs pages: {missing}"


def _paragraph_with(page: str, words: str) -> str:
    """The paragraph (or list item) of ``docs/<page>`` that mentions ``words``."""
    text = (DOCS / page).read_text()
    parts = [p for p in re.split(r"\n\s*\n|\n(?=- )", text) if words in p]
    assert parts, f"docs/{page} does not mention {words!r}"
    return " ".join(parts[0].split())


def test_the_user_guides_say_what_users_of_each_feature_need():
    """Facts users looked for on the page of the feature and found elsewhere (issue 41):
    the extra plot_schedule needs, the shape cg's matvec receives, placements by node
    where hosts are described."""
    plot = _paragraph_with("pipelines.md", "plot_schedule(intervals, path)")
    assert "matplotlib" in plot and '".[plot]"' in plot
    assert "sm.pipeline.plot_schedule" in _paragraph_with("install.md", "Optional extras")
    matvec = _paragraph_with("linalg.md", "- `cg(A, b,")
    assert "`matvec` receives" in matvec and "`(N, 1)`" in matvec
    running = (DOCS / "running.md").read_text()
    assert "## Placements by node" in running
    by_node = _paragraph_with("running.md", 'sm.placement("cpu", {0: [0, 1], 1: [0, 1]})')
    assert "node_of(rank)" in by_node and "{0: []}" in by_node


@pytest.mark.skipif(importlib.util.find_spec("sphinx") is None
                    or importlib.util.find_spec("myst_parser") is None,
                    reason='Sphinx or myst-parser is not installed (pip install -e ".[docs]")')
@pytest.mark.timeout(960)  # above the build's own limit, so that one reports a hang
def test_the_docs_build_with_warnings_as_errors(tmp_path):
    # a guard against a hang, not a speed target: the build takes about a minute on a
    # quiet 2-core machine and several under load
    r = subprocess.run([sys.executable, "-m", "sphinx", "-q", "-W", "-b", "html",
                        "-d", str(tmp_path / "doctrees"), str(DOCS), str(tmp_path / "html")],
                       capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    html = tmp_path / "html"
    # autodoc leaves out, without a warning, module data it cannot document: every
    # public name must have its entry on its page
    missing = [f"sm.{name}" for name in sm.__all__
               if not isinstance(getattr(sm, name), types.ModuleType)
               and f'id="sbpmpi.{name}"' not in _read(html / "api" / "generated" / f"sbpmpi.{name}.html")]
    for name, page in submodule_pages().items():
        module = getattr(sm, name)
        text = _read(html / page.relative_to(DOCS).with_suffix(".html"))
        missing += [f"sm.{name}.{member}" for member in getattr(module, "__all__", ())
                    if f'id="{module.__name__}.{member}"' not in text
                    and f'id="module-{module.__name__}.{member}"' not in text]  # a submodule
    assert not missing, f"documented names without an entry in the built site: {missing}"


def _read(path: Path) -> str:
    return path.read_text() if path.is_file() else ""
