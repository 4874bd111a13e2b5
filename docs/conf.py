"""Sphinx configuration of the sbpmpi documentation.

Build with ``pip install -e ".[docs]"`` then ``sphinx-build -W -b html docs docs/_build/html``.
The pages are Markdown (MyST); the API reference is generated from the docstrings by
autodoc and autosummary (the stubs go to ``docs/api/generated/``, which git ignores).
Importing sbpmpi initialises MPI as a world of one process, which is all autodoc needs.
"""

from __future__ import annotations

import sbpmpi

project = "sbpmpi"
author = "sbpmpi developers"
copyright = "sbpmpi developers (MIT license)"
release = sbpmpi.__version__
version = release

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
]

source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]
templates_path = ["_templates"]

myst_enable_extensions = ["colon_fence"]
myst_heading_anchors = 3

autosummary_generate = True
autosummary_imported_members = True
autodoc_default_options = {"members": True, "undoc-members": True, "show-inheritance": True}
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_typehints_description_target = "documented"
autodoc_preserve_defaults = True
napoleon_google_docstring = False
napoleon_numpy_docstring = True
# "Attributes" sections as fields of the class: autodoc documents slots and properties as
# members already, and a second description of each would be a duplicate
napoleon_use_ivar = True

html_theme = "furo"
html_title = f"sbpmpi {release}"
