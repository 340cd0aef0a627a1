"""Argument types of the ``ebfl`` parser: each refuses a bad value with one line."""

from __future__ import annotations

import argparse
import math


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


def _size(text):
    """argparse type: a number of training images per client (>= 2), or "all"."""
    return None if text == "all" else _integer(2)(text)


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
