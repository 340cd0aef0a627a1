"""Handlers of ``ebfl reproduce``: the papers' experiments and ebfl's own (``hapt``)."""

from __future__ import annotations

import os
from pathlib import Path

from ebfl.cli._output import _emit, _nan_to_none, _print_table, _progress, _round, _save_figure


def _cmd_reproduce_estimation(args):
    from ebfl.generative.estimation import reproduce_estimation

    payload = reproduce_estimation(quick=args.quick, rng=args.seed, progress=_progress(args),
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
    _emit(args, payload, render, quick="replicates")


def _cmd_reproduce_regression(args):
    from ebfl.generative.regression import e3_regression, plot_e3

    kwargs = (dict(m=1000, runs=1, em_rounds=100, gd_rounds=200) if args.quick
              else dict(m=10_000, runs=3, em_rounds=300, gd_rounds=1000))
    payload = e3_regression(rng=args.seed, progress=_progress(args), **kwargs)
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


def _lr_grid(args):
    """The grid of ``--lr-grid``: None without it, the paper's when given bare."""
    from ebfl.generative.adaped import PAPER_LR_GRID

    if args.lr_grid is not None and not args.lr_grid:
        return PAPER_LR_GRID
    return args.lr_grid


def _cmd_reproduce_adaped(args):
    from ebfl.generative.adaped import METHODS, plot_table1, table1

    payload = table1(args.dataset, methods=tuple(args.methods or METHODS),
                     seeds=tuple(range(args.seed, args.seed + args.seeds)), quick=args.quick,
                     femnist_root=args.femnist_root, progress=_progress(args), device=args.device,
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


def _cmd_reproduce_adaped_protocol(args):
    from ebfl.generative.adaped_protocol import (
        SEARCH_METHODS,
        plot_protocol_search,
        protocol_search,
    )

    payload = protocol_search(args.sizes, methods=tuple(args.methods or SEARCH_METHODS),
                              seeds=tuple(range(args.seed, args.seed + args.seeds)),
                              lr_grid=_lr_grid(args),
                              classes_per_client=args.classes_per_client,
                              dataset=args.dataset, quick=args.quick,
                              checkpoint_dir=args.checkpoint_dir, progress=_progress(args),
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
    from ebfl.fedhdp.experiment import plot_sweep, reproduce_fedhdp

    _check_seeds_and_rounds(args)
    table = "sweep" if args.sweep else "3"
    payload = reproduce_fedhdp(args.dataset, table=table, lam=args.lam, ratios=args.ratio,
                               seeds=tuple(range(args.seed, args.seed + args.seeds)),
                               quick=args.quick, n_rounds=args.rounds,
                               denominator=args.denominator, checkpoint_dir=args.checkpoint_dir,
                               progress=_progress(args), device=args.device)
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


def _cmd_reproduce_perada(args):
    from ebfl.perada.experiment import (
        PARTS,
        check_backbone_weights,
        plot_perada,
        reproduce_perada,
    )

    _check_seeds_and_rounds(args)
    if args.arch == "resnet18" and args.dataset != "cifar10":
        raise ValueError(f"--arch resnet18 runs on --dataset cifar10 (3-channel images), got "
                         f"--dataset {args.dataset}")
    # the weights file is read and checked here, so that its errors name the option
    check_backbone_weights(args.arch, args.backbone_weights,
                            names={"arch": "--arch", "backbone_weights": "--backbone-weights",
                                   "cache_dir": "--cache-dir"})
    payload = reproduce_perada(dataset=args.dataset, quick=args.quick,
                               parts=args.part or PARTS,
                               seeds=tuple(range(args.seed, args.seed + args.seeds)),
                               n_rounds=args.rounds, checkpoint_dir=args.checkpoint_dir,
                               arch=args.arch, backbone_weights=args.backbone_weights,
                               cache_dir=args.cache_dir, progress=_progress(args),
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
    from ebfl.dppfl.experiment import plot_dppfl, reproduce_dppfl

    payload = reproduce_dppfl(quick=args.quick, n_reps=args.reps,
                              checkpoint_dir=args.checkpoint_dir, jobs=args.jobs,
                              progress=_progress(args))
    _save_figure(args, plot_dppfl, payload, "dppfl_figures.png")
    _emit(args, _nan_to_none(payload), _render_dp_pfl)


def _render_dp_pfl(p):
    scale = "quick pipeline check" if p["quick"] else f"{p['protocol']['n_reps']} repetitions"
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
    from ebfl.generative.adaped import dp_sweep, plot_dp_sweep

    payload = dp_sweep(args.dataset, noise_multipliers=tuple(args.noise or (0.5, 1.0, 2.0, 4.0)),
                       clip=args.clip, delta=args.delta, concatenate=args.concatenate,
                       fine_tune=args.fine_tune, seed=args.seed, quick=args.quick,
                       femnist_root=args.femnist_root, progress=_progress(args),
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
    from ebfl.generative.adaped import fedem_comparison, plot_fedem_comparison

    zs = () if args.non_private else tuple(args.noise or (1.0, 4.0, 16.0))
    payload = fedem_comparison(args.dataset, noise_multipliers=zs, clip=args.clip,
                               delta=args.delta, seeds=tuple(range(args.seed,
                                                                   args.seed + args.seeds)),
                               quick=args.quick, femnist_root=args.femnist_root,
                               progress=_progress(args), device=args.device)
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


def _cmd_hapt(args):
    from ebfl._validation import check_choice
    from ebfl.datasets import ACTIVITIES, hapt_windows, load_hapt_raw
    from ebfl.generative.hapt import hapt_logistic, plot_hapt

    check_choice(args.positive, "--positive", set(ACTIVITIES.values()))  # before the slow load
    windows = hapt_windows(load_hapt_raw(args.data, download=args.download,
                                         progress=_progress(args)))
    payload = hapt_logistic(positive=args.positive, quick=args.quick, windows=windows,
                            progress=_progress(args))
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
