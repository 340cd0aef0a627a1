"""Renamed options keep their former spellings as deprecated aliases: the same parsed
value and result, one warning line on stderr, hidden from ``--help``; both spellings at
once, or a required option missing under both, is one ``error:`` line and exit status 2."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

import ebfl.cli
from ebfl.cli import main
from ebfl.cli._parser import _REMOVED_IN, _alias, _Parser

BOUNDS_GAUSSIAN = ("bounds gaussian --clients 100 --samples-per-client 10 --sigma-theta 1 "
                   "--sigma-x 2 --json")
BOUNDS_BETA = "bounds beta --alpha 2 --beta 5 --samples-per-client 14 --json"
BOUNDS_FEDHDP = ("bounds fedhdp --clients 20 --opt-out 0.05 --alpha2 1 --tau2 1 --gamma2 0.5 "
                 "--json")
PRIVATE_BERNOULLI = "private-bernoulli --clients 200 --samples-per-client 10 --epsilon 1 --json"
DP_ADAPED = ("accounting dp-adaped --clients 66 --clients-per-round 22 --rounds 240 "
             "--local-steps 10 --clip 1 --noise 5 --json")
DP_PFL = ("accounting dp-pfl --omega-every 100 --omega-steps 2 --sampling-rate 1 --drop 0 "
          "--json")
FLOWER_SIMULATE = "flower simulate dp-pfl --omega-every 10 --rounds 40"
FLOWER_APP = "flower app my-app dp-pfl --omega-every 10 --rounds 40"

#: (command line in the current names, former spelling, current spelling, runs fast): every
#: alias of the parser, each in a command line that gives its option a value.
ALIASES = [
    (BOUNDS_GAUSSIAN, "--m", "--clients", True),
    (BOUNDS_GAUSSIAN, "--n", "--samples-per-client", True),
    (BOUNDS_BETA, "--n", "--samples-per-client", True),
    (BOUNDS_FEDHDP, "--n-clients", "--clients", True),
    (BOUNDS_FEDHDP, "--rho", "--opt-out", True),
    (PRIVATE_BERNOULLI, "--n", "--samples-per-client", True),
    (DP_ADAPED, "--m", "--clients", False),
    (DP_ADAPED, "--k", "--clients-per-round", False),
    (DP_ADAPED, "--sync-gap", "--local-steps", False),
    (DP_PFL, "--inner", "--omega-every", False),
    (DP_PFL, "--outer", "--omega-steps", False),
    (DP_PFL, "--q", "--sampling-rate", False),
    (FLOWER_SIMULATE, "--inner", "--omega-every", False),
    (FLOWER_APP, "--inner", "--omega-every", False),
]
_ids = [f"{line.split(' --')[0]} {old}" for line, old, _, _ in ALIASES]

#: (command line, current spelling, former spelling) of each required option with an alias.
REQUIRED = [
    (BOUNDS_GAUSSIAN, "--clients", "--m"),
    (BOUNDS_GAUSSIAN, "--samples-per-client", "--n"),
    (BOUNDS_BETA, "--samples-per-client", "--n"),
    (BOUNDS_FEDHDP, "--clients", "--n-clients"),
    (BOUNDS_FEDHDP, "--opt-out", "--rho"),
    (DP_ADAPED, "--clients", "--m"),
    (DP_ADAPED, "--clients-per-round", "--k"),
    (DP_ADAPED, "--rounds", "--iterations"),
    (DP_ADAPED, "--local-steps", "--sync-gap"),
]


def _respell(line, new, old):
    """``line`` split into arguments, with option ``new`` spelled ``old``."""
    argv = line.split()
    argv[argv.index(new)] = old
    return argv


def _without(line, option):
    """``line`` (a string or a list of arguments) without ``option`` and its value."""
    argv = line.split() if isinstance(line, str) else list(line)
    i = argv.index(option)
    return argv[:i] + argv[i + 2:]


def _warning(old, use):
    return f"warning: {old} is deprecated and will be removed in ebfl {_REMOVED_IN}; use {use}"


@pytest.fixture
def parsed(monkeypatch):
    """``main`` parses as usual but runs no command: returns the parsed options of each call."""
    seen = []
    build = ebfl.cli.build_parser

    class Parser:
        def parse_args(self, argv):
            args = build().parse_args(argv)
            seen.append(dict(vars(args)))
            args.func = lambda args: None
            return args

    monkeypatch.setattr(ebfl.cli, "build_parser", Parser)
    return seen


def _one_error(capsys, argv):
    """The one ``error:`` line of ``ebfl argv``, after checking its status and empty stdout."""
    assert main(argv) == 2
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert out == "" and len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


@pytest.mark.parametrize(("line", "old", "new", "fast"), ALIASES, ids=_ids)
def test_an_alias_parses_as_its_option_and_warns_once(line, old, new, fast, parsed, capsys):
    assert main(line.split()) == 0
    assert capsys.readouterr().err == ""
    assert main(_respell(line, new, old)) == 0
    assert capsys.readouterr().err == _warning(old, new) + "\n"
    current, former = parsed
    assert former == current


@pytest.mark.parametrize(("line", "old", "new"),
                         [(line, old, new) for line, old, new, fast in ALIASES if fast],
                         ids=[i for i, (*_, fast) in zip(_ids, ALIASES, strict=True) if fast])
def test_an_alias_gives_the_same_result(line, old, new, capsys):
    assert main(line.split()) == 0
    current = capsys.readouterr().out
    assert main(_respell(line, new, old)) == 0
    former, err = capsys.readouterr()
    assert former == current and json.loads(former)
    assert err.splitlines() == [_warning(old, new)]


def test_every_former_spelling_at_once(capsys):
    """Several aliases in one command line: one warning line each, in the order given."""
    argv = ["accounting", "dp-adaped", "--m", "66", "--k", "22", "--iterations", "2400",
            "--sync-gap", "10", "--clip", "1", "--noise", "5", "--json"]
    assert main(argv) == 0
    former, err = capsys.readouterr()
    assert err.splitlines() == [
        _warning("--m", "--clients"), _warning("--k", "--clients-per-round"),
        _warning("--iterations", "--rounds 240 (--iterations 2400 / --local-steps 10)"),
        _warning("--sync-gap", "--local-steps")]
    assert main(DP_ADAPED.split()) == 0
    out, err = capsys.readouterr()
    assert err == "" and out == former
    assert json.loads(out)["setting"]["n_iterations"] == 2400


@pytest.mark.parametrize("order", ["iterations first", "local steps first"])
def test_iterations_keep_their_meaning(order, parsed, capsys):
    """--iterations T was T local iterations in all: it becomes --rounds T/tau, whichever
    option comes first, never --rounds T."""
    pairs = [["--iterations", "2400"], ["--local-steps", "10"]]
    if order != "iterations first":
        pairs.reverse()
    argv = _without(_without(DP_ADAPED, "--rounds"), "--local-steps") + sum(pairs, [])
    assert main(argv) == 0
    assert capsys.readouterr().err == _warning(
        "--iterations", "--rounds 240 (--iterations 2400 / --local-steps 10)") + "\n"
    assert parsed[-1]["rounds"] == 240 and parsed[-1]["local_steps"] == 10


def test_iterations_not_a_multiple_of_the_local_steps(capsys):
    argv = _respell(DP_ADAPED, "--rounds", "--iterations")
    argv[argv.index("--iterations") + 1] = "2405"
    line = _one_error(capsys, argv)
    assert "--iterations 2405 is not a multiple of --local-steps 10" in line


@pytest.mark.parametrize(("line", "old", "new", "fast"), ALIASES, ids=_ids)
def test_the_former_spelling_is_not_in_the_help(line, old, new, fast, capsys):
    assert main([*line.split(" --")[0].split(), "--help"]) == 0
    out = capsys.readouterr().out
    assert re.search(rf"(?<![\w-]){re.escape(new)}(?![\w-])", out)
    assert not re.search(rf"(?<![\w-]){re.escape(old)}(?![\w-])", out), out


@pytest.mark.parametrize(("line", "old", "new", "fast"),
                         [*ALIASES, (DP_ADAPED, "--iterations", "--rounds", False)],
                         ids=[*_ids, "accounting dp-adaped --iterations"])
def test_both_spellings_at_once_are_an_error(line, old, new, fast, capsys):
    argv = line.split()
    value = argv[argv.index(new) + 1]
    for extra in ([old, value], [old, value, new, value]):
        error = _one_error(capsys, argv + extra)
        assert old in error and new in error and "two spellings of one option" in error


@pytest.mark.parametrize(("line", "new", "old"), REQUIRED,
                         ids=[f"{line.split(' --')[0]} {new}" for line, new, _ in REQUIRED])
def test_a_required_option_missing_under_both_spellings(line, new, old, capsys):
    error = _one_error(capsys, _without(line, new))
    assert error.startswith(f"error: the following arguments are required: {new}")
    assert not re.search(rf"(?<![\w-]){re.escape(old)}(?![\w-])", error)


def test_a_missing_option_beside_a_former_spelling(capsys):
    """Every missing required option is named in one line, in the current spelling."""
    error = _one_error(capsys, ["bounds", "gaussian", "--m", "10"])
    assert "required: --samples-per-client, --sigma-theta, --sigma-x" in error
    assert "warning" not in error


def test_a_bad_value_under_the_former_spelling_is_one_error_line(capsys):
    argv = _respell(BOUNDS_GAUSSIAN, "--clients", "--m")
    argv[argv.index("--m") + 1] = "1"
    error = _one_error(capsys, argv)
    assert "--clients: must be an integer >= 2, got 1" in error


def test_an_alias_needs_an_option_that_takes_former_spellings():
    parser = _Parser(prog="p")
    parser.add_argument("--plain")
    with pytest.raises(ValueError, match="cannot alias --old to --plain"):
        _alias(parser, "--old", "--plain")


def test_the_installed_command_warns_on_stderr_only():
    """The real entry point: the warning on stderr, stdout one JSON object, status 0."""
    run = subprocess.run([sys.executable, "-m", "ebfl.cli", "bounds", "beta", "--alpha", "2",
                          "--beta", "5", "--n", "14", "--json"],
                         capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stderr
    assert run.stderr.splitlines() == [_warning("--n", "--samples-per-client")]
    assert json.loads(run.stdout)["n"] == 14
