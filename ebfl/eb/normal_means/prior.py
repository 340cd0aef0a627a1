r"""Priors of the normal-means model as mixtures of simple components.

Every prior family of :func:`ebfl.eb.ebnm` is a finite mixture
g = sum_k w_k g_k of components of four kinds, each with two parameters (a, b):

* ``"normal"``: N(a, b^2), b >= 0 (b = 0: a point mass at a);
* ``"uniform"``: uniform on [a, b], a < b;
* ``"exp+"`` / ``"exp-"``: a + Exp(scale b) / a - Exp(scale b), b > 0 (a Laplace
  component is the half-and-half mixture of the two);
* ``"tnormal+"``: N(a, b^2) conditioned on theta >= 0, b > 0 (the slab of the
  generalized binary prior).

For x_i ~ N(theta_i, s_i^2) each component has a closed-form marginal density
and a posterior that is a normal truncated to an interval, so the posterior
under the mixture (:meth:`NormalMeansPrior.posterior`) is exact: no quadrature.
(The horseshoe is not a finite mixture: it is represented by its quadrature in
log lambda, a scale mixture of normals accurate to about 1e-10 relative; see
:mod:`ebfl.eb.normal_means.horseshoe`.)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from scipy import special

from ebfl.eb.normal_means.truncated import log_normal_mass, truncated_normal_pieces

__all__ = ["KINDS", "NormalMeansPosterior", "NormalMeansPrior"]

KINDS = ("normal", "uniform", "exp+", "exp-", "tnormal+")
#: Entries of the density matrix from which the Numba kernel computes it.
_KERNEL_MIN = 20_000
_LOG_2PI = np.log(2 * np.pi)


@dataclass(frozen=True)
class NormalMeansPrior:
    """g = sum_k weights[k] * component(kinds[k], a[k], b[k]) (see the module docstring).

    Attributes
    ----------
    weights : ndarray (K,)
        Nonnegative, summing to 1.
    kinds : tuple of str
    a, b : ndarray (K,)
    family : str
        The prior family it was fitted as (for display).
    parameters : dict, optional
        The family's own parameters where they are fewer than the components'
        (the horseshoe's ``scale``; the generalized binary's ``pi``, ``mode`` and
        ``ratio``): shown by ``repr`` in place of the components.
    """

    weights: np.ndarray
    kinds: tuple
    a: np.ndarray
    b: np.ndarray
    family: str = "mixture"
    parameters: dict | None = None

    def __post_init__(self):
        w = np.array(self.weights, dtype=float, ndmin=1)
        a = np.array(self.a, dtype=float, ndmin=1)
        b = np.array(self.b, dtype=float, ndmin=1)
        kinds = tuple(self.kinds)
        if not (w.shape == a.shape == b.shape == (len(kinds),)) or w.ndim != 1:
            raise ValueError(f"weights, kinds, a and b must have one entry per component, got "
                             f"{w.shape}, {len(kinds)}, {a.shape}, {b.shape}")
        if not kinds:
            raise ValueError("a prior needs at least one component")
        bad = set(kinds) - set(KINDS)
        if bad:
            raise ValueError(f"kinds must be among {KINDS}, got {sorted(bad)}")
        if not (np.all(np.isfinite(w)) and np.all(w >= 0) and abs(w.sum() - 1) < 1e-8):
            raise ValueError("weights must be nonnegative and sum to 1")
        if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
            raise ValueError("component parameters a and b must be finite")
        k = np.array(kinds)
        if np.any(b[k == "normal"] < 0) or np.any(b[np.isin(k, ("exp+", "exp-", "tnormal+"))]
                                                  <= 0):
            raise ValueError("normal components need sd b >= 0, exponential and truncated "
                             "normal ones b > 0")
        if np.any(b[k == "uniform"] <= a[k == "uniform"]):
            raise ValueError("uniform components need a < b")
        for name, arr in (("weights", w / w.sum()), ("a", a), ("b", b)):
            arr.setflags(write=False)
            object.__setattr__(self, name, arr)
        object.__setattr__(self, "kinds", kinds)
        if self.parameters is not None:
            object.__setattr__(self, "parameters", dict(self.parameters))

    # ---------------------------------------------------------------- the prior itself
    @property
    def n_components(self):
        return len(self.kinds)

    @property
    def mean(self):
        """E[theta] under g."""
        return float(self.weights @ self._component_means())

    def _component_means(self):
        k = np.array(self.kinds)
        return np.select([k == "normal", k == "uniform", k == "exp+", k == "exp-"],
                         [self.a, (self.a + self.b) / 2, self.a + self.b, self.a - self.b],
                         self._tnormal_moments()[1])

    def _tnormal_moments(self):
        """(log mass, mean, var) of every component's N(a, b^2) on [0, inf) (those of
        the ``tnormal+`` components; placeholders for the others)."""
        b = np.where(self.b > 0, self.b, 1.0)
        return truncated_normal_pieces(self.a, b, 0.0, np.inf)[:3]

    def cdf(self, t):
        """G(t) = P(theta <= t), for an array of t."""
        t = np.asarray(t, dtype=float)[..., None]
        a, b, k = self.a, self.b, np.array(self.kinds)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            normal = np.where(b > 0, special.ndtr((t - a) / np.where(b > 0, b, 1)),
                              (t >= a).astype(float))
            uniform = np.clip((t - a) / (b - a), 0, 1)
            exp_pos = np.where(t >= a, -np.expm1(-(t - a) / b), 0.0)
            exp_neg = np.where(t >= a, 1.0, np.exp(np.minimum((t - a) / b, 0)))
            safe = np.where(b > 0, b, 1.0)
            # P(0 <= N(a, b^2) <= t) / P(N(a, b^2) >= 0), in log space (no cancellation
            # in the tails)
            trunc = np.where(t > 0, np.exp(log_normal_mass(-a / safe, (t - a) / safe)
                                           - log_normal_mass(-a / safe, np.inf)), 0.0)
        comp = np.select([k == "normal", k == "uniform", k == "exp+", k == "exp-"],
                         [normal, uniform, exp_pos, exp_neg], trunc)
        return comp @ self.weights

    def sample(self, size, rng=None):
        """``size`` draws of theta from g."""
        from ebfl._validation import as_generator, check_int_scalar

        size = check_int_scalar(size, "size", minimum=0)
        rng = as_generator(rng)
        comp = rng.choice(self.n_components, size=size, p=self.weights)
        a, b, k = self.a[comp], self.b[comp], np.array(self.kinds)[comp]
        out = np.select([k == "normal", k == "uniform", k == "exp+"],
                        [a + b * rng.standard_normal(size), rng.uniform(a, np.maximum(b, a)),
                         a + b * rng.standard_exponential(size)],
                        a - b * rng.standard_exponential(size))
        trunc = k == "tnormal+"
        if np.any(trunc):
            from scipy import stats

            lo = -a[trunc] / b[trunc]
            out[trunc] = a[trunc] + b[trunc] * stats.truncnorm.rvs(lo, np.inf,
                                                                  random_state=rng)
        return out

    def to_frame(self):
        """The components as a pandas DataFrame (weight, kind, a, b)."""
        import pandas as pd

        return pd.DataFrame({"weight": self.weights, "kind": self.kinds, "a": self.a,
                             "b": self.b})

    def describe(self, max_chars=300):
        """The prior as text: its family's parameters where it has them
        (``horseshoe(scale=0.33, mode=0)``), else the components with weight > 0
        (``0.64*point(0) + 0.18*exp+(0, 2.15)``)."""
        if self.parameters is not None:
            shown = ", ".join(f"{k}={v:.4g}" for k, v in self.parameters.items())
            if self.family == "horseshoe":
                shown += f", mode={self.a[0]:.4g}"
            return f"{self.family}({shown})"
        shown = " + ".join(
            f"{w:.3g}*point({a:.3g})" if kind == "normal" and b == 0 else
            f"{w:.3g}*{kind}({a:.3g}, {b:.3g})"
            for w, kind, a, b in zip(self.weights, self.kinds, self.a, self.b, strict=True)
            if w > 0)
        return shown if len(shown) <= max_chars else shown[:max_chars] + " ..."

    def __repr__(self):
        if self.parameters is not None:
            return f"NormalMeansPrior({self.describe()}; {self.n_components} components)"
        return (f"NormalMeansPrior(family={self.family!r}, {self.n_components} components: "
                f"{self.describe()})")

    def active(self):
        """The same prior without its components of weight 0."""
        keep = self.weights > 0
        return NormalMeansPrior(self.weights[keep], tuple(np.array(self.kinds)[keep]),
                                self.a[keep], self.b[keep], self.family, self.parameters)

    # -------------------------------------------------------- likelihood and posterior
    def log_component_density(self, x, s):
        """log of each component's marginal density of x_i ~ N(theta_i, s_i^2), (n, K)."""
        x, s = np.broadcast_arrays(np.asarray(x, float), np.asarray(s, float))
        if x.size * self.n_components >= _KERNEL_MIN:
            from ebfl.eb.normal_means._grid_kernels import log_component_matrix

            codes = np.array([KINDS.index(k) for k in self.kinds], dtype=np.int64)
            return log_component_matrix(np.ascontiguousarray(x), np.ascontiguousarray(s),
                                        codes, self.a, self.b)
        return self._log_component_density_numpy(x, s)

    def _log_component_density_numpy(self, x, s):
        """:meth:`log_component_density` in numpy: the Numba kernel's twin (and the path of
        small problems, where compiling would cost more than it saves)."""
        x = np.asarray(x, float)[:, None]
        s = np.asarray(s, float)[:, None]
        a, b, k = self.a[None], self.b[None], np.array(self.kinds)[None]
        out = np.empty(np.broadcast_shapes(x.shape, a.shape))
        for kind in set(self.kinds):
            cols = np.flatnonzero(k[0] == kind)
            ac, bc = a[:, cols], b[:, cols]
            if kind == "normal":
                var = s**2 + bc**2
                out[:, cols] = -0.5 * (_LOG_2PI + np.log(var) + (x - ac) ** 2 / var)
            elif kind == "uniform":
                out[:, cols] = log_normal_mass((ac - x) / s, (bc - x) / s) - np.log(bc - ac)
            elif kind == "tnormal+":
                # N(x; a, s^2 + b^2) P(theta >= 0 | x, untruncated) / P(theta >= 0)
                var = s**2 + bc**2
                m, sd = _normal_posterior(x, s, ac, bc)
                out[:, cols] = (-0.5 * (_LOG_2PI + np.log(var) + (x - ac) ** 2 / var)
                                + special.log_ndtr(m / sd) - special.log_ndtr(ac / bc))
            else:
                sign = 1.0 if kind == "exp+" else -1.0
                z = sign * (x - ac)
                out[:, cols] = (-np.log(bc) + s**2 / (2 * bc**2) - z / bc
                                + special.log_ndtr(z / s - s / bc))
        return out

    def _posterior_pieces(self, x, s):
        """Per (i, k): the component posterior's truncated normal (mean, sd, lo, hi)."""
        x = np.asarray(x, float)[:, None]
        s = np.asarray(s, float)[:, None]
        a, b, k = self.a[None], self.b[None], np.array(self.kinds)[None]
        shape = np.broadcast_shapes(x.shape, a.shape)
        mean, sd = np.empty(shape), np.empty(shape)
        lo, hi = np.full(shape, -np.inf), np.full(shape, np.inf)
        for kind in set(self.kinds):
            cols = np.flatnonzero(k[0] == kind)
            ac, bc = a[:, cols], b[:, cols]
            if kind == "normal":
                with np.errstate(divide="ignore", invalid="ignore"):
                    v = np.where(bc > 0, 1.0 / (1.0 / s**2 + 1.0 / np.where(bc > 0, bc, 1)**2),
                                 0.0)
                    m = np.where(bc > 0, v * (x / s**2 + ac / np.where(bc > 0, bc, 1)**2), ac)
                mean[:, cols], sd[:, cols] = np.broadcast_to(m, (shape[0], cols.size)), \
                    np.sqrt(np.broadcast_to(v, (shape[0], cols.size)))
            elif kind == "uniform":
                mean[:, cols], sd[:, cols] = x, np.broadcast_to(s, (shape[0], cols.size))
                lo[:, cols], hi[:, cols] = ac, bc
            elif kind == "tnormal+":
                mean[:, cols], sd[:, cols] = _normal_posterior(x, s, ac, bc)
                lo[:, cols] = 0.0
            else:
                sign = 1.0 if kind == "exp+" else -1.0
                mean[:, cols] = x - sign * s**2 / bc
                sd[:, cols] = np.broadcast_to(s, (shape[0], cols.size))
                if sign > 0:
                    lo[:, cols] = ac
                else:
                    hi[:, cols] = ac
        return mean, sd, lo, hi

    def posterior(self, x, s):
        """The posterior of every theta_i given x_i ~ N(theta_i, s_i^2) under this prior.

        Parameters
        ----------
        x, s : array_like (n,)
            Observations and their standard errors (s > 0).

        Returns
        -------
        NormalMeansPosterior
        """
        if np.any(self.weights == 0):
            # Components without weight have no posterior weight either: a fitted grid
            # prior keeps a few of its hundreds of components, and only those are needed.
            return self.active().posterior(x, s)
        x, s = np.broadcast_arrays(np.asarray(x, float), np.asarray(s, float))
        fields = ("mean", "sd", "second_moment", "lfsr", "prob_zero", "log_marginal")
        if x.size * self.n_components >= _KERNEL_MIN:
            # The kernel works row by row, with no (rows, components) temporaries, and
            # its output arrays are fresh: no defensive copy.
            arrays = self._posterior_arrays(x, s)
            return NormalMeansPosterior(**dict(zip(fields, arrays, strict=True)),
                                        _prior=self, _data=(x, s), _fresh=True)
        # (numpy: below the kernel's size, so the (rows, components) arrays are small)
        arrays = self._posterior_arrays_numpy(x, s)
        return NormalMeansPosterior(**dict(zip(fields, arrays, strict=True)), _prior=self,
                                    _data=(x, s))

    def _block_rows(self):
        """Rows per block of the log-likelihood: about 2 * 10^6 entries."""
        return max(1, 2_000_000 // self.n_components)

    def _posterior_arrays(self, x, s):
        """(mean, sd, second moment, lfsr, P(0), log marginal) of rows x, s: by the Numba
        kernel for large problems, the rows it flags (a truncated piece whose variance
        needs quadrature) and small problems by numpy."""
        if x.size * self.n_components < _KERNEL_MIN:
            return self._posterior_arrays_numpy(x, s)
        from ebfl.eb.normal_means._grid_kernels import posterior_rows

        out = tuple(np.empty(x.size) for _ in range(6))
        lost = np.zeros(x.size, dtype=np.bool_)
        codes = np.array([KINDS.index(k) for k in self.kinds], dtype=np.int64)
        with np.errstate(divide="ignore"):
            log_w = np.log(self.weights)
        posterior_rows(np.ascontiguousarray(x), np.ascontiguousarray(s), codes, self.a,
                       self.b, log_w, *out, lost)
        if np.any(lost):
            for arr, fixed in zip(out, self._posterior_arrays_numpy(x[lost], s[lost]),
                                  strict=True):
                arr[lost] = fixed
        return out

    def _posterior_arrays_numpy(self, x, s):
        """:meth:`_posterior_arrays` in numpy (the kernel's twin)."""
        resp, log_marg = self._responsibilities(x, s)
        m, sd, lo, hi = self._posterior_pieces(x, s)
        # P(theta > 0) of each piece is its own mass, not 1 - P(< 0): the lfsr of a
        # negative effect has the relative accuracy of a positive one.
        first, var_k, below, above = _piece_moments(m, sd, lo, hi)
        at_zero = ((sd == 0) & (m == 0)).astype(float)
        mean = np.sum(resp * first, axis=1)
        second_moment = np.sum(resp * (first**2 + var_k), axis=1)
        p_neg = np.sum(resp * below, axis=1)
        p_pos = np.sum(resp * above, axis=1)
        p_zero = np.sum(resp * at_zero, axis=1)
        # The law of total variance, not E[theta^2] - E[theta]^2: no cancellation when the
        # posterior sd is far below |mean|.
        var = np.sum(resp * (var_k + (first - mean[:, None]) ** 2), axis=1)
        lfsr = np.minimum(p_neg + p_zero, p_pos + p_zero)
        return mean, np.sqrt(var), second_moment, np.clip(lfsr, 0.0, 1.0), p_zero, log_marg

    def _log_joint(self, x, s):
        """log w_k + log of component k's marginal density at x_i, shape (n, K)."""
        with np.errstate(divide="ignore"):
            return self.log_component_density(x, s) + np.log(self.weights)[None]

    def _responsibilities(self, x, s):
        """P(component k | x_i), shape (n, K), and log of each x_i's marginal density."""
        log_joint = self._log_joint(x, s)
        log_marg = special.logsumexp(log_joint, axis=1)
        return np.exp(log_joint - log_marg[:, None]), log_marg

    def log_likelihood(self, x, s):
        """sum_i log of the marginal density of x_i under this prior."""
        x, s = np.broadcast_arrays(np.asarray(x, float), np.asarray(s, float))
        block = self._block_rows()
        return float(sum(np.sum(special.logsumexp(self._log_joint(x[i:i + block],
                                                                  s[i:i + block]), axis=1))
                         for i in range(0, max(x.size, 1), block)))


def _piece_moments(m, sd, lo, hi):
    """(mean, variance, P(< 0), P(> 0)) of every piece N(m, sd^2) on [lo, hi], (n, K).

    Columns untruncated on every row (normal components) take the plain normal's
    moments and Phi(-+m / sd): the general truncated formulas cost five times as much
    and a scale mixture (the horseshoe's) has hundreds of such columns.
    """
    plain = np.all(np.isneginf(lo) & np.isposinf(hi), axis=0)
    if not np.any(plain):
        return truncated_normal_pieces(m, sd, lo, hi)[1:]
    first, var = m.copy(), sd**2
    below, above = np.empty_like(m), np.empty_like(m)
    mp, sp = m[:, plain], sd[:, plain]
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(sp > 0, mp / np.where(sp > 0, sp, 1.0), np.sign(mp) * np.inf)
    # a point mass (sd 0) at m: P(< 0) = [m < 0], P(> 0) = [m > 0] (z = -+inf, or 0 at 0)
    below[:, plain] = np.where((sp == 0) & (mp == 0), 0.0, special.ndtr(-z))
    above[:, plain] = np.where((sp == 0) & (mp == 0), 0.0, special.ndtr(z))
    rest = ~plain
    if np.any(rest):
        _, f, v, b, a = truncated_normal_pieces(m[:, rest], sd[:, rest], lo[:, rest],
                                                hi[:, rest])
        first[:, rest], var[:, rest], below[:, rest], above[:, rest] = f, v, b, a
    return first, var, below, above


def _normal_posterior(x, s, a, b):
    """Mean and sd of theta | x for theta ~ N(a, b^2), b > 0, x ~ N(theta, s^2)."""
    var = s**2 + b**2
    return (x * b**2 + a * s**2) / var, s * b / np.sqrt(var)


@dataclass(frozen=True)
class NormalMeansPosterior:
    """Each theta_i's posterior: its mean, sd, second moment, local false sign rate.

    Attributes
    ----------
    mean, sd, second_moment : ndarray (n,)
    lfsr : ndarray (n,)
        min(P(theta_i >= 0 | x), P(theta_i <= 0 | x)): how likely the sign of the
        posterior mean is wrong.
    prob_zero : ndarray (n,)
        P(theta_i = 0 | x) (the local false discovery rate of priors with a point
        mass at 0).
    log_marginal : ndarray (n,)
        log of each observation's marginal density.
    """

    mean: np.ndarray
    sd: np.ndarray
    second_moment: np.ndarray
    lfsr: np.ndarray
    prob_zero: np.ndarray
    log_marginal: np.ndarray
    _prior: NormalMeansPrior = field(repr=False, default=None)
    _data: tuple = field(repr=False, default=None)
    #: The arrays were made for this object alone (frozen in place, not copied).
    _fresh: bool = field(repr=False, default=False)

    def __post_init__(self):
        for name in ("mean", "sd", "second_moment", "lfsr", "prob_zero", "log_marginal"):
            value = getattr(self, name)
            arr = value if self._fresh else np.array(value, dtype=float)
            arr.setflags(write=False)
            object.__setattr__(self, name, arr)

    def __repr__(self):
        return f"NormalMeansPosterior(n={self.mean.size})"

    def to_frame(self):
        """A pandas DataFrame with one row per observation."""
        import pandas as pd

        return pd.DataFrame({"mean": self.mean, "sd": self.sd,
                             "second_moment": self.second_moment, "lfsr": self.lfsr,
                             "prob_zero": self.prob_zero})

    def sample(self, n_samples, rng=None):
        """Draws from each theta_i's posterior, shape (n_samples, n)."""
        from ebfl._validation import as_generator, check_int_scalar

        n_samples = check_int_scalar(n_samples, "n_samples", minimum=1, maximum=10**7)
        rng = as_generator(rng)
        prior = self._prior
        x, s = self._data
        if prior is None:  # the flat prior: theta_i | x_i ~ N(x_i, s_i^2)
            return x + s * rng.standard_normal((n_samples, x.size))
        resp, _ = prior._responsibilities(x, s)
        m, sd, lo, hi = prior._posterior_pieces(x, s)
        n = x.size
        cum = np.cumsum(resp, axis=1)
        u = rng.random((n_samples, n))
        comp = np.minimum((u[..., None] > cum[None]).sum(axis=2), resp.shape[1] - 1)
        rows = np.arange(n)[None]
        mu, sig, a, b = m[rows, comp], sd[rows, comp], lo[rows, comp], hi[rows, comp]
        # Inverse-cdf draws of the truncated normals in log space, on the side of the
        # tail where the cdf is small: Phi(z) = Phi(b) (u + (1 - u) Phi(a) / Phi(b)),
        # u uniform, inverted by ndtri_exp (exact however far into the tail).
        safe = np.where(sig > 0, sig, 1.0)
        alpha, beta = (a - mu) / safe, (b - mu) / safe
        flip = alpha > 0
        lo_z, hi_z = np.where(flip, -beta, alpha), np.where(flip, -alpha, beta)
        log_pa, log_pb = special.log_ndtr(lo_z), special.log_ndtr(hi_z)
        u = rng.random(mu.shape)
        with np.errstate(divide="ignore"):
            log_p = log_pb + np.log(u + (1 - u) * np.exp(log_pa - log_pb))
        z = special.ndtri_exp(np.minimum(log_p, 0.0))
        z = np.clip(np.where(flip, -z, z), alpha, beta)
        return np.where(sig > 0, mu + sig * z, mu)
