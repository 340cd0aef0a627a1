"""The Python examples of README.md and of every docs page run as written.

Each Markdown file (``README.md`` and ``docs/**/*.md``, except the generated
``docs/api`` and a build folder) is one test: its ```` ```python ```` blocks run
in order, in one namespace of their own, so a page's blocks may build on each
other but never on another page's; the README's each run alone (a tour's block is
copied on its own). A block whose first line is
``# needs the NAME data`` (a dataset folder of the data home) runs in a test of
its own, in a fresh namespace (it must be self-contained), and skips, naming the
dataset, when the data home lacks it. Tracebacks point at the Markdown file and
its line. Heavy examples belong in ``bash``/``console`` blocks with their
printed output, not in python blocks: this file runs with the fast tests.
"""

import re
import textwrap
from pathlib import Path

import pytest

from tests.conftest import has_dataset, missing_data_reason

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
#: Folders of docs/ that hold no hand-written page: Sphinx's output and the API pages
#: it generates.
SKIP_DIRS = {"_build", "api", "_templates", "_ext"}
NEEDS = re.compile(r"# needs the ([\w-]+) data\n")
#: A fenced python block, possibly indented (inside a list item), up to its closing fence.
BLOCK = re.compile(r"^([ \t]*)```python[ \t]*\n(.*?)^\1```[ \t]*$", flags=re.M | re.S)


def _pages():
    pages = [ROOT / "README.md"]
    pages += sorted(p for p in DOCS.rglob("*.md")
                    if not SKIP_DIRS.intersection(p.relative_to(DOCS).parts[:-1]))
    return pages


def _blocks(page):
    """``(line, code)`` for each python block of ``page``; ``line`` is the code's first line."""
    text = page.read_text()
    blocks = []
    for match in BLOCK.finditer(text):
        line = text.count("\n", 0, match.start(2)) + 1
        blocks.append((line, textwrap.dedent(match.group(2))))
    return blocks


def _run(page, line, code, namespace):
    # Leading newlines make the compiled lines the Markdown file's own lines.
    exec(compile("\n" * (line - 1) + code, str(page), "exec"), namespace)  # noqa: S102


def _name(page):
    return page.relative_to(ROOT).as_posix()


PLAIN = [(page, [b for b in _blocks(page) if not NEEDS.match(b[1])]) for page in _pages()]
PLAIN = [pytest.param(page, blocks, id=_name(page)) for page, blocks in PLAIN if blocks]
WITH_DATA = [pytest.param(page, line, code, id=f"{_name(page)}:{line}")
             for page in _pages() for line, code in _blocks(page) if NEEDS.match(code)]


def test_pages_are_collected():
    names = {_name(p) for p in _pages()}
    assert "README.md" in names and "docs/index.md" in names
    assert not any(n.startswith(("docs/api/", "docs/_build/")) for n in names)
    readme = [code for _, code in _blocks(ROOT / "README.md") if not NEEDS.match(code)]
    assert len(readme) >= 4


@pytest.mark.parametrize(("page", "blocks"), PLAIN)
def test_python_blocks_run(page, blocks):
    """A docs page's blocks share one namespace; the README's tour is read (and copied)
    block by block, so each of its blocks runs alone, in a fresh namespace."""
    alone = page.name == "README.md"
    namespace = {"__name__": "__docs__"}
    for line, code in blocks:
        if alone:
            namespace = {"__name__": "__docs__"}
        _run(page, line, code, namespace)


@pytest.mark.parametrize(("page", "line", "code"), WITH_DATA)
def test_python_blocks_with_data_run(page, line, code):
    folder = NEEDS.match(code).group(1)
    if not has_dataset(folder):
        pytest.skip(missing_data_reason(folder))
    _run(page, line, code, {"__name__": "__docs__"})
