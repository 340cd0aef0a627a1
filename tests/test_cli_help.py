"""The ``ebfl`` help explains itself: every option has a help text with its default,
every leaf subcommand ends with example command lines, and every example parses."""

from __future__ import annotations

import argparse
import shlex

import pytest

from ebfl.cli import main
from ebfl.cli._parser import build_parser


def _walk(parser, path=("ebfl",)):
    """(path, parser, is_leaf) of ``parser`` and every subparser below it."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    yield path, parser, not subs
    for action in subs:
        for name, sub in action.choices.items():
            yield from _walk(sub, path + (name,))


_PARSERS = list(_walk(build_parser()))
_LEAVES = [(path, parser) for path, parser, leaf in _PARSERS if leaf]
_ids = [" ".join(path) for path, _, _ in _PARSERS]
_leaf_ids = [" ".join(path) for path, _ in _LEAVES]


def _arguments(parser):
    return [a for a in parser._actions
            if not isinstance(a, (argparse._HelpAction, argparse._VersionAction,
                                  argparse._SubParsersAction))]


def _examples(parser):
    """The example command lines of a parser's epilog."""
    lines = []
    for line in (parser.epilog or "").splitlines():
        line = line.strip().removeprefix("$ ")
        if line.startswith("ebfl "):
            lines.append(line)
    return lines


def test_walk_finds_every_command():
    assert len(_LEAVES) >= 20
    assert ("ebfl", "demo") in [path for path, _ in _LEAVES]


@pytest.mark.parametrize(("path", "parser", "leaf"), _PARSERS, ids=_ids)
def test_every_argument_has_help(path, parser, leaf):
    missing = [a.option_strings or a.dest for a in _arguments(parser)
               if not (a.help and str(a.help).strip())]
    assert not missing, f"{' '.join(path)}: no help for {missing}"


@pytest.mark.parametrize(("path", "parser", "leaf"), _PARSERS, ids=_ids)
def test_every_default_is_stated(path, parser, leaf):
    silent = []
    for a in _arguments(parser):
        if not a.option_strings or a.default in (None, False, argparse.SUPPRESS) \
                or isinstance(a.default, list):
            continue
        if "default" not in str(a.help):
            silent.append(a.option_strings)
    assert not silent, f"{' '.join(path)}: the help does not state the default of {silent}"


@pytest.mark.parametrize(("path", "parser"), _LEAVES, ids=_leaf_ids)
def test_every_leaf_has_an_example(path, parser):
    assert parser.epilog and "ebfl " in parser.epilog
    examples = _examples(parser)
    assert examples
    for line in examples:
        assert shlex.split(line)[1:len(path)] == list(path[1:]), line


@pytest.mark.parametrize(("path", "parser"), _LEAVES, ids=_leaf_ids)
def test_every_example_parses(path, parser):
    for line in _examples(parser):
        try:
            args = build_parser().parse_args(shlex.split(line)[1:])
        except SystemExit as exc:  # pragma: no cover - the failure message
            pytest.fail(f"example does not parse ({exc.code}): {line}")
        assert callable(args.func)


_GROUPS = [path for path, _, leaf in _PARSERS if not leaf]


@pytest.mark.parametrize("path", _GROUPS, ids=[" ".join(path) for path in _GROUPS])
def test_group_help_exits_zero(path, capsys):
    assert main([*path[1:], "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: ")


@pytest.mark.parametrize(("path", "parser"), _LEAVES, ids=_leaf_ids)
def test_help_prints_the_examples(path, parser, capsys):
    assert main([*path[1:], "--help"]) == 0
    out = capsys.readouterr().out
    for line in _examples(parser):
        assert line in out


_QUICK = [(path, a.help) for path, parser in _LEAVES for a in _arguments(parser)
          if "--quick" in a.option_strings]


@pytest.mark.parametrize(("path", "text"), _QUICK, ids=[" ".join(p) for p, _ in _QUICK])
def test_every_quick_mode_states_its_time_and_what_it_is(path, text):
    import re

    # a measured wall time within the 2 minutes a quick run may take
    took = re.search(r"(\d+) s[^()]*, measured on 2 idle cores", text)
    assert took and int(took.group(1)) <= 120, text
    assert ("not comparable with the paper's" in text
            or "the paper's setting with wider Monte Carlo errors" in text), text


def test_quick_help_matches_the_quick_settings():
    pytest.importorskip("torch")
    from ebfl.fedhdp.experiment import QUICK as FEDHDP
    from ebfl.generative.adaped import QUICK_ROUNDS, QUICK_ROUNDS_ALL_CLIENTS
    from ebfl.perada.experiment import QUICK as PERADA
    from ebfl.perada.experiment import QUICK_METHODS

    helps = {" ".join(path[2:]): text for path, text in _QUICK}
    for name in ("adaped", "adaped-protocol", "dp-adaped"):
        assert f"{QUICK_ROUNDS} rounds" in helps[name]
    assert f"{QUICK_ROUNDS_ALL_CLIENTS} rounds of every client" in helps["adaped-fedem"]
    assert (f"{PERADA.n_clients} clients, {PERADA.n_rounds} rounds, {len(QUICK_METHODS)} "
            "methods") in helps["perada"]
    assert (f"{FEDHDP['n_clients']} clients, {FEDHDP['rounds']} rounds of "
            f"{FEDHDP['local_epochs']} local epochs, q = {FEDHDP['sampling_rate']}"
            ) in helps["fedhdp"]
