"""CoTTA's augmentations (``mmseg_stag.core.methods.cotta_transforms``: the
authors' ``cifar/my_transforms.py`` and ``get_tta_transforms`` of
github.com/qinenergy/cotta, on the tensor paths of torchvision 0.11) against
hand computations."""
import math

import pytest
import torch
import torch.nn.functional as F
from reference.adaptation_testbed import unit_images as batch

from mmseg_stag.core.methods import cotta_transforms as A


def test_augment_shape_range_and_identity_settings():
    x = batch(1, n=4, size=12)
    aug = A.CoTTAAugment()
    torch.manual_seed(0)
    for _ in range(5):
        y = aug(x)
        assert y.shape == x.shape and y.dtype == x.dtype
        assert y.min() >= 0 and y.max() <= 1
    assert aug(x.float()).dtype == torch.float32
    # out-of-range inputs are clipped too
    y = aug(3 * x - 1)
    assert y.min() >= 0 and y.max() <= 1
    identity = A.CoTTAAugment(brightness=None, contrast=None,
                              saturation=None, hue=None, gamma=None,
                              degrees=None, translate=None, scale=None,
                              blur_sigma=None, hflip_prob=None,
                              noise_std=None)
    state = torch.get_rng_state()
    assert torch.equal(identity(x), x)
    assert torch.equal(torch.get_rng_state(), state)  # nothing drawn
    # neutral ranges (torchvision's ColorJitter: disabled), zero-width
    # affine/blur/noise ranges: the input up to float error
    neutral = A.CoTTAAugment(brightness=(1, 1), contrast=(1, 1),
                             saturation=(1, 1), hue=(0, 0), gamma=(1, 1),
                             degrees=(0, 0), translate=(0, 0),
                             scale=(1, 1), blur_sigma=(1e-4, 1e-4),
                             hflip_prob=0.0, noise_std=0.0)
    assert neutral.brightness is None and neutral.hue is None
    torch.testing.assert_close(neutral(x), x, rtol=0, atol=1e-12)


def test_color_ops_neutral_factors_and_hand_values():
    x = batch(2, n=3, size=6)
    for fn in (A.adjust_brightness, A.adjust_contrast, A.adjust_saturation,
               A.adjust_gamma):
        torch.testing.assert_close(fn(x, 1.0), x)
    torch.testing.assert_close(A.adjust_hue(x, 0.0), x)
    torch.testing.assert_close(A.hsv_to_rgb(A.rgb_to_hsv(x)), x)
    torch.testing.assert_close(A.adjust_brightness(x, 1.5),
                               (1.5 * x).clamp(0, 1))
    gray = 0.2989 * x[:, 0] + 0.587 * x[:, 1] + 0.114 * x[:, 2]
    mean = gray.mean(dim=(1, 2)).view(-1, 1, 1, 1)
    torch.testing.assert_close(A.adjust_contrast(x, 0.7),
                               (0.7 * x + 0.3 * mean).clamp(0, 1))
    torch.testing.assert_close(A.adjust_saturation(x, 0.0),
                               gray.unsqueeze(1).expand_as(x))
    torch.testing.assert_close(A.adjust_gamma(x, 1.3), x ** 1.3)
    # pure colours: HSV by hand, a third of the wheel turns red into green
    red = torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64).view(1, 3, 1, 1)
    green = torch.tensor([0.0, 1.0, 0.0],
                         dtype=torch.float64).view(1, 3, 1, 1)
    torch.testing.assert_close(A.rgb_to_hsv(red).flatten(),
                               torch.tensor([0.0, 1.0, 1.0],
                                            dtype=torch.float64))
    torch.testing.assert_close(A.adjust_hue(red, 1 / 3), green)
    torch.testing.assert_close(A.adjust_hue(green, -1 / 3), red)
    cyan = torch.tensor([0.0, 0.5, 0.5], dtype=torch.float64).view(1, 3, 1,
                                                                   1)
    torch.testing.assert_close(A.rgb_to_hsv(cyan).flatten(),
                               torch.tensor([0.5, 1.0, 0.5],
                                            dtype=torch.float64))
    with pytest.raises(ValueError):
        A.adjust_hue(x, 0.6)


def test_geometric_ops_by_hand():
    x = batch(3, n=2, size=8)
    # clockwise rotation by 90 degrees (torchvision's affine convention)
    torch.testing.assert_close(A.affine(x, 90.0, (0, 0), 1.0),
                               torch.rot90(x, -1, (-2, -1)))
    torch.testing.assert_close(A.affine(x, 0.0, (0, 0), 1.0), x)
    # an integer shift moves the image, zero fill
    y = A.affine(x, 0.0, (2, -1), 1.0)
    torch.testing.assert_close(y[..., :-1, 2:], x[..., 1:, :-2])
    assert y[..., :2].abs().max() == 0 and y[..., -1, :].abs().max() == 0
    # torchvision's tensor affine, transcribed (_get_inverse_affine_matrix,
    # _gen_affine_grid, _apply_grid_transform with fill 0) on a non-square
    # image: pixel-centre grid about the centre, validity-mask blend
    img = batch(5, n=2, size=12)[..., :9, :]
    h, w = img.shape[-2:]
    angle, (tx, ty), sc = 33.0, (2, -1), 1.07
    rot = math.radians(angle)
    m = [math.cos(rot) / sc, math.sin(rot) / sc, 0.0,
         -math.sin(rot) / sc, math.cos(rot) / sc, 0.0]
    m[2] += m[0] * (-tx) + m[1] * (-ty)
    m[5] += m[3] * (-tx) + m[4] * (-ty)
    theta = torch.tensor(m, dtype=torch.float64).reshape(1, 2, 3)
    base = torch.empty(1, h, w, 3, dtype=torch.float64)
    base[..., 0].copy_(torch.linspace(-w * 0.5 + 0.5, w * 0.5 - 0.5, w))
    base[..., 1].copy_(torch.linspace(-h * 0.5 + 0.5, h * 0.5 - 0.5,
                                      h).unsqueeze(-1))
    base[..., 2].fill_(1)
    rescaled = theta.transpose(1, 2) / torch.tensor([0.5 * w, 0.5 * h],
                                                    dtype=torch.float64)
    grid = base.view(1, h * w, 3).bmm(rescaled).view(1, h, w, 2)
    sampled = F.grid_sample(
        torch.cat((img, torch.ones_like(img[:, :1])), 1),
        grid.expand(2, h, w, 2), mode='bilinear', padding_mode='zeros',
        align_corners=False)
    expected = sampled[:, :3] * sampled[:, 3:]
    torch.testing.assert_close(A.affine(img, angle, (tx, ty), sc), expected)
    # blur: reflect padding and the 2-D kernel outer(k, k)
    k = torch.exp(-0.5 * (torch.arange(-2., 3.,
                                       dtype=torch.float64) / 0.7) ** 2)
    k = k / k.sum()
    k2 = torch.outer(k, k).expand(3, 1, 5, 5)
    expected = F.conv2d(F.pad(x, [2, 2, 2, 2], mode='reflect'), k2,
                        groups=3)
    torch.testing.assert_close(A.gaussian_blur(x, 5, 0.7), expected)
    torch.testing.assert_close(A.gaussian_blur(x, 5, 1e-3), x)
    const = torch.full((1, 3, 6, 6), 0.3, dtype=torch.float64)
    torch.testing.assert_close(A.gaussian_blur(const, 5, 2.0), const)
    assert torch.equal(A.center_crop(F.pad(x, [4, 4, 4, 4]), (8, 8)), x)


def test_augment_pipeline_and_draw_order_by_hand():
    x = batch(4, n=2, size=8)
    aug = A.CoTTAAugment()
    torch.manual_seed(21)
    out = aug(x)
    torch.manual_seed(21)
    y = x.clamp(0, 1)
    order = torch.randperm(5).tolist()
    ranges = [(0.6, 1.4), (0.7, 1.3), (0.5, 1.5), (-0.06, 0.06), (0.7, 1.3)]
    for i in order:
        f = torch.empty(1).uniform_(*ranges[i]).item()
        if i == 0:
            y = (f * y).clamp(0, 1)
        elif i == 1:
            y = A.adjust_contrast(y, f)
        elif i == 2:
            y = A.adjust_saturation(y, f)
        elif i == 3:
            y = A.adjust_hue(y, f)
        else:
            y = y.clamp(1e-8, 1.0) ** f
    y = F.pad(y, [4, 4, 4, 4], mode='replicate')
    angle = torch.empty(1).uniform_(-15, 15).item()
    tx = int(round(torch.empty(1).uniform_(-1.0, 1.0).item()))  # 16 / 16
    ty = int(round(torch.empty(1).uniform_(-1.0, 1.0).item()))
    scale = torch.empty(1).uniform_(0.9, 1.1).item()
    y = A.affine(y, angle, (tx, ty), scale)
    y = A.gaussian_blur(y, 5, torch.empty(1).uniform_(0.001, 0.5).item())
    y = y[..., 4:12, 4:12]
    if torch.rand(1) < 0.5:
        y = y.flip(-1)
    y = (y + torch.randn(y.shape) * 0.005).clamp(0, 1)
    torch.testing.assert_close(out, y)
    # normalised inputs: mapped to [0, 1] and back around the same draws
    mean, std = (0.4, 0.5, 0.6), (0.2, 0.25, 0.3)
    m = torch.tensor(mean, dtype=torch.float64).view(1, 3, 1, 1)
    s = torch.tensor(std, dtype=torch.float64).view(1, 3, 1, 1)
    torch.manual_seed(21)
    out_n = A.CoTTAAugment(mean=mean, std=std)((x - m) / s)
    torch.testing.assert_close(out_n, (out - m) / s)
