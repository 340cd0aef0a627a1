"""Sphinx configuration of the ebfl documentation (``make docs``)."""

import os
import sys
from pathlib import Path

import ebfl

sys.path.insert(0, str(Path(__file__).parent / "_ext"))
# Quiet, deterministic imports while the API pages are generated.
os.environ.setdefault("OMP_WAIT_POLICY", "passive")

project = "ebfl"
author = "the ebfl developers"
copyright = "2026, the ebfl developers"  # noqa: A001
release = ebfl.__version__
version = ".".join(release.split(".")[:2])

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.mathjax",
    "numpydoc",
    "myst_parser",
    "apigen",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
exclude_patterns = ["_build", "_templates", "README.md"]
templates_path = ["_templates"]

autosummary_generate = True
autosummary_imported_members = True
autodoc_typehints = "none"
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False

# Every cross-reference must resolve, except to libraries whose inventories the
# offline build does not load.
nitpicky = True
nitpick_ignore_regex = [("py:class", r"(torch|abc|numpy|pandas|flwr)\..*"),
                        ("py:class", r"Module|ABC")]

myst_enable_extensions = ["dollarmath", "colon_fence", "deflist"]
myst_heading_anchors = 3

# No intersphinx: the build must pass offline (CI has no network but the package index).

html_theme = "pydata_sphinx_theme"
html_title = f"ebfl {release}"
html_theme_options = {
    "navigation_depth": 2,
    "show_toc_level": 2,
    "secondary_sidebar_items": ["page-toc"],
    "footer_start": ["copyright"],
    "footer_end": [],
}
html_static_path = []
