"""Numerical settings shared by the Numba kernels.

Kept in one place so that tests and benchmarks see the same flags (the STUMPY
habit): ``fastmath`` is off because the kernels are checked against plain-numpy
twins to 1e-12, and reassociated sums would not meet that.
"""

FASTMATH = False
#: Numba on-disk cache for compiled kernels (speeds up a second interpreter start).
CACHE = True
#: Largest dense (n, z) table used to compress beta-binomial likelihoods; beyond
#: it the compression falls back to sorting (``np.unique``).
MAX_DENSE_TABLE_CELLS = 1 << 24
