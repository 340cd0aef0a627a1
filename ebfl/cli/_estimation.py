"""Handlers of the estimation commands: ``bounds``, ``fit``, ``private``, ``demo``,
``validate`` and ``reproduce election``."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from ebfl.cli._output import _emit, _print_table, _progress


def _cmd_bounds_gaussian(args):
    from ebfl.bounds import (
        gaussian_bounds,
        gaussian_mechanism_sigma_q,
        gaussian_mechanism_true_delta,
        quantizer_sigma_q,
    )
    from ebfl.privacy.mechanisms import paper_clip_range

    setting = (args.clients, args.samples_per_client, args.sigma_theta, args.sigma_x)
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

    b = beta_bounds(args.alpha, args.beta, args.samples_per_client)
    payload = {"model": "beta-bernoulli", **b.as_dict()}

    def render(p):
        rows = [{"quantity": k, "value": p[k]} for k in ("weight", "posterior", "local")]
        _print_table(f"Beta-Bernoulli, known prior Beta({p['alpha']}, {p['beta']}), n={p['n']}",
                     rows, ["quantity", "value"])
    _emit(args, payload, render)


def _cmd_bounds_fedhdp(args):
    from ebfl.fedhdp import fedhdp_bounds

    b = fedhdp_bounds(args.clients, args.opt_out, args.alpha2, args.tau2, args.gamma2)
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


def _id_not_with_client(args):
    if args.id is not None and args.client is not None:
        raise ValueError("--id names the clients of the one-row-per-client format; with "
                         "--client the ids are that column's values")


def _row_ids(frame, args):
    """The clients' ids: the --id column's values, or the row numbers from 0."""
    from ebfl._tables import column

    return list(column(frame, args.id, "--id")) if args.id is not None else list(frame.index)


def _cmd_fit_beta_binomial(args):
    import pandas as pd

    from ebfl._tables import client_ids, numeric_column, read_table, where
    from ebfl.eb import beta_binomial_eb, npmle_binomial

    _distinct_columns(args, ("successes", "trials", "id", "client", "value"))
    frame = read_table(args.path, max_mib=args.max_size)
    _id_not_with_client(args)
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
        clients = _row_ids(frame, args)
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
             "upper": upper, "weight_on_own_mean": res.shrinkage}
    summary = {
        "model": "beta-binomial", "method": res.method, "n_clients": res.n_clients,
        "prior": None if res.prior is None else {"alpha": res.prior.alpha,
                                                 "beta": res.prior.beta,
                                                 "mean": res.prior.mean},
        "log_likelihood": res.log_likelihood, "n_clipped": res.n_clipped,
        # the MLE's state: an edge (e.g. no overdispersion) is a finding, not a failure
        **{k: res.diagnostics[k] for k in ("converged", "active_bounds") if k in res.diagnostics},
        "mean_weight_on_own_mean": float(np.mean(res.shrinkage)), "level": args.level,
    }
    _finish_fit(args, summary, table)


#: What a meta-analyst reads beside the fit: REML's restricted log-likelihood, DL's Q,
#: and whether the likelihood search converged (names as in ``gaussian_eb``).
_GAUSSIAN_DIAGNOSTICS = ("restricted_log_likelihood", "q_statistic", "converged", "at_zero")


def _cmd_fit_gaussian(args):
    from ebfl._tables import client_ids, numeric_column, read_table
    from ebfl.eb import gaussian_eb, gaussian_eb_samples, npmle_normal
    from ebfl.ragged import Ragged

    _distinct_columns(args, ("mean", "se", "id", "client", "value"))
    frame = read_table(args.path, max_mib=args.max_size)
    _id_not_with_client(args)
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
        clients = _row_ids(frame, args)
        if args.method == "npmle":
            _two_clients(x.size, args)
            _finish_npmle(args, npmle_normal(x, s), clients, {"local": x}, "gaussian")
            return
        res = gaussian_eb(x, s, method=args.method)
    else:
        raise ValueError("give --mean and --se, or --client and --value")
    lower, upper = res.posterior.interval(args.level)
    mean = res.posterior.mean
    if mean.ndim == 1:
        table = {"client": clients, "estimate": mean, "sd": res.posterior.sd, "lower": lower,
                 "upper": upper, "weight_on_own_mean": res.shrinkage, "se": res.s}
    else:
        table = {"client": clients, "sd": res.posterior.sd,
                 "weight_on_own_mean": res.shrinkage, "se": res.s}
        for k, name in enumerate(args.value):
            table.update({f"estimate_{name}": mean[:, k], f"lower_{name}": lower[:, k],
                          f"upper_{name}": upper[:, k]})
    summary = {"model": "gaussian", "method": res.method, "n_clients": res.n_clients,
               "prior": {"mean": res.prior.mean, "sd": res.prior.sd,
                         "tau2": res.prior.sd**2},
               "log_likelihood": res.log_likelihood,
               **{k: res.diagnostics[k] for k in _GAUSSIAN_DIAGNOSTICS if k in res.diagnostics},
               "sigma_x": res.diagnostics.get("sigma_x"),
               "mean_weight_on_own_mean": float(np.mean(res.shrinkage)),
               "level": args.level}
    _finish_fit(args, summary, table)


def _cmd_fit_normal_means(args):
    from ebfl._tables import column, numeric_column, read_table
    from ebfl.eb import ebnm

    frame = read_table(args.path, max_mib=args.max_size)
    _distinct_columns(args, ("x", "s", "id"))
    x = numeric_column(frame, args.x, "--x")
    s = numeric_column(frame, args.s, "--s", positive=True)
    if args.mode == "estimate":
        mode = "estimate"
    else:
        try:
            mode = float(args.mode)
        except ValueError:
            raise ValueError(f"--mode must be a number or 'estimate', got {args.mode!r}") \
                from None
        if not math.isfinite(mode):
            raise ValueError(f"--mode must be finite, got {args.mode!r}")
    ids = (list(column(frame, args.id, "--id")) if args.id is not None
           else list(range(len(frame))))
    fit = ebnm(x, s, args.family, mode=mode)
    post = fit.posterior
    table = {"id": ids, "x": x, "s": s, "mean": post.mean, "sd": post.sd, "lfsr": post.lfsr,
             "prob_zero": post.prob_zero}
    g = fit.fitted_g
    summary = {"model": "normal-means", "family": fit.family, "n": int(x.size),
               "log_likelihood": fit.log_likelihood, "mode": fit.mode,
               "prior": "flat (improper)" if g is None else g.describe(),
               "converged": fit.diagnostics.get("converged"),
               "lfsr_below_0.05": int(np.sum(post.lfsr < 0.05))}
    if "kkt" in fit.diagnostics:
        summary["kkt"] = fit.diagnostics["kkt"]
    if g is not None and g.parameters is not None:
        summary["prior_parameters"] = dict(g.parameters)
    if args.json and g is not None:  # every component with weight > 0, for programs
        summary["prior_components"] = g.to_frame()[g.weights > 0].to_dict("records")
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


def _cmd_private_bernoulli(args):
    from ebfl.privacy.sweep import (
        DEFAULT_EPSILONS,
        plot_private_bernoulli,
        private_bernoulli_sweep,
    )

    sweep = private_bernoulli_sweep(args.epsilon or DEFAULT_EPSILONS, alpha=args.alpha,
                                    beta=args.beta,
                                    n_clients=args.clients, n=args.samples_per_client,
                                    rng=args.seed)
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


def _cmd_demo(args):
    from ebfl.demo import format_demo, run_demo

    payload = run_demo(n_clients=args.clients, rng=args.seed)
    _emit(args, payload, lambda p: print(format_demo(p)))


def _cmd_validate(args):
    from ebfl.validation import validate
    from ebfl.validation.sweeps import plot_sweeps

    report = validate(args.names or None, n_reps=args.reps, quick=args.quick, rng=args.seed,
                      progress=_progress(args))
    payload = {"quick": args.quick, "seed": args.seed, "counts": report.counts(),
               "results": report.to_dicts()}
    if args.plot:
        payload["figures"] = plot_sweeps(args.plot, n_reps=args.reps, quick=args.quick,
                                         rng=args.seed, progress=_progress(args))

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
    _emit(args, payload, render, quick="replicates")


def _cmd_election(args):
    from ebfl.datasets import election_matrix, load_county_returns
    from ebfl.generative.election import election_experiment, plot_election

    returns = load_county_returns(args.data, verify=not args.no_verify, progress=_progress(args))
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
