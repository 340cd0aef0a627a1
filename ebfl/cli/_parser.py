"""The ``ebfl`` argument parser: every subcommand, its options and its handler."""

from __future__ import annotations

import argparse
import sys

from ebfl._tables import DEFAULT_MAX_MIB
from ebfl.cli._accounting import (
    _cmd_accounting_dp_adaped,
    _cmd_accounting_dp_pfl,
    _cmd_accounting_fedhdp,
)
from ebfl.cli._estimation import (
    _cmd_bounds_beta,
    _cmd_bounds_fedhdp,
    _cmd_bounds_gaussian,
    _cmd_demo,
    _cmd_election,
    _cmd_fit_beta_binomial,
    _cmd_fit_gaussian,
    _cmd_fit_normal_means,
    _cmd_private_bernoulli,
    _cmd_validate,
)
from ebfl.cli._flower import _cmd_flower_app, _cmd_flower_simulate
from ebfl.cli._reproduce import (
    _cmd_hapt,
    _cmd_reproduce_adaped,
    _cmd_reproduce_adaped_fedem,
    _cmd_reproduce_adaped_protocol,
    _cmd_reproduce_dp_adaped,
    _cmd_reproduce_dp_pfl,
    _cmd_reproduce_estimation,
    _cmd_reproduce_fedhdp,
    _cmd_reproduce_perada,
    _cmd_reproduce_regression,
)
from ebfl.cli._types import (
    _device,
    _integer,
    _nonnegative,
    _open_unit,
    _positive,
    _real,
    _size,
    _unit,
)


def _add_max_size(p):
    p.add_argument("--max-size", type=_positive, default=DEFAULT_MAX_MIB, metavar="MIB",
                   help="the most a compressed CSV may expand to when read "
                        f"(default: {DEFAULT_MAX_MIB} MiB)")


def _add_json(parser):
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object instead of a table")


def _add_seed(parser, what):
    parser.add_argument("--seed", type=_integer(0), default=0,
                        help=f"random seed, an integer >= 0, of {what} (default 0)")


_SEEDS = "the run (with --seeds N: the first of seed, seed+1, ...)"


def _examples(parser, *lines):
    """End ``parser``'s help with example command lines (kept as written)."""
    parser.epilog = "example" + ("s" if len(lines) > 1 else "") + ":\n" + "\n".join(
        "  " + line for line in lines)


#: A ``--quick`` run's wall time is measured on two idle cores with the data in the data
#: home and Numba's cache warm, and stated in its help (``tests/test_cli_help.py`` checks
#: that every ``--quick`` states one, and the rounds against the library's constants).
_QUICK_NOT_COMPARABLE = "a pipeline check whose numbers are not comparable with the paper's"


def _add_quick(parser, what, took, *, comparable=False):
    """``--quick``: what it shrinks, how long it took, and whether its numbers can be
    read beside the paper's (only fewer replicates can)."""
    kind = ("the paper's setting with wider Monte Carlo errors" if comparable
            else _QUICK_NOT_COMPARABLE)
    parser.add_argument("--quick", action="store_true",
                        help=f"{what}: {kind} ({took}, measured on 2 idle cores)")


def _neural_arguments(parser, *, plot, seeds, quick):
    """Options shared by the neural experiments: dataset, seed, quick mode, figure, JSON
    (``quick``: what it shrinks and its time, as :func:`_add_quick` takes them)."""
    parser.add_argument("--dataset", default="mnist",
                        choices=["mnist", "femnist", "fashion-mnist", "hapt"],
                        help="the clients' data (default mnist)")
    parser.add_argument("--femnist-root", metavar="DIR",
                        help="LEAF FEMNIST directory with train/ and test/ (default: data home)")
    _add_seed(parser, _SEEDS if seeds else "the run")
    _add_quick(parser, *quick)
    parser.add_argument("--plot", metavar="DIR", help=f"save {plot} there")
    _device_argument(parser)
    _add_json(parser)


def _device_argument(parser):
    parser.add_argument("--device", type=_device, metavar="DEVICE",
                        help="where the models train: cpu (default), cuda or cuda:N; the same "
                             "random numbers on every device")


def _privacy_arguments(parser, *, noise_default, clip_help):
    parser.add_argument("--noise", type=_positive, action="append",
                        help=f"noise multiplier sigma/C > 0 (repeat; default {noise_default})")
    parser.add_argument("--clip", type=_positive, default=1.0,
                        help=f"{clip_help}, clip norm > 0 (default 1)")
    parser.add_argument("--delta", type=_open_unit, default=1e-5,
                        help="delta in (0, 1) at which each run's (epsilon, delta) is "
                             "reported (default 1e-5)")


def _table1_protocol_arguments(parser):
    """Table 1's unstated protocol: classes per client and the learning-rate grid."""
    parser.add_argument("--classes-per-client", type=_integer(1), default=3, metavar="C",
                        help="classes of each client's images (mnist, fashion-mnist; default 3)")
    parser.add_argument("--lr-grid", type=_positive, nargs="*", metavar="LR",
                        help="choose each method's learning rate per seed on a validation "
                             "split of the training images (never the test set); bare: the "
                             "paper's grid 0.2 0.15 0.125 0.1 0.075 0.05")


class _Formatter(argparse.HelpFormatter):
    """argparse's formatter, but a description or epilog with line breaks (the
    examples) is printed as written; one-line texts are wrapped as usual."""

    def _fill_text(self, text, width, indent):
        if "\n" in text:
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)


class _Parser(argparse.ArgumentParser):
    """argparse, with a usage error as one ``error: ...`` line and exit status 2, like
    every other user mistake (argparse would print the usage block first). Its
    subparsers are ``_Parser`` too (argparse's default ``parser_class``). A former
    spelling of a renamed option (:func:`_alias`) is settled after each parse."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)

    def error(self, message):
        self.exit(2, f"error: {message} (see `{self.prog} --help`)\n")

    def parse_known_args(self, args=None, namespace=None):
        namespace, extras = super().parse_known_args(args, namespace)
        # A subcommand's parser settles its own options (its errors then point at its
        # help); a parser above finds nothing left to settle.
        _settle(namespace)
        return namespace, extras


#: The release that drops the former spellings of renamed options: the minor release after
#: 0.1, written out rather than derived from ``__version__``, so that the promise a warning
#: makes stays the same as the version moves on.
_REMOVED_IN = "0.2"

#: The namespace attribute where the options with former spellings note, during one parse,
#: which spelling gave which value; :func:`_settle` removes it again.
_SPELLINGS = "_ebfl_spellings"


class _Renamed(argparse.Action):
    """``store`` for an option with former spellings (:func:`_alias`).

    It notes which spelling gave each value, for :func:`_settle`, and does not store
    the value of a former spelling that has to be converted (``--iterations``): that
    waits for the options it depends on, and a value that was never converted stays
    unset rather than taken in the new option's meaning.
    """

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, **kwargs)
        self.former = {}  # former spelling -> its converter, or None: the same value

    def __call__(self, parser, namespace, values, option_string=None):
        if self.former.get(option_string) is None:
            setattr(namespace, self.dest, values)
        if _SPELLINGS not in vars(namespace):
            setattr(namespace, _SPELLINGS, [])
        getattr(namespace, _SPELLINGS).append((parser, self, option_string, values))


def _option(parser, name, *former, **kwargs):
    """``parser.add_argument(name, **kwargs)``, with each spelling in ``former`` kept as a
    deprecated alias of it (:func:`_alias`); returns the action."""
    action = parser.add_argument(name, action=_Renamed, **kwargs)
    for old in former:
        _alias(parser, old, name)
    return action


def _alias(parser, old, new, convert=None):
    """Keep ``old``, a former spelling of option ``new``, as a deprecated alias.

    ``old`` is parsed as ``new`` (the same action, so the same type, dest and, for a
    required option, the same requirement), is left out of ``--help`` and the usage,
    and prints one warning line after a successful parse; giving both spellings is an
    error (:func:`_settle`).

    Parameters
    ----------
    parser : argparse.ArgumentParser
        The subcommand's parser, where ``new`` was added by :func:`_option`.
    old, new : str
        The former and the current option strings, e.g. ``"--m"`` and ``"--clients"``.
    convert : callable, optional
        ``convert(parser, namespace, value) -> (new_value, use)`` for a former spelling
        whose number meant something else (``--iterations`` T is ``--rounds`` T/tau):
        called after parsing, ``use`` ends the warning ("use ..."). Default: the same
        value, and the warning says "use NEW".
    """
    action = parser._option_string_actions[new]
    if not isinstance(action, _Renamed) or old in parser._option_string_actions:
        raise ValueError(f"cannot alias {old} to {new}")  # a mistake in this module
    action.former[old] = convert
    # argparse finds an option string (and its abbreviations) in this table; --help and the
    # usage print only action.option_strings, which leaves the old spelling out.
    parser._option_string_actions[old] = action


def _settle(namespace):
    """After a parse: refuse two spellings of one option, convert a former spelling's value
    where it meant something else, and print one warning line per former spelling used."""
    noted = vars(namespace).pop(_SPELLINGS, None)
    if not noted:
        return
    given = {}  # action -> {spelling: (parser, value)}, in the order given
    for parser, action, spelling, value in noted:
        given.setdefault(action, {})[spelling] = (parser, value)
    for action, spellings in given.items():
        if len(spellings) > 1:
            parser = next(iter(spellings.values()))[0]
            parser.error(f"{' and '.join(spellings)} are two spellings of one option; give "
                         f"{action.option_strings[0]} once")
    warnings = []
    for action, spellings in given.items():
        (spelling, (parser, value)), = spellings.items()
        if spelling not in action.former:
            continue
        use = action.option_strings[0]
        if action.former[spelling] is not None:
            value, use = action.former[spelling](parser, namespace, value)
            setattr(namespace, action.dest, value)
        warnings.append(f"warning: {spelling} is deprecated and will be removed in ebfl "
                        f"{_REMOVED_IN}; use {use}")
    for line in warnings:  # only once nothing can fail: an error stays the one line
        print(line, file=sys.stderr)


def _iterations_to_rounds(parser, namespace, iterations):
    """``--iterations T`` (local iterations in all) of ``accounting dp-adaped`` as the
    ``--rounds T/tau`` (tau = ``--local-steps``) that mean the same run."""
    tau = namespace.local_steps
    if iterations % tau:
        parser.error(f"--iterations {iterations} is not a multiple of --local-steps {tau}: "
                     "T local iterations in all are T/tau rounds of tau")
    rounds = iterations // tau
    return rounds, f"--rounds {rounds} (--iterations {iterations} / --local-steps {tau})"


class _Deferred:
    """Help text computed when argparse formats it (``%(name)s`` calls ``str``)."""

    def __init__(self, make):
        self._make = make

    def __str__(self):
        return self._make()


def _check_names():
    from ebfl.validation.registry import CHECKS

    return ", ".join(CHECKS)


def _job_arguments(p):
    """Options of a federated job (``ebfl flower``)."""
    from ebfl.eb.normal_means import FAMILIES
    from ebfl.flower.jobs import ALGORITHMS, DATASETS

    p.add_argument("algorithm", choices=ALGORITHMS, help="the algorithm or EB protocol to run")
    p.add_argument("--dataset", choices=DATASETS,
                   help="digits (learning; bundled with scikit-learn); mnist (fedhdp only: the "
                        "FedHDP paper's non-IID MNIST and protocol, from the data home, never "
                        "downloaded); simulated or elections (eb-*) (default: digits for "
                        "learning, simulated for eb-*)")
    p.add_argument("--clients", type=_integer(1),
                   help="number of clients, >= 1 (default 6; elections: every county, or the "
                        "first N; mnist: 2000)")
    p.add_argument("--rounds", type=_integer(1), default=3,
                   help="federated rounds, >= 1 (default 3)")
    p.add_argument("--clients-per-round", type=_integer(1),
                   help="K, clients sampled per round, >= 1 (default: all; mnist: the expected "
                        "K of Poisson sampling, default 5 %% of the clients)")
    # no argparse defaults here: the job fills them, per dataset (mnist: the paper's)
    p.add_argument("--local-steps", type=_integer(1),
                   help="tau, local steps per round, >= 1 (default 5; mnist: 25 local epochs, "
                        "50 steps at 2000 clients)")
    p.add_argument("--batch-size", type=_integer(1),
                   help="local minibatch size, >= 1 (default 10; mnist: 20)")
    p.add_argument("--eval-every", type=_integer(1), default=1,
                   help="evaluate every this many rounds, >= 1 (default 1)")
    p.add_argument("--lr", type=_positive,
                   help="learning rate > 0 (default 0.1; mnist: 0.5, decayed by 0.9 every 50 "
                        "rounds)")
    p.add_argument("--epsilon", type=_positive,
                   help="local privacy of the eb-* protocols (eb-normal-means: (epsilon, "
                        "--delta)); dp-pfl: each device's (epsilon, 1e-3) (default: no "
                        "privacy)")
    p.add_argument("--family", choices=FAMILIES,
                   help="eb-normal-means: the prior family of ebnm (default point_normal)")
    p.add_argument("--delta", type=_open_unit,
                   help="eb-normal-means with --epsilon: the Gaussian mechanism's delta "
                        "(default 1e-5)")
    _option(p, "--omega-every", "--inner", type=_integer(1), metavar="K",
            help="dp-pfl: an Omega-step every K rounds (global iterations), K >= 1 "
                 "(default 10)")
    _add_seed(p, "the job: data split, initialization, client sampling and noise")
    p.add_argument("--clip", type=_positive,
                   help="clip norm (dp-adaped, dp-fedem; fedhdp: the initial S; default 1, "
                        "mnist: 0.5)")
    p.add_argument("--noise", type=_nonnegative,
                   help="noise std (dp-adaped, dp-fedem); fedhdp: the private group's noise "
                        "multiplier (default 0.1; mnist: 1.5)")
    p.add_argument("--opt-out", type=_unit,
                   help="fedhdp, fedhdp-point: fraction of non-private clients, in [0, 1] "
                        "(default 0.5; mnist: 0.05)")
    p.add_argument("--gamma2", type=_nonnegative,
                   help="fedhdp-point: privacy-noise variance of the private average "
                        "(default 1)")
    p.add_argument("--ratio", type=_unit,
                   help="in [0, 1]; fedhdp, fedhdp-point: the private clients' weight ratio r; "
                        "dp-pfl: the budget split epsilon2/epsilon1 (default: per algorithm; "
                        "fedhdp: 0.1, mnist: 0.01)")
    p.add_argument("--lam", type=_nonnegative,
                   help="fedhdp, fedhdp-point, dp-pfl: lambda >= 0 (default: per algorithm)")


def build_parser():
    """The argparse parser of ``ebfl``."""
    from ebfl import __version__, cli

    parser = _Parser(prog="ebfl", description=cli.__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"ebfl {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    bounds = sub.add_parser("bounds", help="closed-form MSEs and bounds").add_subparsers(
        dest="model", required=True)
    g = bounds.add_parser("gaussian", help="Theorem 1 and the local/global/oracle MSEs")
    _option(g, "--clients", "--m", type=_integer(2), required=True, metavar="M",
            help="m, number of clients, >= 2")
    _option(g, "--samples-per-client", "--n", type=_integer(1), required=True, metavar="N",
            help="n, samples per client, >= 1")
    g.add_argument("--sigma-theta", type=_real, required=True,
                   help="sigma_theta >= 0, sd of the client means theta_i around the "
                        "global mean (the prior's sd)")
    g.add_argument("--sigma-x", type=_positive, required=True,
                   help="sigma_x > 0, sd of one sample around its client's mean")
    g.add_argument("--d", type=_integer(1), default=1, help="dimension d, >= 1 (default 1)")
    g.add_argument("--k-bits", type=_integer(1),
                   help="Theorem 2: k-bit stochastic quantizer, k >= 1 (needs --r)")
    g.add_argument("--epsilon", type=_positive,
                   help="Theorem 2: Gaussian LDP mechanism epsilon > 0 (needs --delta, --r)")
    g.add_argument("--delta", type=_open_unit,
                   help="Theorem 2: Gaussian LDP mechanism delta in (0, 1)")
    g.add_argument("--r", type=_positive,
                   help="Theorem 2: |mu| <= r per coordinate, r > 0 (sets b)")
    _add_json(g)
    g.set_defaults(func=_cmd_bounds_gaussian)
    _examples(g,
              "ebfl bounds gaussian --clients 100 --samples-per-client 10 --sigma-theta 1 "
              "--sigma-x 2",
              "ebfl bounds gaussian --clients 100 --samples-per-client 10 --sigma-theta 1 "
              "--sigma-x 2 --epsilon 1 --delta 1e-5 --r 1")
    b = bounds.add_parser("beta", help="known Beta prior: posterior and local MSE")
    b.add_argument("--alpha", type=_real, required=True,
                   help="alpha > 0 of the Beta(alpha, beta) prior of the success rates")
    b.add_argument("--beta", type=_real, required=True,
                   help="beta > 0 of the Beta(alpha, beta) prior")
    _option(b, "--samples-per-client", "--n", type=_integer(1), required=True, metavar="N",
            help="n, Bernoulli trials per client, >= 1")
    _add_json(b)
    b.set_defaults(func=_cmd_bounds_beta)
    _examples(b,
              "ebfl bounds beta --alpha 2 --beta 5 --samples-per-client 14")
    fh = bounds.add_parser("fedhdp", help="FedHDP point estimation: optimal r, lambdas and MSEs "
                           "(Lemma 1, Lemma 2, Theorem 3)")
    _option(fh, "--clients", "--n-clients", type=_integer(2), required=True, metavar="N",
            help="N, number of clients, >= 2")
    _option(fh, "--opt-out", "--rho", type=_real, required=True, metavar="RHO",
            help="rho in [0, 1], fraction of clients that opt out of privacy (rho * N whole)")
    fh.add_argument("--alpha2", type=_positive, required=True,
                    help="alpha^2 > 0, variance of a client's local estimate")
    fh.add_argument("--tau2", type=_real, required=True, help="tau^2 >= 0, heterogeneity")
    fh.add_argument("--gamma2", type=_real, required=True,
                    help="gamma^2 >= 0, privacy-noise variance of the private clients' mean")
    _add_json(fh)
    fh.set_defaults(func=_cmd_bounds_fedhdp)
    _examples(fh,
              "ebfl bounds fedhdp --clients 100 --opt-out 0.1 --alpha2 1 --tau2 0.5 --gamma2 2")

    fit = sub.add_parser("fit", help="empirical Bayes on your own CSV").add_subparsers(
        dest="model", required=True)
    fb = fit.add_parser("beta-binomial", help="success counts per client (Beta prior)")
    fb.add_argument("path", help="CSV file")
    fb.add_argument("--successes", help="column of successes (one row per client)")
    fb.add_argument("--trials", help="column of trials (one row per client)")
    fb.add_argument("--method", default="mle",
                    choices=["mle", "moments", "loo_printed", "loo_proof", "loo_corrected",
                             "npmle"],
                    help="prior fit; npmle = nonparametric prior on a grid (default mle)")
    fg = fit.add_parser("gaussian", help="client means (Gaussian prior)")
    fg.add_argument("path", help="CSV file")
    fg.add_argument("--mean", help="column of client means (one row per client)")
    fg.add_argument("--se", help="column of their standard errors")
    fg.add_argument("--sigma-x", type=_positive,
                    help="known noise sd (raw samples; else pooled)")
    fg.add_argument("--method", default="mle", choices=["mle", "reml", "dl", "moments", "npmle"],
                    help="prior fit: maximum likelihood, restricted ML, DerSimonian-Laird, "
                         "moments; npmle = nonparametric prior on a grid (with --mean/--se) "
                         "(default mle)")
    for p in (fb, fg):
        p.add_argument("--id", help="column of client ids kept in the output (one row per "
                                    "client; default: row numbers from 0)")
        p.add_argument("--client", help="client id column (one row per observation)")
        p.add_argument("--value", action="append",
                       help="observation column (with --client; repeat for d > 1)")
        p.add_argument("--level", type=_open_unit, default=0.95,
                       help="credible level in (0, 1) (default 0.95)")
        p.add_argument("--output", help="write per-client estimates to this CSV")
        _add_max_size(p)
        _add_json(p)
    fb.set_defaults(func=_cmd_fit_beta_binomial)
    _examples(fb,
              "ebfl fit beta-binomial counts.csv --successes wins --trials games --output "
              "posterior.csv",
              "ebfl fit beta-binomial outcomes.csv --client county --value republican_win "
              "--method loo_printed")
    fg.set_defaults(func=_cmd_fit_gaussian)
    _examples(fg,
              "ebfl fit gaussian means.csv --mean mean --se se --method reml",
              "ebfl fit gaussian samples.csv --client id --value x --json")
    from ebfl.eb.normal_means import FAMILIES as NORMAL_MEANS_FAMILIES

    fn = fit.add_parser(
        "normal-means", help="estimates and standard errors under a prior family (ebnm)",
        description="Empirical Bayes normal means: x_i ~ N(theta_i, s_i^2), theta_i ~ g, g "
                    "from a prior family, fitted by maximum marginal likelihood.")
    fn.add_argument("path", help="CSV file, one row per observation")
    fn.add_argument("--x", required=True, help="column of estimates x_i")
    fn.add_argument("--s", required=True, help="column of their standard errors s_i (> 0)")
    fn.add_argument("--family", default="point_normal", choices=list(NORMAL_MEANS_FAMILIES),
                    help="prior family (default point_normal)")
    fn.add_argument("--mode", default="0", metavar="M|estimate",
                    help="the prior's mode: a number, or 'estimate' (default 0)")
    fn.add_argument("--id", help="column of row ids kept in the output (default: row numbers)")
    fn.add_argument("--output", help="write the posteriors (mean, sd, lfsr, ...) to this CSV")
    _add_max_size(fn)
    _add_json(fn)
    fn.set_defaults(func=_cmd_fit_normal_means)
    _examples(fn,
              "ebfl fit normal-means effects.csv --x beta --s se --family point_laplace "
              "--output posterior.csv",
              "ebfl fit normal-means effects.csv --x beta --s se --family unimodal --mode "
              "estimate --json")

    pb = sub.add_parser("private-bernoulli",
                        help="paper's vs corrected private Bernoulli EB across epsilon")
    pb.add_argument("--alpha", type=_real, default=2.0,
                    help="alpha > 0 of the Beta(alpha, beta) population of success rates "
                         "(default 2)")
    pb.add_argument("--beta", type=_real, default=2.0,
                    help="beta > 0 of the Beta population (default 2)")
    pb.add_argument("--clients", type=_integer(1), default=10_000,
                    help="number of simulated clients, >= 3 (default 10000)")
    _option(pb, "--samples-per-client", "--n", type=_integer(1), default=14, metavar="N",
            help="n, Bernoulli trials per client, >= 2 (default 14)")
    pb.add_argument("--epsilon", type=_positive, action="append",
                    help="LDP level epsilon > 0 (repeat; default: the grid 0.25 0.5 1 2 3 "
                         "5 8 12 20 50)")
    _add_seed(pb, "the simulated population and its private messages")
    pb.add_argument("--plot", metavar="DIR", help="save private_bernoulli.png there")
    _add_json(pb)
    pb.set_defaults(func=_cmd_private_bernoulli)
    _examples(pb,
              "ebfl private-bernoulli --clients 1000 --epsilon 1 --epsilon 5")

    acc = sub.add_parser("accounting", help="privacy accounting").add_subparsers(
        dest="algorithm", required=True)
    ad = acc.add_parser("dp-adaped", help="Theorem 7 epsilon beside a correct accountant")
    _option(ad, "--clients", "--m", type=_integer(1), required=True, metavar="M",
            help="m, number of clients, >= 1")
    _option(ad, "--clients-per-round", "--k", type=_integer(1), required=True, metavar="K",
            help="K, clients sampled per round, >= 1")
    _option(ad, "--rounds", type=_integer(1), required=True,
            help="T/tau synchronization rounds, >= 1 (T = rounds x tau local iterations in "
                 "all)")
    # --iterations gave T itself: converted to rounds, so that an old command line still
    # describes the same run.
    _alias(ad, "--iterations", "--rounds", convert=_iterations_to_rounds)
    _option(ad, "--local-steps", "--sync-gap", type=_integer(1), required=True, metavar="TAU",
            help="tau, local iterations per round, >= 1")
    ad.add_argument("--clip", type=_positive, required=True,
                    help="C1 > 0, clip norm of the mu update")
    ad.add_argument("--noise", type=_positive, required=True, help="sigma_q1 > 0, noise sd on mu")
    ad.add_argument("--clip-psi", type=_positive,
                    help="C2 > 0, clip norm of the psi update (omit for the concatenated variant)")
    ad.add_argument("--noise-psi", type=_positive, help="sigma_q2 > 0, noise sd on psi")
    ad.add_argument("--delta", type=_open_unit, default=1e-5,
                    help="delta in (0, 1) at which the user-level epsilon is computed "
                         "(default 1e-5)")
    ad.add_argument("--sampling", default="without_replacement",
                    choices=["without_replacement", "poisson"],
                    help="K fixed clients per round (Algorithm 5), or Poisson with rate K/m "
                         "(default without_replacement)")
    ad.add_argument("--accountant", default="rdp", choices=["rdp", "pld"],
                    help="dp-accounting's RDP or PLD accountant (default rdp; pld needs "
                         "--sampling poisson unless K = m)")
    ad.add_argument("--trust", default="aggregator", choices=["aggregator", "local"],
                    help="aggregator: the adversary sees only the sum of the sampled "
                         "clients; local: the server sees each client's update (default "
                         "aggregator)")
    _add_json(ad)
    ad.set_defaults(func=_cmd_accounting_dp_adaped)
    _examples(ad,
              "ebfl accounting dp-adaped --clients 100 --clients-per-round 10 --rounds 100 "
              "--local-steps 10 --clip 1 --noise 1 --clip-psi 1 --noise-psi 1",
              "ebfl accounting dp-adaped --clients 100 --clients-per-round 10 --rounds 100 "
              "--local-steps 10 --clip 1 --noise 1 --sampling poisson --accountant pld")
    af = acc.add_parser("fedhdp", help="DP-FedAvg / FedHDP privacy group: epsilon by RDP and PLD")
    af.add_argument("--sampling-rate", type=_positive, required=True,
                    help="q in (0, 1], the probability that a client takes part in a round")
    af.add_argument("--noise", type=_positive, required=True,
                    help="z > 0, the noise multiplier (noise sd over the clip norm)")
    af.add_argument("--rounds", type=_integer(1), required=True, help="T rounds, >= 1")
    af.add_argument("--delta", type=_open_unit, required=True,
                    help="delta in (0, 1) at which the client-level epsilon is computed")
    af.add_argument("--accountant", default="both", choices=["rdp", "pld", "both"],
                    help="RDP (TensorFlow Privacy's orders, improved conversion), PLD, or "
                         "both (default)")
    _add_json(af)
    af.set_defaults(func=_cmd_accounting_fedhdp)
    _examples(af,
              "ebfl accounting fedhdp --sampling-rate 0.1 --noise 1.1 --rounds 500 --delta 1e-5")
    dp = acc.add_parser("dp-pfl", help="DP-PFL: Theorem 5's noise and the epsilon it delivers "
                        "(RDP, PLD, Corollary 4)")
    dp.add_argument("--epsilon", type=_positive, default=8.0,
                    help="end-to-end target epsilon > 0 of a device (default 8)")
    dp.add_argument("--delta", type=_open_unit, default=1e-3,
                    help="delta in (0, 1) of the device's target (default 1e-3)")
    _option(dp, "--omega-every", "--inner", type=_integer(1), default=2000, metavar="K",
            help="K >= 1: an Omega-step every K global iterations (rounds) (default 2000)")
    _option(dp, "--omega-steps", "--outer", type=_integer(1), default=10, metavar="H",
            help="H >= 1, Omega-steps (default 10); every one of the K H iterations is a "
                 "release")
    dp.add_argument("--drop", type=_unit, default=0.2,
                    help="drop probability in [0, 1) (default 0.2, Figure 4's optimum)")
    _option(dp, "--sampling-rate", "--q", type=_positive, default=0.5, metavar="Q",
            help="q = n_iter/n_t in (0, 1], a device's sampling rate (default 0.5: tau = 1, "
                 "the device with the fewest samples)")
    dp.add_argument("--ratio", type=_positive, default=1.0,
                    help="r = epsilon2/epsilon1 > 0, the budget split (default 1)")
    _add_json(dp)
    dp.set_defaults(func=_cmd_accounting_dp_pfl)
    _examples(dp,
              "ebfl accounting dp-pfl --epsilon 4 --delta 1e-3 --json")

    val = sub.add_parser("validate", help="Monte Carlo checks of the paper's theorems")
    names = val.add_argument("names", nargs="*", metavar="NAME",
                             help="checks to run (default all): %(check_names)s")
    # Listed only when the help is printed: the checks register themselves as their
    # modules are imported, which takes seconds that no other command should pay.
    names.check_names = _Deferred(_check_names)
    val.add_argument("--reps", type=_integer(2),
                     help="replicates per check, >= 2 (default: per check)")
    _add_quick(val, "fewer replicates per check", "23 s", comparable=True)
    _add_seed(val, "the Monte Carlo replicates")
    val.add_argument("--plot", metavar="DIR", help="save sweep figures (MC vs formula) there")
    _add_json(val)
    val.set_defaults(func=_cmd_validate)
    _examples(val,
              "ebfl validate --quick",
              "ebfl validate --quick --json --seed 1")

    rep = sub.add_parser("reproduce", help="the papers' experiments").add_subparsers(
        dest="experiment", required=True)
    est = rep.add_parser("estimation", help="E1 (Bernoulli) and E8 (private Gaussian)")
    _add_quick(est, "10 E1 runs per prior and 20 E8 runs instead of 100 and 200, the same m",
               "9 s", comparable=True)
    _add_seed(est, "the simulations (E1 and E8 get independent streams)")
    est.add_argument("--plot", metavar="DIR", help="save the E8 figure there")
    _add_json(est)
    est.set_defaults(func=_cmd_reproduce_estimation)
    _examples(est,
              "ebfl reproduce estimation --quick --plot figures")

    el = rep.add_parser("election", help="county elections: personalized vs local (E2)")
    el.add_argument("--data", metavar="PATH",
                    help="local countypres_2000-2020.csv[.gz|.xz] (default: the data home)")
    el.add_argument("--no-verify", action="store_true", help="skip the sha256 check of --data")
    el.add_argument("--epsilon", type=_positive, action="append",
                    help="LDP level epsilon > 0 of the private variants (repeat; default 1 "
                         "and 5)")
    _add_seed(el, "the folds and the privacy noise")
    el.add_argument("--plot", metavar="DIR", help="save the shrinkage and per-fold figures")
    _add_json(el)
    el.set_defaults(func=_cmd_election)
    _examples(el,
              "ebfl reproduce election --epsilon 1 --epsilon 5 --plot figures")

    reg = rep.add_parser("regression", help="E3: personalized linear regression")
    _add_quick(reg, "m = 1000 clients, one run, 100 EM and 200 GD rounds", "9 s")
    _add_seed(reg, "the simulated clients and the training")
    reg.add_argument("--plot", metavar="DIR", help="save the E3 figure there")
    _add_json(reg)
    reg.set_defaults(func=_cmd_reproduce_regression)
    _examples(reg,
              "ebfl reproduce regression --quick")

    ada = rep.add_parser("adaped", help="Table 1: AdaPeD vs personalized-FL baselines (torch)")
    _neural_arguments(ada, plot="the accuracy-per-round figure", seeds=True,
                      quick=("8 rounds, one evaluation", "63 s on MNIST"))
    ada.add_argument("--methods", nargs="+", metavar="NAME",
                     help="subset of the methods (default: all)")
    ada.add_argument("--seeds", type=_integer(1), default=1,
                     help="runs, >= 1 (seeds seed, seed+1, ...; default 1)")
    ada.add_argument("--samples-per-client", type=_integer(2, 70_000), metavar="N",
                     help="training images kept per client, drawn from its classes (mnist, "
                          "fashion-mnist; default: all, about 1,100)")
    _table1_protocol_arguments(ada)
    ada.set_defaults(func=_cmd_reproduce_adaped)
    _examples(ada,
              "ebfl reproduce adaped --quick --dataset mnist --methods AdaPeD FedAvg")

    aps = rep.add_parser("adaped-protocol",
                         help="Table 1 over training images per client (and tuned rates), "
                              "and how close each comes to the paper")
    aps.add_argument("--dataset", default="mnist", choices=["mnist", "fashion-mnist"],
                     help="the clients' data (default mnist)")
    aps.add_argument("--sizes", type=_size, nargs="+", default=[50, 100, 200, 500, None],
                     metavar="N", help="training images per client, or all (default: 50 100 "
                                       "200 500 all)")
    aps.add_argument("--methods", nargs="+", metavar="NAME",
                     help="default: AdaPeD FedAvg FedAvg+FT pFedMe QuPeD-FP Local")
    _add_seed(aps, _SEEDS)
    aps.add_argument("--seeds", type=_integer(1), default=1,
                     help="runs per size, >= 1 (default 1)")
    _table1_protocol_arguments(aps)
    _add_quick(aps, "8 rounds per run", "106 s for the default sizes")
    aps.add_argument("--checkpoint-dir", metavar="DIR",
                     help="keep each finished (size, seed) there and resume from it")
    aps.add_argument("--plot", metavar="DIR", help="save the accuracy-per-size figure there")
    _device_argument(aps)
    _add_json(aps)
    aps.set_defaults(func=_cmd_reproduce_adaped_protocol)
    _examples(aps,
              "ebfl reproduce adaped-protocol --quick --sizes 50 100 --checkpoint-dir runs")

    fh = rep.add_parser("fedhdp", help="FedHDP Table 3 and the r-sweeps of Tables 8-9 (torch)")
    fh.add_argument("--dataset", default="mnist",
                    choices=["mnist", "mnist-skewed", "fashion-mnist", "synthetic",
                             "synthetic-skewed"],
                    help="non-IID MNIST (2,000 one-digit clients) or its skewed variant; "
                         "fashion-mnist: a stand-in for the paper's FMNIST (TFF's EMNIST "
                         "digits) with its Table 7 settings; synthetic*: the same structure "
                         "on random images, no download (default mnist)")
    fh.add_argument("--sweep", action="store_true",
                    help="Tables 8-9: the baselines and FedHDP at every r (default: Table 3)")
    fh.add_argument("--ratio", type=_unit, action="append", metavar="R",
                    help="r in [0, 1] of the sweep (repeat; default: the paper's grid)")
    fh.add_argument("--lam", type=_nonnegative, default=0.005,
                    help="lambda_p = lambda_np >= 0 (default 0.005)")
    fh.add_argument("--rounds", type=_integer(1), help="rounds, >= 1 (default: the paper's 500)")
    fh.add_argument("--denominator", choices=["realized", "expected"], default="realized",
                    help="realized: Algorithm 2 as printed; expected: the variant the "
                         "accountant's epsilon is a proof for (default realized)")
    _add_seed(fh, _SEEDS)
    fh.add_argument("--seeds", type=_integer(1), default=1,
                    help="runs, >= 1 (seeds seed, seed+1, ...; default 1)")
    fh.add_argument("--checkpoint-dir", metavar="DIR",
                    help="one checkpoint per run there: an interrupted run resumes")
    _add_quick(fh, "200 clients, 12 rounds of 2 local epochs, q = 0.1", "101 s on MNIST")
    fh.add_argument("--plot", metavar="DIR", help="save the accuracy-vs-r figure (--sweep)")
    _device_argument(fh)
    _add_json(fh)
    fh.set_defaults(func=_cmd_reproduce_fedhdp)
    _examples(fh,
              "ebfl reproduce fedhdp --quick --dataset synthetic",
              "ebfl reproduce fedhdp --quick --dataset synthetic --sweep --ratio 0.1 --ratio 0.5")

    pa = rep.add_parser("perada", help="PerAda Tables 1, 2, 4 and Figures 4, 7 at CPU scale "
                                       "(adapters, distillation, OOD tests, DP; torch)")
    pa.add_argument("--dataset", default="mnist", choices=["mnist", "synthetic", "cifar10"],
                    help="mnist: a Fashion-MNIST-pretrained small ResNet personalized on MNIST "
                         "(default); synthetic: generated images, no data needed; cifar10: the "
                         "paper's data from the data home")
    pa.add_argument("--part", action="append", metavar="PART",
                    choices=["table1", "table2", "figure4", "figure7", "table4"],
                    help="run only these parts (repeat; default: all)")
    pa.add_argument("--arch", default="small", choices=["small", "resnet18"],
                    help="small: the CPU-scale backbone; resnet18: the paper's (needs "
                         "--backbone-weights) (default small)")
    pa.add_argument("--backbone-weights", metavar="FILE",
                    help="torchvision-format ResNet-18 ImageNet state_dict (.pth) for --arch "
                         "resnet18")
    pa.add_argument("--cache-dir", metavar="DIR",
                    help="where the pretrained backbone is cached (default: DATA_HOME/pretrained)")
    pa.add_argument("--rounds", type=_integer(1), help="rounds, >= 1 (default: the protocol's)")
    _add_seed(pa, _SEEDS)
    pa.add_argument("--seeds", type=_integer(1), default=1,
                    help="runs, >= 1 (seeds seed, seed+1, ...; default 1)")
    pa.add_argument("--checkpoint-dir", metavar="DIR",
                    help="one result file per finished run there: an interrupted run resumes")
    _add_quick(pa, "4 clients, 2 rounds, 7 methods, small test sets", "25 s on MNIST")
    pa.add_argument("--plot", metavar="DIR", help="save the figures there")
    _device_argument(pa)
    _add_json(pa)
    pa.set_defaults(func=_cmd_reproduce_perada)
    _examples(pa,
              "ebfl reproduce perada --quick --dataset synthetic")

    dpf = rep.add_parser("dp-pfl", help="DP-PFL Figures 2-5 on 30 smartphone users, with "
                                        "fixed-Omega baselines")
    dpf.add_argument("--reps", type=_integer(1),
                     help="repetitions, >= 1: random splits and seeds (default 10, the paper's)")
    dpf.add_argument("--jobs", type=_integer(1), default=2,
                     help="fits run side by side on this many threads, >= 1 (default 2)")
    dpf.add_argument("--checkpoint-dir", metavar="DIR",
                     help="one result file per fit there: an interrupted run resumes")
    _add_quick(dpf, "2 repetitions, 40 x 2 iterations, a small grid", "20 s")
    dpf.add_argument("--plot", metavar="DIR", help="save Figures 2-5 there")
    _add_json(dpf)
    dpf.set_defaults(func=_cmd_reproduce_dp_pfl)
    _examples(dpf,
              "ebfl reproduce dp-pfl --quick")

    dpa = rep.add_parser("dp-adaped", help="Figures 1-3: DP-AdaPeD accuracy against epsilon")
    _neural_arguments(dpa, plot="the accuracy-vs-epsilon figure", seeds=False,
                      quick=("8 rounds per noise level", "44 s on MNIST"))
    _privacy_arguments(dpa, noise_default="0.5 1 2 4", clip_help="C1 = C2")
    dpa.add_argument("--concatenate", action="store_true", help="one clip on [h; k] (E6/E7)")
    dpa.add_argument("--fine-tune", action="store_true", help="Algorithm 6 (E6)")
    dpa.set_defaults(func=_cmd_reproduce_dp_adaped)
    _examples(dpa,
              "ebfl reproduce dp-adaped --quick --noise 1 --noise 4")

    e7 = rep.add_parser("adaped-fedem",
                        help="Figure 3: AdaPeD vs FedEM, non-private and DP, full participation")
    _neural_arguments(e7, plot="the accuracy-vs-epsilon figure", seeds=True,
                      quick=("2 rounds of every client", "78 s on MNIST"))
    _privacy_arguments(e7, noise_default="1 4 16", clip_help="C")
    e7.add_argument("--non-private", action="store_true",
                    help="only the non-private pair (the paper's 99.04 vs 98.90 on MNIST)")
    e7.add_argument("--seeds", type=_integer(1), default=1,
                    help="runs, >= 1 (seeds seed, seed+1, ...; default 1)")
    e7.set_defaults(func=_cmd_reproduce_adaped_fedem)
    _examples(e7,
              "ebfl reproduce adaped-fedem --quick --non-private")

    hapt = rep.add_parser("hapt", help="personalized logistic regression, 30 smartphone users")
    hapt.add_argument("--positive", default="SITTING",
                      help="activity against the rest (default SITTING)")
    hapt.add_argument("--data", metavar="PATH",
                      help="local hapt_raw.npz or the official UCI zip (default: the data home)")
    hapt.add_argument("--download", action="store_true",
                      help="download the official UCI zip if the data home has neither file "
                           "(UCI publishes no checksum)")
    _add_quick(hapt, "2,000 GD, 15 EM and 100 FedAvg rounds", "11 s")
    hapt.add_argument("--plot", metavar="DIR", help="save the accuracy figure there")
    _add_json(hapt)
    hapt.set_defaults(func=_cmd_hapt)
    _examples(hapt,
              "ebfl reproduce hapt --quick --download")

    fl = sub.add_parser("flower", help="federated runs on Flower (needs ebfl[flower])"
                        ).add_subparsers(dest="action", required=True)
    fs = fl.add_parser("simulate", help="a job on Flower's Simulation Engine, in this process")
    _job_arguments(fs)
    fs.add_argument("--compare", action="store_true",
                    help="also run in process; report max |difference| of the final parameters")
    fs.add_argument("--failures", default="", metavar="R:C,...",
                    help="clients that crash: round:client pairs, 0-based (e.g. 1:0,2:3; default: "
                         "none)")
    fs.add_argument("--verbose", action="store_true", help="Flower's and Ray's logs")
    fs.add_argument("--plot", metavar="DIR", help="save the metric-per-round figure there")
    _add_json(fs)
    fs.set_defaults(func=_cmd_flower_simulate)
    _examples(fs,
              "ebfl flower simulate adaped --dataset digits --clients 6 --rounds 3 --compare",
              "ebfl flower simulate fedhdp --dataset mnist --clients 200 --rounds 2 "
              "--local-steps 2 --compare",
              "ebfl flower simulate eb-normal-means --family ash --clients 6 --rounds 2")
    fa = fl.add_parser("app", help="write a deployable Flower App for a job")
    fa.add_argument("directory", help="folder to write the app to (new or empty)")
    _job_arguments(fa)
    fa.add_argument("--superlink", default="127.0.0.1:9093",
                    help="the SuperLink's address, HOST:PORT (default 127.0.0.1:9093)")
    fa.add_argument("--overwrite", action="store_true", help="replace an existing app")
    _add_json(fa)
    fa.set_defaults(func=_cmd_flower_app)
    _examples(fa,
              "ebfl flower app my-app fedavg --rounds 5")

    demo = sub.add_parser("demo", help="simulate the paper's settings, compare with theory")
    demo.add_argument("--clients", type=_integer(2), default=10_000,
                      help="simulated clients in each of the two settings (Gaussian and "
                           "Beta-Bernoulli), >= 3 (default 10000)")
    _add_seed(demo, "the simulated clients")
    _add_json(demo)
    demo.set_defaults(func=_cmd_demo)
    _examples(demo,
              "ebfl demo --clients 1000",
              "ebfl demo --json")
    # The long commands show progress bars on stderr when it is a terminal; --quiet
    # silences them (a log or a pipe never gets them).
    for long_running in (val, *rep.choices.values()):
        long_running.add_argument("--quiet", action="store_true",
                                  help="no progress bars (by default they are shown on "
                                       "stderr when it is a terminal)")
    return parser
