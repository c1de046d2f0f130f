"""CoTTA's test-time augmentations in pure torch, one draw per batch.

Follows CoTTA's cifar/cotta.py (get_tta_transforms) on torchvision 0.11's
tensor code paths; the order of the random draws: docs/methods.md.
"""
import math
import numbers
from typing import Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

Range = Optional[Tuple[float, float]]

#: ``rgb_to_grayscale`` weights of torchvision (ITU-R 601-2 luma).
GRAY_WEIGHTS = (0.2989, 0.587, 0.114)


def _check_rgb(img: torch.Tensor) -> None:
    if img.dim() < 3 or img.shape[-3] != 3:
        raise ValueError('colour augmentations need RGB images [..., 3, H, W]'
                         f', got shape {tuple(img.shape)}')


def _blend(img1: torch.Tensor, img2: torch.Tensor,
           ratio: float) -> torch.Tensor:
    return (ratio * img1 + (1.0 - ratio) * img2).clamp(0, 1.0)


def rgb_to_grayscale(img: torch.Tensor) -> torch.Tensor:
    """Return the luma ``[..., 1, H, W]`` of RGB images."""
    _check_rgb(img)
    r, g, b = img.unbind(dim=-3)
    gray = GRAY_WEIGHTS[0] * r + GRAY_WEIGHTS[1] * g + GRAY_WEIGHTS[2] * b
    return gray.to(img.dtype).unsqueeze(dim=-3)


def adjust_brightness(img: torch.Tensor, factor: float) -> torch.Tensor:
    return _blend(img, torch.zeros_like(img), factor)


def adjust_contrast(img: torch.Tensor, factor: float) -> torch.Tensor:
    """Blend with the per-image mean of the grayscale image."""
    mean = rgb_to_grayscale(img).mean(dim=(-3, -2, -1), keepdim=True)
    return _blend(img, mean, factor)


def adjust_saturation(img: torch.Tensor, factor: float) -> torch.Tensor:
    return _blend(img, rgb_to_grayscale(img), factor)


def rgb_to_hsv(img: torch.Tensor) -> torch.Tensor:
    """RGB -> HSV in [0, 1] (torchvision's ``_rgb2hsv``)."""
    _check_rgb(img)
    r, g, b = img.unbind(dim=-3)
    maxc = img.max(dim=-3).values
    minc = img.min(dim=-3).values
    eqc = maxc == minc
    cr = maxc - minc
    ones = torch.ones_like(maxc)
    s = cr / torch.where(eqc, ones, maxc)
    cr_divisor = torch.where(eqc, ones, cr)
    rc = (maxc - r) / cr_divisor
    gc = (maxc - g) / cr_divisor
    bc = (maxc - b) / cr_divisor
    hr = (maxc == r) * (bc - gc)
    hg = ((maxc == g) & (maxc != r)) * (2.0 + rc - bc)
    hb = ((maxc != g) & (maxc != r)) * (4.0 + gc - rc)
    h = hr + hg + hb
    h = torch.fmod((h / 6.0 + 1.0), 1.0)
    return torch.stack((h, s, maxc), dim=-3)


def hsv_to_rgb(img: torch.Tensor) -> torch.Tensor:
    """HSV -> RGB (torchvision's ``_hsv2rgb``)."""
    h, s, v = img.unbind(dim=-3)
    i = torch.floor(h * 6.0)
    f = (h * 6.0) - i
    i = i.to(torch.int64) % 6
    p = (v * (1.0 - s)).clamp(0.0, 1.0)
    q = (v * (1.0 - s * f)).clamp(0.0, 1.0)
    t = (v * (1.0 - s * (1.0 - f))).clamp(0.0, 1.0)
    index = i.unsqueeze(dim=-3)

    def pick(*candidates):
        return torch.stack(candidates, dim=-3).gather(-3, index)

    return torch.cat((pick(v, q, p, p, t, v), pick(t, v, v, q, p, p),
                      pick(p, p, t, v, v, q)), dim=-3)


def adjust_hue(img: torch.Tensor, factor: float) -> torch.Tensor:
    """Rotate the hue by ``factor``, a fraction of the colour wheel in
    ``[-0.5, 0.5]``."""
    if not -0.5 <= factor <= 0.5:
        raise ValueError(f'hue factor {factor} is not in [-0.5, 0.5]')
    h, s, v = rgb_to_hsv(img).unbind(dim=-3)
    h = (h + factor) % 1.0
    return hsv_to_rgb(torch.stack((h, s, v), dim=-3))


def adjust_gamma(img: torch.Tensor, gamma: float) -> torch.Tensor:
    return (img ** gamma).clamp(0, 1)


def inverse_affine_matrix(angle: float, translate: Sequence[float],
                          scale: float) -> list:
    """Return torchvision's ``_get_inverse_affine_matrix`` (2x3, as a list)
    without shear."""
    rot = math.radians(angle)
    tx, ty = translate
    cos, sin = math.cos(rot), math.sin(rot)
    matrix = [x / scale for x in (cos, sin, 0.0, -sin, cos, 0.0)]
    matrix[2] += matrix[0] * (-tx) + matrix[1] * (-ty)
    matrix[5] += matrix[3] * (-tx) + matrix[4] * (-ty)
    return matrix


def affine(img: torch.Tensor, angle: float, translate: Sequence[float],
           scale: float, fill: float = 0.0,
           crop: Optional[Tuple[int, int]] = None) -> torch.Tensor:
    """Warp ``img [N, C, H, W]`` about its centre, as torchvision's affine;
    ``crop``: compute only this centre crop."""
    n, c, h, w = img.shape
    m = inverse_affine_matrix(angle, translate, scale)
    # from pixel to affine_grid's normalised coordinates
    theta = torch.tensor([[m[0], m[1] * h / w, 2.0 * m[2] / w],
                          [m[3] * w / h, m[4], 2.0 * m[5] / h]],
                         dtype=img.dtype, device=img.device)
    grid = F.affine_grid(theta.unsqueeze(0), [1, c + 1, h, w],
                         align_corners=False)
    if crop is not None:
        grid = center_crop(grid.permute(0, 3, 1, 2), crop).permute(0, 2, 3, 1)
    oh, ow = grid.shape[1:3]
    ones = torch.ones((n, 1, h, w), dtype=img.dtype, device=img.device)
    out = F.grid_sample(torch.cat((img, ones), dim=1),
                        grid.expand(n, oh, ow, 2), mode='bilinear',
                        padding_mode='zeros', align_corners=False)
    out, mask = out[:, :-1], out[:, -1:].expand(n, c, oh, ow)
    return out * mask + (1.0 - mask) * fill


def gaussian_blur(img: torch.Tensor, kernel_size: int,
                  sigma: float, pad: bool = True) -> torch.Tensor:
    """Blur ``img [N, C, H, W]`` separably, as torchvision's GaussianBlur,
    with reflect padding (``pad``) or over the valid pixels only."""
    if sigma <= 0:
        raise ValueError(f'sigma must be positive, got {sigma}')
    # torchvision's _get_gaussian_kernel1d
    pos = torch.linspace(-(kernel_size - 1) * 0.5, (kernel_size - 1) * 0.5,
                         steps=kernel_size, dtype=img.dtype,
                         device=img.device)
    pdf = torch.exp(-0.5 * (pos / sigma).pow(2))
    k = pdf / pdf.sum()
    half = kernel_size // 2
    if pad:
        x = F.pad(img, [half, half, half, half], mode='reflect')
        h, w = img.shape[-2:]
    else:
        x = img
        h, w = img.shape[-2] - 2 * half, img.shape[-1] - 2 * half
    # shifted views: faster on CPU than a depthwise conv with a tiny kernel
    rows = sum(k[i] * x[..., i:i + h, :] for i in range(kernel_size))
    return sum(k[i] * rows[..., i:i + w] for i in range(kernel_size))


def center_crop(img: torch.Tensor, size: Tuple[int, int]) -> torch.Tensor:
    h, w = img.shape[-2:]
    th, tw = size
    top = int(round((h - th) / 2.0))
    left = int(round((w - tw) / 2.0))
    return img[..., top:top + th, left:left + tw]


def _range(value, name: str, center: float = 1.0,
           bound: Tuple[float, float] = (0.0, float('inf')),
           clip_first_on_zero: bool = True) -> Range:
    """Check a jitter range as torchvision's ``ColorJitter._check_input``."""
    if value is None:
        return None
    if isinstance(value, numbers.Number):
        if value < 0:
            raise ValueError(f'if {name} is a single number, it must be '
                             'non-negative')
        value = [center - float(value), center + float(value)]
        if clip_first_on_zero:
            value[0] = max(value[0], 0.0)
    elif isinstance(value, (tuple, list)) and len(value) == 2:
        value = [float(value[0]), float(value[1])]
        if not bound[0] <= value[0] <= value[1] <= bound[1]:
            raise ValueError(f'{name} values should be between {bound}, '
                             f'got {value}')
    else:
        raise TypeError(f'{name} should be a number, a (min, max) pair or '
                        f'None, got {value!r}')
    if value[0] == value[1] == center:
        return None
    return value[0], value[1]


def _uniform(low: float, high: float) -> float:
    """Draw one float32 from torch's global generator, as torchvision."""
    return float(torch.empty(1).uniform_(low, high).item())


def cotta_augment_params(soft: bool = False,
                         gaussian_std: float = 0.005) -> dict:
    """Return :class:`CoTTAAugment`'s arguments of CoTTA's presets."""
    return dict(
        brightness=(0.8, 1.2) if soft else (0.6, 1.4),
        contrast=(0.85, 1.15) if soft else (0.7, 1.3),
        saturation=(0.75, 1.25) if soft else (0.5, 1.5),
        hue=(-0.03, 0.03) if soft else (-0.06, 0.06),
        gamma=(0.85, 1.15) if soft else (0.7, 1.3),
        pad_fraction=0.5,
        degrees=(-8.0, 8.0) if soft else (-15.0, 15.0),
        translate=(1 / 16, 1 / 16),
        scale=(0.95, 1.05) if soft else (0.9, 1.1),
        blur_kernel=5,
        blur_sigma=(0.001, 0.25) if soft else (0.001, 0.5),
        hflip_prob=0.5,
        noise_std=gaussian_std,
        clip=(0.0, 1.0))


def _floats(values):
    """``values`` as a tuple of floats; None stays None."""
    return None if values is None else tuple(map(float, values))


class CoTTAAugment:
    """CoTTA's augmentation chain as one callable on a batch.

    Follows CoTTA's cifar/cotta.py (get_tta_transforms); the options (each
    None to turn a step off) and the order of the random draws:
    docs/methods.md (CoTTA). ``mean``, ``std``: a normalisation of the
    inputs, undone around the augmentation.

    Raises:
        ValueError: If an argument is out of range.
    """

    def __init__(self,
                 brightness=(0.6, 1.4),
                 contrast=(0.7, 1.3),
                 saturation=(0.5, 1.5),
                 hue=(-0.06, 0.06),
                 gamma=(0.7, 1.3),
                 pad_fraction: float = 0.5,
                 degrees=(-15.0, 15.0),
                 translate=(1 / 16, 1 / 16),
                 scale=(0.9, 1.1),
                 blur_kernel: int = 5,
                 blur_sigma=(0.001, 0.5),
                 hflip_prob: Optional[float] = 0.5,
                 noise_std: Optional[float] = 0.005,
                 clip=(0.0, 1.0),
                 mean: Optional[Sequence[float]] = None,
                 std: Optional[Sequence[float]] = None):
        self.brightness = _range(brightness, 'brightness')
        self.contrast = _range(contrast, 'contrast')
        self.saturation = _range(saturation, 'saturation')
        self.hue = _range(hue, 'hue', center=0.0, bound=(-0.5, 0.5),
                          clip_first_on_zero=False)
        self.gamma = _range(gamma, 'gamma')
        if not pad_fraction >= 0:
            raise ValueError(f'pad_fraction must be >= 0, got {pad_fraction}')
        self.pad_fraction = float(pad_fraction)
        if isinstance(degrees, numbers.Number):
            degrees = (-float(degrees), float(degrees))
        self.degrees, self.translate = _floats(degrees), _floats(translate)
        if translate is not None and not all(
                0.0 <= t <= 1.0 for t in self.translate):
            raise ValueError(f'translate values must be in [0, 1], got '
                             f'{self.translate}')
        self.scale = _floats(scale)
        if scale is not None and not all(s > 0 for s in self.scale):
            raise ValueError(f'scale values must be positive, got '
                             f'{self.scale}')
        self.blur_kernel = int(blur_kernel)
        self.blur_sigma = _floats(blur_sigma)
        if self.blur_sigma is not None and (
                self.blur_kernel <= 0 or self.blur_kernel % 2 == 0):
            raise ValueError(f'blur_kernel must be odd and positive, got '
                             f'{blur_kernel}')
        self.hflip_prob = None if hflip_prob is None else float(hflip_prob)
        self.noise_std = None if noise_std is None else float(noise_std)
        self.clip = _floats(clip)
        if (mean is None) != (std is None):
            raise ValueError('give both mean and std, or neither')
        self.mean, self.std = _floats(mean), _floats(std)

    def color_jitter(self, img: torch.Tensor) -> torch.Tensor:
        """Jitter colours in a random order, as ``ColorJitterPro``."""
        ops = (self.brightness, self.contrast, self.saturation, self.hue,
               self.gamma)
        if all(op is None for op in ops):
            return img
        # the authors clamp before gamma (NaN gradients of x**gamma at 0)
        fns = (adjust_brightness, adjust_contrast, adjust_saturation,
               adjust_hue, lambda x, f: adjust_gamma(x.clamp(1e-8, 1.0), f))
        for fn_id in torch.randperm(5).tolist():
            if ops[fn_id] is not None:
                img = fns[fn_id](img, _uniform(*ops[fn_id]))
        return img

    def affine_params(self, width: int,
                      height: int) -> Tuple[float, Tuple[int, int], float]:
        """Draw angle, integer translation and scale (RandomAffine)."""
        angle = 0.0 if self.degrees is None else _uniform(*self.degrees)
        tx = ty = 0
        if self.translate is not None:
            max_d = (float(self.translate[0] * width),
                     float(self.translate[1] * height))
            tx, ty = (int(round(_uniform(-m, m))) for m in max_d)
        scale = 1.0 if self.scale is None else _uniform(*self.scale)
        return angle, (tx, ty), scale

    def augment01(self, x: torch.Tensor) -> torch.Tensor:
        """Augment a batch of images in ``[0, 1]``."""
        if x.dim() != 4:
            raise ValueError(f'CoTTAAugment needs images [N, C, H, W], got '
                             f'shape {tuple(x.shape)}')
        h, w = x.shape[-2:]
        if self.clip is not None:
            x = x.clamp(*self.clip)
        x = self.color_jitter(x)
        ph, pw = int(h * self.pad_fraction), int(w * self.pad_fraction)
        if ph or pw:
            x = F.pad(x, [pw, pw, ph, ph], mode='replicate')
        # only the final crop (+ the blur margin) is warped and blurred
        half = self.blur_kernel // 2 if self.blur_sigma is not None else 0
        window = (h + 2 * half, w + 2 * half) \
            if ph >= half and pw >= half else None
        if not (self.degrees is None and self.translate is None
                and self.scale is None):
            angle, translate, scale = self.affine_params(x.shape[-1],
                                                         x.shape[-2])
            x = affine(x, angle, translate, scale, crop=window)
        elif window is not None:
            x = center_crop(x, window)
        if self.blur_sigma is not None:
            sigma = _uniform(*self.blur_sigma)
            x = gaussian_blur(x, self.blur_kernel, sigma,
                              pad=window is None)
        x = center_crop(x, (h, w))
        if self.hflip_prob is not None and \
                bool(torch.rand(1) < self.hflip_prob):
            x = x.flip(-1)
        if self.noise_std is not None:
            noise = torch.randn(x.size()) * self.noise_std
            x = x + noise.to(device=x.device, dtype=x.dtype)
        if self.clip is not None:
            x = x.clamp(*self.clip)
        return x

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.mean is None:
            return self.augment01(x)
        mean, std = (torch.tensor(v, dtype=x.dtype, device=x.device).view(
            1, -1, 1, 1) for v in (self.mean, self.std))
        return (self.augment01(x * std + mean) - mean) / std

    def __repr__(self) -> str:
        # the options, in the order __init__ sets them
        args = ', '.join(f'{f}={v}' for f, v in vars(self).items())
        return f'{type(self).__name__}({args})'
