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


def flatten(tree, prefix=""):
    """A flat dict ``"a/b/c" -> array`` of a nested tree (keys must not contain "/")."""
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
    tree = {}
    for name, value in flat.items():
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
    idx = np.asarray(idx, dtype=np.int64)

    def take(a):
        if _is_torch(a):
            return a[sys.modules["torch"].from_numpy(idx)]
        return a[idx]

    return _map(take, tree)


def tree_put(tree, idx, rows):
    """Write the stack ``rows`` into rows ``idx`` of ``tree`` (in place)."""
    idx = np.asarray(idx, dtype=np.int64)
    for key, value in tree.items():
        if isinstance(value, dict):
            tree_put(value, idx, rows[key])
        elif _is_torch(value):
            value[sys.modules["torch"].from_numpy(idx)] = rows[key]
        else:
            value[idx] = rows[key]


def tree_cat(trees):
    """Stacks concatenated along axis 0 (e.g. one-client replies into one stack)."""
    first = trees[0]
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
    total = 0
    for value in flatten(tree).values():
        if _is_torch(value):
            total += value.numel() * value.element_size()
        else:
            total += np.asarray(value).nbytes
    return int(total)
