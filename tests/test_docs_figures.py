"""The documentation's figures agree with their pages, and redraw from their numbers.

Each figure that ebfl can draw again keeps the numbers it shows in
``docs/figures/<name>.json`` (written and redrawn by ``docs/figures/redraw.py``).
For each one this checks that those numbers agree with the tables and captions of
the pages that print them (to the printed precision), that the caption's seeds
and command are the JSON's, and that the JSON redraws the committed PNG. A figure
without stored numbers must say so in its caption.
"""

import importlib
import importlib.util
import re
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
FIGURES_DIR = DOCS / "figures"
_spec = importlib.util.spec_from_file_location("docs_figures_redraw", FIGURES_DIR / "redraw.py")
redraw = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(redraw)

NAMES = redraw.stored_names()
PNGS = sorted(p.stem for p in FIGURES_DIR.glob("*.png"))
PAGES = sorted(DOCS.glob("*.md")) + sorted((DOCS / "guide").glob("*.md"))


# --- reading the pages ------------------------------------------------------------------

def _text(page):
    return (ROOT / page).read_text(encoding="utf-8")


def caption(png):
    """(page, caption) of the figure ``png`` on the page that shows it: a MyST figure's
    caption, or a Markdown image's alt text."""
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        block = re.search(r"```\{figure\} [^\n]*/" + re.escape(png) + r"\n(.*?)\n```", text,
                          re.S)
        if block:
            body = [ln for ln in block.group(1).splitlines() if not ln.startswith(":")]
            return page, " ".join(ln.strip() for ln in body if ln.strip())
        image = re.search(r"!\[([^\]]*)\]\([^)]*/" + re.escape(png) + r"\)", text)
        if image:
            return page, image.group(1)
    return None, None


def section(page, heading):
    """The text of ``page`` from the heading that starts with ``heading`` to the next
    heading of the same or a higher level."""
    text = _text(page)
    start = text.index("\n" + heading) + 1
    body = text.index("\n", start)
    level = len(heading) - len(heading.lstrip("#"))
    end = re.search(rf"^#{{1,{level}}} ", text[body:], re.M)
    return text[start:body + end.start()] if end else text[start:]


def tables(text):
    """The Markdown tables of ``text``: each a list of rows, each a list of cells (the
    header first, the separator row dropped; bold marks removed)."""
    out, current = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            cells = [c.strip().replace("**", "") for c in line.strip().strip("|").split("|")]
            if not all(set(c) <= set("-: ") for c in cells):
                current.append(cells)
        elif current:
            out.append(current)
            current = []
    return out


def table(text, first_header):
    """The one table of ``text`` whose first header cell is ``first_header``."""
    found = [t for t in tables(text) if t[0][0] == first_header]
    assert len(found) == 1, f"{len(found)} tables headed {first_header!r}"
    return found[0]


def row(tab, label):
    """The cells of the row of ``tab`` whose first cell is ``label``."""
    found = [r for r in tab[1:] if r[0] == label]
    assert len(found) == 1, f"{len(found)} rows {label!r}"
    return found[0]


def row_where(tab, *first):
    """The cells of the row of ``tab`` whose first cells are ``first``."""
    found = [r for r in tab[1:] if tuple(r[:len(first)]) == first]
    assert len(found) == 1, f"{len(found)} rows {first!r}"
    return found[0]


_SUPERSCRIPT = str.maketrans("⁻⁰¹²³⁴⁵⁶⁷⁸⁹", "-0123456789")
_NUMBER = re.compile(r"(?<![\w.])([−-]?\d[\d,]*(?:\.(\d+))?)(?: × 10([⁻⁰¹²³⁴⁵⁶⁷⁸⁹]+))?")


def numbers(text):
    """The numbers printed in ``text``, each ``(value, half a unit of its last digit)``;
    ``1.6 × 10⁻⁹`` and ``9,159`` read as numbers."""
    out = []
    for m in _NUMBER.finditer(text):
        value = float(m.group(1).replace("−", "-").replace(",", ""))
        half = 0.5 * 10.0 ** -len(m.group(2) or "")
        if m.group(3):
            scale = 10.0 ** int(m.group(3).translate(_SUPERSCRIPT))
            value, half = value * scale, half * scale
        out.append((value, half))
    return out


def agrees(ours, printed):
    """``ours`` rounds to ``printed`` = (value, half unit); the JSON keeps 6 significant
    digits, hence the small relative slack."""
    value, half = printed
    return abs(ours - value) <= half * (1 + 1e-6) + 1e-6 * abs(ours)


def check(ours, cell, *, index=0, where=""):
    printed = numbers(cell)[index]
    assert agrees(ours, printed), f"{where}: ours {ours!r}, the page prints {cell!r}"


# --- per figure: its numbers against the page --------------------------------------------

def _estimation_e8(stored):
    d = stored["data"]
    text = section("docs/reproductions.md", "### E8")
    tab = table(text, "ε₀")
    assert len(tab) - 1 == len(d["rows"])
    for cells, r in zip(tab[1:], d["rows"], strict=True):
        where = f"E8 at eps0 = {cells[0]}"
        check(r["epsilon"], cells[0], where=where)
        check(r["mse"]["mean"], cells[1], where=where)
        check(r["mse"]["se"], cells[1], index=1, where=where)
        check(r["formula"], cells[2], where=where)
        check(r["weight"], cells[3], where=where)
        check(r["true_delta"], cells[4], where=where)
    line = re.search(r"\(local estimator: (.*?)\)", text).group(1)
    printed = re.split(r";|against", line)
    for ours, cell in zip((d["local"]["mean"], d["local"]["formula"], d["non_private"]["mean"],
                           d["non_private"]["formula"]), printed, strict=True):
        check(ours, cell, where="E8's local and non-private MSEs")


_ELECTION_ROWS = {"Republican two-party vote share": "share",
                  "0/1 outcome (a Republican win)": "outcome"}


def _election_gains(stored):
    d = stored["data"]
    tab = table(section("docs/reproductions.md", "### E2"), "target of the held-out election")
    methods = ("loo_printed", "loo_corrected", "mle")
    for label, target in _ELECTION_ROWS.items():
        for cell, meth in zip(row(tab, label)[2:], methods, strict=True):
            values = d["gains"][target][meth]["per_fold"]
            assert np.mean(values) == pytest.approx(d["gains"][target][meth]["mean"], abs=1e-4)
            check(np.mean(values), cell, where=f"E2 {target} {meth}")
            check(np.std(values, ddof=1), cell, index=1, where=f"E2 {target} {meth}")
    paper = d["paper"]
    assert f"{paper['gain_pct']:g} ± {paper['pm']:g} %" in caption("election_gains.png")[1]
    # the guide prints the non-private corrected gains fold by fold
    tab = table(_text("docs/guide/elections.md"), "target")
    for target in ("outcome", "share"):
        cells = row_where(tab, target, "non-private `loo_corrected`")
        folds = numbers(cells[3])
        values = d["gains"][target]["loo_corrected"]["per_fold"]
        assert all(agrees(v, p) for v, p in zip(values, folds, strict=True)), cells


def _election_shrinkage(stored):
    d = stored["data"]
    text = _text("docs/guide/elections.md")
    printed = re.search(r"([\d,]+) counties are\s+present in all six elections", text).group(1)
    assert d["n_counties"] == int(printed.replace(",", "")) == sum(d["counties"])
    cap = caption("election_shrinkage.png")[1]
    training = [y for y in d["years"] if y != d["held_out"]]
    assert f"every election but {d['held_out']}" in cap
    assert f"Republican wins {training[0]}-{training[-1]}" in cap
    assert d["n_trials"] == len(training)


_HAPT_NAMES = {"majority class (per client)": "majority class",
               "local, ridge logistic (C = 1)": "local (ridge, C=1)",
               "FedAvg": "FedAvg", "FedAvg + fine-tuning": "FedAvg + fine-tuning",
               "Algorithm 3, sign fixed": "Algorithm 3 (sign fixed)",
               "Algorithm 3 as printed": "Algorithm 3 (as printed)",
               "EB, Laplace EM (corrected)": "EB, Laplace EM (corrected)"}


def _hapt_logistic(stored):
    results = stored["data"]["results"]
    for page, heading, columns in (
            ("docs/reproductions.md", "### Logistic regression", ("accuracy", "sigma_theta2")),
            ("docs/guide/regression.md", "## Logistic regression",
             ("accuracy", "balanced_accuracy", "sigma_theta2"))):
        tab = table(section(page, heading), "estimator")
        assert len(tab) > 4
        for cells in tab[1:]:
            r = results[_HAPT_NAMES[cells[0]]]
            for key, cell in zip(columns, cells[1:], strict=True):
                if key == "sigma_theta2" and cell == "–":
                    assert key not in r
                    continue
                check(r[key], cell, where=f"{page}: {cells[0]} {key}")
                if key == "accuracy":
                    check(r["se"], cell, index=1, where=f"{page}: {cells[0]} se")
    assert stored["data"]["settings"]["task"] == "SITTING vs rest"
    assert "SITTING against the rest" in caption("hapt_logistic.png")[1]


_TABLE1_NAMES = {"FedAvg + fine-tuning": "FedAvg+FT", "Ditto": "Ditto", "pFedMe": "pFedMe",
                 "AdaPeD": "AdaPeD", "local": "Local"}


def _adaped_table1_hapt(stored):
    d = stored["data"]
    rounds, claims = re.search(r"At round (\d+): (.*?)\.(?: |$)",
                               caption("adaped_table1_hapt.png")[1]).groups()
    claims = dict(re.findall(r"([A-Za-z][A-Za-z +-]*?) (\d+\.\d+)", claims))
    assert set(claims) == set(_TABLE1_NAMES)
    for name, value in claims.items():
        last_round, accuracy = d["curves"][_TABLE1_NAMES[name]][-1]
        assert last_round == int(rounds) == d["settings"]["rounds"]
        check(accuracy, value, where=f"round {rounds}, {name}")


def _dp_row(stored, label):
    d = stored["data"]
    tab = table(section("docs/guide/neural.md", "## DP-AdaPeD"), "run")
    zs = [numbers(h)[0][0] for h in tab[0][1:5]]
    assert zs == [r["noise_multiplier"] for r in d["runs"]]
    index = [r[0] for r in tab].index(label)
    accuracy, epsilon = tab[index], tab[index + 1]
    assert epsilon[0] == "ε by Theorem 7 / by the accountant"
    for r, acc, eps in zip(d["runs"], accuracy[1:5], epsilon[1:5], strict=True):
        check(r["accuracy"], acc, where=f"{label}, z = {r['noise_multiplier']}")
        check(r["epsilon_theorem7"], eps, where=f"{label}, Theorem 7's epsilon")
        check(r["epsilon_accountant"], eps, index=1, where=f"{label}, the accountant's")
    check(d["reference"]["AdaPeD"], accuracy[5], where=f"{label}, non-private")
    check(d["reference"]["Local"], accuracy[6], where=f"{label}, local")


def _adaped_dp_hapt(stored):
    _dp_row(stored, "HAPT, K = 10 of 30, separate clips (92 s)")
    assert not stored["data"]["settings"]["concatenate"]


def _adaped_dp_hapt_concat_finetune(stored):
    _dp_row(stored, "HAPT, one clip on [h; k] and fine-tuning (Figure 2's; 99 s)")
    s = stored["data"]["settings"]
    assert s["concatenate"] and s["fine_tune"]
    assert "`--concatenate --fine-tune`" in caption("adaped_dp_hapt_concat_finetune.png")[1]


def _adaped_fedem_hapt(stored):
    d = stored["data"]
    tab = table(section("docs/guide/neural.md", "## AdaPeD against FedEM"), "z")
    cells = row(tab, "non-private")
    for name, cell in zip(("AdaPeD", "FedEM"), cells[3:], strict=True):
        check(d["non_private"][name]["mean"], cell, where=f"non-private {name}")
        check(d["non_private"][name]["sd"], cell, index=1, where=f"non-private {name}")
    for r in d["runs"]:
        cells = row(tab, f"{r['noise_multiplier']:g}")
        check(r["epsilon_accountant"], cells[1], where=f"z = {cells[0]}, epsilon")
        check(r["epsilon_theorem7"], cells[2], where=f"z = {cells[0]}, Theorem 7")
        for name, cell in zip(("DP-AdaPeD", "DP-FedEM"), cells[3:], strict=True):
            check(r[name]["mean"], cell, where=f"z = {cells[0]}, {name}")
            check(r[name]["sd"], cell, index=1, where=f"z = {cells[0]}, {name}")
    assert d["settings"]["seeds"] == stored["seeds"]


_PROTOCOL_NAMES = {"AdaPeD": "AdaPeD", "FedAvg": "FedAvg", "FedAvg + fine-tuning": "FedAvg+FT",
                   "pFedMe": "pFedMe", "QuPeD (full precision)": "QuPeD-FP",
                   "local training only": "Local"}


def _protocol_rows(panel):
    return {(r["samples_per_client"], r["method"]): r for r in panel["rows"]}


def _adaped_table1_protocol(stored):
    from ebfl.generative.adaped_protocol import _seeds_text, seeds_by_size

    default, tuned = stored["data"]
    text = section("docs/guide/neural.md", "### Which protocol reproduces Table 1?")
    for panel in (default, tuned):
        sizes = panel["settings"]["sizes"]
        heads = ["50", "100", "200", "500", "all (≈ 1,100)", "paper"] if panel is default \
            else ["50, seeds 0–2", "all, seed 0", "paper"]
        tab = [t for t in tables(text) if t[0] == ["method", *heads]]
        assert len(tab) == 1, heads
        tab = tab[0]
        rows = _protocol_rows(panel)
        by_size = seeds_by_size(panel)
        for size, head in zip(sizes, heads, strict=False):
            if panel is tuned:  # the header names the seeds of the column
                assert head == f"{size}, {_seeds_text(by_size[size])}"
            for cells in tab[1:]:
                if cells[0] not in _PROTOCOL_NAMES:
                    continue  # the RMS-gap row
                r = rows[size, _PROTOCOL_NAMES[cells[0]]]
                cell = cells[heads.index(head) + 1]
                where = f"{cells[0]} at {size} ({'tuned' if panel is tuned else 'default'})"
                check(r["mean"], cell, where=where)
                if len(r["seeds"]) > 1:
                    check(r["sd"], cell, index=1, where=where)
                if r.get("lr"):
                    rates = re.search(r"\((.*)\)", cell).group(1).replace("*", "")
                    assert [float(v) for v in rates.split(",")] == r["lr"], where
                paper = cells[-1]
                if r["paper"] is None:
                    assert paper == "–"
                else:
                    check(r["paper"], paper, where=where + ", the paper")
                # seed 0 alone (kept in the history) is one of the seeds behind mean ± sd
                x0, m, s, k = r["seed_0"], r["mean"], r["sd"], len(r["seeds"])
                assert (x0 - m) ** 2 <= (k - 1) * s ** 2 + 0.05, where
    # the Table 1 summary on the reproductions page
    tab = table(section("docs/reproductions.md", "### Table 1"), "method")
    rows_d, rows_t = _protocol_rows(default), _protocol_rows(tuned)
    for cells in tab[1:]:
        name = _PROTOCOL_NAMES[cells[0]]
        check(rows_d["all", name]["mean"], cells[1], where=f"reproductions: {name}, all")
        check(rows_d[50, name]["mean"], cells[2], where=f"reproductions: {name}, 50")
        if (key := ("all", name)) in rows_t:
            check(rows_t[key]["mean"], cells[3], where=f"reproductions: {name}, tuned")
    # the caption says which seeds each panel has
    cap = caption("adaped_table1_protocol.png")[1]
    left, right = re.split(r"\bright:", cap)
    for part, panel in ((left, default), (right, tuned)):
        claimed = {_seeds_text(v) for v in seeds_by_size(panel).values()}
        assert claimed == set(re.findall(r"seeds? \d+(?:–\d+)?", part)), (part, claimed)


def _within(data, sigmas=4.0):
    """Monte Carlo against the formula, by the guide's rule for the row's kind."""
    est, se, formula = (np.asarray(data[k]) for k in ("estimate", "se", "formula"))
    gap = est - formula
    return {"exact": np.abs(gap) <= sigmas * se, "upper": gap <= sigmas * se,
            "lower": gap >= -sigmas * se}[data["kind"]]


def _sweep(kind, xlabel, phrase):
    def run(stored):
        d = stored["data"]
        assert d["kind"] == kind and d["xlabel"] == xlabel
        assert _within(d).all()
        assert phrase in caption(stored["figure"])[1]
    return run


def _validate_theorem2_quantizer(stored):
    _sweep("upper", "bits per coordinate k", "against the upper bound")(stored)
    xs = stored["data"]["x"]
    lo, hi = re.search(r"k = (\d+) to (\d+)", caption(stored["figure"])[1]).groups()
    assert xs == list(range(int(lo), int(hi) + 1))


def _validate_theorem4(stored):
    _sweep("lower", "eps0", "against its lower bound")(stored)
    assert "it stays near 1" in caption(stored["figure"])[1]
    assert min(stored["data"]["estimate"]) >= 0.9


def _fedhdp_figure1(stored):
    from ebfl.fedhdp import theory as T

    d = stored["data"]
    p = d["params"]
    for panel in d["panels"]:
        for curve in panel:
            args = (p["n_clients"], p["rho"], p["alpha2"], curve["sigma_c2"] - p["alpha2"],
                    curve["gamma2"])
            formula = T.server_mse(np.asarray(d["r_points"]), *args)
            assert np.all(np.abs(np.asarray(curve["mean"]) - formula)
                          <= 4 * np.asarray(curve["se"]))
    assert "formula against Monte Carlo" in caption(stored["figure"])[1]


def _fedhdp_figure2(stored):
    d = stored["data"]
    true, paper = re.search(r"the true minimizer ([\d.]+) against the paper's λ\\\* = ([\d.]+)",
                            caption(stored["figure"])[1]).groups()
    check(d["minimizer"]["opt"]["stays private"]["lambda"], true, where="true minimizer")
    check(d["paper_lambda"]["stays private"]["lambda"], paper, where="the paper's lambda*")
    assert not d["regression"]


def _fedhdp_figure3(stored):
    d = stored["data"]
    assert d["regression"]
    assert f"linear regression with d = {d['d']}" in caption(stored["figure"])[1]


def _fedhdp_figure4(stored):
    points = stored["data"]["points"]
    hdp, opt = (np.asarray(points[k]["mean"]) for k in ("hdp", "opt"))
    se = np.asarray(points["hdp"]["se"]) + np.asarray(points["opt"]["se"])
    assert np.all(opt <= hdp + 4 * se)  # r* is optimal: FedHDP never loses to uniform weights
    assert "HDP-FedAvg, DP-FedAvg and FedHDP" in caption(stored["figure"])[1]


def _private_bernoulli(stored):
    s = stored["data"]["setting"]
    alpha, beta, m, n = re.search(r"Beta\((\d+), (\d+)\), m = 10(\S+), n = (\d+)",
                                  caption(stored["figure"])[1]).groups()
    assert (s["alpha"], s["beta"], s["n"]) == (float(alpha), float(beta), int(n))
    assert s["m"] == 10 ** int(m.translate(_SUPERSCRIPT))
    # the page: the paper's weight stays near n/(n+1) or above however large epsilon is
    assert "stays near n/(n+1) or above" in _text("docs/guide/privacy.md")
    assert min(r["paper_weight"] for r in stored["data"]["rows"]) >= s["n"] / (s["n"] + 1) - 0.01


CHECKS = {
    "estimation_e8": _estimation_e8,
    "election_gains": _election_gains,
    "election_shrinkage": _election_shrinkage,
    "hapt_logistic": _hapt_logistic,
    "adaped_table1_hapt": _adaped_table1_hapt,
    "adaped_dp_hapt": _adaped_dp_hapt,
    "adaped_dp_hapt_concat_finetune": _adaped_dp_hapt_concat_finetune,
    "adaped_fedem_hapt": _adaped_fedem_hapt,
    "adaped_table1_protocol": _adaped_table1_protocol,
    "validate_theorem1": _sweep("exact", "sigma_theta", "against the exact formula across σθ"),
    "validate_theorem2_ldp": _sweep("exact", "eps0", "against the exact formula across ε₀"),
    "validate_theorem2_quantizer": _validate_theorem2_quantizer,
    "validate_theorem4": _validate_theorem4,
    "fedhdp_figure1_server_mse": _fedhdp_figure1,
    "fedhdp_figure2_local_mse": _fedhdp_figure2,
    "fedhdp_figure3_regression": _fedhdp_figure3,
    "fedhdp_figure4_optout_fraction": _fedhdp_figure4,
    "private_bernoulli_epsilon": _private_bernoulli,
}


# --- the tests ---------------------------------------------------------------------------

def test_every_figure_is_shown_and_has_numbers_or_says_why_not():
    assert PNGS and NAMES
    for name in PNGS:
        page, cap = caption(f"{name}.png")
        assert page is not None, f"{name}.png is on no page"
        assert (name in NAMES) != (name in redraw.WITHOUT_NUMBERS), name
        if name in redraw.WITHOUT_NUMBERS:
            assert "not kept" in cap, f"{name}'s caption should say its numbers were not kept"
    assert set(NAMES) <= set(PNGS) and set(NAMES) == set(redraw.FIGURES)
    assert set(CHECKS) == set(NAMES), "every stored figure needs its check against the page"


@pytest.mark.parametrize("name", NAMES)
def test_the_record_says_what_made_it(name):
    stored = redraw.load(name)
    assert stored["figure"] == f"{name}.png"
    page, cap = caption(stored["figure"])
    assert page == ROOT / stored["page"]
    assert stored["command"].startswith("ebfl ") and stored["source"]
    assert all(isinstance(s, int) for s in stored["seeds"])
    assert callable(redraw.plot_function(stored))
    # a command in the caption is the one that produced the numbers (less its output flags)
    for command in re.findall(r"`(ebfl [^`]*)`", cap):
        assert _bare(command) == _bare(stored["command"].split(";")[0]), (command, name)
    # the seeds a caption names are the JSON's
    for claim in re.findall(r"(?<!--)\bseeds? (\d+)(?:[–-](\d+))?", cap):
        first, last = int(claim[0]), int(claim[1] or claim[0])
        assert set(range(first, last + 1)) <= set(stored["seeds"]), (claim, name)
    if re.search(r"\bone seed\b", cap):
        assert len(stored["seeds"]) == 1


def _bare(command):
    return re.sub(r"\s*--(json|plot DIR|quiet)\b", "", command).strip()


@pytest.mark.parametrize("name", NAMES)
def test_the_numbers_agree_with_the_page(name):
    CHECKS[name](redraw.load(name))


@pytest.mark.parametrize("name", NAMES)
def test_the_figure_redraws_from_its_numbers(name, tmp_path, monkeypatch):
    from matplotlib.image import imread

    monkeypatch.setenv("MPLBACKEND", "Agg")
    path = redraw.redraw(name, tmp_path)
    new, committed = imread(path), imread(FIGURES_DIR / f"{name}.png")
    assert new.shape == committed.shape
    # The committed PNG is this drawing: compared on 8 x 8 blocks, so that a
    # different font rasterizer passes and a moved point or line does not.
    h, w = (s - s % 8 for s in new.shape[:2])

    def blocks(img):
        return img[:h, :w, :3].reshape(h // 8, 8, w // 8, 8, 3).mean(axis=(1, 3))

    differ = np.abs(blocks(new) - blocks(committed)).max(axis=-1) > 0.05
    assert differ.mean() < 0.002, f"{name}.png is not drawn from {name}.json"


def test_redraw_refuses_a_figure_without_numbers(capsys):
    with pytest.raises(SystemExit):
        redraw.main(["dppfl_figures"])
    assert "no stored numbers for dppfl_figures (dppfl_figures: drawn by the full run" in \
        capsys.readouterr().err


def test_numbers_reads_what_pages_print():
    assert numbers("0.01662 ± 0.00002") == [(0.01662, 5e-6), (0.00002, 5e-6)]
    assert numbers("244 / 9,159") == [(244.0, 0.5), (9159.0, 0.5)]
    (value, half), = numbers("1.6 × 10⁻⁹")
    assert value == pytest.approx(1.6e-9) and half == pytest.approx(5e-11)
    assert [v for v, _ in numbers("3.1 2.1 −2.0")] == [3.1, 2.1, -2.0]
    assert agrees(96.874, numbers("96.87")[0]) and not agrees(96.876, numbers("96.87")[0])


def test_the_dppfl_legend_hides_no_curve(tmp_path, monkeypatch):
    """Figures 3-5 share one legend below the axes (it used to cover Figure 5's
    non-private line); drawn here from the guide's Figure 5 means."""
    import ebfl._plotting
    from ebfl.dppfl.experiment import plot_dppfl

    eps = [0.01, 0.03, 0.1, 0.3, 1, 3, 8, 30, 100]
    tab = table(section("docs/guide/dppfl.md", "## Reproduction"),
                "Figure 5 (τ = 1, drop 0.2): ε")

    def curve(label):
        return {"mean": [v for v, _ in numbers(" ".join(row(tab, label)[1:]))],
                "sd": [0.02] * len(eps)}

    flat = {"mean": [0.1, 0.1], "sd": [0.01, 0.01]}
    history = {"iteration": [0, 10], "primal": [1e4, 1e2]}
    result = {"figure2": [{"tau": t, "drop": 0.0, "non_private": history, "private": history}
                          for t in (0, 0.5, 1)],
              "figure3": {"tau": [0, 1], "non_private": flat, "private": flat,
                          "per_iteration": flat},
              "figure4": {"drop": [0, 0.2], "non_private": flat, "private": flat,
                          "per_iteration": flat},
              "figure5": {"epsilon": eps, "tau": 1.0, "drop": 0.2,
                          "private": curve("Theorem 5"), "per_iteration": curve("ε per iteration"),
                          "corrected": curve("corrected"), "non_private": 0.0057},
              "paper": {"figure4_argmin_drop": 0.2, "figure4_min_error": 0.097}}
    drawn = []
    subplots = ebfl._plotting.subplots

    def keep(*args, **kwargs):
        drawn.append(subplots(*args, **kwargs))
        return drawn[-1]

    monkeypatch.setattr(ebfl._plotting, "subplots", keep)
    plot_dppfl(result, tmp_path / "f.png")
    (fig, axes), = drawn
    bottom = list(axes[1])
    assert all(ax.get_legend() is None for ax in bottom)
    (legend,) = fig.legends
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    renderer = FigureCanvasAgg(fig).get_renderer()
    top = legend.get_window_extent(renderer).y1
    assert top <= min(ax.get_tightbbox(renderer).y0 for ax in bottom) + 1
    assert len(legend.get_texts()) == 5  # three curves, the corrected one, the paper's star


def test_the_shrinkage_figure_summarizes_every_county():
    """Counties with as many wins share one posterior mean, so the figure's JSON keeps
    one per number of wins: the same numbers as the per-county fit."""
    from ebfl.datasets.elections import ElectionMatrix
    from ebfl.eb.beta_binomial import beta_binomial_eb
    from ebfl.generative.election import METHODS, shrinkage_data

    rng = np.random.default_rng(3)
    m, years = 400, (2000, 2004, 2008, 2012)
    wins = (rng.random((m, len(years))) < rng.beta(2, 1, (m, 1))).astype(np.int8)
    blank = np.zeros((m, len(years)))
    matrix = ElectionMatrix(np.arange(m).astype(str), np.arange(m).astype(str), years, wins,
                            blank, blank.astype(np.int64), blank.astype(np.int64))
    d = shrinkage_data(matrix, held_out=1)
    z = np.delete(wins, 1, axis=1).sum(axis=1)
    assert d["held_out"] == 2004 and d["n_trials"] == 3
    assert d["counties"] == [int(np.sum(z == k)) for k in range(4)] and sum(d["counties"]) == m
    for meth in METHODS:
        per_county = beta_binomial_eb(z, np.full(m, 3), method=meth).posterior.mean
        stored = np.array(d["posterior_mean"][meth], dtype=float)
        np.testing.assert_allclose(stored[z], per_county, rtol=1e-12)
