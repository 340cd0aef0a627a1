"""Sphinx configuration of the ebfl documentation (``make docs``)."""

import os
import re
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
    # The links start beside the logo and the search is an icon (Ctrl+K), so that the
    # header stays one row at 1400 px.
    "navbar_align": "left",
    "navbar_persistent": ["search-button"],
    "secondary_sidebar_items": ["page-toc"],
    "footer_start": ["copyright"],
    "footer_end": [],
    # Never empty (see below), so the theme need not render it twice to check.
    "templates_skip_empty_check": ["sidebar-nav-bs.html", "navbar-nav.html",
                                   "sidebar-nav-site.html"],
}
# The theme's left sidebar shows the current top-level section's pages, which leaves
# it empty on the landing page and on the top-level pages without children;
# _templates/sidebar-nav-site.html falls back to the whole site's navigation there.
html_sidebars = {"**": ["sidebar-collapse", "sidebar-nav-site"]}
# Narrower sidebars, a wider article and code that wraps rather than scrolls.
html_static_path = ["_static"]
html_css_files = ["ebfl.css"]


# A line break may fall after each dot and underscore of the names in the left
# navigation, so that ebfl.eb.normal_means.generalized_binary wraps between its parts
# rather than mid-word: the sidebar template (_templates/sidebar-nav-site.html) passes
# its HTML through this filter, which inserts <wbr> in the link texts only.
_NAV_TEXT = re.compile(r">([^<>]+)<")
_NAME_BREAK = re.compile(r"([._])(?=[A-Za-z0-9])")


def _break_names(html):
    return _NAV_TEXT.sub(lambda m: ">" + _NAME_BREAK.sub(r"\1<wbr>", m.group(1)) + "<",
                         str(html))


def _add_filters(app):
    templates = getattr(app.builder, "templates", None)
    if templates is not None and hasattr(templates, "environment"):
        templates.environment.filters["break_names"] = _break_names


# Sphinx keeps every word of an inline literal on one line (so "--quick" never splits
# at its hyphens), which pushes a word longer than the line (a test id, a long path)
# out of the column: such literals get a class, and _static/ebfl.css lets them break.
_LONG_LITERAL = 40


def _mark_long_literals(app, doctree, docname):
    from docutils import nodes

    for node in doctree.findall(nodes.literal):
        if max(map(len, node.astext().split()), default=0) > _LONG_LITERAL:
            node["classes"].append("long-literal")


def setup(app):
    app.connect("builder-inited", _add_filters)
    app.connect("doctree-resolved", _mark_long_literals)
