"""Handlers of ``ebfl flower``: simulation and deployment apps."""

from __future__ import annotations

from ebfl.cli._output import _emit, _print_table, _save_figure


def _flower():
    # Without Flower this raises ModuleNotFoundError(name="flwr"): ``ebfl.cli.main``
    # turns it into one error line naming the extra.
    from ebfl.flower import runtime as flower

    return flower


def _job_settings(args):
    return {"algorithm": args.algorithm, "dataset": args.dataset, "clients": args.clients,
            "rounds": args.rounds, "seed": args.seed, "clients-per-round": args.clients_per_round,
            "local-steps": args.local_steps, "batch-size": args.batch_size, "lr": args.lr,
            "eval-every": args.eval_every, "epsilon": args.epsilon, "clip": args.clip,
            "noise": args.noise, "opt-out": args.opt_out, "gamma2": args.gamma2,
            "ratio": args.ratio, "lambda": args.lam, "inner": args.omega_every,
            "family": args.family, "delta": args.delta}


def _cmd_flower_simulate(args):
    from ebfl.federated.faults import check_failures
    from ebfl.flower.jobs import build_job

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
                     f"{p['config']['n_clients']} clients, {p['config']['n_rounds']} rounds "
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
    from ebfl.flower.deploy import write_app

    settings = _job_settings(args)
    path = write_app(args.directory, settings, superlink=args.superlink,
                     overwrite=args.overwrite)
    payload = {"app": str(path), "settings": {k: v for k, v in settings.items()
                                              if v is not None}}

    def render(p):
        print(f"wrote the Flower App to {p['app']} (see its README.md for the steps)")
    _emit(args, payload, render)
