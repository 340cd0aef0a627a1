"""Checkpoints of :func:`ebfl.federated.run`: what a run resumes from, and what it refuses.

A checkpoint is the run's state after a round, pickled, followed by a trailer
holding the SHA-256 of the pickle: a file that was truncated, damaged on disk
or is not a checkpoint at all fails the checksum and is never unpickled. It
records the configuration (algorithm, run, failures so far) and a digest of
the clients' data it was written for: a run resumes only from a checkpoint of
the same configuration on the same data, else it stops with a ValueError that
says what differs. Writes are atomic (a temporary file renamed over the old
one), so a crash mid-write leaves the previous checkpoint intact.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import pickle
import sys
from collections.abc import Mapping
from pathlib import Path

import numpy as np

__all__ = ["check_checkpoint_path", "data_digest", "load_checkpoint", "save_checkpoint"]

#: The trailer: this marker, then the hex SHA-256 of everything before it.
_MARKER = b"\nebfl-checkpoint-sha256:"
_TRAILER = len(_MARKER) + 64
#: Version of the payload's layout (a dict with these keys).
FORMAT = 2
_KEYS = {"format", "identity", "data", "server", "clients", "round", "history", "metrics"}
_START_AFRESH = "delete it, or pass another checkpoint path, to start afresh"
_CHUNK = 1 << 20


# ------------------------------------------------------------------ path

def check_checkpoint_path(checkpoint, name="checkpoint"):
    """``checkpoint`` as a Path that can be read and written: a file, or a new one.

    Checked before a run starts, so that a folder, or a path under a file, fails
    at once instead of after the first rounds.
    """
    if not isinstance(checkpoint, str | os.PathLike):
        raise TypeError(f"{name} must be a path, got {type(checkpoint).__name__}")
    path = Path(checkpoint)
    if path.is_dir():
        raise ValueError(f"{name} {str(path)!r} is a folder; give a file path, e.g. "
                         f"{str(path / 'run.ckpt')!r}")
    if path.exists() and not path.is_file():
        raise ValueError(f"{name} {str(path)!r} is not a regular file")
    existing = next((p for p in path.parents if p.exists()), None)
    if existing is not None and not existing.is_dir():
        raise ValueError(f"{name} {str(path)!r}: {str(existing)!r} is a file, not a folder")
    if existing is not None and not os.access(existing if not path.exists() else path,
                                              os.W_OK):
        raise ValueError(f"{name} {str(path)!r} is not writable")
    return path


# ------------------------------------------------------------------ data digest

def data_digest(data):
    """A SHA-256 (hex) of the clients' data: every array's dtype, shape and bytes.

    Walks the data object (dataclass fields, attributes, dicts, lists) down to
    numpy arrays, torch tensors (read on the CPU, so data on a GPU gives the
    digest of the same data on the CPU; a device itself is not content) and
    scalars. One pass over the bytes, done only when a run has a checkpoint.
    """
    h = hashlib.sha256()
    _feed(h, data, set(), 0)
    return h.hexdigest()


def _torch():
    return sys.modules.get("torch")


def _feed(h, obj, seen, depth):
    torch = _torch()
    if obj is None or isinstance(obj, bool | int | float | complex | str | bytes | np.generic):
        h.update(f"{type(obj).__name__}:{obj!r};".encode())
    elif isinstance(obj, np.ndarray):
        _feed_array(h, obj)
    elif torch is not None and isinstance(obj, torch.Tensor):
        _feed_tensor(h, obj)
    elif torch is not None and isinstance(obj, torch.device):
        pass  # where the data sit is not what they are
    elif id(obj) in seen or depth > 32:
        h.update(b"<seen>")
    else:
        seen.add(id(obj))
        h.update(f"<{type(obj).__qualname__}>".encode())
        if isinstance(obj, Mapping):
            for key, value in sorted(obj.items(), key=lambda kv: repr(kv[0])):
                h.update(repr(key).encode())
                _feed(h, value, seen, depth + 1)
        elif isinstance(obj, list | tuple):
            for value in obj:
                _feed(h, value, seen, depth + 1)
        elif isinstance(obj, set | frozenset):
            h.update(repr(sorted(map(repr, obj))).encode())
        elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            for f in dataclasses.fields(obj):  # not __dict__: cached properties are not data
                h.update(f.name.encode())
                _feed(h, getattr(obj, f.name), seen, depth + 1)
        elif hasattr(obj, "__dict__") and not callable(obj):
            for key, value in sorted(vars(obj).items()):
                h.update(key.encode())
                _feed(h, value, seen, depth + 1)
        # anything else (a function, a module): its type name only, never its address
        h.update(b"</>")


def _feed_array(h, arr):
    h.update(f"ndarray:{arr.dtype.str}:{arr.shape};".encode())
    if arr.dtype.kind == "O":  # the bytes of an object array are addresses
        h.update(repr(arr.tolist()).encode())
        return
    flat = np.ascontiguousarray(arr).reshape(-1)
    for start in range(0, flat.size, _CHUNK):
        h.update(flat[start:start + _CHUNK].view(np.uint8))


def _feed_tensor(h, t):
    torch = _torch()
    t = t.detach()
    h.update(f"tensor:{t.dtype}:{tuple(t.shape)};".encode())
    if t.is_sparse:
        t = t.to_dense()
    flat = t.to("cpu").contiguous().reshape(-1)
    for start in range(0, flat.numel(), _CHUNK):
        h.update(flat[start:start + _CHUNK].contiguous().view(torch.uint8).numpy())


# ------------------------------------------------------------------ file

class _HashingWriter:
    """A file that hashes what is written to it (the pickle is hashed as it streams)."""

    def __init__(self, fh):
        self.fh = fh
        self.sha = hashlib.sha256()

    def write(self, b):
        self.sha.update(b)
        return self.fh.write(b)


def save_checkpoint(path, payload):
    """Write ``payload`` and its checksum atomically: a crash mid-write never leaves a
    truncated checkpoint, only the previous one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as fh:
        writer = _HashingWriter(fh)
        pickle.dump({"format": FORMAT, **payload}, writer, protocol=pickle.HIGHEST_PROTOCOL)
        fh.write(_MARKER + writer.sha.hexdigest().encode())
    tmp.replace(path)


def _damaged(path, why):
    return ValueError(f"checkpoint {str(path)!r} cannot be read: {why}; {_START_AFRESH}")


def load_checkpoint(path):
    """The payload of a checkpoint, after its checksum is verified (else a ValueError)."""
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size < _TRAILER:
                raise _damaged(path, f"it is too short ({size} bytes) to be a checkpoint")
            fh.seek(size - _TRAILER)
            trailer = fh.read(_TRAILER)
            if not trailer.startswith(_MARKER):
                raise _damaged(path, "it does not end with its checksum (it is truncated, "
                                     "damaged, not a checkpoint, or written by an older ebfl)")
            content = size - _TRAILER
            sha = hashlib.sha256()
            fh.seek(0)
            left = content
            while left:
                chunk = fh.read(min(_CHUNK, left))
                if not chunk:
                    break
                sha.update(chunk)
                left -= len(chunk)
            if sha.hexdigest().encode() != trailer[len(_MARKER):]:
                raise _damaged(path, "its checksum does not match its content (the file is "
                                     "damaged)")
            fh.seek(0)
            saved = pickle.load(fh)
    except OSError as exc:
        raise _damaged(path, exc.strerror or str(exc)) from None
    except (pickle.UnpicklingError, EOFError, AttributeError, ImportError) as exc:
        # the checksum matched: written by an ebfl whose classes have since changed
        raise _damaged(path, f"its content cannot be unpickled ({exc})") from None
    if not isinstance(saved, dict) or set(saved) != _KEYS or saved["format"] != FORMAT:
        raise _damaged(path, "it is not a checkpoint of ebfl.federated.run")
    return saved


# ------------------------------------------------------------------ identity

def check_resumable(path, saved, identity, digest, n_rounds):
    """Refuse to resume from ``saved`` unless it was written for this run (identity and
    data), saying what differs."""
    if saved["data"] != digest:
        raise ValueError(f"checkpoint {str(path)!r} was written for other data (the clients' "
                         f"data of this run differ from those of the run that wrote it); "
                         f"{_START_AFRESH}")
    old = saved["identity"]
    done = int(saved["round"])
    now = {**identity, "failures": {r: c for r, c in identity["failures"].items() if r < done}}
    old = {**old, "failures": {r: c for r, c in old["failures"].items() if r < done}}
    if old != now:
        diffs = _differences(old, now)
        raise ValueError(f"checkpoint {str(path)!r} was written by another configuration "
                         f"({'; '.join(diffs[:4])}{'; ...' if len(diffs) > 4 else ''}); "
                         f"{_START_AFRESH}")
    if done > n_rounds:
        raise ValueError(f"checkpoint {str(path)!r} holds {done} rounds, more than this run's "
                         f"n_rounds={n_rounds}; ask for at least {done} rounds, or {_START_AFRESH}")


def _differences(old, new, prefix=""):
    """'key: X in the checkpoint, Y now' for every differing leaf of two nested dicts."""
    if isinstance(old, dict) and isinstance(new, dict) and prefix != "failures":
        out = []
        for key in sorted(set(old) | set(new), key=str):
            name = f"{prefix}.{key}" if prefix else str(key)
            out += _differences(old.get(key, "<unset>"), new.get(key, "<unset>"), name)
        return out
    if old == new:
        return []
    what = "failures in the rounds done" if prefix == "failures" else prefix
    return [f"{what}: {_short(old)} in the checkpoint, {_short(new)} now"]


def _short(value):
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
