"""Command-line interface of ebfl: fit, bound, validate and reproduce from a shell.

The subcommands include ``ebfl bounds``, ``fit``, ``validate`` and ``reproduce``
(every experiment: the papers' and ebfl's own, ``election`` and ``hapt`` among
them); ``ebfl --help`` lists them all.

Every subcommand accepts ``--json`` and then prints exactly one JSON object on
stdout; otherwise it prints a readable table. A user's mistake (a missing or
corrupted file, a wrong column, a bad option value) prints one line
``error: ...`` on stderr, nothing on stdout, and exits with status 2.

This module is that error boundary (:func:`main`); the parser is built in
``_parser``, and each command group has its handlers in a module of its own
(``_estimation``, ``_accounting``, ``_reproduce``, ``_flower``), rendering in
``_output`` and the option types in ``_types``.
"""

from __future__ import annotations

import lzma
import os
import pickle
import sys
import zipfile
import zlib
from pathlib import Path

from ebfl.cli._parser import build_parser

__all__ = ["main"]


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


#: Optional dependencies, by top-level module, and the extra that installs each.
_EXTRAS = {"torch": "learning", "h5py": "learning", "flwr": "flower", "ray": "flower"}


def main(argv=None):
    """Entry point of the ``ebfl`` command; returns the exit status.

    A user's mistake prints one line ``error: ...`` on stderr and returns 2;
    stdout stays empty. So does a command whose optional dependency is missing (the
    line names the extra that installs it). Output into a pipe whose reader has gone
    (``ebfl demo --json | head``) ends quietly with status 1.
    """
    try:
        status = _run(argv)
        sys.stdout.flush()  # here, not at exit: a closed pipe must fail where it is caught
        return status
    except BrokenPipeError:
        # As Python's documentation advises: stdout to devnull, so that the
        # interpreter's last flush does not raise (and print) the same error again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1


def _run(argv):
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # --help (0), or a usage error already printed (2)
        return exc.code
    try:
        _check_outputs(args)
        args.func(args)
    except BrokenPipeError:
        raise  # (an OSError, but not the user's mistake: see main)
    except ModuleNotFoundError as exc:
        missing = (exc.name or "").partition(".")[0]
        if missing not in _EXTRAS:
            raise  # a module of ours or a core dependency: a bug or a broken install
        print(f"error: this command needs {missing}, which is not installed: "
              f"pip install 'ebfl[{_EXTRAS[missing]}]'", file=sys.stderr)
        return 2
    except _USER_ERRORS as exc:
        print(f"error: {_one_line(exc)}", file=sys.stderr)
        return 2
    return 0
