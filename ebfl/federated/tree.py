"""Nested dicts of arrays (numpy or torch): the states and messages of a federated run.

A *tree* is a dict whose values are arrays or trees. Client states and replies
are stacks: every array has one row per client along axis 0. torch is never
imported here; torch tensors are recognized by their module.
"""

from __future__ import annotations

import sys

import numpy as np

__all__ = ["flatten", "tree_cat", "tree_nbytes", "tree_put", "tree_take", "unflatten"]

SEP = "/"  # parameter names hold dots; "/" keeps flat keys reversible


def _is_torch(x):
    return type(x).__module__.split(".")[0] == "torch"


def _tree_iv(tree, name="tree"):
    if not isinstance(tree, dict):
        raise TypeError(f"{name} must be a dict of arrays (or of such dicts), got "
                        f"{type(tree).__name__}")
    return tree


def _positions(idx, name="idx"):
    """Row positions as a 1-D int64 array: integers only (numpy would truncate 0.7 to 0)."""
    if _is_torch(idx):
        idx = idx.detach().cpu().numpy()
    try:
        arr = np.asarray(idx)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a 1-D array of integer row positions") from None
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a 1-D array of row positions, got shape {arr.shape}")
    if arr.size and (arr.dtype == bool or arr.dtype.kind not in "iu"):
        raise TypeError(f"{name} must hold integer row positions, got dtype {arr.dtype}")
    return arr.astype(np.int64, copy=False)


def _check_rows(idx, n_rows, key, name="idx"):
    """Positions must lie in [0, n_rows - 1]: a negative one would count from the end."""
    if idx.size and (idx.min() < 0 or idx.max() >= n_rows):
        bad = int(idx.min() if idx.min() < 0 else idx.max())
        raise ValueError(f"{name} must hold row positions in [0, {n_rows - 1}] ({key!r} has "
                         f"{n_rows} rows), got {bad}")


def _rows_of(a, key):
    shape = tuple(a.shape)
    if not shape:
        raise ValueError(f"tree entry {key!r} is a scalar; a stack has one row per client")
    return shape[0]


def flatten(tree, prefix=""):
    """A flat dict ``"a/b/c" -> array`` of a nested tree (keys must not contain "/")."""
    _tree_iv(tree)
    out = {}
    for key, value in tree.items():
        if SEP in str(key):
            raise ValueError(f"tree keys must not contain {SEP!r}, got {key!r}")
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, name + SEP))
        else:
            out[name] = value
    return out


def unflatten(flat):
    """The nested tree of a flat dict written by :func:`flatten`."""
    _tree_iv(flat, "flat")
    tree = {}
    for name, value in flat.items():
        if not isinstance(name, str):
            raise TypeError(f"flat must have string keys ('a/b/c'), got {name!r}")
        *path, leaf = name.split(SEP)
        node = tree
        for key in path:
            node = node.setdefault(key, {})
        node[leaf] = value
    return tree


def _map(fn, tree):
    return {k: _map(fn, v) if isinstance(v, dict) else fn(v) for k, v in tree.items()}


def tree_take(tree, idx):
    """Rows ``idx`` (positions along axis 0) of every array of a stack (copies)."""
    _tree_iv(tree)
    idx = _positions(idx)

    def take(a):
        _check_rows(idx, _rows_of(a, "tree"), "tree")
        if _is_torch(a):
            return a[sys.modules["torch"].from_numpy(idx)]
        return a[idx]

    return _map(take, tree)


def tree_put(tree, idx, rows):
    """Write the stack ``rows`` into rows ``idx`` of ``tree`` (in place)."""
    _tree_iv(tree)
    _tree_iv(rows, "rows")
    idx = _positions(idx)
    missing = [k for k in tree if k not in rows]
    if missing:
        raise ValueError(f"rows must hold every key of tree; it lacks {missing[:5]}")
    for key, value in tree.items():
        if isinstance(value, dict):
            tree_put(value, idx, rows[key])
            continue
        _check_rows(idx, _rows_of(value, key), key)
        if _rows_of(rows[key], key) != idx.size:
            raise ValueError(f"rows[{key!r}] must have {idx.size} rows (one per position of "
                             f"idx), got {_rows_of(rows[key], key)}")
        if _is_torch(value):
            value[sys.modules["torch"].from_numpy(idx)] = rows[key]
        else:
            value[idx] = rows[key]


def tree_cat(trees):
    """Stacks concatenated along axis 0 (e.g. one-client replies into one stack)."""
    if isinstance(trees, dict) or not isinstance(trees, list | tuple):
        raise TypeError(f"trees must be a list of trees, got {type(trees).__name__}")
    if not trees:
        raise ValueError("trees must hold at least one tree")
    first = _tree_iv(trees[0], "trees[0]")
    for i, t in enumerate(trees):
        if not isinstance(t, dict) or set(t) != set(first):
            raise ValueError(f"trees[{i}] must have the keys of trees[0] "
                             f"{sorted(map(str, first))}")
    out = {}
    for key, value in first.items():
        parts = [t[key] for t in trees]
        if isinstance(value, dict):
            out[key] = tree_cat(parts)
        elif _is_torch(value):
            out[key] = sys.modules["torch"].cat(parts)
        else:
            out[key] = np.concatenate(parts)
    return out


def tree_nbytes(tree):
    """Bytes of the array payload of a tree (what a message carries, framing aside)."""
    _tree_iv(tree)
    total = 0
    for value in flatten(tree).values():
        if _is_torch(value):
            total += value.numel() * value.element_size()
        else:
            total += np.asarray(value).nbytes
    return int(total)
