"""Timing helper shared by the benchmark scripts."""

import gc
import math
import re
import time


def best_of(fn, reps):
    """(minimum wall time in seconds over ``reps`` calls of ``fn()``, its last return value).

    The previous call's result is released before the next call, so that a peak
    memory measured around ``best_of`` is that of one call.
    """
    times = []
    out = None
    for _ in range(reps):
        out = None
        gc.collect()
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return min(times), out


def rss_kib(field="VmRSS"):
    """The process's resident set size (``VmRSS``) or its peak (``VmHWM``), KiB (Linux).

    ``VmHWM`` belongs to this process alone and is reset by :func:`reset_peak_rss`;
    ``getrusage``'s ``ru_maxrss`` is not reset and, in a child started by
    ``subprocess``, also covers the parent's RSS at the exec.
    """
    with open("/proc/self/status") as f:
        return int(re.search(rf"{field}:\s+(\d+)", f.read()).group(1))


def reset_peak_rss():
    """Reset the peak-RSS mark (``VmHWM``) to the current RSS; False if not permitted."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def bmm_seconds(a, b, reps, calls=10):
    """Best time of one ``torch.bmm(a, b)``, seconds (the operands reused: the fastest
    this product runs here). ``best_of`` would ``gc.collect`` around each call, which
    takes longer than a small product; on a GPU the clock is read after a synchronize."""
    import torch

    sync = torch.cuda.synchronize if a.device.type == "cuda" else (lambda: None)
    out = torch.bmm(a, b)
    best = math.inf
    for _ in range(max(reps, 5)):
        sync()
        t0 = time.perf_counter()
        for _ in range(calls):
            torch.bmm(a, b, out=out)
        sync()
        best = min(best, (time.perf_counter() - t0) / calls)
    return best
