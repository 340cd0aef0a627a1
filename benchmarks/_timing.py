"""Timing helper shared by the benchmark scripts."""

import gc
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
