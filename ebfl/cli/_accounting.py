"""Handlers of ``ebfl accounting``: DP-AdaPeD, FedHDP (DP-FedAvg) and DP-PFL."""

from __future__ import annotations

import re

import numpy as np

from ebfl.cli._output import _emit, _print_table


def _cmd_accounting_dp_adaped(args):
    from ebfl.privacy.accounting import (
        DEFAULT_ORDERS,
        dp_adaped_epsilon,
        rdp_to_epsilon,
        theorem7_rdp,
    )

    mech = {"n_clients": args.clients, "n_sampled": args.clients_per_round,
            "n_iterations": args.rounds * args.local_steps, "sync_gap": args.local_steps,
            "clip_mu": args.clip, "noise_mu": args.noise,
            "clip_psi": args.clip_psi, "noise_psi": args.noise_psi}
    orders = np.asarray(DEFAULT_ORDERS)
    rdp = theorem7_rdp(orders, **mech)
    correct = dp_adaped_epsilon(args.delta, sampling=args.sampling, accountant=args.accountant,
                                trust=args.trust, **mech)
    payload = {
        "setting": {k: v for k, v in mech.items() if v is not None},
        "delta": args.delta,
        "theorem7_epsilon_lemma2": rdp_to_epsilon(orders, rdp, args.delta),
        "theorem7_epsilon_classic": rdp_to_epsilon(orders, rdp, args.delta, conversion="classic"),
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
    from ebfl.privacy.accounting.core import NOISE_MULTIPLIER_RANGE
    from ebfl.privacy.accounting.dp_fedavg import dp_fedavg_epsilon
    from ebfl.privacy.accounting.guarantee import VALID_FOR, dp_fedavg_guarantee

    lo, hi = NOISE_MULTIPLIER_RANGE  # the library's own refusals would name its arguments
    if args.sampling_rate > 1 or not lo <= args.noise <= hi:
        raise ValueError(f"--sampling-rate must lie in (0, 1] and --noise in [{lo:g}, {hi:g}], "
                         f"got {args.sampling_rate:g} and {args.noise:g}")
    setting = {"sampling_rate": args.sampling_rate, "noise_multiplier": args.noise,
               "n_rounds": args.rounds, "delta": args.delta}
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
                     f"z={s['noise_multiplier']:g}, T={s['n_rounds']}, delta={s['delta']:g}",
                     rows, ["accountant", "epsilon", "order"])
        print(f"model: {p['accountant_model']}\n{p['valid_for']}")
    _emit(args, payload, render)


def _cmd_accounting_dp_pfl(args):
    from ebfl.dppfl.accounting import dppfl_privacy_report

    if args.sampling_rate > 1:
        raise ValueError(f"--sampling-rate must lie in (0, 1] (q = n_iter/n_t), got "
                         f"{args.sampling_rate:g}")
    if args.drop >= 1:
        raise ValueError("--drop must lie in [0, 1): at 1 no device ever takes part")
    try:
        payload = dppfl_privacy_report(args.epsilon, args.delta, inner=args.omega_every,
                                       outer=args.omega_steps, drop_probability=args.drop,
                                       sampling_rate=args.sampling_rate, ratio=args.ratio)
    except ValueError as exc:  # the report names its arguments: name the options instead
        options = {"epsilon": "--epsilon", "delta": "--delta", "inner": "--omega-every",
                   "outer": "--omega-steps", "drop_probability": "--drop",
                   "sampling_rate": "--sampling-rate", "ratio": "--ratio"}
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
