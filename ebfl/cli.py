"""Command-line interface of ebfl: fit, bound, validate and reproduce from a shell.

The subcommands include ``ebfl bounds``, ``fit``, ``validate``, ``reproduce``,
``election`` and ``hapt``; ``ebfl --help`` lists them all.

Every subcommand accepts ``--json`` and then prints exactly one JSON object on
stdout; otherwise it prints a readable table. A user's mistake (a missing or
corrupted file, a wrong column, a bad option value) prints one line
``error: ...`` on stderr, nothing on stdout, and exits with status 2.
"""

from __future__ import annotations

import argparse
import json
import lzma
import math
import os
import pickle
import re
import sys
import zipfile
import zlib
from pathlib import Path

import numpy as np

from ebfl._tables import DEFAULT_MAX_MIB

__all__ = ["main"]


def _print_table(title, rows, columns):
    print(title)
    widths = [max(len(c), *(len(_fmt(r.get(c))) for r in rows)) for c in columns]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)))
    for r in rows:
        print("  ".join(_fmt(r.get(c)).ljust(w) for c, w in zip(columns, widths, strict=True)))


def _fmt(value):
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.7g}"
    return str(value)


def _emit(args, payload, render):
    if args.json:
        json.dump(payload, sys.stdout, default=_json_default)
        sys.stdout.write("\n")
    else:
        render(payload)


def _save_figure(args, plot, payload, name):
    """Save ``plot(payload, path)`` as ``--plot DIR/name`` (if asked); the paths in the payload."""
    if args.plot:
        Path(args.plot).mkdir(parents=True, exist_ok=True)
        payload["figures"] = [str(plot(payload, Path(args.plot) / name))]


def _json_default(obj):
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    raise TypeError(f"not JSON serializable: {type(obj).__name__}")


# ------------------------------------------------------------------- bounds

def _cmd_bounds_gaussian(args):
    from ebfl.bounds import (
        gaussian_bounds,
        gaussian_mechanism_sigma_q,
        gaussian_mechanism_true_delta,
        quantizer_sigma_q,
    )
    from ebfl.privacy.mechanisms import paper_clip_range

    setting = (args.m, args.n, args.sigma_theta, args.sigma_x)
    extra = {}
    if args.k_bits is not None and args.epsilon is not None:
        raise ValueError("give either --k-bits (quantizer) or --epsilon/--delta (privacy)")
    if (args.k_bits is not None or args.epsilon is not None) and args.r is None:
        raise ValueError("--r (bound on |mu| per coordinate) is needed with --k-bits/--epsilon")
    if args.epsilon is not None and args.delta is None:
        raise ValueError("--epsilon needs --delta")
    sigma_q = 0.0
    if args.k_bits is not None:
        sigma_q = quantizer_sigma_q(*setting, args.k_bits, args.r)
        extra = {"mechanism": "quantizer", "k_bits": args.k_bits}
    elif args.epsilon is not None:
        sigma_q = gaussian_mechanism_sigma_q(*setting, args.epsilon, args.delta, args.r)
        # the paper's sigma, and the delta it really delivers for the whole d-vector
        true_delta = gaussian_mechanism_true_delta(*setting, args.epsilon, args.delta, args.r,
                                                   d=args.d)
        extra = {"mechanism": "gaussian", "epsilon": args.epsilon, "delta": args.delta,
                 "true_delta": true_delta, "paper_claim_holds": true_delta <= args.delta}
    if extra:
        extra.update(r=args.r, b=paper_clip_range(args.r, *setting))
    b = gaussian_bounds(*setting, args.d, sigma_q=sigma_q)
    key = "theorem2" if extra else "theorem1"
    payload = {"model": "gaussian", **extra, **b.as_dict(), key: b.personalized}

    def render(p):
        names = (["b", "sigma_q", "weight", key] if extra else ["weight", key]) + (
            ["true_delta", "paper_claim_holds"] if "true_delta" in p else []) + [
            "local", "global_only", "oracle", "lower_known_prior", "lower_estimated_mean"]
        rows = [{"quantity": k, "value": p[k]} for k in names]
        mech = "" if not extra else " " + ", ".join(
            f"{k}={p[k]}" for k in ("mechanism", "k_bits", "epsilon", "delta", "r") if k in p)
        _print_table(f"Gaussian model: m={p['m']} n={p['n']} sigma_theta={p['sigma_theta']} "
                     f"sigma_x={p['sigma_x']} d={p['d']}{mech} (MSE summed over d)", rows,
                     ["quantity", "value"])
    _emit(args, payload, render)


def _cmd_bounds_beta(args):
    from ebfl.bounds import beta_bounds

    b = beta_bounds(args.alpha, args.beta, args.n)
    payload = {"model": "beta-bernoulli", **b.as_dict()}

    def render(p):
        rows = [{"quantity": k, "value": p[k]} for k in ("weight", "posterior", "local")]
        _print_table(f"Beta-Bernoulli, known prior Beta({p['alpha']}, {p['beta']}), n={p['n']}",
                     rows, ["quantity", "value"])
    _emit(args, payload, render)


def _cmd_bounds_fedhdp(args):
    from ebfl.fedhdp import fedhdp_bounds

    b = fedhdp_bounds(args.n_clients, args.rho, args.alpha2, args.tau2, args.gamma2)
    # JSON has no NaN or infinity: null for a group with no client, "inf" for lambda = inf.
    payload = {"model": "fedhdp-point-estimation", **{
        k: (None if isinstance(v, float) and math.isnan(v) else "inf" if v == math.inf else v)
        for k, v in b.to_dict().items()}}

    def render(p):
        names = ["n_nonprivate", "n_private", "optimal_ratio", "server_mse_optimal",
                 "server_mse_hdp_fedavg", "server_mse_dp_fedavg", "gap_hdp_fedavg",
                 "gap_dp_fedavg", "gap_dp_vs_hdp_fedavg"]
        for group in ("nonprivate", "private"):
            names += [f"lambda_{group}", f"lambda_{group}_exact", f"mse_{group}",
                      f"mse_{group}_exact", f"bayes_{group}"]
        rows = [{"quantity": k, "value": p[k]} for k in names]
        _print_table(f"FedHDP point estimation: N={p['n_clients']} rho_np={p['rho']} "
                     f"alpha^2={p['alpha2']} tau^2={p['tau2']} gamma^2={p['gamma2']} "
                     "(lambda: eq. (17)/(18); _exact: the MSE's minimizer; "
                     "- = no client in the group)", rows, ["quantity", "value"])
    _emit(args, payload, render)


# ---------------------------------------------------------------------- fit

def _distinct_columns(args, options):
    """Refuse one column named by two options (e.g. ``--successes n --trials n``): each
    option means a different quantity, so the fit would be of nonsense."""
    seen = {}
    for option in options:
        names = getattr(args, option)
        for name in names if isinstance(names, list) else [names]:
            if name is None:
                continue
            if name in seen:
                first = seen[name]
                said = (f"--{option} names the column {name!r} twice" if first == option else
                        f"--{first} and --{option} name the same column {name!r}")
                raise ValueError(f"{said}: give each its own column")
            seen[name] = option


def _cmd_fit_beta_binomial(args):
    import pandas as pd

    from ebfl._tables import client_ids, numeric_column, read_table, where
    from ebfl.eb import beta_binomial_eb, npmle_binomial

    _distinct_columns(args, ("successes", "trials", "client", "value"))
    frame = read_table(args.path, max_mib=args.max_size)
    if args.client is not None:
        if args.value is None or len(args.value) != 1:
            raise ValueError("--client needs exactly one --value column of 0/1 outcomes")
        ids = client_ids(frame, args.client)
        values = numeric_column(frame, args.value[0], "--value", count_from=0)
        if not np.isin(values, (0, 1)).all():
            k = int(np.argmin(np.isin(values, (0, 1))))
            raise ValueError(f"--value: column {args.value[0]!r} must hold only 0 and 1; "
                             f"{where(k)} has {values[k]}")
        grouped = pd.Series(values, index=frame.index).groupby(ids, sort=True)
        clients, z, n = grouped.sum().index, grouped.sum().to_numpy(), grouped.size().to_numpy()
    elif args.successes and args.trials:
        clients = frame.index
        z = numeric_column(frame, args.successes, "--successes", count_from=0)
        n = numeric_column(frame, args.trials, "--trials", count_from=1)
        if (z > n).any():
            k = int(np.argmax(z > n))
            raise ValueError(f"--successes: column {args.successes!r} exceeds --trials column "
                             f"{args.trials!r} ({z[k]} > {n[k]}) at {where(k)}")
    else:
        raise ValueError("give --successes and --trials, or --client and --value")
    if args.method == "npmle":
        _two_clients(len(z), args)
        _finish_npmle(args, npmle_binomial(z, n), clients,
                      {"successes": np.asarray(z, np.int64), "trials": np.asarray(n, np.int64),
                       "local": np.asarray(z) / np.asarray(n)}, "beta-binomial")
        return
    res = beta_binomial_eb(z, n, method=args.method)
    lower, upper = res.posterior.interval(args.level)
    z, n = np.asarray(z, np.int64), np.asarray(n, np.int64)  # validated by the fit
    table = {"client": list(clients), "successes": z, "trials": n, "local": z / n,
             "estimate": res.posterior.mean, "sd": res.posterior.sd, "lower": lower,
             "upper": upper, "shrinkage": res.shrinkage}
    summary = {
        "model": "beta-binomial", "method": res.method, "n_clients": res.n_clients,
        "prior": None if res.prior is None else {"alpha": res.prior.alpha,
                                                 "beta": res.prior.beta,
                                                 "mean": res.prior.mean},
        "log_likelihood": res.log_likelihood, "n_clipped": res.n_clipped,
        # the MLE's state: an edge (e.g. no overdispersion) is a finding, not a failure
        **{k: res.diagnostics[k] for k in ("converged", "active_bounds") if k in res.diagnostics},
        "mean_shrinkage": float(np.mean(res.shrinkage)), "level": args.level,
    }
    _finish_fit(args, summary, table)


#: What a meta-analyst reads beside the fit: REML's restricted log-likelihood, DL's Q,
#: and whether the likelihood search converged (names as in ``gaussian_eb``).
_GAUSSIAN_DIAGNOSTICS = ("restricted_log_likelihood", "q_statistic", "converged", "at_zero")


def _cmd_fit_gaussian(args):
    from ebfl._tables import client_ids, numeric_column, read_table
    from ebfl.eb import gaussian_eb, gaussian_eb_samples, npmle_normal
    from ebfl.ragged import Ragged

    _distinct_columns(args, ("mean", "se", "client", "value"))
    frame = read_table(args.path, max_mib=args.max_size)
    if args.client is not None:
        if not args.value:
            raise ValueError("--client needs at least one --value column")
        if args.method == "npmle":
            raise ValueError("--method npmle needs --mean and --se (one row per client)")
        ids = client_ids(frame, args.client)
        values = np.column_stack([numeric_column(frame, v, "--value") for v in args.value])
        order = ids.reset_index(drop=True).sort_values(kind="stable").index.to_numpy()
        counts = ids.iloc[order].groupby(ids.iloc[order], sort=True).size()
        values = values[order]
        data = Ragged.from_counts(values if values.shape[1] > 1 else values[:, 0],
                                  counts.to_numpy())
        res = gaussian_eb_samples(data, sigma_x=args.sigma_x, method=args.method)
        clients = list(counts.index)
    elif args.mean and args.se:
        x = numeric_column(frame, args.mean, "--mean")
        s = numeric_column(frame, args.se, "--se", positive=True)
        if args.method == "npmle":
            _two_clients(x.size, args)
            _finish_npmle(args, npmle_normal(x, s), list(frame.index), {"local": x}, "gaussian")
            return
        res = gaussian_eb(x, s, method=args.method)
        clients = list(frame.index)
    else:
        raise ValueError("give --mean and --se, or --client and --value")
    lower, upper = res.posterior.interval(args.level)
    mean = res.posterior.mean
    if mean.ndim == 1:
        table = {"client": clients, "estimate": mean, "sd": res.posterior.sd, "lower": lower,
                 "upper": upper, "shrinkage": res.shrinkage, "se": res.s}
    else:
        table = {"client": clients, "sd": res.posterior.sd, "shrinkage": res.shrinkage,
                 "se": res.s}
        for k, name in enumerate(args.value):
            table.update({f"estimate_{name}": mean[:, k], f"lower_{name}": lower[:, k],
                          f"upper_{name}": upper[:, k]})
    summary = {"model": "gaussian", "method": res.method, "n_clients": res.n_clients,
               "prior": {"mean": res.prior.mean, "sd": res.prior.sd,
                         "tau2": res.prior.sd**2},
               "log_likelihood": res.log_likelihood,
               **{k: res.diagnostics[k] for k in _GAUSSIAN_DIAGNOSTICS if k in res.diagnostics},
               "sigma_x": res.diagnostics.get("sigma_x"),
               "mean_shrinkage": float(np.mean(res.shrinkage)), "level": args.level}
    _finish_fit(args, summary, table)


def _two_clients(m, args):
    """The parametric fits refuse one client themselves; one client's NPMLE is a point mass
    on its own estimate (no shrinkage at all), which is a mistake, not a fit."""
    if m < 2:
        raise ValueError(f"--method npmle needs at least 2 clients; {args.path} has {m}")


def _finish_npmle(args, fit, clients, columns, model):
    """Per-client posterior means and sds under the NPMLE prior (no normal intervals:
    the posterior is discrete)."""
    table = {"client": clients, **columns, "estimate": fit.posterior_mean,
             "sd": np.sqrt(fit.posterior_var)}
    atoms, weights = fit.support(threshold=0.01)
    summary = {"model": model, "method": "npmle", "n_clients": int(fit.posterior_mean.size),
               "prior": {"mean": fit.prior_mean, "sd": float(np.sqrt(fit.prior_var)),
                         "atoms_above_1pct": np.round(atoms, 4).tolist(),
                         "their_weights": np.round(weights, 4).tolist()},
               "log_likelihood": fit.log_likelihood, "kkt": fit.kkt,
               "log_likelihood_gap_bound": fit.diagnostics["log_likelihood_gap_bound"],
               "iterations": fit.n_iter, "converged": fit.converged}
    _finish_fit(args, summary, table)


def _finish_fit(args, summary, table):
    import pandas as pd

    out = pd.DataFrame(table)
    if args.output:
        try:
            out.to_csv(args.output, index=False)
        except OSError as exc:  # checked beforehand, but a disk can fill or refuse
            raise OSError(f"--output {args.output}: cannot write it "
                          f"({exc.strerror or exc})") from None
        summary["output"] = args.output

    def render(p):
        _print_table("Fit", [{"field": k, "value": v} for k, v in p.items()], ["field", "value"])
        print()
        print(out.head(10).to_string(index=False))
        if len(out) > 10:
            print(f"... {len(out) - 10} more clients" + ("" if args.output else
                                                         " (use --output FILE for all)"))
    _emit(args, summary, render)


# ---------------------------------------------------------- private-bernoulli

def _cmd_private_bernoulli(args):
    from ebfl.privacy.sweep import (
        DEFAULT_EPSILONS,
        plot_private_bernoulli,
        private_bernoulli_sweep,
    )

    sweep = private_bernoulli_sweep(args.epsilon or DEFAULT_EPSILONS, alpha=args.alpha,
                                    beta=args.beta,
                                    n_clients=args.clients, n=args.n, rng=args.seed)
    if args.plot:
        Path(args.plot).mkdir(parents=True, exist_ok=True)
        sweep["figure"] = str(plot_private_bernoulli(sweep, Path(args.plot) /
                                                     "private_bernoulli.png"))

    def render(p):
        print("non-private references:", {k: {kk: round(vv, 6) for kk, vv in v.items()}
                                          for k, v in p["reference"].items()})
        _print_table("private estimators (mean weight on the local mean, MSE)", p["rows"],
                     ["epsilon", "paper_weight", "paper_mse", "corrected_weight",
                      "corrected_mse"])
        if "figure" in p:
            print("figure:", p["figure"])
    _emit(args, sweep, render)


# --------------------------------------------------------------- accounting

def _cmd_accounting_dp_adaped(args):
    from ebfl.privacy.accounting import (
        DEFAULT_ORDERS,
        dp_adaped_epsilon,
        rdp_to_epsilon,
        theorem7_rdp,
    )

    mech = {"n_clients": args.m, "n_sampled": args.k, "n_iterations": args.iterations,
            "sync_gap": args.sync_gap, "clip_mu": args.clip, "noise_mu": args.noise,
            "clip_psi": args.clip_psi, "noise_psi": args.noise_psi}
    orders = np.asarray(DEFAULT_ORDERS)
    rdp = theorem7_rdp(orders, **mech)
    correct = dp_adaped_epsilon(args.delta, sampling=args.sampling, accountant=args.accountant,
                                trust=args.trust, **mech)
    payload = {
        "setting": {k: v for k, v in mech.items() if v is not None},
        "delta": args.delta,
        "theorem7_epsilon_lemma2": rdp_to_epsilon(orders, rdp, args.delta),
        "theorem7_epsilon_classic": rdp_to_epsilon(orders, rdp, args.delta, method="classic"),
        "epsilon": correct.epsilon,
        "accountant": correct.accountant, "sampling": args.sampling, "trust": args.trust,
        "neighboring_relation": correct.neighboring_relation, "n_rounds": correct.n_rounds,
    }
    payload["ratio_to_theorem7"] = payload["epsilon"] / payload["theorem7_epsilon_lemma2"]

    def render(p):
        rows = [{"quantity": k, "value": p[k]} for k in
                ("theorem7_epsilon_lemma2", "theorem7_epsilon_classic", "epsilon",
                 "ratio_to_theorem7", "n_rounds", "neighboring_relation")]
        _print_table(f"DP-AdaPeD user-level privacy at delta={p['delta']} ({p['accountant']}, "
                     f"{p['sampling']} sampling, trust={p['trust']})", rows,
                     ["quantity", "value"])
    _emit(args, payload, render)


def _cmd_accounting_fedhdp(args):
    from ebfl.privacy.dp_fedavg import NOISE_MULTIPLIER_RANGE, dp_fedavg_epsilon
    from ebfl.privacy.guarantee import VALID_FOR, dp_fedavg_guarantee

    lo, hi = NOISE_MULTIPLIER_RANGE  # the library's own refusals would name its arguments
    if args.sampling_rate > 1 or not lo <= args.noise <= hi:
        raise ValueError(f"--sampling-rate must lie in (0, 1] and --noise in [{lo:g}, {hi:g}], "
                         f"got {args.sampling_rate:g} and {args.noise:g}")
    setting = {"sampling_rate": args.sampling_rate, "noise_multiplier": args.noise,
               "rounds": args.rounds, "delta": args.delta}
    kinds = ["rdp", "pld"] if args.accountant == "both" else [args.accountant]
    results = {kind: dp_fedavg_epsilon(accountant=kind, **setting) for kind in kinds}
    # the epsilon of the accountant's model: a proof only for runs inside it
    payload = {"setting": setting, "valid_for": VALID_FOR,
               **dp_fedavg_guarantee(sampling="poisson", denominator="expected")}
    if "rdp" in results:
        payload["rdp"] = {"epsilon": results["rdp"].epsilon, "order": results["rdp"].order,
                          "conversion": results["rdp"].conversion}
    if "pld" in results:
        payload["pld"] = {"epsilon": results["pld"].epsilon, "value_discretization_interval":
                          results["pld"].value_discretization_interval}

    def render(p):
        rows = [{"accountant": kind, "epsilon": p[kind]["epsilon"],
                 "order": p[kind].get("order")} for kind in ("rdp", "pld") if kind in p]
        s = p["setting"]
        _print_table(f"DP-FedAvg / FedHDP group, client level: q={s['sampling_rate']:g}, "
                     f"z={s['noise_multiplier']:g}, T={s['rounds']}, delta={s['delta']:g}",
                     rows, ["accountant", "epsilon", "order"])
        print(f"model: {p['accountant_model']}\n{p['valid_for']}")
    _emit(args, payload, render)


def _cmd_accounting_dp_pfl(args):
    from ebfl.dppfl.accounting import dppfl_privacy_report

    if args.q > 1:
        raise ValueError(f"--q must lie in (0, 1] (q = n_iter/n_t), got {args.q:g}")
    if args.drop >= 1:
        raise ValueError("--drop must lie in [0, 1): at 1 no device ever takes part")
    try:
        payload = dppfl_privacy_report(args.epsilon, args.delta, inner=args.inner,
                                       outer=args.outer, drop_probability=args.drop,
                                       sampling_rate=args.q, ratio=args.ratio)
    except ValueError as exc:  # the report names its arguments: name the options instead
        options = {"epsilon": "--epsilon", "delta": "--delta", "inner": "--inner",
                   "outer": "--outer", "drop_probability": "--drop", "sampling_rate": "--q",
                   "ratio": "--ratio"}
        raise ValueError(re.sub(rf"\b({'|'.join(options)})(?=( must|=| \* ))",
                                lambda m: options[m[1]], str(exc))) from exc

    def render(p):
        s, cal, got, cor4 = p["setting"], p["calibration"], p["delivered"], p["corollary4"]
        rows = [{"quantity": k, "value": v} for k, v in (
            ("releases (K H)", s["releases"]), ("active probability p", s["active_probability"]),
            ("epsilon per iteration", cal["epsilon_iteration"]),
            ("epsilon1", cal["epsilon1"]), ("epsilon2", cal["epsilon2"]),
            ("sigma1", cal["sigma1"]), ("sigma2", cal["sigma2"]),
            ("delivered epsilon, RDP", got["rdp"]), ("delivered epsilon, PLD", got["pld"]),
            ("Corollary 4 epsilon", cor4["epsilon"]),
            ("Corollary 4, every order", cor4["epsilon_unrestricted"]),
            ("proof's form, every order", cor4["epsilon_proof_form_unrestricted"]),
            ("corrected sigma1 (RDP meets the target)", p["corrected"]["sigma1"]),
            ("corrected sigma2", p["corrected"]["sigma2"]))]
        _print_table(f"DP-PFL Theorem 5 noise for (epsilon={s['epsilon']:g}, "
                     f"delta={s['delta']:g}), K={s['inner']}, H={s['outer']}, "
                     f"drop={s['drop_probability']:g}, q={s['sampling_rate']:g}, "
                     f"r={s['ratio']:g}; a device active in every iteration", rows,
                     ["quantity", "value"])
        print("violated conditions:", "; ".join(cal["violated"]) or "none")
        print("Corollary 4 conditions failing:", "; ".join(cor4["failed"]) or "none")
    _emit(args, payload, render)


# --------------------------------------------------------------------- demo

def _cmd_demo(args):
    from ebfl.demo import format_demo, run_demo

    payload = run_demo(n_clients=args.clients, rng=args.seed)
    _emit(args, payload, lambda p: print(format_demo(p)))


# ----------------------------------------------------------------- validate

def _cmd_validate(args):
    from ebfl.validation import validate
    from ebfl.validation.sweeps import plot_sweeps

    report = validate(args.names or None, reps=args.reps, quick=args.quick, rng=args.seed,
                      progress=not args.json)
    payload = {"quick": args.quick, "seed": args.seed, "counts": report.counts(),
               "results": report.to_dicts()}
    if args.plot:
        payload["figures"] = plot_sweeps(args.plot, reps=args.reps, quick=args.quick,
                                         rng=args.seed, progress=not args.json)

    def render(p):
        rows = [{"check": r["name"], "row": r["label"], "kind": r["kind"],
                 "formula": r["formula"], "monte carlo": r["estimate"], "se": r["se"],
                 "verdict": r["verdict"] + (" *" if r["flag"] else "")}
                for r in p["results"]]
        _print_table("Monte Carlo checks (* = a statement of the paper flagged as wrong or "
                     "approximate)", rows,
                     ["check", "row", "kind", "formula", "monte carlo", "se", "verdict"])
        print("\n" + ", ".join(f"{k}: {v}" for k, v in p["counts"].items()))
        flags = dict.fromkeys((r["name"], r["flag"]) for r in p["results"] if r["flag"])
        for name, flag in flags:  # every distinct flag of a check, in order
            print(f"* {name}: {flag}")
        for path in p.get("figures", []):
            print("saved", path)
    _emit(args, payload, render)


def _cmd_reproduce_estimation(args):
    from ebfl.experiments.estimation import reproduce_estimation

    payload = reproduce_estimation(quick=args.quick, rng=args.seed, progress=not args.json,
                                   plot_dir=args.plot)

    def render(p):
        rows = []
        for r in p["E1"]:
            row = {"prior": r["prior"], "paper": f"{r['paper_decrease_pct']} ± {r['paper_pm']}"}
            for meth in ("loo_printed", "loo_corrected", "mle"):
                row[meth] = f"{r[meth]['mean']:.1f} ± {r[meth]['sd']:.1f}"
            row["(6) in paper band"] = r["within_paper_band"]
            rows.append(row)
        _print_table("E1: % MSE decrease vs local (mean ± sd over runs)", rows,
                     ["prior", "paper", "loo_printed", "loo_corrected", "mle",
                      "(6) in paper band"])
        e8 = p["E8"]
        rows = [{"eps0": r["epsilon"], "monte carlo": r["mse"]["mean"], "se": r["mse"]["se"],
                 "Theorem 2.2": r["formula"], "a": r["weight"], "true delta": r["true_delta"],
                 "paper's delta holds": r["paper_claim_holds"]} for r in e8["rows"]]
        _print_table(f"\nE8: MSE vs eps0 (local {e8['local']['formula']:.7g}, non-private "
                     f"{e8['non_private']['formula']:.7g})", rows,
                     ["eps0", "monte carlo", "se", "Theorem 2.2", "a", "true delta",
                      "paper's delta holds"])
        for path in p["figures"]:
            print("saved", path)
    _emit(args, payload, render)


def _cmd_reproduce_regression(args):
    from ebfl.experiments.regression import e3_regression, plot_e3

    kwargs = (dict(m=1000, runs=1, em_rounds=100, gd_rounds=200) if args.quick
              else dict(m=10_000, runs=3, em_rounds=300, gd_rounds=1000))
    payload = e3_regression(rng=args.seed, progress=not args.json, **kwargs)
    payload["quick"] = args.quick
    _save_figure(args, plot_e3, payload, "e3_regression.png")
    payload.pop("curves")

    def render(p):
        for row in p["rows"]:
            rows = [{"estimator": k, "mse": v["mean"], "sd": v["sd"]}
                    for k, v in row["mse"].items()]
            _print_table(f"\nE3, d = {row['d']} (m = {p['settings']['m']}, n = 10)", rows,
                         ["estimator", "mse", "sd"])
            g, paper = row["gains_pct"], row["paper"]
            print(f"gain vs local {g['vs_local']['mean']:.1f} % (paper {paper['vs_local'][0]} "
                  f"± {paper['vs_local'][1]}); vs FedAvg {g['vs_fedavg']['mean']:.1f} % "
                  f"(paper {paper['vs_fedavg'][0]} ± {paper['vs_fedavg'][1]}); unknown vs known "
                  f"+{row['unknown_vs_known_pct']:.1f} % (paper {paper['unknown_vs_known_pct']})")
            print("fitted variances:", row["fitted_variances"])
        for path in p.get("figures", []):
            print("saved", path)
    _emit(args, payload, render)


# ----------------------------------------------------------------- election

def _cmd_election(args):
    from ebfl.datasets import election_matrix, load_county_returns
    from ebfl.experiments.election import election_experiment, plot_election

    returns = load_county_returns(args.data, verify=not args.no_verify, progress=not args.json)
    matrix = election_matrix(returns)
    payload = election_experiment(matrix, epsilons=tuple(args.epsilon or (1.0, 5.0)),
                                  rng=args.seed)
    if args.plot:
        payload["figures"] = plot_election(matrix, payload, args.plot)

    def render(p):
        paper = p["paper"]
        print(f"{p['n_counties']} counties in all of {p['years']} (paper: "
              f"{paper['n_counties']}); paper's gain {paper['gain_pct']} ± {paper['pm']} %")
        rows = []
        for section in ("gains", "private"):
            for target, ests in p[section].items():
                for est, s in ests.items():
                    rows.append({"target": target, "estimator": est,
                                 "gain % (mean)": s["mean"], "sd over folds": s["sd"],
                                 "per fold": " ".join(f"{v:.1f}" for v in s["per_fold"])})
        vm = p["vote_models"]
        for est in ("beta-binomial on votes", "gaussian EB on shares"):
            rows.append({"target": "share (vs mean share)", "estimator": est,
                         "gain % (mean)": vm[est]["mean"], "sd over folds": vm[est]["sd"],
                         "per fold": " ".join(f"{v:.1f}" for v in vm[est]["per_fold"])})
        _print_table("\nMSE gain over the local estimator, six leave-one-election-out folds",
                     rows, ["target", "estimator", "gain % (mean)", "sd over folds",
                            "per fold"])
        print("\neq. (6) within the paper's band:", p["reproduces_paper"])
        for path in p.get("figures", []):
            print("saved", path)
    _emit(args, payload, render)


# ------------------------------------------------------------------- adaped

def _add_json(parser):
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def _neural_arguments(parser, *, plot):
    """Options shared by the neural experiments: dataset, seed, quick mode, figure, JSON."""
    parser.add_argument("--dataset", default="mnist",
                        choices=["mnist", "femnist", "fashion-mnist", "hapt"])
    parser.add_argument("--femnist-root", metavar="DIR",
                        help="LEAF FEMNIST directory with train/ and test/ (default: data home)")
    parser.add_argument("--seed", type=_integer(0), default=0)
    parser.add_argument("--quick", action="store_true", help="10 rounds, one evaluation")
    parser.add_argument("--plot", metavar="DIR", help=f"save {plot} there")
    _device_argument(parser)
    _add_json(parser)


def _device(text):
    """argparse type: a torch device, checked before any work (CUDA must be usable)."""
    try:
        from ebfl.learning.torch.functional import check_device
    except ImportError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    try:
        return str(check_device(text))
    except (TypeError, ValueError) as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _device_argument(parser):
    parser.add_argument("--device", type=_device, metavar="DEVICE",
                        help="where the models train: cpu (default), cuda or cuda:N; the same "
                             "random numbers on every device")


def _privacy_arguments(parser, *, noise_default, clip_help):
    parser.add_argument("--noise", type=_positive, action="append",
                        help=f"noise multiplier sigma/C (repeat; default {noise_default})")
    parser.add_argument("--clip", type=_positive, default=1.0, help=f"{clip_help} (default 1)")
    parser.add_argument("--delta", type=_open_unit, default=1e-5)


def _table1_protocol_arguments(parser):
    """Table 1's unstated protocol: classes per client and the learning-rate grid."""
    parser.add_argument("--classes-per-client", type=_integer(1), default=3, metavar="C",
                        help="classes of each client's images (mnist, fashion-mnist; default 3)")
    parser.add_argument("--lr-grid", type=_positive, nargs="*", metavar="LR",
                        help="choose each method's learning rate per seed on a validation "
                             "split of the training images (never the test set); bare: the "
                             "paper's grid 0.2 0.15 0.125 0.1 0.075 0.05")


def _lr_grid(args):
    """The grid of ``--lr-grid``: None without it, the paper's when given bare."""
    from ebfl.experiments.adaped import PAPER_LR_GRID

    if args.lr_grid is not None and not args.lr_grid:
        return PAPER_LR_GRID
    return args.lr_grid


def _cmd_reproduce_adaped(args):
    from ebfl.experiments.adaped import METHODS, plot_table1, table1

    payload = table1(args.dataset, methods=tuple(args.methods or METHODS),
                     seeds=tuple(range(args.seed, args.seed + args.seeds)), quick=args.quick,
                     femnist_root=args.femnist_root, progress=not args.json, device=args.device,
                     classes_per_client=args.classes_per_client,
                     samples_per_client=args.samples_per_client, lr_grid=_lr_grid(args))
    _save_figure(args, plot_table1, payload, f"table1_{args.dataset}.png")
    payload.pop("curves")

    def render(p):
        s = p["settings"]
        rows = [{"method": k, "accuracy %": v["mean"], "sd": v["sd"],
                 "paper": (f"{p['paper'][k][0]} ± {p['paper'][k][1]}" if k in p["paper"]
                           else "-"),
                 "lr": _rates(v.get("lr"), v.get("lr_at_edge")),
                 "seconds": sum(v["seconds"]) + sum(v.get("selection_seconds", []))}
                for k, v in p["results"].items()]
        _print_table(f"\nTable 1 on {s['dataset']}{' (stand-in)' if s['stand_in'] else ''}: "
                     f"{s['clients']} clients, K = {s['sampled_per_round']}, {s['rounds']} "
                     f"rounds of tau = {s['tau']}, seeds {s['seeds']}; {s['split']}", rows,
                     ["method", "accuracy %", "sd", "paper", "lr", "seconds"])
        if s["lr_grid"]:
            print(_EDGE_NOTE)
        for path in p.get("figures", []):
            print("saved", path)
    _emit(args, payload, render)


_EDGE_NOTE = ("lr: the rate chosen on validation per seed; *: the grid's smallest or "
              "largest, so a better rate may lie outside the grid")


def _rates(rates, at_edge):
    """The chosen learning rates of a Table 1 row; ``*``: the grid's smallest or largest."""
    if not rates:
        return "default"
    return " ".join(f"{v:g}" + "*" * edge for v, edge in zip(rates, at_edge, strict=True))


def _size(text):
    """argparse type: a number of training images per client (>= 2), or "all"."""
    return None if text == "all" else _integer(2)(text)


def _cmd_reproduce_adaped_protocol(args):
    from ebfl.experiments.adaped_protocol import (
        SEARCH_METHODS,
        plot_protocol_search,
        protocol_search,
    )

    payload = protocol_search(args.sizes, methods=tuple(args.methods or SEARCH_METHODS),
                              seeds=tuple(range(args.seed, args.seed + args.seeds)),
                              lr_grid=_lr_grid(args),
                              classes_per_client=args.classes_per_client,
                              dataset=args.dataset, quick=args.quick,
                              checkpoint_dir=args.checkpoint_dir, progress=not args.json,
                              device=args.device)
    _save_figure(args, plot_protocol_search, payload, f"table1_protocol_{args.dataset}.png")

    def render(p):
        s = p["settings"]
        rows = [{"images/client": r["samples_per_client"], "method": r["method"],
                 "accuracy %": r["mean"], "sd": r["sd"],
                 "paper": "-" if r["paper"] is None else r["paper"],
                 "lr": _rates(r["lr"], r["lr_at_edge"]),
                 "seconds": r["seconds"]} for r in p["rows"]]
        _print_table(f"\nTable 1 protocol search on {s['dataset']}: {s['classes_per_client']} "
                     f"classes per client, K = {s['sampled_per_round']}, {s['rounds']} rounds, "
                     f"seeds {s['seeds']}", rows,
                     ["images/client", "method", "accuracy %", "sd", "paper", "lr", "seconds"])
        if s["lr_grid"]:
            print(_EDGE_NOTE)
        if p["agreement"]:
            _print_table("\nAgreement with the paper (points of accuracy, ours minus the "
                         "paper's; Kendall's tau of the two orderings)",
                         p["agreement"],
                         ["samples_per_client", "methods", "rms_gap", "max_gap", "worst",
                          "kendall_tau"])
            print(f"closest to the paper: {p['best']} images per client")
            for name, c in p["closest"].items():
                print(f"  {name}: closest at {c['samples_per_client']} images per client, "
                      f"{c['gap']:+.2f} points from the paper")
        for path in p.get("figures", []):
            print("saved", path)
    _emit(args, payload, render)


#: Bounds of the torch reproductions' --seeds and --rounds (checked before any data load).
_MAX_SEEDS, _MAX_ROUNDS, _MAX_SEED = 10_000, 10**6, 2**63 - 1


def _check_seeds_and_rounds(args):
    """--seeds, --seed and --rounds, before ``range(seed, seed + seeds)`` is built and any
    data are loaded."""
    if args.seeds > _MAX_SEEDS:
        raise ValueError(f"--seeds must be an integer in [1, {_MAX_SEEDS}], got {args.seeds}")
    if args.seed + args.seeds - 1 > _MAX_SEED:
        raise ValueError(f"--seed must be <= {_MAX_SEED - args.seeds + 1} with --seeds "
                         f"{args.seeds} (the last seed must be <= 2^63 - 1), got {args.seed}")
    if args.rounds is not None and args.rounds > _MAX_ROUNDS:
        raise ValueError(f"--rounds must be an integer in [1, {_MAX_ROUNDS}], got {args.rounds}")
    if getattr(args, "cache_dir", None) is not None:  # --checkpoint-dir: _check_outputs
        _check_folder_to_create(args.cache_dir, "--cache-dir")


def _check_folder_to_create(path, option):
    """``path`` is a folder, or can be created (with its parents) under a writable folder."""
    folder = Path(path).expanduser()
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"{option} {path} exists and is not a folder")
    existing = next(p for p in (folder, *folder.absolute().parents) if p.exists())
    if not existing.is_dir():
        raise ValueError(f"{option} {path}: {existing} is a file, not a folder")
    if not os.access(existing, os.W_OK):
        raise ValueError(f"{option} {path} is not writable")


def _cmd_reproduce_fedhdp(args):
    from ebfl.experiments.fedhdp import plot_sweep, reproduce_fedhdp

    _check_seeds_and_rounds(args)
    table = "sweep" if args.sweep else "3"
    payload = reproduce_fedhdp(args.dataset, table=table, lam=args.lam, ratios=args.ratio,
                               seeds=tuple(range(args.seed, args.seed + args.seeds)),
                               quick=args.quick, rounds=args.rounds,
                               denominator=args.denominator, checkpoint_dir=args.checkpoint_dir,
                               progress=not args.json, device=args.device)
    if table == "sweep":
        _save_figure(args, plot_sweep, payload, f"fedhdp_sweep_{args.dataset}.png")
    payload = _nan_to_none(payload)

    def render(p):
        pr = p["protocol"]
        cols = ["algorithm", "r", "acc_g", "acc_g_p", "acc_g_np", "delta_g", "acc_l_p",
                "acc_l_np", "delta_l"]
        rows = []
        for r in p["rows"]:
            rows.append({c: _round(r[c], 2) for c in cols}
                        | {"": "ours", "epsilon": _round(r["epsilon"], 3)})
            if r["paper"]:
                rows.append({"algorithm": "", "r": "", "": "paper",
                             **{c: r["paper"].get(c) for c in cols[2:]}})
        _print_table(f"\nFedHDP on {p['dataset']}{' (quick)' if p['quick'] else ''}: "
                     f"{p['federation']['n_clients']} clients, {pr['rounds']} rounds, q = "
                     f"{pr['sampling_rate']}, z = {pr['noise_multiplier']}, lambda = "
                     f"{p['rows'][0]['lambda']}, seeds {p['seeds']} ({p['seconds']:.0f} s; "
                     "accuracy in %)", rows, ["", *cols, "epsilon"])
        print(f"epsilon: {p['privacy']['guarantee']}"
              + (f" ({p['privacy']['condition']})" if p["privacy"]["condition"] else ""))
        for path in p.get("figures", []):
            print("saved", path)
    _emit(args, payload, render)


def _round(value, digits):
    return round(value, digits) if isinstance(value, float) else value


def _nan_to_none(obj):
    """NaN -> None (null in JSON, "-" in tables), recursively."""
    if isinstance(obj, dict):
        return {k: _nan_to_none(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_nan_to_none(v) for v in obj]
    if isinstance(obj, float) and obj != obj:
        return None
    return obj


def _cmd_reproduce_perada(args):
    from ebfl.experiments.perada import (
        PARTS,
        _check_backbone_weights,
        plot_perada,
        reproduce_perada,
    )

    _check_seeds_and_rounds(args)
    if args.arch == "resnet18" and args.dataset != "cifar10":
        raise ValueError(f"--arch resnet18 runs on --dataset cifar10 (3-channel images), got "
                         f"--dataset {args.dataset}")
    # the weights file is read and checked here, so that its errors name the option
    _check_backbone_weights(args.arch, args.backbone_weights,
                            names={"arch": "--arch", "backbone_weights": "--backbone-weights",
                                   "cache_dir": "--cache-dir"})
    payload = reproduce_perada(dataset=args.dataset, quick=args.quick,
                               parts=args.part or PARTS,
                               seeds=tuple(range(args.seed, args.seed + args.seeds)),
                               rounds=args.rounds, checkpoint_dir=args.checkpoint_dir,
                               arch=args.arch, backbone_weights=args.backbone_weights,
                               cache_dir=args.cache_dir, progress=not args.json,
                               device=args.device)
    _save_figure(args, plot_perada, payload, f"perada_{args.dataset}.png")
    _emit(args, _nan_to_none(payload), _render_perada)


def _render_perada(p):
    scale = "quick pipeline check" if p["quick"] else "CPU scale"
    print(f"PerAda reproduction on {p['dataset']} ({scale}); the paper's columns are "
          "CIFAR-10 with ResNet-18, a different setting")
    print(p["federation_text"])
    paper1 = p.get("paper", {}).get("table1", {})
    if p.get("table1"):
        rows = []
        for r in p["table1"]:
            ref = paper1.get(r["algorithm"], {})
            rows.append({**{k: _round(v, 2) for k, v in r.items()},
                         "paper local": ref.get("local_test"),
                         "paper global": ref.get("global_test")})
        _print_table("\nTable 1 analogue: personalized models (accuracy %, mean and std across "
                     "clients)", rows,
                     ["algorithm", "personalization", "trained_parameters",
                      "communicated_parameters", "local_test", "local_test_std", "global_test",
                      "global_test_std", "ood", "paper local", "paper global"])
    paper2 = p.get("paper", {}).get("table2", {})
    if p.get("table2"):
        rows = [{**{k: _round(v, 3) for k, v in r.items()},
                 "paper global": paper2.get(r["algorithm"], {}).get("global_test"),
                 "paper CIFAR-10-C": paper2.get(r["algorithm"], {}).get("cifar10_c")}
                for r in p["table2"]]
        _print_table("\nTable 2 analogue: global models (accuracy %)", rows,
                     ["algorithm", "global_test", "ood", "phi_test", "phi_aux", "paper global",
                      "paper CIFAR-10-C"])
    for key, title, cols in (
            ("figure4", "Figure 4 analogue: distillation steps and data",
             ["kd_data", "kd_steps", "local_test", "global_test", "ood", "global_model",
              "phi_test", "phi_aux"]),
            ("figure7", "Figure 7 analogue: lambda",
             ["lam", "local_test", "global_test", "ood", "prediction_distance"]),
            ("table4", "Table 4 analogue: sample-level DP (delta = 1e-5), Local-test",
             ["algorithm", "epsilon_target", "noise_multiplier", "epsilon_mean", "epsilon_std",
              "local_test", "local_test_std"])):
        if p.get(key):
            _print_table(f"\n{title}", [{k: _round(v, 3) for k, v in r.items()} for r in p[key]],
                         cols)
    print(f"\n{p['seconds']:.0f} s")
    for path in p.get("figures", []):
        print("saved", path)


def _cmd_reproduce_dp_pfl(args):
    from ebfl.experiments.dppfl import plot_dppfl, reproduce_dppfl

    payload = reproduce_dppfl(quick=args.quick, reps=args.reps,
                              checkpoint_dir=args.checkpoint_dir, jobs=args.jobs,
                              progress=not args.json)
    _save_figure(args, plot_dppfl, payload, "dppfl_figures.png")
    _emit(args, _nan_to_none(payload), _render_dp_pfl)


def _render_dp_pfl(p):
    scale = "quick pipeline check" if p["quick"] else f"{p['protocol']['reps']} repetitions"
    d = p["data"]
    print(f"DP-PFL on {d['devices']} HAPT users ({d['features']} features), 'sitting' vs the "
          f"rest ({scale}); K={p['protocol']['inner']}, H={p['protocol']['outer']}, "
          f"epsilon={p['protocol']['epsilon']:g}, delta={p['protocol']['delta']:g}")
    labels = {"non_private": "non-private", "private": "private (Theorem 5)",
              "per_iteration": "epsilon per iteration"}
    f5_labels = {**labels, "corrected": "corrected"}
    for name, xkey in (("figure3", "tau"), ("figure4", "drop")):
        fig = p[name]
        rows = [{xkey: x, **{labels[k]: f"{fig[k]['mean'][i]:.4f} +- {fig[k]['sd'][i]:.4f}"
                             for k in labels}} for i, x in enumerate(fig[xkey])]
        _print_table(f"\n{name.replace('figure', 'Figure ')}: test error", rows,
                     [xkey, *labels.values()])
    f5 = p["figure5"]
    keys = ("private", "per_iteration", "corrected")
    rows = [{"epsilon": e, **{f5_labels[k]: f"{f5[k]['mean'][i]:.4f} +- {f5[k]['sd'][i]:.4f}"
                              for k in keys}} for i, e in enumerate(f5["epsilon"])]
    _print_table("\nFigure 5: test error against epsilon", rows,
                 ["epsilon", *(f5_labels[k] for k in keys)])
    rows = [{**r, "error": f"{r['error_mean']:.4f} +- {r['error_sd']:.4f}"}
            for r in p["baselines"]]
    _print_table("\nWhat learning Omega buys (tau=1, drop 0.2)", rows,
                 ["method", "private", "lam", "xi", "rho", "error"])
    for key, cal in p["calibration"].items():
        print(f"\nnoise ({f5_labels[key]}): sigma1 {cal['sigma1'][0]:.4g}-{cal['sigma1'][1]:.4g}, "
              f"delivered epsilon (RDP) {cal['delivered_epsilon_rdp'][0]:.4g}-"
              f"{cal['delivered_epsilon_rdp'][1]:.4g} for a target of {cal['target_epsilon']:g}"
              f"; violated: {', '.join(cal['violated']) or 'none'}")
    s, paper = p["summary"], p.get("paper")
    if paper:
        print(f"\nFigure 4 private minimum: ours {s['figure4_private']['min_error']:.4f} at "
              f"drop {s['figure4_private']['argmin_drop']:g} (epsilon per iteration: "
              f"{s['figure4_per_iteration']['min_error']:.4f} at "
              f"{s['figure4_per_iteration']['argmin_drop']:g}); paper "
              f"{paper['figure4_min_error']:g} at {paper['figure4_argmin_drop']:g}")
    print(f"\n{p['seconds']:.0f} s")
    for path in p.get("figures", []):
        print("saved", path)


def _cmd_reproduce_dp_adaped(args):
    from ebfl.experiments.adaped import dp_sweep, plot_dp_sweep

    payload = dp_sweep(args.dataset, noise_multipliers=tuple(args.noise or (0.5, 1.0, 2.0, 4.0)),
                       clip=args.clip, delta=args.delta, concatenate=args.concatenate,
                       fine_tune=args.fine_tune, seed=args.seed, quick=args.quick,
                       femnist_root=args.femnist_root, progress=not args.json,
                       device=args.device)
    _save_figure(args, plot_dp_sweep, payload, f"dp_adaped_{args.dataset}.png")

    def render(p):
        _print_table(f"\nDP-AdaPeD on {p['settings']['dataset']} (delta = "
                     f"{p['settings']['delta']:g}, clip {p['settings']['clip']:g})", p["runs"],
                     ["noise_multiplier", "accuracy", "epsilon_theorem7", "epsilon_accountant"])
        print("reference:", {k: round(v, 2) for k, v in p["reference"].items()})
        for path in p.get("figures", []):
            print("saved", path)
    _emit(args, payload, render)


def _cmd_reproduce_adaped_fedem(args):
    from ebfl.experiments.adaped import fedem_comparison, plot_fedem_comparison

    zs = () if args.non_private else tuple(args.noise or (1.0, 4.0, 16.0))
    payload = fedem_comparison(args.dataset, noise_multipliers=zs, clip=args.clip,
                               delta=args.delta, seeds=tuple(range(args.seed,
                                                                   args.seed + args.seeds)),
                               quick=args.quick, femnist_root=args.femnist_root,
                               progress=not args.json, device=args.device)
    if zs:
        _save_figure(args, plot_fedem_comparison, payload, f"adaped_fedem_{args.dataset}.png")

    def render(p):
        s = p["settings"]
        rows = [{"method": k, "accuracy %": v["mean"], "sd": v["sd"],
                 "paper": (f"{p['paper'][k][0]} ± {p['paper'][k][1]}" if k in p["paper"]
                           else "-")} for k, v in p["non_private"].items()]
        _print_table(f"\nAdaPeD vs FedEM on {s['dataset']}{' (stand-in)' if s['stand_in'] else ''}"
                     f": all {s['clients']} clients every round, {s['rounds']} rounds, seeds "
                     f"{s['seeds']}", rows, ["method", "accuracy %", "sd", "paper"])
        if p["runs"]:
            rows = [{"z": r["noise_multiplier"], "epsilon": r["epsilon_accountant"],
                     "Thm 7 epsilon": r["epsilon_theorem7"],
                     "DP-AdaPeD %": r["DP-AdaPeD"]["mean"], "DP-AdaPeD sd": r["DP-AdaPeD"]["sd"],
                     "DP-FedEM %": r["DP-FedEM"]["mean"], "DP-FedEM sd": r["DP-FedEM"]["sd"]}
                    for r in p["runs"]]
            _print_table(f"\nprivate (delta = {s['delta']:g}, clip {s['clip']:g}; epsilon by a "
                         "correct accountant, the same for both)", rows, list(rows[0]))
        for path in p.get("figures", []):
            print("saved", path)
    _emit(args, payload, render)


# --------------------------------------------------------------------- hapt

def _flower():
    try:
        from ebfl.federated import flower
    except ImportError as exc:
        raise ValueError(f"ebfl flower needs Flower: pip install 'ebfl[flower]' ({exc})") from None
    return flower


def _job_settings(args):
    return {"algorithm": args.algorithm, "dataset": args.dataset, "clients": args.clients,
            "rounds": args.rounds, "seed": args.seed, "clients-per-round": args.clients_per_round,
            "local-steps": args.local_steps, "batch-size": args.batch_size, "lr": args.lr,
            "eval-every": args.eval_every, "epsilon": args.epsilon, "clip": args.clip,
            "noise": args.noise, "opt-out": args.opt_out, "gamma2": args.gamma2,
            "ratio": args.ratio, "lambda": args.lam, "inner": args.inner}


def _cmd_flower_simulate(args):
    from ebfl.federated.faults import check_failures
    from ebfl.federated.jobs import build_job

    settings = _job_settings(args)
    job = build_job(settings)  # bad settings and failures fail here, before Ray starts
    failures = check_failures(args.failures, job.config,
                              everyone=job.algorithm.all_clients_train, name="--failures")
    flower = _flower()
    payload = flower.compare_runtimes(settings, failures=failures, compare=args.compare,
                                      verbose=args.verbose)
    _save_figure(args, flower.plot_comparison, payload,
                 f"flower_{payload['settings']['algorithm']}.png")

    def render(p):
        rows = []
        for i, h in enumerate(p["flower"]["history"]):
            row = {"round": h["round"], "replies": f"{h['replies']}/{h['clients']}",
                   "bytes down": h["bytes_down"], "bytes up": h["bytes_up"],
                   "flower": h.get("accuracy", h.get(next(iter(p["flower"]["final"]), ""), None))}
            if "in_process" in p:
                ih = p["in_process"]["history"][i]
                row["in process"] = ih.get("accuracy", ih.get(next(iter(p["flower"]["final"]),
                                                                  ""), None))
            rows.append(row)
        metric = "accuracy" if "accuracy" in p["flower"]["final"] else next(
            iter(p["flower"]["final"]), "metric")
        cols = ["round", "replies", "bytes down", "bytes up", "flower"]
        if "in_process" in p:
            cols.append("in process")
        _print_table(f"\n{p['settings']['algorithm']} on {p['settings']['dataset']}, "
                     f"{p['config']['n_clients']} clients, {p['config']['rounds']} rounds "
                     f"(mean {metric} per round)", rows, cols)
        print(f"Flower: {p['flower']['seconds']:.1f} s (the rounds; Ray's start-up apart)",
              end="")
        if "in_process" in p:
            print(f"; in process: {p['in_process']['seconds']:.2f} s; max |difference| of the "
                  f"final parameters: {p['max_abs_diff']:.3g}")
        else:
            print()
        for path in p.get("figures", []):
            print("saved", path)
    _emit(args, payload, render)


def _cmd_flower_app(args):
    from ebfl.federated.deploy import write_app

    settings = _job_settings(args)
    path = write_app(args.directory, settings, superlink=args.superlink,
                     overwrite=args.overwrite)
    payload = {"app": str(path), "settings": {k: v for k, v in settings.items()
                                              if v is not None}}

    def render(p):
        print(f"wrote the Flower App to {p['app']} (see its README.md for the steps)")
    _emit(args, payload, render)


def _cmd_hapt(args):
    from ebfl._validation import check_choice
    from ebfl.datasets import ACTIVITIES, hapt_windows, load_hapt_raw
    from ebfl.experiments.hapt import hapt_logistic, plot_hapt

    check_choice(args.positive, "--positive", set(ACTIVITIES.values()))  # before the slow load
    windows = hapt_windows(load_hapt_raw(args.data, download=args.download,
                                         progress=not args.json))
    payload = hapt_logistic(positive=args.positive, quick=args.quick, windows=windows,
                            progress=not args.json)
    _save_figure(args, plot_hapt, payload, "hapt_logistic.png")
    payload.pop("curves")

    def render(p):
        s = p["settings"]
        rows = [{"estimator": k, "test accuracy": v["accuracy"], "se": v["se"],
                 "balanced accuracy": v["balanced_accuracy"],
                 "sigma_theta2": v.get("sigma_theta2")} for k, v in p["results"].items()]
        _print_table(f"\n{s['task']}: {s['clients']} subjects as clients, d = {s['d']}, "
                     f"{s['train_windows'][0]}-{s['train_windows'][1]} training windows each",
                     rows, ["estimator", "test accuracy", "se", "balanced accuracy",
                            "sigma_theta2"])
        for path in p.get("figures", []):
            print("saved", path)
    _emit(args, payload, render)


# ------------------------------------------------------------------- parser

class _Parser(argparse.ArgumentParser):
    """argparse, with a usage error as one ``error: ...`` line and exit status 2, like
    every other user mistake (argparse would print the usage block first)."""

    def error(self, message):
        self.exit(2, f"error: {message} (see `{self.prog} --help`)\n")


def _shown(text):
    """An option's text as quoted in an error, cut short (``int`` accepts 4,300 digits)."""
    return repr(text if len(text) <= 40 else text[:37] + "...")


def _integer(minimum, maximum=None):
    """argparse type: an integer >= ``minimum`` (and <= ``maximum`` when given)."""
    rule = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"

    def integer(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"must be an integer {rule}, got {_shown(text)}") from None
        if value < minimum or (maximum is not None and value > maximum):
            raise argparse.ArgumentTypeError(f"must be an integer {rule}, got {value}")
        return value
    return integer


def _real(text):
    """argparse type: a finite number (``1e400`` overflows to inf and is refused)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {_shown(text)}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {_shown(text)}")
    return value


def _positive(text):
    """argparse type: a finite number > 0."""
    value = _real(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {value:g}")
    return value


def _nonnegative(text):
    """argparse type: a finite number >= 0."""
    value = _real(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {value:g}")
    return value


def _unit(text):
    """argparse type: a number in the closed interval [0, 1] (a ratio, a fraction)."""
    value = _real(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"must lie in [0, 1], got {value:g}")
    return value


def _open_unit(text):
    """argparse type: a number in the open interval (0, 1) (a level, a delta)."""
    value = _real(text)
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"must lie in (0, 1), got {value:g}")
    return value


def _job_arguments(p):
    """Options of a federated job (``ebfl flower``)."""
    from ebfl.federated.jobs import ALGORITHMS, DATASETS

    p.add_argument("algorithm", choices=ALGORITHMS, help="the algorithm or EB protocol")
    p.add_argument("--dataset", choices=DATASETS,
                   help="digits (learning; bundled with scikit-learn), simulated or "
                        "elections (eb-*)")
    p.add_argument("--clients", type=_integer(1),
                   help="clients (default 6; elections: every county, or the first N)")
    p.add_argument("--rounds", type=_integer(1), default=3, help="rounds (default 3)")
    p.add_argument("--clients-per-round", type=_integer(1), help="K (default: all)")
    p.add_argument("--local-steps", type=_integer(1), default=5, help="tau (default 5)")
    p.add_argument("--batch-size", type=_integer(1), default=10, help="default 10")
    p.add_argument("--eval-every", type=_integer(1), default=1, help="default 1")
    p.add_argument("--lr", type=_positive, default=0.1, help="learning rate (default 0.1)")
    p.add_argument("--epsilon", type=_positive,
                   help="local privacy of the eb-* protocols; dp-pfl: each device's (epsilon, "
                        "1e-3) (default: no privacy)")
    p.add_argument("--inner", type=_integer(1),
                   help="dp-pfl: K, global iterations (rounds) per Omega-step (default 10)")
    p.add_argument("--seed", type=_integer(0), default=0)
    p.add_argument("--clip", type=_positive,
                   help="clip norm (dp-adaped, dp-fedem; fedhdp: the initial S, default 1)")
    p.add_argument("--noise", type=_nonnegative,
                   help="noise std (dp-adaped, dp-fedem; default 0.1); fedhdp: the private "
                        "group's noise multiplier")
    p.add_argument("--opt-out", type=_unit,
                   help="fedhdp, fedhdp-point: fraction of non-private clients (default 0.5)")
    p.add_argument("--gamma2", type=_nonnegative,
                   help="fedhdp-point: privacy-noise variance of the private average "
                        "(default 1)")
    p.add_argument("--ratio", type=_unit,
                   help="fedhdp, fedhdp-point: the private clients' weight ratio r; dp-pfl: "
                        "the budget split epsilon2/epsilon1")
    p.add_argument("--lam", type=_nonnegative,
                   help="fedhdp, fedhdp-point, dp-pfl: lambda")


def build_parser():
    """The argparse parser of ``ebfl``."""
    from ebfl import __version__

    parser = _Parser(prog="ebfl", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"ebfl {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    bounds = sub.add_parser("bounds", help="closed-form MSEs and bounds").add_subparsers(
        dest="model", required=True)
    g = bounds.add_parser("gaussian", help="Theorem 1 and the local/global/oracle MSEs")
    g.add_argument("--m", type=_integer(2), required=True, help="number of clients")
    g.add_argument("--n", type=_integer(1), required=True, help="samples per client")
    g.add_argument("--sigma-theta", type=_real, required=True)
    g.add_argument("--sigma-x", type=_positive, required=True)
    g.add_argument("--d", type=_integer(1), default=1, help="dimension (default 1)")
    g.add_argument("--k-bits", type=_integer(1), help="Theorem 2: k-bit stochastic quantizer")
    g.add_argument("--epsilon", type=_positive, help="Theorem 2: Gaussian LDP mechanism epsilon")
    g.add_argument("--delta", type=_open_unit, help="Theorem 2: Gaussian LDP mechanism delta")
    g.add_argument("--r", type=_positive, help="Theorem 2: |mu| <= r per coordinate (sets b)")
    _add_json(g)
    g.set_defaults(func=_cmd_bounds_gaussian)
    b = bounds.add_parser("beta", help="known Beta prior: posterior and local MSE")
    b.add_argument("--alpha", type=_real, required=True)
    b.add_argument("--beta", type=_real, required=True)
    b.add_argument("--n", type=_integer(1), required=True, help="trials per client")
    _add_json(b)
    b.set_defaults(func=_cmd_bounds_beta)
    fh = bounds.add_parser("fedhdp", help="FedHDP point estimation: optimal r, lambdas and MSEs "
                           "(Lemma 1, Lemma 2, Theorem 3)")
    fh.add_argument("--n-clients", type=_integer(2), required=True, help="N, number of clients")
    fh.add_argument("--rho", type=_real, required=True,
                    help="fraction of clients that opt out of privacy (rho * N whole)")
    fh.add_argument("--alpha2", type=_positive, required=True,
                    help="alpha^2, variance of a client's local estimate")
    fh.add_argument("--tau2", type=_real, required=True, help="tau^2 >= 0, heterogeneity")
    fh.add_argument("--gamma2", type=_real, required=True,
                    help="gamma^2 >= 0, privacy-noise variance of the private clients' mean")
    _add_json(fh)
    fh.set_defaults(func=_cmd_bounds_fedhdp)

    fit = sub.add_parser("fit", help="empirical Bayes on your own CSV").add_subparsers(
        dest="model", required=True)
    fb = fit.add_parser("beta-binomial", help="success counts per client (Beta prior)")
    fb.add_argument("path", help="CSV file")
    fb.add_argument("--successes", help="column of successes (one row per client)")
    fb.add_argument("--trials", help="column of trials (one row per client)")
    fb.add_argument("--method", default="mle",
                    choices=["mle", "moments", "loo_printed", "loo_proof", "loo_corrected",
                             "npmle"],
                    help="prior fit; npmle = nonparametric prior on a grid")
    fg = fit.add_parser("gaussian", help="client means (Gaussian prior)")
    fg.add_argument("path", help="CSV file")
    fg.add_argument("--mean", help="column of client means (one row per client)")
    fg.add_argument("--se", help="column of their standard errors")
    fg.add_argument("--sigma-x", type=_positive,
                    help="known noise sd (raw samples; else pooled)")
    fg.add_argument("--method", default="mle", choices=["mle", "reml", "dl", "moments", "npmle"],
                    help="prior fit: maximum likelihood, restricted ML, DerSimonian-Laird, "
                         "moments; npmle = nonparametric prior on a grid (with --mean/--se)")
    for p in (fb, fg):
        p.add_argument("--client", help="client id column (one row per observation)")
        p.add_argument("--value", action="append",
                       help="observation column (with --client; repeat for d > 1)")
        p.add_argument("--level", type=_open_unit, default=0.95, help="credible level")
        p.add_argument("--output", help="write per-client estimates to this CSV")
        p.add_argument("--max-size", type=_positive, default=DEFAULT_MAX_MIB, metavar="MIB",
                       help="the most a compressed CSV may expand to when read "
                            f"(default: {DEFAULT_MAX_MIB} MiB)")
        _add_json(p)
    fb.set_defaults(func=_cmd_fit_beta_binomial)
    fg.set_defaults(func=_cmd_fit_gaussian)

    pb = sub.add_parser("private-bernoulli",
                        help="paper's vs corrected private Bernoulli EB across epsilon")
    pb.add_argument("--alpha", type=_real, default=2.0)
    pb.add_argument("--beta", type=_real, default=2.0)
    pb.add_argument("--clients", type=_integer(1), default=10_000)
    pb.add_argument("--n", type=_integer(1), default=14)
    pb.add_argument("--epsilon", type=_positive, action="append",
                    help="repeat; default: a grid")
    pb.add_argument("--seed", type=_integer(0), default=0)
    pb.add_argument("--plot", metavar="DIR", help="save private_bernoulli.png there")
    _add_json(pb)
    pb.set_defaults(func=_cmd_private_bernoulli)

    acc = sub.add_parser("accounting", help="privacy accounting").add_subparsers(
        dest="algorithm", required=True)
    ad = acc.add_parser("dp-adaped", help="Theorem 7 epsilon beside a correct accountant")
    ad.add_argument("--m", type=_integer(1), required=True, help="number of clients")
    ad.add_argument("--k", type=_integer(1), required=True, help="clients sampled per round")
    ad.add_argument("--iterations", type=_integer(1), required=True,
                    help="T local iterations in all")
    ad.add_argument("--sync-gap", type=_integer(1), required=True,
                    help="tau, iterations per round")
    ad.add_argument("--clip", type=_positive, required=True,
                    help="C1, clip norm of the mu update")
    ad.add_argument("--noise", type=_positive, required=True, help="sigma_q1, noise sd on mu")
    ad.add_argument("--clip-psi", type=_positive,
                    help="C2 (omit for the concatenated variant)")
    ad.add_argument("--noise-psi", type=_positive, help="sigma_q2")
    ad.add_argument("--delta", type=_open_unit, default=1e-5)
    ad.add_argument("--sampling", default="without_replacement",
                    choices=["without_replacement", "poisson"])
    ad.add_argument("--accountant", default="rdp", choices=["rdp", "pld"])
    ad.add_argument("--trust", default="aggregator", choices=["aggregator", "local"])
    _add_json(ad)
    ad.set_defaults(func=_cmd_accounting_dp_adaped)
    af = acc.add_parser("fedhdp", help="DP-FedAvg / FedHDP privacy group: epsilon by RDP and PLD")
    af.add_argument("--sampling-rate", type=_positive, required=True,
                    help="q in (0, 1], the probability that a client takes part in a round")
    af.add_argument("--noise", type=_positive, required=True,
                    help="z, the noise multiplier (noise sd over the clip norm)")
    af.add_argument("--rounds", type=_integer(1), required=True, help="T rounds")
    af.add_argument("--delta", type=_open_unit, required=True)
    af.add_argument("--accountant", default="both", choices=["rdp", "pld", "both"],
                    help="RDP (TensorFlow Privacy's orders, improved conversion), PLD, or "
                         "both (default)")
    _add_json(af)
    af.set_defaults(func=_cmd_accounting_fedhdp)
    dp = acc.add_parser("dp-pfl", help="DP-PFL: Theorem 5's noise and the epsilon it delivers "
                        "(RDP, PLD, Corollary 4)")
    dp.add_argument("--epsilon", type=_positive, default=8.0,
                    help="end-to-end target epsilon of a device (default 8)")
    dp.add_argument("--delta", type=_open_unit, default=1e-3, help="default 1e-3")
    dp.add_argument("--inner", type=_integer(1), default=2000,
                    help="K, global iterations per Omega-step (default 2000)")
    dp.add_argument("--outer", type=_integer(1), default=10,
                    help="H, Omega-steps (default 10); every one of the K H iterations "
                         "is a release")
    dp.add_argument("--drop", type=_unit, default=0.2,
                    help="drop probability in [0, 1) (default 0.2, Figure 4's optimum)")
    dp.add_argument("--q", type=_positive, default=0.5,
                    help="sampling rate q = n_iter/n_t in (0, 1] (default 0.5: tau = 1, "
                         "the device with the fewest samples)")
    dp.add_argument("--ratio", type=_positive, default=1.0,
                    help="r = epsilon2/epsilon1 > 0, the budget split (default 1)")
    _add_json(dp)
    dp.set_defaults(func=_cmd_accounting_dp_pfl)

    from ebfl.validation.checks import CHECKS

    val = sub.add_parser("validate", help="Monte Carlo checks of the paper's theorems")
    val.add_argument("names", nargs="*", metavar="NAME",
                     help=f"checks to run (default all): {', '.join(CHECKS)}")
    val.add_argument("--reps", type=_integer(2),
                     help="replicates per check (default: per check)")
    val.add_argument("--quick", action="store_true", help="fewer replicates")
    val.add_argument("--seed", type=_integer(0), default=0)
    val.add_argument("--plot", metavar="DIR", help="save sweep figures (MC vs formula) there")
    _add_json(val)
    val.set_defaults(func=_cmd_validate)

    rep = sub.add_parser("reproduce", help="the papers' experiments").add_subparsers(
        dest="experiment", required=True)
    est = rep.add_parser("estimation", help="E1 (Bernoulli) and E8 (private Gaussian)")
    est.add_argument("--quick", action="store_true", help="fewer runs (same m)")
    est.add_argument("--seed", type=_integer(0), default=0)
    est.add_argument("--plot", metavar="DIR", help="save the E8 figure there")
    _add_json(est)
    est.set_defaults(func=_cmd_reproduce_estimation)

    el = sub.add_parser("election", help="county elections: personalized vs local (E2)")
    el.add_argument("--data", metavar="PATH",
                    help="local countypres_2000-2020.csv[.gz|.xz] (default: the data home)")
    el.add_argument("--no-verify", action="store_true", help="skip the sha256 check of --data")
    el.add_argument("--epsilon", type=_positive, action="append",
                    help="LDP level of the private variants (repeat; default 1 and 5)")
    el.add_argument("--seed", type=_integer(0), default=0)
    el.add_argument("--plot", metavar="DIR", help="save the shrinkage and per-fold figures")
    _add_json(el)
    el.set_defaults(func=_cmd_election)

    reg = rep.add_parser("regression", help="E3: personalized linear regression")
    reg.add_argument("--quick", action="store_true", help="m = 1000, one run, fewer rounds")
    reg.add_argument("--seed", type=_integer(0), default=0)
    reg.add_argument("--plot", metavar="DIR", help="save the E3 figure there")
    _add_json(reg)
    reg.set_defaults(func=_cmd_reproduce_regression)

    ada = rep.add_parser("adaped", help="Table 1: AdaPeD vs personalized-FL baselines (torch)")
    _neural_arguments(ada, plot="the accuracy-per-round figure")
    ada.add_argument("--methods", nargs="+", metavar="NAME", help="subset of the methods")
    ada.add_argument("--seeds", type=_integer(1), default=1,
                     help="runs (seeds seed, seed+1, ...)")
    ada.add_argument("--samples-per-client", type=_integer(2, 70_000), metavar="N",
                     help="training images kept per client, drawn from its classes (mnist, "
                          "fashion-mnist; default: all, about 1,100)")
    _table1_protocol_arguments(ada)
    ada.set_defaults(func=_cmd_reproduce_adaped)

    aps = rep.add_parser("adaped-protocol",
                         help="Table 1 over training images per client (and tuned rates), "
                              "and how close each comes to the paper")
    aps.add_argument("--dataset", default="mnist", choices=["mnist", "fashion-mnist"])
    aps.add_argument("--sizes", type=_size, nargs="+", default=[50, 100, 200, 500, None],
                     metavar="N", help="training images per client, or all (default: 50 100 "
                                       "200 500 all)")
    aps.add_argument("--methods", nargs="+", metavar="NAME",
                     help="default: AdaPeD FedAvg FedAvg+FT pFedMe QuPeD-FP Local")
    aps.add_argument("--seed", type=_integer(0), default=0)
    aps.add_argument("--seeds", type=_integer(1), default=1, help="runs per size")
    _table1_protocol_arguments(aps)
    aps.add_argument("--quick", action="store_true", help="10 rounds per run")
    aps.add_argument("--checkpoint-dir", metavar="DIR",
                     help="keep each finished (size, seed) there and resume from it")
    aps.add_argument("--plot", metavar="DIR", help="save the accuracy-per-size figure there")
    _device_argument(aps)
    _add_json(aps)
    aps.set_defaults(func=_cmd_reproduce_adaped_protocol)

    fh = rep.add_parser("fedhdp", help="FedHDP Table 3 and the r-sweeps of Tables 8-9 (torch)")
    fh.add_argument("--dataset", default="mnist",
                    choices=["mnist", "mnist-skewed", "fashion-mnist", "synthetic",
                             "synthetic-skewed"],
                    help="non-IID MNIST (2,000 one-digit clients) or its skewed variant; "
                         "fashion-mnist: a stand-in for the paper's FMNIST (TFF's EMNIST "
                         "digits) with its Table 7 settings; synthetic*: the same structure "
                         "on random images, no download")
    fh.add_argument("--sweep", action="store_true",
                    help="Tables 8-9: the baselines and FedHDP at every r (default: Table 3)")
    fh.add_argument("--ratio", type=_unit, action="append", metavar="R",
                    help="r of the sweep (repeat; default: the paper's grid)")
    fh.add_argument("--lam", type=_nonnegative, default=0.005,
                    help="lambda_p = lambda_np (default 0.005)")
    fh.add_argument("--rounds", type=_integer(1), help="override the paper's 500 rounds")
    fh.add_argument("--denominator", choices=["realized", "expected"], default="realized",
                    help="realized: Algorithm 2 as printed; expected: the variant the "
                         "accountant's epsilon is a proof for")
    fh.add_argument("--seed", type=_integer(0), default=0)
    fh.add_argument("--seeds", type=_integer(1), default=1,
                    help="runs (seeds seed, seed+1, ...)")
    fh.add_argument("--checkpoint-dir", metavar="DIR",
                    help="one checkpoint per run there: an interrupted run resumes")
    fh.add_argument("--quick", action="store_true",
                    help="200 clients, 12 rounds of 2 local epochs, q = 0.1 (seconds)")
    fh.add_argument("--plot", metavar="DIR", help="save the accuracy-vs-r figure (--sweep)")
    _device_argument(fh)
    _add_json(fh)
    fh.set_defaults(func=_cmd_reproduce_fedhdp)

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
                         "--backbone-weights)")
    pa.add_argument("--backbone-weights", metavar="FILE",
                    help="torchvision-format ResNet-18 ImageNet state_dict (.pth) for --arch "
                         "resnet18")
    pa.add_argument("--cache-dir", metavar="DIR",
                    help="where the pretrained backbone is cached (default: DATA_HOME/pretrained)")
    pa.add_argument("--rounds", type=_integer(1), help="override the protocol's rounds")
    pa.add_argument("--seed", type=_integer(0), default=0)
    pa.add_argument("--seeds", type=_integer(1), default=1,
                    help="runs (seeds seed, seed+1, ...)")
    pa.add_argument("--checkpoint-dir", metavar="DIR",
                    help="one result file per finished run there: an interrupted run resumes")
    pa.add_argument("--quick", action="store_true",
                    help="6 clients, 3 rounds, 7 methods (seconds: a pipeline check)")
    pa.add_argument("--plot", metavar="DIR", help="save the figures there")
    _device_argument(pa)
    _add_json(pa)
    pa.set_defaults(func=_cmd_reproduce_perada)

    dpf = rep.add_parser("dp-pfl", help="DP-PFL Figures 2-5 on 30 smartphone users, with "
                                        "fixed-Omega baselines")
    dpf.add_argument("--reps", type=_integer(1),
                     help="repetitions: random splits and seeds (default 10, the paper's)")
    dpf.add_argument("--jobs", type=_integer(1), default=2,
                     help="fits run side by side on this many threads (default 2)")
    dpf.add_argument("--checkpoint-dir", metavar="DIR",
                     help="one result file per fit there: an interrupted run resumes")
    dpf.add_argument("--quick", action="store_true",
                     help="2 repetitions, 40 x 2 iterations, a small grid (seconds: a "
                          "pipeline check)")
    dpf.add_argument("--plot", metavar="DIR", help="save Figures 2-5 there")
    _add_json(dpf)
    dpf.set_defaults(func=_cmd_reproduce_dp_pfl)

    dpa = rep.add_parser("dp-adaped", help="Figures 1-3: DP-AdaPeD accuracy against epsilon")
    _neural_arguments(dpa, plot="the accuracy-vs-epsilon figure")
    _privacy_arguments(dpa, noise_default="0.5 1 2 4", clip_help="C1 = C2")
    dpa.add_argument("--concatenate", action="store_true", help="one clip on [h; k] (E6/E7)")
    dpa.add_argument("--fine-tune", action="store_true", help="Algorithm 6 (E6)")
    dpa.set_defaults(func=_cmd_reproduce_dp_adaped)

    e7 = rep.add_parser("adaped-fedem",
                        help="Figure 3: AdaPeD vs FedEM, non-private and DP, full participation")
    _neural_arguments(e7, plot="the accuracy-vs-epsilon figure")
    _privacy_arguments(e7, noise_default="1 4 16", clip_help="C")
    e7.add_argument("--non-private", action="store_true",
                    help="only the non-private pair (the paper's 99.04 vs 98.90 on MNIST)")
    e7.add_argument("--seeds", type=_integer(1), default=1,
                    help="runs (seeds seed, seed+1, ...)")
    e7.set_defaults(func=_cmd_reproduce_adaped_fedem)

    hapt = sub.add_parser("hapt", help="personalized logistic regression, 30 smartphone users")
    hapt.add_argument("--positive", default="SITTING",
                      help="activity against the rest (default SITTING)")
    hapt.add_argument("--data", metavar="PATH",
                      help="local hapt_raw.npz or the official UCI zip (default: the data home)")
    hapt.add_argument("--download", action="store_true",
                      help="download the official UCI zip if the data home has neither file "
                           "(UCI publishes no checksum)")
    hapt.add_argument("--quick", action="store_true", help="fewer rounds")
    hapt.add_argument("--plot", metavar="DIR", help="save the accuracy figure there")
    _add_json(hapt)
    hapt.set_defaults(func=_cmd_hapt)

    fl = sub.add_parser("flower", help="federated runs on Flower (needs ebfl[flower])"
                        ).add_subparsers(dest="action", required=True)
    fs = fl.add_parser("simulate", help="a job on Flower's Simulation Engine, in this process")
    _job_arguments(fs)
    fs.add_argument("--compare", action="store_true",
                    help="also run in process; report max |difference| of the final parameters")
    fs.add_argument("--failures", default="", metavar="R:C,...",
                    help="clients that crash: round:client pairs, 0-based (e.g. 1:0,2:3)")
    fs.add_argument("--verbose", action="store_true", help="Flower's and Ray's logs")
    fs.add_argument("--plot", metavar="DIR", help="save the metric-per-round figure there")
    _add_json(fs)
    fs.set_defaults(func=_cmd_flower_simulate)
    fa = fl.add_parser("app", help="write a deployable Flower App for a job")
    fa.add_argument("directory", help="folder to write the app to (new or empty)")
    _job_arguments(fa)
    fa.add_argument("--superlink", default="127.0.0.1:9093",
                    help="the SuperLink's address, HOST:PORT (default 127.0.0.1:9093)")
    fa.add_argument("--overwrite", action="store_true", help="replace an existing app")
    _add_json(fa)
    fa.set_defaults(func=_cmd_flower_app)

    demo = sub.add_parser("demo", help="simulate the paper's settings, compare with theory")
    demo.add_argument("--clients", type=_integer(2), default=10_000)
    demo.add_argument("--seed", type=_integer(0), default=0)
    _add_json(demo)
    demo.set_defaults(func=_cmd_demo)
    return parser


# ------------------------------------------------------------- the boundary

#: What a user's mistake raises: a bad value (ValueError, TypeError), a file that is
#: missing, unreadable or a folder (OSError), a number too large to compute with
#: (OverflowError, MemoryError), a corrupted archive that a library let through
#: unwrapped. Anything else (AssertionError, KeyError, ...) is a bug of ours and
#: keeps its traceback.
_USER_ERRORS = (ValueError, TypeError, OSError, OverflowError, MemoryError, EOFError,
                lzma.LZMAError, zipfile.BadZipFile, zlib.error, pickle.UnpicklingError)


def _one_line(exc):
    """The message of a user error, on one line; an OSError names its file."""
    if isinstance(exc, OSError) and exc.filename is not None and exc.strerror:
        text = f"{exc.filename}: {exc.strerror}"
    elif isinstance(exc, MemoryError):
        text = f"not enough memory for these options ({exc})"
    elif isinstance(exc, OverflowError):  # math's carry (errno, message) as their args
        text = f"a number is too large for these options ({exc.args[-1] if exc.args else exc})"
    else:
        text = str(exc) or type(exc).__name__
    return " ".join(text.split())


def _check_output_file(path, option):
    """``path`` can be written: not a folder, in an existing, writable folder."""
    target = Path(path)
    if target.is_dir():
        raise ValueError(f"{option} {path} is a folder; give a file name")
    if not target.parent.is_dir():
        raise ValueError(f"{option} {path}: the folder {target.parent} does not exist")
    if not os.access(target.parent, os.W_OK) or (target.exists()
                                                 and not os.access(target, os.W_OK)):
        raise ValueError(f"{option} {path} is not writable")


def _check_output_folder(path, option):
    """``path`` is a writable folder, or can be made one in an existing folder."""
    folder = Path(path)
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"{option} {path} exists and is not a folder")
    if not folder.exists() and not folder.parent.is_dir():
        raise ValueError(f"{option} {path}: its parent folder {folder.parent} does not exist")
    if not os.access(folder if folder.exists() else folder.parent, os.W_OK):
        raise ValueError(f"{option} {path} is not writable")


def _check_outputs(args):
    """Refuse an output that cannot be written before any work is done."""
    if getattr(args, "output", None) is not None:
        _check_output_file(args.output, "--output")
    if getattr(args, "plot", None) is not None:
        _check_output_folder(args.plot, "--plot")
    if getattr(args, "checkpoint_dir", None) is not None:
        _check_output_folder(args.checkpoint_dir, "--checkpoint-dir")


def main(argv=None):
    """Entry point of the ``ebfl`` command; returns the exit status.

    A user's mistake prints one line ``error: ...`` on stderr and returns 2;
    stdout stays empty.
    """
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # --help (0), or a usage error already printed (2)
        return exc.code
    try:
        _check_outputs(args)
        args.func(args)
    except _USER_ERRORS as exc:
        print(f"error: {_one_line(exc)}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
