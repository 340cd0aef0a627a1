"""The documentation site builds with warnings as errors and documents every public object.

The build runs on a copy of ``docs/`` (the API pages are generated into the
source tree), in a subprocess, like ``make docs``.
"""

import importlib
import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Importing every public module imports Flower, whose typer warns about click 8.3.
IMPORTS_FLOWER = pytest.mark.filterwarnings("ignore:'click.utils:DeprecationWarning")
DOCS = ROOT / "docs"


def _apigen():
    spec = importlib.util.spec_from_file_location("apigen", DOCS / "_ext" / "apigen.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@IMPORTS_FLOWER
def test_every_public_module_has_a_section():
    apigen = _apigen()
    listed = [m for _, modules in apigen.SECTIONS for m in modules]
    assert len(listed) == len(set(listed)), "a module is listed twice"
    public = set(apigen.public_modules()) - {"ebfl"}
    assert sorted(public - set(listed)) == [], "public modules missing from apigen.SECTIONS"
    assert sorted(set(listed) - public) == [], "apigen.SECTIONS lists modules that do not exist"


@IMPORTS_FLOWER
def test_every_public_module_declares_all():
    apigen = _apigen()
    without = [m for m in apigen.public_modules()
               if not hasattr(importlib.import_module(m), "__all__")
               and importlib.import_module(m).__spec__.submodule_search_locations is None]
    assert without == []


@pytest.fixture(scope="module")
def built_site(tmp_path_factory):
    pytest.importorskip("sphinx", reason="the docs extra is not installed (pip install -e .[docs])")
    pytest.importorskip("numpydoc", reason="the docs extra is not installed")
    pytest.importorskip("myst_parser", reason="the docs extra is not installed")
    pytest.importorskip("pydata_sphinx_theme", reason="the docs extra is not installed")
    src = tmp_path_factory.mktemp("docs") / "src"
    shutil.copytree(DOCS, src, ignore=shutil.ignore_patterns("_build", "api"))
    out = src.parent / "html"
    proc = subprocess.run(
        [sys.executable, "-m", "sphinx", "-b", "html", "-W", "--keep-going", "-q",
         str(src), str(out)], capture_output=True, text=True, timeout=600)
    return proc, out


def test_site_builds_without_warnings(built_site):
    proc, _ = built_site
    assert proc.returncode == 0, proc.stderr[-6000:]
    assert proc.stderr.strip() == "", proc.stderr[-6000:]


@IMPORTS_FLOWER
def test_every_public_object_has_an_api_page(built_site):
    proc, out = built_site
    assert proc.returncode == 0, proc.stderr[-3000:]
    missing = []
    for _, pages in _apigen().plan():
        for module, rows in pages:
            assert (out / "api" / f"{module}.html").is_file(), module
            for name, home in rows:
                if home == f"{module}.{name}" and not (
                        out / "api" / "objects" / f"{home}.html").is_file():
                    missing.append(home)
    assert missing == []


# Citations of material that is not part of the project: the papers' implementation
# notes ("spec", their section labels) and the directory beside the checkout.
_OUTSIDE = re.compile(
    r"\.\./shared|/shared/papers|-spec\.md|implementation notes"
    r"|\bspec(?:ification)?\b\s*(?:§|\[!|\(?[A-G]\.\d|section|item)", re.IGNORECASE)


def _user_facing_files():
    yield ROOT / "README.md"
    for pattern in ("ebfl/**/*.py", "docs/**/*.md", "docs/**/*.py", "notebooks/*.ipynb",
                    "data/**/*.md", "data/**/*.csv", "data/**/*.json"):
        for path in sorted(ROOT.glob(pattern)):
            generated = {"_build", "api"} & set(path.relative_to(ROOT).parts[1:2])
            if not (path.is_relative_to(DOCS) and generated):
                yield path


def test_no_citation_of_material_outside_the_project():
    hits = []
    for path in _user_facing_files():
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if _OUTSIDE.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:120]}")
    assert hits == []


def _html_pages(out):
    return sorted(path for path in out.rglob("*.html")
                  if not {"_static", "_sources", "_images"} & set(path.relative_to(out).parts))


# The left sidebar's navigation block (docs/_templates/sidebar-nav-site.html).
_SIDEBAR_NAV = re.compile(r'<nav class="bd-docs-nav bd-links[^"]*"[^>]*>(.*?)</nav>', re.S)


def test_every_page_has_a_left_navigation(built_site):
    # The theme's section navigation alone is empty on the landing page and on the
    # top-level pages without children; the template shows the whole site there.
    proc, out = built_site
    assert proc.returncode == 0, proc.stderr[-3000:]
    empty = []
    for page in _html_pages(out):
        nav = _SIDEBAR_NAV.search(page.read_text(encoding="utf-8"))
        if nav is None or 'href="' not in nav.group(1):
            empty.append(str(page.relative_to(out)))
    assert empty == []


@IMPORTS_FLOWER
def test_api_index_summarizes_every_module(built_site):
    bs4 = pytest.importorskip("bs4", reason="the docs extra is not installed")
    proc, out = built_site
    assert proc.returncode == 0, proc.stderr[-3000:]
    soup = bs4.BeautifulSoup((out / "api" / "index.html").read_text(encoding="utf-8"),
                             "html.parser")
    summaries = {}
    for row in soup.select("table.autosummary tr"):
        cells = row.find_all("td")
        if len(cells) == 2:
            summaries[cells[0].get_text(strip=True)] = cells[1].get_text(" ", strip=True)
    modules = [module for _, pages in _apigen().plan() for module, _ in pages]
    assert [m for m in modules if not summaries.get(m)] == []
    # The first line whole, not cut at the period of an abbreviation ("eqs. (46)").
    assert summaries["ebfl.bounds"].endswith("(Theorems 1-4, eqs. (46)-(47)).")
