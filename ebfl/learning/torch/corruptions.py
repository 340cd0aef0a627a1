"""Out-of-distribution test sets: common image corruptions at five severities, in torch.

PerAda (Xie et al., CVPR 2024) measures generalization under distribution
shift on CIFAR-10-C (Hendrycks and Dietterich, ICLR 2019: 19 corruptions of
the CIFAR-10 test set at severities 1-5). This module corrupts any set of
float images the same way, in the spirit of CIFAR-10-C and MNIST-C (Mu and
Gilmer, 2019), so that a data-less or MNIST-scale run has out-of-distribution
test sets too. The corruptions are re-implemented with torch operations
(convolutions, ``affine_grid``/``grid_sample``, interpolation); they are not
pixel-identical to either benchmark, whose files come from ImageMagick,
scikit-image and OpenCV.

Images are float tensors of shape (N, C, H, W) or (N, H, W) (one channel)
with values in [0, 1]. Every corruption returns a new tensor of the input's
shape and dtype, clipped to [0, 1] (the noise, brightness and pattern
corruptions can leave the range; the others cannot); the input is never
modified. Random corruptions draw from a ``torch.Generator`` seeded from
``(seed, name, severity)``, so the same call gives the same images.

Severity parameters (``SEVERITY_PARAMS``, severities 1 to 5), for images of
about 28-32 pixels (pixel lengths are scaled by ``min(H, W) / 28``):

=================  =========================================  ========================
corruption         parameter                                  severities 1..5
=================  =========================================  ========================
gaussian_noise     noise standard deviation                   .08 .12 .18 .26 .38 [a]
shot_noise         photons at intensity 1 (Poisson rate)      60 25 12 5 3 [a]
impulse_noise      fraction of values set to 0 or 1           .03 .06 .09 .17 .27 [a]
gaussian_blur      kernel standard deviation (pixels)         .5 1 1.5 2 3
motion_blur        blur length (pixels), angle U(-45, 45)     3 5 7 9 11
rotate             angle (degrees), random sign               15 30 45 60 90
shear              horizontal shear factor, random sign       .2 .4 .6 .8 1 [a]
zoom               content scale (zoom out, centre fixed)     .9 .8 .7 .6 .5 [a]
translate          shift (pixels) on each axis, random signs  1 2 3 4 5 [a]
fog                fog amplitude a (see :func:`corrupt`)      .3 .6 1 1.5 2.5
contrast           contrast factor                            .4 .3 .2 .1 .05 [a]
brightness         value (HSV) increase                       .1 .2 .3 .4 .5 [a]
pixelate           resolution factor                          .6 .5 .4 .3 .25 [a]
stripe             inverted band on each side (of the width)  .05 .1 .15 .2 .25 [b]
zigzag             number of zigzag lines                     1 2 3 4 5 [c]
=================  =========================================  ========================

[a] MNIST-C's values. [b] Severity 5 is MNIST-C's stripe (a quarter of the
width inverted on each side). [c] MNIST-C's zigzag has one line. The other
values are ours. Families: noise (the first three), blur (``gaussian_blur``,
``motion_blur``), geometric (``rotate``, ``shear``, ``zoom``, ``translate``),
weather (``fog``), digital (``contrast``, ``brightness``, ``pixelate``) and
pattern (``stripe``, ``zigzag``).
"""

from __future__ import annotations

import math
import zlib

import numpy as np
import torch
import torch.nn.functional as F

from ebfl._validation import check_choice, check_distinct_ints, check_int_scalar, check_names

__all__ = ["CORRUPTIONS", "FAMILIES", "SEVERITIES", "SEVERITY_PARAMS", "corrupt",
           "corrupted_test_sets"]

#: The severities, as CIFAR-10-C's.
SEVERITIES = (1, 2, 3, 4, 5)
#: Each corruption's parameter at severities 1..5 (see the module docstring for units).
SEVERITY_PARAMS = {
    "gaussian_noise": (0.08, 0.12, 0.18, 0.26, 0.38),
    "shot_noise": (60.0, 25.0, 12.0, 5.0, 3.0),
    "impulse_noise": (0.03, 0.06, 0.09, 0.17, 0.27),
    "gaussian_blur": (0.5, 1.0, 1.5, 2.0, 3.0),
    "motion_blur": (3, 5, 7, 9, 11),
    "rotate": (15.0, 30.0, 45.0, 60.0, 90.0),
    "shear": (0.2, 0.4, 0.6, 0.8, 1.0),
    "zoom": (0.9, 0.8, 0.7, 0.6, 0.5),
    "translate": (1.0, 2.0, 3.0, 4.0, 5.0),
    "fog": (0.3, 0.6, 1.0, 1.5, 2.5),
    "contrast": (0.4, 0.3, 0.2, 0.1, 0.05),
    "brightness": (0.1, 0.2, 0.3, 0.4, 0.5),
    "pixelate": (0.6, 0.5, 0.4, 0.3, 0.25),
    "stripe": (0.05, 0.1, 0.15, 0.2, 0.25),
    "zigzag": (1, 2, 3, 4, 5),
}
#: The corruptions' names.
CORRUPTIONS = tuple(SEVERITY_PARAMS)
#: The corruptions by family.
FAMILIES = {
    "noise": ("gaussian_noise", "shot_noise", "impulse_noise"),
    "blur": ("gaussian_blur", "motion_blur"),
    "geometric": ("rotate", "shear", "zoom", "translate"),
    "weather": ("fog",),
    "digital": ("contrast", "brightness", "pixelate"),
    "pattern": ("stripe", "zigzag"),
}


# -- input checks and seeding -----------------------------------------------------------------


def _from_numpy(arr):
    """A tensor over ``arr`` (no copy when torch can share it: writable, positive strides)."""
    if arr.flags.writeable and all(st >= 0 for st in arr.strides):
        return torch.from_numpy(arr)
    return torch.from_numpy(np.array(arr))


def _images_iv(x, name="x"):
    """``x`` as a float tensor (N, C, H, W) or (N, H, W) in [0, 1] (numpy is wrapped, not
    copied, when possible)."""
    if isinstance(x, np.ndarray):
        if x.dtype.kind != "f":
            raise TypeError(f"{name} must hold float images in [0, 1], got dtype {x.dtype} "
                            "(convert uint8 pixels with x / 255)")
        x = _from_numpy(x)
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a float tensor of images, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{name} must hold float images in [0, 1], got dtype {x.dtype} "
                        "(convert uint8 pixels with x / 255)")
    if x.ndim not in (3, 4):
        raise ValueError(f"{name} must have shape (N, C, H, W) or (N, H, W), got "
                         f"{tuple(x.shape)}")
    if x.numel():
        lo, hi = float(x.min()), float(x.max())
        if not (math.isfinite(lo) and math.isfinite(hi)) or lo < 0.0 or hi > 1.0:
            raise ValueError(f"{name} must lie in [0, 1] (images scaled to [0, 1]), got values "
                             f"in [{lo:g}, {hi:g}]")
    return x


def _generator(seed, name, severity):
    """A torch generator for one (seed, corruption, severity): distinct streams for
    distinct corruptions and severities of one seed."""
    ss = np.random.SeedSequence([seed, zlib.crc32(name.encode()), severity])
    return torch.Generator().manual_seed(int(ss.generate_state(1, np.uint64)[0] >> 1))


def _px(length, x):
    """A length given for 28-pixel images, scaled to ``x``'s size."""
    return length * min(x.shape[-2:]) / 28.0


def _random_signs(n, g, dtype):
    return torch.randint(0, 2, (n,), generator=g).to(dtype) * 2 - 1


# -- noise --------------------------------------------------------------------------------------


def _gaussian_noise(x, sd, g):
    return x + sd * torch.randn(x.shape, generator=g, dtype=x.dtype)


def _shot_noise(x, photons, g):
    return torch.poisson(x * photons, generator=g) / photons


def _impulse_noise(x, amount, g):
    u = torch.rand(x.shape, generator=g, dtype=x.dtype)
    out = torch.where(u < amount / 2, torch.ones_like(x), x)  # salt
    return torch.where((u >= amount / 2) & (u < amount), torch.zeros_like(x), out)  # pepper


# -- blur ---------------------------------------------------------------------------------------


def _gaussian_blur(x, sigma, g):
    sigma = _px(sigma, x)
    radius = max(1, math.ceil(3 * sigma))
    t = torch.arange(-radius, radius + 1, dtype=x.dtype)
    kernel = torch.exp(-0.5 * (t / sigma) ** 2)
    kernel = kernel / kernel.sum()
    c = x.shape[1]
    padded = F.pad(x, (radius, radius, radius, radius), mode="replicate")
    rows = F.conv2d(padded, kernel.view(1, 1, 1, -1).repeat(c, 1, 1, 1), groups=c)
    return F.conv2d(rows, kernel.view(1, 1, -1, 1).repeat(c, 1, 1, 1), groups=c)


def _base_grid(x):
    """Pixel-centre offsets from the image centre, in pixels: (H, W, 2) as (x right, y down)."""
    h, w = x.shape[-2:]
    ys = torch.arange(h, dtype=x.dtype) + 0.5 - h / 2
    xs = torch.arange(w, dtype=x.dtype) + 0.5 - w / 2
    gy, gx = torch.meshgrid(ys, xs, indexing="ij")
    return torch.stack([gx, gy], dim=-1)


def _sample(x, where, padding_mode):
    """Bilinear samples of ``x`` at pixel offsets ``where`` (N, H, W, 2) from the centre."""
    h, w = x.shape[-2:]
    scale = torch.tensor([2.0 / w, 2.0 / h], dtype=x.dtype)  # pixels -> grid_sample's [-1, 1]
    return F.grid_sample(x, where * scale, mode="bilinear", padding_mode=padding_mode,
                         align_corners=False)


def _motion_blur(x, length, g):
    length = _px(length, x)
    n = x.shape[0]
    angle = torch.deg2rad(torch.rand(n, generator=g, dtype=x.dtype) * 90 - 45)
    direction = torch.stack([torch.cos(angle), torch.sin(angle)], dim=-1).view(n, 1, 1, 2)
    base = _base_grid(x)
    taps = max(2, round(length))
    out = torch.zeros_like(x)
    for t in torch.linspace(-(length - 1) / 2, (length - 1) / 2, taps, dtype=x.dtype):
        out += _sample(x, base + t * direction, "border")
    return out / taps


# -- geometric (affine maps of the pixel grid) ---------------------------------------------------


def _warp(x, inverse, shift=None):
    """Each output pixel at offset ``o`` (pixels from the centre) takes the input's value at
    ``inverse @ o + shift`` (bilinear; zeros outside). ``inverse``: (N, 2, 2)."""
    where = torch.einsum("nij,hwj->nhwi", inverse, _base_grid(x))
    if shift is not None:
        where = where + shift.view(-1, 1, 1, 2)
    return _sample(x, where, "zeros")


def _rotation_inverse(degrees):
    """Inverse maps (N, 2, 2) of counterclockwise rotations by ``degrees`` (N,), in the
    (x right, y down) pixel frame: the direction of ``torch.rot90(x, 1, dims=(-2, -1))``."""
    a = torch.deg2rad(degrees)
    c, s = torch.cos(a), torch.sin(a)
    return torch.stack([torch.stack([c, -s], -1), torch.stack([s, c], -1)], -2)


def _rotate(x, degrees, g):
    signs = _random_signs(x.shape[0], g, x.dtype)
    return _warp(x, _rotation_inverse(signs * degrees))


def _shear(x, factor, g):
    s = _random_signs(x.shape[0], g, x.dtype) * factor
    one, zero = torch.ones_like(s), torch.zeros_like(s)
    inverse = torch.stack([torch.stack([one, s], -1), torch.stack([zero, one], -1)], -2)
    return _warp(x, inverse)


def _zoom(x, scale, g):
    inverse = torch.eye(2, dtype=x.dtype).expand(x.shape[0], 2, 2) / scale
    return _warp(x, inverse)


def _translate(x, shift, g):
    n = x.shape[0]
    signs = torch.stack([_random_signs(n, g, x.dtype), _random_signs(n, g, x.dtype)], -1)
    return _warp(x, torch.eye(2, dtype=x.dtype).expand(n, 2, 2), -_px(shift, x) * signs)


# -- weather --------------------------------------------------------------------------------------


def _smooth_field(n, h, w, g, dtype, octaves=4):
    """Low-frequency random fields in [0, 1], (N, 1, H, W): uniform noise on grids of 2, 3,
    5, 9 points per side, bilinearly upsampled and summed with weights 1, 1/2, 1/4, 1/8
    (a cheap stand-in for the plasma fractal of CIFAR-10-C's fog), then min-max scaled."""
    field = torch.zeros(n, 1, h, w, dtype=dtype)
    for o in range(octaves):
        coarse = torch.rand(n, 1, 2**o + 1, 2**o + 1, generator=g, dtype=dtype)
        field += F.interpolate(coarse, size=(h, w), mode="bilinear", align_corners=True) / 2**o
    lo = field.amin(dim=(2, 3), keepdim=True)
    hi = field.amax(dim=(2, 3), keepdim=True)
    return (field - lo) / (hi - lo).clamp_min(torch.finfo(dtype).tiny)


def _fog(x, amplitude, g):
    field = _smooth_field(x.shape[0], x.shape[2], x.shape[3], g, x.dtype)
    peak = x.amax(dim=(1, 2, 3), keepdim=True)
    return (x + amplitude * field) * peak / (peak + amplitude)


# -- digital ------------------------------------------------------------------------------------


def _contrast(x, factor, g):
    mean = x.mean(dim=(1, 2, 3), keepdim=True)
    return (x - mean) * factor + mean


def _brightness(x, increase, g):
    # HSV value V = max over channels; raising V by `increase` at fixed hue and saturation
    # scales the pixel by (V + increase) / V (capped at 1); a black pixel turns grey
    value = x.amax(dim=1, keepdim=True)
    target = (value + increase).clamp(max=1.0)
    scaled = x * target / value.clamp_min(torch.finfo(x.dtype).tiny)
    return torch.where(value > 0, scaled, target.expand_as(x))


def _pixelate(x, factor, g):
    h, w = x.shape[-2:]
    small = F.interpolate(x, size=(max(1, int(h * factor)), max(1, int(w * factor))),
                          mode="area")
    return F.interpolate(small, size=(h, w), mode="nearest")


# -- pattern ------------------------------------------------------------------------------------


def _stripe(x, fraction, g):
    band = int(round(x.shape[-1] * fraction))
    out = x.clone()
    if band:
        out[..., :band] = 1 - x[..., :band]
        out[..., -band:] = 1 - x[..., -band:]
    return out


def _zigzag_rows(n, lines, h, w, g, dtype):
    """The zigzags as rows (N, lines, W) over the image columns (NaN outside the span):
    teeth of half-period 2 and amplitude 2 (28-pixel units) along a slanted line from
    column 2 to column 25, starting at a random row and drifting by at most 5 rows."""
    unit = min(h, w) / 28.0
    c0, c1 = 2 * unit, min(25 * unit, w - 1.0)
    half, amp = 2 * unit, 2 * unit
    cols = torch.arange(w, dtype=dtype) - c0  # pixel columns along the line
    phase = cols / half  # tooth vertices at odd multiples of `half`, alternating +amp, -amp
    tri = 1 - (phase.remainder(4) - 1).abs()  # triangle wave: 0 at 0, 1 at 1, -1 at 3
    tri = torch.where(phase.remainder(4) > 2, -(1 - (phase.remainder(4) - 3).abs()), tri)
    r0 = torch.rand(n, lines, 1, generator=g, dtype=dtype) * (h - 1)
    drift = (torch.rand(n, lines, 1, generator=g, dtype=dtype) * 10 - 5) * unit
    rows = r0 + drift * cols / (c1 - c0) + amp * tri
    outside = (cols < 0) | (cols > c1 - c0)
    return torch.where(outside, torch.full_like(rows, float("nan")), rows)


def _zigzag(x, lines, g):
    # ink falls linearly with the vertical distance to the zigzag (as MNIST-C's lines do),
    # from 1 on it to 0 at 1.5 pixels (28-pixel units); lines combine by their maximum
    n, _, h, w = x.shape
    rows = _zigzag_rows(n, int(lines), h, w, g, x.dtype)  # (n, lines, w)
    pixel_rows = torch.arange(h, dtype=x.dtype).view(1, 1, h, 1)
    dist = (pixel_rows - rows[:, :, None, :]).abs().nan_to_num(nan=float("inf"))
    ink = (1 - dist / _px(1.5, x)).clamp(min=0).amax(dim=1, keepdim=True)
    return x + ink


_KERNELS = {
    "gaussian_noise": _gaussian_noise, "shot_noise": _shot_noise,
    "impulse_noise": _impulse_noise, "gaussian_blur": _gaussian_blur,
    "motion_blur": _motion_blur, "rotate": _rotate, "shear": _shear, "zoom": _zoom,
    "translate": _translate, "fog": _fog, "contrast": _contrast, "brightness": _brightness,
    "pixelate": _pixelate, "stripe": _stripe, "zigzag": _zigzag,
}


def _corrupt(x4, name, severity, seed):
    """The kernel on checked (N, C, H, W) images, computed in float32 or float64."""
    work = x4 if x4.dtype in (torch.float32, torch.float64) else x4.float()
    if work.shape[0] == 0:
        return x4.clone()
    out = _KERNELS[name](work, SEVERITY_PARAMS[name][severity - 1],
                         _generator(seed, name, severity))
    return out.clamp(0.0, 1.0).to(x4.dtype)


# -- public API ---------------------------------------------------------------------------------


def corrupt(x, name, severity=3, *, seed=0):
    """Corrupt images with one corruption at one severity.

    Parameters
    ----------
    x : Tensor or ndarray, float, shape (N, C, H, W) or (N, H, W)
        Images with values in [0, 1]; never modified.
    name : str
        One of :data:`CORRUPTIONS` (see the module docstring for what each
        does and its parameter at each severity).
    severity : int, default=3
        1 (mild) to 5 (strong).
    seed : int, default=0
        Seeds the corruption's random draws (noise, angles, signs, fields,
        lines) together with ``name`` and ``severity``: the same arguments
        give the same images.

    Returns
    -------
    Tensor
        Same shape and dtype as ``x``, clipped to [0, 1].

    Raises
    ------
    ValueError
        An unknown ``name`` (the message lists the accepted ones), a severity
        outside 1..5, images outside [0, 1] or of the wrong rank.
    TypeError
        ``x`` is not a float tensor or array.

    Notes
    -----
    The geometric corruptions resample the pixel grid with
    ``torch.nn.functional.grid_sample`` (bilinear, zeros outside the image,
    pixel centres at half-integers: ``align_corners=False``) about the image
    centre; a rotation by 90 degrees of a square image is exact up to
    rounding. Motion blur averages bilinear samples along a line through each
    pixel (edges repeated). Fog is ``(x + a F) m / (m + a)``, with ``F`` a
    smooth random field in [0, 1] and ``m`` the image's maximum (CIFAR-10-C's
    formula): the image dims and a haze appears.

    Examples
    --------
    >>> x = torch.zeros(2, 1, 28, 28)
    >>> x[:, :, 10:18, 12:16] = 1.0
    >>> y = corrupt(x, "rotate", severity=5, seed=0)
    >>> y.shape, bool(y.min() >= 0), bool(y.max() <= 1)
    (torch.Size([2, 1, 28, 28]), True, True)
    >>> bool(torch.equal(y, corrupt(x, "rotate", severity=5, seed=0)))
    True
    """
    x = _images_iv(x)
    check_choice(name, "name", CORRUPTIONS)
    severity = check_int_scalar(severity, "severity", minimum=1, maximum=5)
    seed = check_int_scalar(seed, "seed", minimum=0, maximum=2**63 - 1)
    x4 = x if x.ndim == 4 else x.unsqueeze(1)
    out = _corrupt(x4, name, severity, seed)
    return out if x.ndim == 4 else out.squeeze(1)


def _labels_iv(y, n):
    if isinstance(y, np.ndarray):
        if y.dtype.kind not in "biu":
            raise TypeError(f"y must hold integer class labels, got dtype {y.dtype}")
        y = _from_numpy(y)
    if not isinstance(y, torch.Tensor):
        raise TypeError(f"y must be a tensor or array of class labels, got {type(y).__name__}")
    if y.dtype == torch.bool or y.is_floating_point() or y.is_complex():
        raise TypeError(f"y must hold integer class labels, got dtype {y.dtype}")
    if y.shape != (n,):
        raise ValueError(f"y must have shape ({n},) (one label per image of x), got "
                         f"{tuple(y.shape)}")
    return y.to(torch.int64)


def corrupted_test_sets(x, y, names=None, severities=SEVERITIES, *, seed=0):
    """Out-of-distribution test sets: ``x`` under each corruption, all severities stacked.

    Like CIFAR-10-C's files, each corruption's set holds the whole test set
    once per severity, severity by severity (rows ``k n .. (k+1) n - 1`` are
    ``severities[k]``), and the labels repeat accordingly.

    Parameters
    ----------
    x : Tensor or ndarray, float, shape (n, C, H, W) or (n, H, W)
        Clean test images in [0, 1]; never modified.
    y : Tensor or ndarray of int, shape (n,)
    names : sequence of str, optional
        Corruptions (default: all of :data:`CORRUPTIONS`).
    severities : sequence of int, default=(1, 2, 3, 4, 5)
        Distinct severities in 1..5, in the order stacked.
    seed : int, default=0
        As in :func:`corrupt` (each corruption and severity has its own stream).

    Returns
    -------
    dict
        name -> ``(x_c, y_c)``: images of shape ``(len(severities) n, ...)``
        and dtype of ``x``, int64 labels of shape ``(len(severities) n,)``.

    Raises
    ------
    ValueError
        An unknown name, a bad severity, or ``y`` not of shape (n,).

    Examples
    --------
    >>> x, y = torch.rand(4, 1, 28, 28), torch.arange(4)
    >>> sets = corrupted_test_sets(x, y, names=["fog", "stripe"], severities=(1, 5))
    >>> sets["fog"][0].shape, sets["fog"][1].tolist()
    (torch.Size([8, 1, 28, 28]), [0, 1, 2, 3, 0, 1, 2, 3])
    """
    x = _images_iv(x)
    y = _labels_iv(y, x.shape[0])
    names = list(CORRUPTIONS) if names is None else check_names(names, "names", CORRUPTIONS,
                                                                what="corruption")
    severities = check_distinct_ints(severities, "severities", minimum=1, maximum=5)
    seed = check_int_scalar(seed, "seed", minimum=0, maximum=2**63 - 1)
    x4 = x if x.ndim == 4 else x.unsqueeze(1)
    out = {}
    for name in names:
        parts = [_corrupt(x4, name, s, seed) for s in severities]
        images = torch.cat(parts)
        out[name] = (images if x.ndim == 4 else images.squeeze(1), y.repeat(len(severities)))
    return out
