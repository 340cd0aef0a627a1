"""Rendering of the commands' results: tables, JSON, figures."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np


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


def _progress(args):
    """Progress bars (tqdm, on stderr) for a long command: shown where stderr is a
    terminal, never in a log or a pipe, and not with ``--quiet``."""
    return sys.stderr.isatty() and not getattr(args, "quiet", False)


#: What a ``--quick`` run is, said beside its results (``quick_note`` in ``--json``). The
#: reproductions shrink the experiment, so their numbers answer "does it run", not "does it
#: reproduce"; ``validate`` and ``reproduce estimation`` only take fewer replicates.
QUICK_NOTES = {
    "scale": "quick mode: a pipeline check at reduced scale (fewer rounds, clients or "
             "images); its numbers are not comparable with the paper's. Run without --quick "
             "for the reproduction.",
    "replicates": "quick mode: fewer Monte Carlo replicates, so wider standard errors; run "
                  "without --quick for the full count.",
}


def _emit(args, payload, render, *, quick=None):
    """Print ``payload`` as JSON (``--json``) or through ``render``; a ``--quick`` run
    says what it is (``quick``: a key of :data:`QUICK_NOTES`, default "scale")."""
    note = QUICK_NOTES[quick or "scale"] if getattr(args, "quick", False) else None
    if note is not None and isinstance(payload, dict):
        payload = {**payload, "quick_note": note}
    if args.json:
        json.dump(payload, sys.stdout, default=_json_default)
        sys.stdout.write("\n")
    else:
        render(payload)
        if note is not None:
            print(f"\n{note}")


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
