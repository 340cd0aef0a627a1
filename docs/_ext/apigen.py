"""Write the API reference pages from the package's ``__all__`` lists.

Every public module (no component starting with ``_``) gets a page listing the
objects it exports; each object is documented once, on the page of the first
module that exports it in :data:`SECTIONS` order, and the other pages link to it.
The pages are regenerated on every build, so the reference cannot fall behind the
code; ``tests/test_docs.py`` checks that every public object has a page.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from pathlib import Path

# (title, modules) in the order the reference presents them; a module missing
# here is appended to "Other modules" and flagged by tests/test_docs.py.
SECTIONS = [
    ("Empirical Bayes", ["ebfl.eb", "ebfl.eb.gaussian", "ebfl.eb.beta_binomial",
                         "ebfl.eb.discrete", "ebfl.eb.gaussian_mixture", "ebfl.eb.npmle",
                         "ebfl.eb.mixture_weights", "ebfl.eb.normal_means",
                         "ebfl.eb.normal_means.api", "ebfl.eb.normal_means.families",
                         "ebfl.eb.normal_means.grid", "ebfl.eb.normal_means.horseshoe",
                         "ebfl.eb.normal_means.generalized_binary",
                         "ebfl.eb.normal_means.deconvolver", "ebfl.eb.normal_means.modes",
                         "ebfl.eb.normal_means.names",
                         "ebfl.eb.normal_means.prior", "ebfl.eb.normal_means.truncated",
                         "ebfl.eb.priors", "ebfl.eb.results", "ebfl.models", "ebfl.ragged"]),
    ("Quantization, privacy and accounting",
     ["ebfl.privacy", "ebfl.privacy.mechanisms", "ebfl.privacy.estimators",
      "ebfl.privacy.shrinkage",
      "ebfl.privacy.accounting", "ebfl.privacy.accounting.core", "ebfl.privacy.accounting.rdp",
      "ebfl.privacy.accounting.accountant", "ebfl.privacy.accounting.dp_fedavg",
      "ebfl.privacy.accounting.adaped",
      "ebfl.privacy.accounting.guarantee", "ebfl.privacy.sweep"]),
    ("Bounds and Monte Carlo validation",
     ["ebfl.bounds", "ebfl.validation", "ebfl.validation.engine", "ebfl.validation.sweeps",
      "ebfl.validation.registry"]),
    ("Personalized regression",
     ["ebfl.learning", "ebfl.learning.regression", "ebfl.learning.logistic_eb",
      "ebfl.learning.population_models", "ebfl.learning.federated", "ebfl.learning.data",
      "ebfl.learning.partition", "ebfl.learning.theorem6"]),
    ("Neural personalized FL (torch)",
     ["ebfl.learning.torch", "ebfl.learning.torch.engine", "ebfl.learning.torch.strategies",
      "ebfl.learning.torch.baselines", "ebfl.learning.torch.baselines.adaptation",
      "ebfl.learning.torch.baselines.global_model", "ebfl.learning.torch.baselines.local_copy",
      "ebfl.learning.torch.baselines.distillation", "ebfl.learning.torch.baselines.fedem",
      "ebfl.learning.torch.partial",
      "ebfl.learning.torch.distillation",
      "ebfl.learning.torch.adapters", "ebfl.learning.torch.pretrain",
      "ebfl.learning.torch.dp_sgd", "ebfl.learning.torch.models",
      "ebfl.learning.torch.corruptions", "ebfl.learning.torch.functional",
      "ebfl.learning.torch.stacked",
      "ebfl.learning.torch.data"]),
    ("The generative framework (AdaPeD)",
     ["ebfl.generative", "ebfl.generative.algorithm", "ebfl.generative.checks",
      "ebfl.generative.estimation", "ebfl.generative.election", "ebfl.generative.regression",
      "ebfl.generative.hapt", "ebfl.generative.adaped", "ebfl.generative.adaped_protocol"]),
    ("FedHDP", ["ebfl.fedhdp", "ebfl.fedhdp.theory", "ebfl.fedhdp.aggregation",
                "ebfl.fedhdp.levels", "ebfl.fedhdp.point_estimation", "ebfl.fedhdp.algorithm",
                "ebfl.fedhdp.data",
                "ebfl.fedhdp.experiment", "ebfl.fedhdp.checks", "ebfl.fedhdp.figures"]),
    ("PerAda", ["ebfl.perada", "ebfl.perada.algorithm", "ebfl.perada.dp",
                "ebfl.perada.generalization", "ebfl.perada.data", "ebfl.perada.experiment"]),
    ("DP-PFL", ["ebfl.dppfl", "ebfl.dppfl.algorithm", "ebfl.dppfl.objective",
                "ebfl.dppfl.accounting", "ebfl.dppfl.theory", "ebfl.dppfl.exact", "ebfl.dppfl.data",
                "ebfl.dppfl.federated", "ebfl.dppfl.experiment", "ebfl.dppfl.checks"]),
    ("Federated runtimes and Flower",
     ["ebfl.federated", "ebfl.federated.protocol", "ebfl.federated.runtime",
      "ebfl.federated.checkpoint", "ebfl.federated.faults", "ebfl.federated.streams",
      "ebfl.federated.eb", "ebfl.federated.eb_normal_means", "ebfl.federated.eb_data",
      "ebfl.federated.tree",
      "ebfl.flower", "ebfl.flower.jobs", "ebfl.flower.runtime", "ebfl.flower.deploy",
      "ebfl.flower.loopback"]),
    ("Datasets and the data home",
     ["ebfl.datasets", "ebfl.datasets.elections", "ebfl.datasets.idx", "ebfl.datasets.cifar",
      "ebfl.datasets.leaf", "ebfl.datasets.tff_emnist", "ebfl.datasets.uci_har",
      "ebfl.datasets.hapt", "ebfl.datasets.hapt_uci", "ebfl.datasets.synthetic_digits"]),
    ("Command line and demo", ["ebfl.cli", "ebfl.demo"]),
]


def public_modules(package: str = "ebfl") -> list[str]:
    """Every importable module of ``package`` without a private component."""
    root = importlib.import_module(package)
    names = [package]
    for info in pkgutil.walk_packages(root.__path__, package + "."):
        if not any(part.startswith("_") for part in info.name.split(".")):
            names.append(info.name)
    return sorted(names)


def exported(module: str) -> list[tuple[str, object]]:
    """``(name, object)`` for the module's ``__all__``, submodules left out."""
    mod = importlib.import_module(module)
    out = []
    for name in getattr(mod, "__all__", ()):
        obj = getattr(mod, name)
        if not inspect.ismodule(obj):
            out.append((name, obj))
    return out


def _key(name, obj):
    # The same object exported under the same name is documented once. Constants are
    # matched by name too: equal small ints or strings may be one interned object.
    return (id(obj), name)


def plan():
    """``[(title, [(module, [(name, home)])])]``: where each object is documented."""
    listed = [m for _, mods in SECTIONS for m in mods]
    others = [m for m in public_modules() if m not in listed and m != "ebfl"]
    sections = SECTIONS + ([("Other modules", others)] if others else [])
    home: dict[tuple[int, str], str] = {}
    out = []
    for title, modules in sections:
        pages = []
        for module in modules:
            rows = []
            for name, obj in exported(module):
                key = _key(name, obj)
                full = f"{module}.{name}"
                rows.append((name, home.setdefault(key, full)))
            pages.append((module, rows))
        out.append((title, pages))
    return out


def _module_page(module: str, rows) -> str:
    own = [name for name, full in rows if full == f"{module}.{name}"]
    shared = [(name, full) for name, full in rows if full != f"{module}.{name}"]
    lines = [module, "=" * len(module), "", f".. automodule:: {module}", "   :no-members:", ""]
    if own:
        # A heading of its own, so that the table does not land inside the last
        # section of the module docstring.
        lines += ["Contents", "-" * 8, "", f".. currentmodule:: {module}", "", ".. autosummary::",
                  "   :toctree: objects", "   :nosignatures:", ""]
        lines += [f"   {name}" for name in own] + [""]
    if shared:
        # Summaries as in "Contents"; "~" shows the short name, the link goes to the
        # object's one page under the module that documents it.
        lines += ["Also exported here", "-" * 18, "", ".. autosummary::", "   :nosignatures:",
                  ""]
        lines += [f"   ~{full}" for _, full in shared] + [""]
    return "\n".join(lines)


def write_pages(outdir: Path) -> list[Path]:
    """Write ``index.rst`` and one page per module into ``outdir``."""
    outdir.mkdir(parents=True, exist_ok=True)
    written = []
    sections = plan()
    index = ["API reference", "=============", "",
             "Everything a module lists in ``__all__``, grouped by area, each module with the",
             "first line of its docstring. The top-level ``ebfl`` namespace re-exports the",
             "most used estimators and models:", "",
             ".. autosummary::", "   :nosignatures:", ""]
    # The top-level names link to the one page of each object (ebfl itself has none).
    homes = {_key(name, getattr(importlib.import_module(module), name)): full
             for _, pages in sections for module, rows in pages for name, full in rows}
    index += [f"   ~{homes[_key(name, obj)]}" for name, obj in exported("ebfl")] + [""]
    for title, pages in sections:
        # The toctree (hidden) makes the sidebar and the page order; the table, with
        # one summary per module, is what the reader sees.
        index += [title, "-" * len(title), "", ".. toctree::", "   :hidden:",
                  "   :maxdepth: 1", ""]
        index += [f"   {module}" for module, _ in pages]
        index += ["", ".. autosummary::", "   :nosignatures:", ""]
        for module, rows in pages:
            path = outdir / f"{module}.rst"
            text = _module_page(module, rows)
            if not path.exists() or path.read_text() != text:
                path.write_text(text)
            written.append(path)
            index.append(f"   {module}")
        index.append("")
    path = outdir / "index.rst"
    text = "\n".join(index)
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    return written


def _homes() -> dict[int, str]:
    """``id(object) -> documented name`` of the functions, classes and containers."""
    homes = {}
    for _, pages in plan():
        for module, rows in pages:
            mod = importlib.import_module(module)
            for name, full in rows:
                obj = getattr(mod, name)
                # Not scalars: equal small ints and strings may be one interned object.
                if callable(obj) or isinstance(obj, (tuple, list, dict, frozenset)):
                    homes.setdefault(id(obj), full)
    return homes


def _resolve(path: str) -> tuple[list[str], list[object]] | None:
    """The names after the longest importable module of dotted ``path``, and the
    objects along them (the module first); None if a name is missing."""
    if not path:  # a reference from a page outside any module (the user guide)
        return None
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        objects = [obj]
        for part in parts[i:]:
            obj = getattr(obj, part, None)
            if obj is None:
                return None
            objects.append(obj)
        return parts[i:], objects
    return None


def _object_at(path: str):
    """The object at dotted ``path``, or None."""
    found = _resolve(path)
    return found[1][-1] if found else None


def _documented_name(path: str, homes: dict[int, str]) -> str | None:
    """Where the object at ``path`` (any module path that exports it) is documented."""
    found = _resolve(path)
    if found is None:
        return None
    names, chain = found[0], found[1][1:]
    if len(chain) >= 2 and inspect.isclass(chain[-2]):
        # A member: documented on the class of the MRO that defines it.
        for klass in chain[-2].__mro__:
            if names[-1] in vars(klass) and id(klass) in homes:
                return f"{homes[id(klass)]}.{names[-1]}"
    for k in range(len(chain) - 1, -1, -1):
        if id(chain[k]) in homes:
            return ".".join([homes[id(chain[k])], *names[k + 1:]])
    return None


def _missing_reference(app, env, node, contnode):
    """Resolve a Python reference by any path that exports the object.

    Each object has one page, under the first module that exports it; docstrings
    refer to objects by their defining module (``ebfl.eb.gaussian.gaussian_eb``), by
    a name relative to the current module or class, or by a member inherited from a
    documented class, which Sphinx alone cannot match to that page.
    """
    if node.get("refdomain") != "py":
        return None
    if not hasattr(app.env, "_ebfl_homes"):
        app.env._ebfl_homes = _homes()
    homes = app.env._ebfl_homes
    target = node["reftarget"].lstrip("~.")
    module, cls = node.get("py:module"), node.get("py:class")
    candidates = [target]
    if module:
        candidates.insert(0, f"{module}.{target}")
        if cls:
            candidates.insert(0, f"{module}.{cls}.{target}")
    # Names in a docstring refer to the module that defines the documented object.
    page = node.get("refdoc", "")
    contexts = [_object_at(f"{module}.{cls}" if module and cls else module or "")]
    if page.startswith("api/objects/"):
        contexts.append(_object_at(page.rpartition("/")[2]))
    for context in contexts:
        defining = getattr(context, "__module__", None) or getattr(context, "__name__", None)
        if defining:
            candidates.append(f"{defining}.{target}")
            if cls:
                candidates.append(f"{defining}.{cls}.{target}")
    names = [name for candidate in candidates
             for name in (_documented_name(candidate, homes), candidate) if name]
    # A summary line in an autosummary table of an API page (the index, a module's
    # "Also exported here") is parsed without the module of the object it summarizes:
    # there a plain name may stand for the one documented object of that name.
    if page.startswith("api/") and "." not in target:
        if not hasattr(app.env, "_ebfl_short_names"):
            short = {}
            for full in set(homes.values()):
                short.setdefault(full.rpartition(".")[2], set()).add(full)
            app.env._ebfl_short_names = short
        matches = app.env._ebfl_short_names.get(target, ())
        if len(matches) == 1:
            names.extend(matches)
    domain = env.get_domain("py")
    for name in names:
        # "obj" matches any object type: autosummary documents module constants as
        # attributes, which a :data: role alone does not find.
        found = domain.resolve_xref(env, node["refdoc"], app.builder, "obj", name,
                                    node, contnode)
        if found is not None:
            return found
    return None


_sphinx_summary = None  # sphinx.ext.autosummary.extract_summary, replaced in setup()


def _public_bases(app, name, obj, options, bases):
    """Show a class's public ancestors in place of private helper bases."""
    out = []
    pending = list(bases)
    while pending:
        base = pending.pop(0)
        if base.__name__.startswith("_") and base.__module__.startswith("ebfl"):
            pending[:0] = [b for b in base.__bases__ if b is not object]
        elif base not in out:
            out.append(base)
    bases[:] = out


def _summary_line(doc, settings):
    """The summary of an autosummary table row: the docstring's first line when it is
    the whole first paragraph and a sentence (numpydoc's summary line), else Sphinx's
    first sentence. Sphinx cuts at the first period followed by a space, which would
    leave "(Theorems 1-4, eqs." of "(Theorems 1-4, eqs. (46)-(47))."."""
    lines = [line.strip() for line in doc]
    start = next((i for i, line in enumerate(lines) if line), None)
    if start is not None:
        first = lines[start]
        if (first.endswith(".") and not first.startswith("..")
                and (start + 1 == len(lines) or not lines[start + 1])):
            return first
    return _sphinx_summary(doc, settings)


def setup(app):
    global _sphinx_summary
    from sphinx.ext import autosummary

    if autosummary.extract_summary is not _summary_line:
        _sphinx_summary = autosummary.extract_summary
        autosummary.extract_summary = _summary_line
    write_pages(Path(app.srcdir) / "api")
    app.connect("missing-reference", _missing_reference)
    app.connect("autodoc-process-bases", _public_bases)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
