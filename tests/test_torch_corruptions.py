"""Image corruptions in torch: shapes, range, determinism, severity, known images, errors."""

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from ebfl.learning.torch.corruptions import (  # noqa: E402
    CORRUPTIONS,
    FAMILIES,
    SEVERITY_PARAMS,
    corrupt,
    corrupted_test_sets,
)

torch.set_num_threads(1)

#: Corruptions that draw nothing at random: the seed does not change them.
DETERMINISTIC = {"gaussian_blur", "zoom", "contrast", "brightness", "pixelate", "stripe"}


def shapes(n, channels, size, seed=0):
    """Black images with three random filled rectangles of intensity 0.6-1 each."""
    g = torch.Generator().manual_seed(seed)
    x = torch.zeros(n, channels, size, size)
    for i in range(n):
        for _ in range(3):
            r0, c0 = torch.randint(0, size - 6, (2,), generator=g).tolist()
            h, w = torch.randint(3, 10, (2,), generator=g).tolist()
            x[i, :, r0:r0 + h, c0:c0 + w] = 0.6 + 0.4 * torch.rand(channels, 1, 1, generator=g)
    return x


@pytest.fixture(scope="module")
def gray():
    return shapes(40, 1, 28)


@pytest.fixture(scope="module")
def color():
    return shapes(24, 3, 32, seed=1)


def test_the_families_partition_the_corruptions():
    names = [n for family in FAMILIES.values() for n in family]
    assert sorted(names) == sorted(CORRUPTIONS) and len(names) == len(set(names))
    assert all(len(SEVERITY_PARAMS[n]) == 5 for n in CORRUPTIONS)


@pytest.mark.parametrize("name", CORRUPTIONS)
def test_shape_dtype_range_and_input_untouched(name, gray, color):
    for x in (gray, color, gray[:, 0], color.double()):
        before = x.clone()
        y = corrupt(x, name, severity=4, seed=3)
        assert torch.equal(x, before)  # the input is never modified
        assert y.shape == x.shape and y.dtype == x.dtype
        assert float(y.min()) >= 0.0 and float(y.max()) <= 1.0
        assert y.data_ptr() != x.data_ptr()
    arr = gray.numpy().copy()
    y = corrupt(arr, name, severity=2)
    np.testing.assert_array_equal(arr, gray.numpy())
    assert isinstance(y, torch.Tensor) and y.shape == gray.shape
    arr.setflags(write=False)  # a read-only or reversed array is copied, not refused
    assert torch.equal(corrupt(arr, name, severity=2), y)
    assert corrupt(arr[::-1], name, severity=2).shape == gray.shape


@pytest.mark.parametrize("name", CORRUPTIONS)
def test_same_seed_same_images(name, gray):
    a = corrupt(gray, name, severity=3, seed=11)
    assert torch.equal(a, corrupt(gray, name, severity=3, seed=11))
    other = corrupt(gray, name, severity=3, seed=12)
    assert torch.equal(a, other) == (name in DETERMINISTIC)


@pytest.mark.parametrize("name", CORRUPTIONS)
def test_severity_five_changes_images_more_than_severity_one(name, gray, color):
    for x in (gray, color):
        mild = (corrupt(x, name, severity=1) - x).abs().mean()
        strong = (corrupt(x, name, severity=5) - x).abs().mean()
        assert strong > 1.2 * mild > 0


# -- known images --------------------------------------------------------------------------------

def test_rotate_by_90_degrees_is_rot90_either_way(gray, color):
    assert SEVERITY_PARAMS["rotate"][4] == 90.0
    for x in (gray, color):
        y = corrupt(x, "rotate", severity=5, seed=0)
        ccw = torch.rot90(x, 1, dims=(-2, -1))
        cw = torch.rot90(x, -1, dims=(-2, -1))
        err_ccw = (y - ccw).abs().amax(dim=(1, 2, 3))
        err_cw = (y - cw).abs().amax(dim=(1, 2, 3))
        assert torch.all(torch.minimum(err_ccw, err_cw) < 1e-5)  # bilinear at exact centres
        assert bool((err_ccw < 1e-5).any()) and bool((err_cw < 1e-5).any())  # both signs


def test_translate_shifts_by_whole_pixels_with_zero_fill(gray):
    s = int(SEVERITY_PARAMS["translate"][2])  # 3 pixels at 28 x 28
    y = corrupt(gray, "translate", severity=3, seed=5)
    for i in range(gray.shape[0]):
        matches = []
        for dy in (-s, s):
            for dx in (-s, s):
                want = torch.zeros_like(gray[i])
                src = gray[i][:, max(0, -dy):28 - max(0, dy), max(0, -dx):28 - max(0, dx)]
                want[:, max(0, dy):28 - max(0, -dy), max(0, dx):28 - max(0, -dx)] = src
                matches.append(float((y[i] - want).abs().max()) < 1e-5)
        assert sum(matches) == 1


def test_stripe_at_severity_five_inverts_a_quarter_on_each_side(gray):
    y = corrupt(gray, "stripe", severity=5)
    want = gray.clone()
    want[..., :7] = 1 - gray[..., :7]
    want[..., 21:] = 1 - gray[..., 21:]
    assert torch.equal(y, want)


def test_zoom_out_keeps_the_centre_of_a_constant_image_and_blanks_the_border():
    x = torch.full((1, 1, 28, 28), 0.7)
    y = corrupt(x, "zoom", severity=5)[0, 0]  # content scaled by 0.5 about the centre
    assert torch.allclose(y[8:20, 8:20], torch.tensor(0.7))
    assert float(y[:6].abs().max()) == 0 and float(y[:, 22:].abs().max()) == 0


def test_contrast_and_brightness_closed_forms(gray, color):
    c = SEVERITY_PARAMS["contrast"][1]
    mean = gray.mean(dim=(1, 2, 3), keepdim=True)
    assert torch.allclose(corrupt(gray, "contrast", 2), (gray - mean) * c + mean, atol=1e-6)
    b = SEVERITY_PARAMS["brightness"][3]
    assert torch.allclose(corrupt(gray, "brightness", 4), (gray + b).clamp(max=1), atol=1e-6)
    # colour: hue and saturation kept, i.e. each pixel scaled by (V + b) / V, V = max channel
    y = corrupt(color, "brightness", 4)
    v = color.amax(dim=1, keepdim=True)
    lit = (v > 0).expand_as(color)
    want = color * (v + b).clamp(max=1) / v.clamp_min(1e-12)
    assert torch.allclose(y[lit], want[lit], atol=1e-6)
    assert torch.allclose(y[~lit], torch.tensor(b))


def test_gaussian_blur_of_an_impulse_is_the_separable_kernel():
    x = torch.zeros(1, 1, 41, 41)
    x[0, 0, 20, 20] = 1.0
    sigma = SEVERITY_PARAMS["gaussian_blur"][1] * 41 / 28
    t = torch.arange(-20, 21, dtype=torch.float64)
    radius = math.ceil(3 * sigma)
    k = torch.where(t.abs() <= radius, torch.exp(-0.5 * (t / sigma) ** 2), torch.tensor(0.0))
    k = k / k.sum()
    y = corrupt(x, "gaussian_blur", 2)[0, 0].double()
    assert torch.allclose(y, torch.outer(k, k), atol=1e-6)


@pytest.mark.parametrize("name", ["gaussian_blur", "motion_blur", "zoom", "pixelate"])
def test_smoothing_keeps_a_constant_image(name):
    x = torch.full((3, 1, 28, 28), 0.4)
    y = corrupt(x, name, 3)
    core = y[..., 10:18, 10:18]  # zoom blanks the border
    assert torch.allclose(core, torch.tensor(0.4), atol=1e-6)


def test_noise_statistics_match_their_distributions():
    x = torch.full((100, 1, 32, 32), 0.5, dtype=torch.float64)
    n = x.numel()
    # Gaussian: sd 0.08 at severity 1 (no clipping: 0.5 is 6 sd from 0 and 1)
    sd = SEVERITY_PARAMS["gaussian_noise"][0]
    r = corrupt(x, "gaussian_noise", 1, seed=1) - 0.5
    assert abs(float(r.std()) - sd) < 5 * sd / math.sqrt(2 * n)
    assert abs(float(r.mean())) < 5 * sd / math.sqrt(n)
    # shot: Poisson(0.5 * lam) / lam has mean 0.5 and variance 0.5 / lam
    lam = SEVERITY_PARAMS["shot_noise"][0]
    y = corrupt(x, "shot_noise", 1, seed=2)
    var = 0.5 / lam
    assert abs(float(y.mean()) - 0.5) < 5 * math.sqrt(var / n)
    assert abs(float(y.var()) / var - 1) < 5 * math.sqrt(2 / n)
    assert torch.allclose(y * lam, (y * lam).round(), atol=1e-9)  # counts of photons
    # impulse: a fraction amount / 2 of the values salted to 1, as many peppered to 0
    amount = SEVERITY_PARAMS["impulse_noise"][4]
    y = corrupt(x, "impulse_noise", 5, seed=3)
    p = amount / 2
    se = math.sqrt(p * (1 - p) / n)
    assert abs(float((y == 1).double().mean()) - p) < 5 * se
    assert abs(float((y == 0).double().mean()) - p) < 5 * se
    assert float(((y != 0) & (y != 1) & (y != 0.5)).double().sum()) == 0


def test_fog_dims_the_image_and_adds_a_smooth_haze(gray):
    a = SEVERITY_PARAMS["fog"][2]
    y = corrupt(gray, "fog", 3, seed=4)
    peak = gray.amax(dim=(1, 2, 3), keepdim=True)
    field = (y * (peak + a) / peak - gray) / a  # solve y = (x + a F) m / (m + a) for F
    assert float(field.min()) > -1e-5 and float(field.max()) < 1 + 1e-5
    assert torch.all(field.amax(dim=(1, 2, 3)) > 1 - 1e-4)  # min-max scaled per image
    # low frequency: neighbouring pixels differ far less than the field's range
    assert float((field[..., 1:] - field[..., :-1]).abs().max()) < 0.25
    assert float(corrupt(torch.zeros(2, 1, 28, 28), "fog", 5).abs().max()) == 0  # m = 0


def test_zigzag_draws_white_lines_on_the_image(gray):
    y = corrupt(gray, "zigzag", 2, seed=6)
    assert torch.all(y >= gray - 1e-7)  # ink only adds
    blank = corrupt(torch.zeros(20, 1, 28, 28), "zigzag", 1, seed=6)
    assert float(blank[..., :2].max()) == 0 and float(blank[..., 26:].max()) == 0
    inked = (blank[:, 0] > 0.5).any(dim=1).sum(dim=1)  # columns with ink, per image
    assert torch.all(inked >= 1)  # it starts inside the image (and may leave it)
    assert float((inked >= 20).double().mean()) > 0.5


# -- the test sets -------------------------------------------------------------------------------

def test_corrupted_test_sets_stack_the_severities(gray):
    y = torch.arange(gray.shape[0]) % 10
    sets = corrupted_test_sets(gray, y.numpy(), names=["fog", "stripe"], severities=(2, 5),
                               seed=7)
    assert list(sets) == ["fog", "stripe"]
    n = gray.shape[0]
    for name, (xc, yc) in sets.items():
        assert xc.shape == (2 * n, 1, 28, 28) and yc.dtype == torch.int64
        assert torch.equal(yc, torch.cat([y, y]))
        assert torch.equal(xc[:n], corrupt(gray, name, 2, seed=7))
        assert torch.equal(xc[n:], corrupt(gray, name, 5, seed=7))
    every = corrupted_test_sets(gray[:2, 0], y[:2], severities=(1,))
    assert list(every) == list(CORRUPTIONS) and every["zoom"][0].shape == (2, 28, 28)


def test_bad_input_is_refused_with_the_accepted_values(gray):
    with pytest.raises(ValueError, match=r"name must be one of \['brightness', 'contrast'"):
        corrupt(gray, "snow")
    with pytest.raises(ValueError, match=r"severity must be an integer in \[1, 5\]"):
        corrupt(gray, "fog", 6)
    with pytest.raises(ValueError, match=r"must lie in \[0, 1\]"):
        corrupt(gray * 255, "fog")
    with pytest.raises(ValueError, match=r"must lie in \[0, 1\]"):
        corrupt(gray * float("nan"), "fog")
    with pytest.raises(TypeError, match="float images in"):
        corrupt((gray * 255).to(torch.uint8), "fog")
    with pytest.raises(TypeError, match="float images in"):
        corrupt(np.zeros((2, 28, 28), np.uint8), "fog")
    with pytest.raises(ValueError, match=r"shape \(N, C, H, W\) or \(N, H, W\)"):
        corrupt(gray[0, 0], "fog")
    with pytest.raises(TypeError, match="float tensor of images"):
        corrupt([[0.0]], "fog")
    with pytest.raises(ValueError, match="seed must be an integer"):
        corrupt(gray, "fog", seed=-1)
    y = torch.zeros(gray.shape[0], dtype=torch.int64)
    with pytest.raises(ValueError, match=r"unknown corruptions \['snow'\]; choose from"):
        corrupted_test_sets(gray, y, names=["fog", "snow"])
    with pytest.raises(ValueError, match="distinct integers in 1..5"):
        corrupted_test_sets(gray, y, severities=(1, 1))
    with pytest.raises(ValueError, match=r"y must have shape \(40,\)"):
        corrupted_test_sets(gray, y[:3])
    with pytest.raises(TypeError, match="integer class labels"):
        corrupted_test_sets(gray, y.float())
