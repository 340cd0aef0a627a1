"""The errata page (docs/errata.md) defines every label the project cites, and what it cites exists.

Labels: ``[!n]`` (the generative-framework paper), ``[DP-PFL n]``, ``[PerAda n]`` and
``[FedHDP n]``. A label is defined by an explicit anchor ``(errata-<paper>-<n>)=`` whose next
non-blank line names the label. Code, docs, the README and the notebooks cite labels as
``errata [!5]``, ``errata [DP-PFL 2], [DP-PFL 4]`` and so on.
"""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ERRATA = ROOT / "docs" / "errata.md"

LABEL = r"\\?\[(?:!\d+|(?:DP-PFL|PerAda|FedHDP) \d+)\\?\]"
#: "errata" followed by one or more labels ("errata [!9], [!10]", "errata\n    [!3]").
CITATION = re.compile(rf"errata((?:[\s,;]*(?:and\s+|to\s+)?{LABEL})+)")
ANCHOR = re.compile(r"^\((errata-(gf|dppfl|perada|fedhdp)-(\d+))\)=\s*$")
PREFIX = {"gf": "!", "dppfl": "DP-PFL ", "perada": "PerAda ", "fedhdp": "FedHDP "}
#: A test the page cites: tests/<file>.py::<function>.
TEST_REF = re.compile(r"(tests/[\w/]+\.py)::(\w+)")


def _page():
    return ERRATA.read_text(encoding="utf-8")


def _labels(text):
    return {m.replace("\\", "") for m in re.findall(LABEL, text)}


def _defined():
    """label -> anchor, for every anchor of the page followed by its label."""
    lines = _page().splitlines()
    out = {}
    for i, line in enumerate(lines):
        m = ANCHOR.match(line)
        if not m:
            continue
        label = f"[{PREFIX[m.group(2)]}{m.group(3)}]"
        following = next((x for x in lines[i + 1:] if x.strip()), "")
        assert label in following.replace("\\", ""), (
            f"anchor {m.group(1)} is not followed by its label {label}: {following!r}")
        assert label not in out, f"{label} is defined twice"
        out[label] = m.group(1)
    return out


def _cited():
    """label -> files citing it, over ebfl/, docs/, README.md and notebooks/."""
    files = [ROOT / "README.md"]
    files += sorted((ROOT / "ebfl").rglob("*.py"))
    files += sorted(p for p in (ROOT / "docs").rglob("*") if p.suffix in (".md", ".rst", ".py")
                    and p.relative_to(ROOT / "docs").parts[0] not in ("_build", "api"))
    files += sorted((ROOT / "notebooks").glob("*.ipynb"))
    out = {}
    for path in files:
        text = path.read_text(encoding="utf-8")
        for m in CITATION.finditer(text):
            for label in _labels(m.group(1)):
                out.setdefault(label, set()).add(str(path.relative_to(ROOT)))
    return out


def test_the_page_defines_labels_of_every_paper():
    defined = _defined()
    for prefix in ("[!", "[DP-PFL ", "[PerAda ", "[FedHDP "):
        assert any(label.startswith(prefix) for label in defined), prefix
    # the generative-framework labels the code cited first keep their numbers
    for n in (3, 4, 5, 9, 10, 12, 13, 14, 15, 19):
        assert f"[!{n}]" in defined
    # the other papers are numbered from 1 without gaps
    for prefix in ("DP-PFL", "PerAda", "FedHDP"):
        numbers = sorted(int(k[len(prefix) + 2:-1]) for k in defined
                         if k.startswith(f"[{prefix} "))
        assert numbers == list(range(1, len(numbers) + 1)), prefix


def test_every_cited_label_is_defined():
    cited, defined = _cited(), _defined()
    assert cited, "no errata citation found: the pattern is broken"
    missing = {label: sorted(where) for label, where in cited.items() if label not in defined}
    assert not missing, f"cited but not defined on docs/errata.md: {missing}"


def test_the_citation_pattern():
    text = ("see errata [!9], [!10] and errata\n    [DP-PFL 2]; "
            "errata \\[PerAda 1\\] to \\[PerAda 8\\]")
    labels = set()
    for m in CITATION.finditer(text):
        labels |= _labels(m.group(1))
    assert labels == {"[!9]", "[!10]", "[DP-PFL 2]", "[PerAda 1]", "[PerAda 8]"}
    assert not CITATION.search("errata [!n] and errata [DP-PFL n]")


def test_links_to_the_page_name_existing_anchors():
    anchors = set(_defined().values())
    anchors |= set(re.findall(r"^\(([\w-]+)\)=\s*$", _page(), flags=re.M))
    for path in sorted((ROOT / "docs").rglob("*.md")):
        if "_build" in path.parts:
            continue
        text = path.read_text(encoding="utf-8")
        own = r"\(#([\w-]+)\)" if path == ERRATA else r"errata\.md#([\w-]+)\)"
        for anchor in re.findall(own, text):
            assert anchor in anchors, f"{path.relative_to(ROOT)} links to a missing #{anchor}"


def _test_functions(path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {node.name for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}


def test_every_cited_test_exists():
    refs = TEST_REF.findall(_page())
    assert len(refs) > 20
    missing = []
    for file, name in refs:
        path = ROOT / file
        if not path.is_file() or name not in _test_functions(path):
            missing.append(f"{file}::{name}")
    assert not missing, f"docs/errata.md cites tests that do not exist: {missing}"


def test_every_cited_validate_check_exists():
    from ebfl.validation import CHECKS

    names = re.findall(r"ebfl validate ([a-z0-9_]+\*?)", _page())
    assert names
    for name in names:
        if name.endswith("*"):
            assert any(check.startswith(name[:-1]) for check in CHECKS), name
        else:
            assert name in CHECKS, f"docs/errata.md cites an unknown check {name!r}"
