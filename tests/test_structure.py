"""The package's structure, read from its own source: layers, private names, file sizes.

Three rules, checked on every module of ``ebfl`` (imports inside functions count):

- **Files of one concern**: no module over :data:`MAX_LINES` lines.
- **Layers that only point down**: no two subpackages import each other (a
  "subpackage" is ``ebfl.X``, the first component under ``ebfl``).
- **No private reach-ins**: a subpackage imports another's public names only;
  not a name starting with ``_``, nor from a module whose path has one. The
  top-level private modules (``ebfl._validation``, ``ebfl._config``, ...) are
  the package's shared internal layer: their public names are for everyone.

A rule with exceptions would list them (``LONG_MODULES``); the list is empty and the
test asserts that it is exactly what the source shows.
"""

import ast
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "ebfl"
MAX_LINES = 900

#: Modules still over MAX_LINES.
LONG_MODULES: set = set()

def _modules():
    """``{dotted name: path}`` of every module of the package."""
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


MODULES = _modules()


def _subpackage(module):
    return ".".join(module.split(".")[:2])


def _imports(module, path):
    """``(imported module, [names])`` of every ``ebfl`` import in ``module``."""
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target == "ebfl" or target.startswith("ebfl."):
                yield target, [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "ebfl" or alias.name.startswith("ebfl."):
                    yield alias.name, []


def _edges():
    """``(importer, imported module, names)`` across subpackages; a name that is a
    submodule (``from ebfl.eb import _kernels``) counts as that module."""
    for module, path in MODULES.items():
        for target, names in _imports(module, path):
            for name in names or [""]:
                full = f"{target}.{name}" if f"{target}.{name}" in MODULES else target
                shown = "" if full != target else name
                if _subpackage(full) != _subpackage(module):
                    yield module, full, shown


def test_no_module_is_longer_than_the_limit():
    long = {m for m, p in MODULES.items() if len(p.read_text().splitlines()) > MAX_LINES}
    assert long - LONG_MODULES == set(), f"new modules over {MAX_LINES} lines"
    assert LONG_MODULES - long == set(), "now short enough: take them off LONG_MODULES"


def test_no_two_subpackages_import_each_other():
    edges = defaultdict(set)
    for module, target, _ in _edges():
        edges[_subpackage(module)].add(_subpackage(target))
    cycles = {(a, b) for a in edges for b in edges[a] if a < b and a in edges.get(b, ())}
    assert cycles == set()


def _private(target, name):
    internal = target.split(".")[2:]  # below the subpackage: ebfl.eb._kernels -> _kernels
    return any(p.startswith("_") for p in internal) or name.startswith("_")


def test_no_private_name_crosses_a_subpackage_line():
    found = {(module, target, name) for module, target, name in _edges()
             if _private(target, name) and name != "__version__"}
    assert found == set(), "private imports across subpackages"
