"""Every user mistake on the ``ebfl`` command line gives exit status 2, nothing on stdout
and one stderr line ``error: ...`` naming the option, column or file: never a traceback.

The commands run in-process (``ebfl.cli.main``); a few run as a real subprocess to
show that no traceback reaches the terminal. Every case fails before any real work,
so the corpus is fast.
"""

import bz2
import errno
import gzip
import io
import lzma
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from ebfl.cli import _parser, main

COUNTS = "wins,games\n3,5\n1,4\n4,6\n0,3\n"
# One defect per column, all in data row 2 (line 3 of the file).
VALUES = """\
n,ok,text,blank,infinite,fraction,negative,zero,huge,big,se,se_neg,id,id_blank,outcome
5,1,1,1,1,1,1,5,1,1,0.5,0.5,a,a,1
5,0,x,,inf,1.5,-1,0,1e30,9,0.5,-0.5,a,,2
5,2,2,2,2,2,2,5,2,2,0.5,0.5,b,b,0
"""
RETURNS_HEADER = ('"year","state","state_po","county_name","county_fips","office","candidate",'
                  '"party","candidatevotes","totalvotes","version","mode"\n')
RETURNS = RETURNS_HEADER + """\
2000,"ALABAMA","AL","AUTAUGA","1001","PRESIDENT","AL GORE","DEMOCRAT",10,31,1,"TOTAL"
2000,"ALABAMA","AL","AUTAUGA","1001","PRESIDENT","GEORGE W. BUSH","REPUBLICAN",20,31,1,"TOTAL"
"""
VOTES_TEXT = RETURNS_HEADER + """\
2000,"ALABAMA","AL","AUTAUGA","1001","PRESIDENT","AL GORE","DEMOCRAT",ten,31,1,"TOTAL"
"""


def _zip(members):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, text in members.items():
            zf.writestr(name, text)
    return buf.getvalue()


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """A folder of good, broken and misleading files (and a sub-folder ``folder``)."""
    root = tmp_path_factory.mktemp("bad-input")
    garbage = bytes(np.random.default_rng(0).integers(0, 256, 300, dtype=np.uint8))
    returns = RETURNS.encode()
    hapt_zip = _zip({"HAPT/RawData/labels.txt": "1 1 5 0 9\n",
                     "HAPT/RawData/acc_exp01_user01.txt": "0 0 1\n" * 10,
                     "HAPT/RawData/gyro_exp01_user01.txt": "0 0 0\n" * 10})
    contents = {
        "counts.csv": COUNTS, "values.csv": VALUES, "one_client.csv": "mean,se\n0.1,0.5\n",
        "empty.csv": b"", "header.csv": "wins,games\n", "quote.csv": 'wins,games\n1,"5\n',
        "latin.csv": "wins,games\n1,5\ncaf\xe9,2\n".encode("latin-1"),
        "garbage.csv.gz": garbage, "garbage.csv.xz": garbage, "garbage.csv.zip": garbage,
        "garbage.csv.bz2": garbage, "truncated.csv.gz": gzip.compress(returns)[:60],
        "truncated.csv.xz": lzma.compress(returns)[:80],
        "truncated.csv.bz2": bz2.compress(returns)[:60],
        "returns.csv": returns, "votes_text.csv": VOTES_TEXT,
        "garbage.npz": garbage, "garbage.zip": garbage, "truncated.zip": hapt_zip[:150],
        "norawdata.zip": _zip({"readme.txt": "hello"}),
        "badlabels.zip": _zip({"HAPT/RawData/labels.txt": "one two three four five\n",
                               "HAPT/RawData/acc_exp01_user01.txt": "0 0 1\n",
                               "HAPT/RawData/gyro_exp01_user01.txt": "0 0 0\n"}),
        "plain.txt": "not a folder",
        # 2 MiB of rows in a few KiB: refused by --max-size 1 before it is parsed
        "bomb.csv.gz": gzip.compress(b"wins,games\n" + b"1,2\n" * (1 << 19)),
        "repeated.csv": "wins,games,wins\n1,5,2\n2,4,1\n",
        "two_members.zip": _zip({"a.csv": COUNTS, "b.csv": COUNTS}),
        "counts.csv.zst": b"(\xb5/\xfd",
    }
    for name, body in contents.items():
        (root / name).write_bytes(body if isinstance(body, bytes) else body.encode())
    (root / "folder").mkdir()
    return root


BB = "fit beta-binomial {d}/values.csv"
GA = "fit gaussian {d}/values.csv"
NM = "fit normal-means {d}/values.csv"
BOUNDS = "bounds gaussian --clients 100 --samples-per-client 15 --sigma-theta 0.1 --sigma-x 0.5"
ACC = ("accounting dp-adaped --clients 66 --clients-per-round 22 --rounds 240 --local-steps 10 "
       "--clip 1 --noise 5")
#: The same setting in the former spellings (deprecated aliases): --iterations T = 240 x 10.
ACC_OLD = "accounting dp-adaped --m 66 --k 22 --iterations 2400 --sync-gap 10 --clip 1 --noise 5"

# name: (argv, {d} standing for the folder of inputs; fragments the error line must contain)
CASES = {
    # --- files: missing, a folder, empty, unparsable, corrupted or truncated compression
    "fit-missing-file": ("fit beta-binomial {d}/nope.csv --successes wins --trials games",
                         ["nope.csv"]),
    "fit-folder": ("fit beta-binomial {d}/folder --successes wins --trials games", ["folder"]),
    "fit-empty": ("fit beta-binomial {d}/empty.csv --successes wins --trials games",
                  ["empty.csv", "empty"]),
    "fit-header-only": ("fit beta-binomial {d}/header.csv --successes wins --trials games",
                        ["header.csv", "no data rows"]),
    "fit-open-quote": ("fit beta-binomial {d}/quote.csv --successes wins --trials games",
                       ["quote.csv"]),
    "fit-not-utf8": ("fit beta-binomial {d}/latin.csv --successes wins --trials games",
                     ["latin.csv"]),
    **{f"fit-garbage-{ext}": (f"fit beta-binomial {{d}}/garbage.csv.{ext} --successes wins "
                              "--trials games", [f"garbage.csv.{ext}"])
       for ext in ("gz", "xz", "zip", "bz2")},
    **{f"fit-truncated-{ext}": (f"fit gaussian {{d}}/truncated.csv.{ext} --mean a --se b",
                                [f"truncated.csv.{ext}"]) for ext in ("gz", "xz", "bz2")},
    "gaussian-missing-file": ("fit gaussian {d}/nope.csv --mean a --se b", ["nope.csv"]),
    "gaussian-folder": ("fit gaussian {d}/folder --mean a --se b", ["folder"]),
    # --- columns: absent, non-numeric, missing, infinite, not a count, out of range
    "bb-no-column": (BB + " --successes nope --trials n", ["--successes", "'nope'", "columns"]),
    "bb-no-trials-column": (BB + " --successes ok --trials nope", ["--trials", "'nope'"]),
    "bb-no-client-column": (BB + " --client nope --value outcome", ["--client", "'nope'"]),
    "bb-no-value-column": (BB + " --client id --value nope", ["--value", "'nope'"]),
    "bb-text": (BB + " --successes text --trials n",
                ["--successes", "'text'", "non-numeric value 'x'", "data row 2", "line 3"]),
    "bb-missing": (BB + " --successes blank --trials n", ["'blank'", "missing", "data row 2"]),
    "bb-infinite": (BB + " --successes infinite --trials n", ["'infinite'", "infinite"]),
    "bb-fraction": (BB + " --successes fraction --trials n", ["'fraction'", "integer count"]),
    "bb-too-large": (BB + " --successes huge --trials n", ["'huge'", "integer count"]),
    "bb-negative": (BB + " --successes negative --trials n", ["'negative'", ">= 0"]),
    "bb-zero-trials": (BB + " --successes ok --trials zero", ["--trials", "'zero'", ">= 1"]),
    "bb-more-successes": (BB + " --successes big --trials n",
                          ["--successes", "'big'", "exceeds", "data row 2"]),
    "bb-missing-client": (BB + " --client id_blank --value outcome",
                          ["--client", "'id_blank'", "data row 2"]),
    "bb-not-binary": (BB + " --client id --value outcome",
                      ["--value", "'outcome'", "0 and 1", "data row 2"]),
    "bb-text-value": (BB + " --client id --value text", ["--value", "'text'", "non-numeric"]),
    "gaussian-text": (GA + " --mean text --se se", ["--mean", "'text'", "data row 2"]),
    "gaussian-infinite": (GA + " --mean infinite --se se", ["--mean", "infinite"]),
    "gaussian-missing-se": (GA + " --mean ok --se blank", ["--se", "'blank'", "missing"]),
    "gaussian-negative-se": (GA + " --mean ok --se se_neg", ["--se", "'se_neg'", "> 0"]),
    "gaussian-no-column": (GA + " --mean nope --se se", ["--mean", "'nope'"]),
    "gaussian-missing-value": (GA + " --client id --value blank", ["--value", "missing"]),
    "gaussian-missing-client": (GA + " --client id_blank --value ok", ["--client", "data row 2"]),
    "gaussian-one-client": ("fit gaussian {d}/one_client.csv --mean mean --se se", ["client"]),
    # --- fit normal-means
    "nm-text": (NM + " --x text --s se", ["--x", "'text'", "data row 2"]),
    "nm-infinite": (NM + " --x infinite --s se", ["--x", "infinite"]),
    "nm-negative-s": (NM + " --x ok --s se_neg", ["--s", "'se_neg'", "> 0"]),
    "nm-zero-s": (NM + " --x ok --s n --family npmle --s zero", ["--s", "'zero'"]),
    "nm-no-column": (NM + " --x nope --s se", ["--x", "'nope'"]),
    "nm-no-id": (NM + " --x ok --s se --id nope", ["--id", "'nope'"]),
    "nm-same-column": (NM + " --x se --s se", ["--x", "--s", "'se'"]),
    "nm-family": (NM + " --x ok --s se --family cauchy", ["--family", "cauchy"]),
    "nm-mode": (NM + " --x ok --s se --mode auto", ["--mode", "'auto'"]),
    "nm-mode-nan": (NM + " --x ok --s se --mode nan", ["--mode", "finite"]),
    "nm-missing-file": ("fit normal-means {d}/nope.csv --x a --s b", ["nope.csv"]),
    "nm-no-x": (NM + " --s se", ["--x"]),
    "npmle-one-client": ("fit gaussian {d}/one_client.csv --mean mean --se se --method npmle",
                         ["--method npmle", "2 clients"]),
    # --- inputs that would give a fit of nonsense, or fill the memory
    "fit-bomb": ("fit beta-binomial {d}/bomb.csv.gz --successes wins --trials games "
                 "--max-size 1", ["bomb.csv.gz", "1 MiB", "--max-size"]),
    "fit-max-size": ("fit beta-binomial {d}/counts.csv --successes wins --trials games "
                     "--max-size 0", ["--max-size"]),
    "fit-repeated-header": ("fit beta-binomial {d}/repeated.csv --successes wins --trials games",
                            ["repeated.csv", "repeated column names", "'wins'"]),
    "fit-two-members": ("fit beta-binomial {d}/two_members.zip --successes wins --trials games",
                        ["two_members.zip", "exactly one file"]),
    "fit-zstd": ("fit beta-binomial {d}/counts.csv.zst --successes wins --trials games",
                 ["counts.csv.zst", "Zstandard"]),
    "bb-same-column": ("fit beta-binomial {d}/counts.csv --successes games --trials games",
                       ["--successes and --trials", "'games'"]),
    "bb-client-is-value": (BB + " --client id --value id", ["--client and --value", "'id'"]),
    "gaussian-value-twice": (GA + " --client id --value ok --value ok",
                             ["--value names the column 'ok' twice"]),
    "gaussian-mean-is-se": (GA + " --mean se --se se", ["--mean and --se"]),
    # --- fit options: missing, contradictory, out of range, unwritable output
    "bb-no-trials": (BB + " --successes ok", ["--successes", "--trials"]),
    "bb-client-no-value": (BB + " --client id", ["--client", "--value"]),
    "bb-two-values": (BB + " --client id --value ok --value n", ["--value"]),
    "gaussian-no-se": (GA + " --mean ok", ["--mean", "--se"]),
    "gaussian-client-no-value": (GA + " --client id", ["--value"]),
    "gaussian-npmle-long": (GA + " --client id --value ok --method npmle", ["npmle", "--mean"]),
    "bad-method": (GA + " --mean ok --se se --method bogus", ["--method", "bogus"]),
    **{f"level-{v}": (BB + f" --successes ok --trials n --level {v}", ["--level"])
       for v in ("0", "1", "1.5", "-0.1", "nan", "inf", "x")},
    "level-npmle": (GA + " --mean ok --se se --method npmle --level 2", ["--level"]),
    **{f"sigma-x-{v}": (GA + f" --client id --value ok --sigma-x {v}", ["--sigma-x"])
       for v in ("0", "-1", "inf", "1e400", "x")},
    "output-no-folder": (BB + " --successes ok --trials n --output {d}/nodir/out.csv",
                         ["--output", "nodir", "does not exist"]),
    "output-is-folder": (BB + " --successes ok --trials n --output {d}/folder",
                         ["--output", "folder"]),
    # --- bounds
    "bounds-m": (BOUNDS.replace("--clients 100", "--clients 1"), ["--clients"]),
    "bounds-m-text": (BOUNDS.replace("--clients 100", "--clients ten"), ["--clients"]),
    "bounds-m-float": (BOUNDS.replace("--clients 100", "--clients 1e3"), ["--clients"]),
    "bounds-m-old": (BOUNDS.replace("--clients 100", "--m 1"), ["--clients"]),
    "bounds-n": (BOUNDS.replace("--samples-per-client 15", "--samples-per-client 0"),
                 ["--samples-per-client"]),
    "bounds-d": (BOUNDS + " --d 0", ["--d"]),
    "bounds-sigma-x": (BOUNDS.replace("--sigma-x 0.5", "--sigma-x 0"), ["--sigma-x"]),
    "bounds-sigma-theta": (BOUNDS.replace("--sigma-theta 0.1", "--sigma-theta -1"),
                           ["sigma_theta"]),
    "bounds-sigma-theta-nan": (BOUNDS.replace("--sigma-theta 0.1", "--sigma-theta nan"),
                               ["--sigma-theta"]),
    "bounds-overflow-float": (BOUNDS.replace("--sigma-theta 0.1", "--sigma-theta 1e400"),
                              ["--sigma-theta"]),
    "bounds-k-bits": (BOUNDS + " --k-bits 0 --r 1", ["--k-bits"]),
    "bounds-no-r": (BOUNDS + " --epsilon 1 --delta 0.1", ["--r"]),
    "bounds-no-delta": (BOUNDS + " --epsilon 1 --r 1", ["--delta"]),
    "bounds-both-mechanisms": (BOUNDS + " --k-bits 2 --epsilon 1 --delta 0.1 --r 1",
                               ["--k-bits", "--epsilon"]),
    "bounds-epsilon": (BOUNDS + " --epsilon 0 --delta 0.1 --r 1", ["--epsilon"]),
    "bounds-delta": (BOUNDS + " --epsilon 1 --delta 1 --r 1", ["--delta"]),
    "bounds-r": (BOUNDS + " --epsilon 1 --delta 0.1 --r -1", ["--r"]),
    "bounds-overflow": ("bounds gaussian --clients 10 --samples-per-client "
                        "100000000000000000000000000000000000000000000 --sigma-theta 1e300 "
                        "--sigma-x 1e-300", []),
    "bounds-missing-option": ("bounds gaussian --clients 10",
                              ["--samples-per-client", "--sigma-theta"]),
    "bounds-missing-option-old": ("bounds gaussian --m 10", ["--samples-per-client"]),
    "beta-alpha": ("bounds beta --alpha -1 --beta 2 --samples-per-client 14", ["alpha"]),
    "beta-beta-nan": ("bounds beta --alpha 1 --beta nan --samples-per-client 14", ["--beta"]),
    "beta-n": ("bounds beta --alpha 1 --beta 2 --samples-per-client -3",
               ["--samples-per-client"]),
    # --- accounting
    "acc-k-above-m": (ACC.replace("--clients-per-round 22", "--clients-per-round 100"), []),
    "acc-rounds": (ACC.replace("--rounds 240", "--rounds 0"), ["--rounds"]),
    "acc-not-multiple": (ACC_OLD.replace("2400", "5"),
                         ["--iterations 5 is not a multiple of --local-steps 10"]),
    "acc-local-steps": (ACC.replace("--local-steps 10", "--local-steps -2"), ["--local-steps"]),
    "acc-clip": (ACC.replace("--clip 1", "--clip 0"), ["--clip"]),
    "acc-noise-nan": (ACC.replace("--noise 5", "--noise nan"), ["--noise"]),
    "acc-psi-alone": (ACC + " --clip-psi 1", ["clip_psi"]),
    "acc-delta-0": (ACC + " --delta 0", ["--delta"]),
    "acc-delta-2": (ACC + " --delta 1.5", ["--delta"]),
    "acc-sampling": (ACC + " --sampling sometimes", ["--sampling"]),
    "acc-pld-without-replacement": (ACC + " --accountant pld", ["pld"]),
    "acc-overflow": (ACC.replace("--clip 1", "--clip 1e300").replace("--noise 5",
                                                                     "--noise 1e-300"), []),
    # --- private-bernoulli
    "pb-clients": ("private-bernoulli --clients 0", ["--clients"]),
    "pb-clients-text": ("private-bernoulli --clients many", ["--clients"]),
    "pb-clients-huge": ("private-bernoulli --clients 100000000000000000000000", []),
    "pb-n": ("private-bernoulli --clients 100 --samples-per-client 0", ["--samples-per-client"]),
    **{f"pb-epsilon-{v}": (f"private-bernoulli --clients 100 --epsilon {v}", ["--epsilon"])
       for v in ("0", "-1", "nan", "inf")},
    "pb-alpha": ("private-bernoulli --clients 100 --alpha -1", ["alpha"]),
    "pb-beta": ("private-bernoulli --clients 100 --beta 0", ["beta"]),
    "pb-seed": ("private-bernoulli --clients 100 --seed -1", ["--seed"]),
    "pb-plot-file": ("private-bernoulli --clients 100 --plot {d}/plain.txt",
                     ["--plot", "plain.txt", "not a folder"]),
    "pb-plot-no-parent": ("private-bernoulli --clients 100 --plot {d}/nodir/sub",
                          ["--plot", "nodir", "does not exist"]),
    # --- validate
    "validate-reps": ("validate known_beta --reps 1", ["--reps"]),
    "validate-reps-text": ("validate known_beta --reps some", ["--reps"]),
    "validate-seed": ("validate known_beta --seed -1", ["--seed"]),
    "validate-unknown": ("validate known_beta nope", ["nope"]),
    "validate-plot-file": ("validate known_beta --reps 5 --plot {d}/plain.txt", ["--plot"]),
    "validate-plot-no-parent": ("validate known_beta --reps 5 --plot {d}/nodir/sub",
                                ["--plot", "nodir"]),
    # --- reproduce (options fail before any experiment runs)
    "estimation-seed": ("reproduce estimation --quick --seed -1", ["--seed"]),
    "estimation-plot-file": ("reproduce estimation --quick --plot {d}/plain.txt", ["--plot"]),
    "estimation-plot-no-parent": ("reproduce estimation --quick --plot {d}/nodir/sub",
                                  ["--plot", "nodir"]),
    "regression-seed": ("reproduce regression --quick --seed x", ["--seed"]),
    "regression-plot": ("reproduce regression --quick --plot {d}/nodir/sub", ["--plot"]),
    "adaped-seeds": ("reproduce adaped --quick --seeds 0", ["--seeds"]),
    "adaped-dataset": ("reproduce adaped --quick --dataset cifar", ["--dataset", "cifar"]),
    "adaped-plot": ("reproduce adaped --quick --plot {d}/plain.txt", ["--plot"]),
    "adaped-samples-huge": ("reproduce adaped --quick --samples-per-client 1000000000000",
                            ["--samples-per-client", "[2, 70000]"]),
    "dp-adaped-noise": ("reproduce dp-adaped --quick --noise 0", ["--noise"]),
    "dp-adaped-noise-inf": ("reproduce dp-adaped --quick --noise inf", ["--noise"]),
    "dp-adaped-clip": ("reproduce dp-adaped --quick --clip -1", ["--clip"]),
    "dp-adaped-delta": ("reproduce dp-adaped --quick --delta 0", ["--delta"]),
    "dp-pfl-reps": ("reproduce dp-pfl --quick --reps 0", ["--reps"]),
    "dp-pfl-jobs": ("reproduce dp-pfl --quick --jobs x", ["--jobs"]),
    "dp-pfl-plot": ("reproduce dp-pfl --quick --plot {d}/plain.txt", ["--plot"]),
    "acc-dp-pfl-q": ("accounting dp-pfl --sampling-rate 1.5", ["--sampling-rate"]),
    "acc-dp-pfl-drop": ("accounting dp-pfl --drop 1", ["--drop"]),
    "acc-dp-pfl-delta": ("accounting dp-pfl --delta 0", ["--delta"]),
    "acc-dp-pfl-epsilon-tiny": ("accounting dp-pfl --epsilon 1e-300", ["--epsilon must lie in"]),
    "acc-dp-pfl-inner-huge": ("accounting dp-pfl --omega-every 100000000000000",
                              ["--omega-every * --omega-steps must be at most"]),
    "flower-dp-pfl-inner": ("flower simulate dp-pfl --omega-every 0", ["--omega-every"]),
    "fedem-seeds": ("reproduce adaped-fedem --quick --seeds -1", ["--seeds"]),
    "fedem-delta": ("reproduce adaped-fedem --quick --delta 2", ["--delta"]),
    # --- election --data
    "election-missing": ("reproduce election --data {d}/nope.csv", ["nope.csv"]),
    "election-folder": ("reproduce election --data {d}/folder", ["folder"]),
    "election-unknown-release": ("reproduce election --data {d}/returns.csv",
                                 ["returns.csv", "sha256"]),
    "election-empty": ("reproduce election --data {d}/empty.csv --no-verify", ["empty.csv"]),
    **{f"election-garbage-{ext}": (
        f"reproduce election --data {{d}}/garbage.csv.{ext} --no-verify",
        [f"garbage.csv.{ext}"]) for ext in ("gz", "xz", "zip", "bz2")},
    **{f"election-truncated-{ext}": (
        f"reproduce election --data {{d}}/truncated.csv.{ext} --no-verify",
        [f"truncated.csv.{ext}"]) for ext in ("gz", "xz", "bz2")},
    "election-not-returns": ("reproduce election --data {d}/counts.csv --no-verify",
                             ["counts.csv", "county_fips"]),
    "election-not-utf8": ("reproduce election --data {d}/latin.csv --no-verify", ["latin.csv"]),
    "election-open-quote": ("reproduce election --data {d}/quote.csv --no-verify", ["quote.csv"]),
    "election-text-votes": ("reproduce election --data {d}/votes_text.csv --no-verify",
                            ["candidatevotes", "'ten'"]),
    "election-too-few-years": ("reproduce election --data {d}/returns.csv --no-verify", ["years"]),
    "election-epsilon": ("reproduce election --data {d}/returns.csv --no-verify --epsilon 0",
                         ["--epsilon"]),
    "election-epsilon-nan": ("reproduce election --epsilon nan", ["--epsilon"]),
    "election-seed": ("reproduce election --seed -1", ["--seed"]),
    "election-plot": ("reproduce election --data {d}/returns.csv --plot {d}/nodir/sub", ["--plot"]),
    # --- hapt --data
    "hapt-missing": ("reproduce hapt --data {d}/nope.npz", ["nope.npz"]),
    "hapt-folder": ("reproduce hapt --data {d}/folder", ["folder"]),
    "hapt-unknown-npz": ("reproduce hapt --data {d}/garbage.npz", ["garbage.npz", "sha256"]),
    "hapt-garbage-zip": ("reproduce hapt --data {d}/garbage.zip", ["garbage.zip"]),
    "hapt-truncated-zip": ("reproduce hapt --data {d}/truncated.zip", ["truncated.zip"]),
    "hapt-other-zip": ("reproduce hapt --data {d}/norawdata.zip",
                       ["norawdata.zip", "labels.txt"]),
    "hapt-bad-table": ("reproduce hapt --data {d}/badlabels.zip",
                       ["labels.txt", "badlabels.zip"]),
    "hapt-positive": ("reproduce hapt --positive JUMPING --data {d}/nope.npz",
                      ["--positive", "JUMPING"]),
    "hapt-plot": ("reproduce hapt --data {d}/garbage.zip --plot {d}/nodir/sub", ["--plot"]),
    # --- demo
    "demo-clients": ("demo --clients 1", ["--clients"]),
    "demo-clients-text": ("demo --clients lots", ["--clients"]),
    "demo-clients-huge": ("demo --clients 100000000000000000000000", []),
    "demo-seed": ("demo --seed -1", ["--seed"]),
    # --- the command line itself
    "no-command": ("", ["command"]),
    "unknown-command": ("fly", ["fly"]),
    "unknown-option": ("demo --bogus", ["--bogus"]),
    "no-path": ("fit gaussian", ["path"]),
}
# Cases whose error comes from a stage that imports torch.
TORCH_CASES = {
    "adaped-methods": ("reproduce adaped --quick --methods AdaPeD Nope", ["Nope"]),
    "adaped-femnist-root": ("reproduce adaped --quick --dataset femnist --femnist-root "
                            "{d}/folder", ["folder"]),
}


def _argv(template, folder):
    return template.format(d=folder).split()


def _fails(capsys, argv):
    """The one error line of ``ebfl argv``, after checking the contract."""
    status = main(argv)
    out, err = capsys.readouterr()
    assert status == 2, f"exit status {status}; stderr: {err}"
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


@pytest.mark.parametrize("template, fragments", list(CASES.values()), ids=list(CASES))
def test_a_mistake_is_one_error_line(template, fragments, inputs, capsys):
    line = _fails(capsys, _argv(template, inputs))
    for fragment in fragments:
        assert fragment in line, line


@pytest.mark.parametrize("template, fragments", list(TORCH_CASES.values()),
                         ids=list(TORCH_CASES))
def test_a_mistake_found_by_the_neural_experiments(template, fragments, inputs, capsys):
    pytest.importorskip("torch")
    line = _fails(capsys, _argv(template, inputs))
    for fragment in fragments:
        assert fragment in line, line


@pytest.mark.parametrize("name", ["fit-garbage-xz", "bb-text", "level-x", "output-no-folder",
                                  "bounds-no-r", "acc-delta-2", "election-truncated-gz",
                                  "hapt-garbage-zip", "demo-clients", "pb-plot-file"])
def test_json_mode_keeps_stdout_empty(name, inputs, capsys):
    template, fragments = CASES[name]
    line = _fails(capsys, _argv(template, inputs) + ["--json"])
    assert all(fragment in line for fragment in fragments), line


def test_unreadable_input_and_unwritable_output(inputs, tmp_path, capsys, monkeypatch):
    """Real permissions where they bite; as root (which reads and writes anything) the
    operating system's refusal is simulated."""
    locked = tmp_path / "locked"
    locked.mkdir()
    secret = tmp_path / "secret.csv"
    secret.write_text(COUNTS)
    secret.chmod(0)
    locked.chmod(0o500)
    if os.geteuid() == 0:
        import pandas as pd

        real_read, real_access = pd.read_csv, os.access

        def read_csv(path, *args, **kwargs):
            if Path(path) == secret:
                raise PermissionError(errno.EACCES, "Permission denied", str(path))
            return real_read(path, *args, **kwargs)

        monkeypatch.setattr(pd, "read_csv", read_csv)
        monkeypatch.setattr(os, "access", lambda path, mode: (
            Path(path) != locked and real_access(path, mode)))
    try:
        line = _fails(capsys, ["fit", "beta-binomial", str(secret), "--successes", "wins",
                               "--trials", "games"])
        assert "secret.csv" in line and "Permission denied" in line
        for option, path in (("--output", locked / "out.csv"), ("--plot", locked / "figures")):
            argv = (["fit", "beta-binomial", str(inputs / "counts.csv"), "--successes", "wins",
                     "--trials", "games", "--output", str(path)] if option == "--output" else
                    ["private-bernoulli", "--clients", "50", "--plot", str(path)])
            line = _fails(capsys, argv)
            assert option in line and "not writable" in line
    finally:
        locked.chmod(0o700)


def test_no_data_and_no_network_is_one_error_line(tmp_path, capsys, monkeypatch):
    from ebfl.datasets import _home

    info = _home.manifest("county_elections")
    offline = {**info, "download": {**info["download"], "url": "http://127.0.0.1:9/x.csv.gz"}}
    monkeypatch.setattr(_home, "manifest", lambda name: offline)  # a port nobody listens on
    monkeypatch.setenv("EBFL_DATA", str(tmp_path))
    line = _fails(capsys, ["reproduce", "election", "--json"])
    assert str(tmp_path / "county-elections") in line and "download" in line
    assert not any((tmp_path / "county-elections").glob("*.csv*"))  # nothing left behind
    line = _fails(capsys, ["reproduce", "hapt"])
    assert str(tmp_path / "uci-hapt-raw") in line and "--download" in line


def test_a_failed_write_is_one_error_line(inputs, capsys, monkeypatch):
    import pandas as pd

    def full_disk(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pd.DataFrame, "to_csv", full_disk)
    line = _fails(capsys, ["fit", "beta-binomial", str(inputs / "counts.csv"), "--successes",
                           "wins", "--trials", "games", "--output", str(inputs / "out.csv")])
    assert "--output" in line and "No space left on device" in line


@pytest.mark.parametrize("raised, shown", [
    (OverflowError(34, "Numerical result out of range"), "too large"),
    (MemoryError(), "not enough memory"),
    (lzma.LZMAError("Corrupt input data"), "Corrupt input data"),
    (zipfile.BadZipFile("Bad CRC-32 for file 'x'"), "Bad CRC-32"),
    (EOFError("Compressed file ended before the end-of-stream marker was reached"), "ended"),
    (ValueError("first line\nsecond line"), "first line second line"),
])
def test_the_boundary_maps_every_user_error_class(raised, shown, monkeypatch, capsys):
    def failing(args):
        raise raised

    monkeypatch.setattr(_parser, "_cmd_demo", failing)
    assert shown in _fails(capsys, ["demo"])


@pytest.mark.parametrize("bug", [KeyError("internal"), AssertionError("invariant")])
def test_a_bug_of_ours_keeps_its_traceback(bug, monkeypatch):
    def broken(args):
        raise bug

    monkeypatch.setattr(_parser, "_cmd_demo", broken)
    with pytest.raises(type(bug)):
        main(["demo"])


def test_help_is_not_an_error(capsys):
    assert main(["bounds", "beta", "--help"]) == 0
    assert "--alpha" in capsys.readouterr().out


def _ebfl(argv):
    """Run the installed ``ebfl`` command (``python -m ebfl.cli`` without one)."""
    script = Path(sys.executable).with_name("ebfl")
    cmd = [str(script)] if script.is_file() else [sys.executable, "-m", "ebfl.cli"]
    return subprocess.run(cmd + argv, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("name", ["fit-garbage-xz", "election-truncated-gz"])
def test_no_traceback_reaches_the_terminal(name, inputs):
    template, fragments = CASES[name]
    done = _ebfl(_argv(template, inputs))
    assert done.returncode == 2 and done.stdout == ""
    assert "Traceback" not in done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith("error: ") and all(f in line for f in fragments), line
