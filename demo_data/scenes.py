"""A laptop-sized stand-in for Cityscapes -> ACDC, written in the real layouts.

Scenes are procedural street layouts labelled with Cityscapes train IDs and
textured with real photographs that ship with scikit-image (brick, grass,
gravel, astronaut, coffee, chelsea). Target conditions use real corruption
code from ``imagecorruptions`` (fog, snow) and this module's own rain
streaks and night (low light + sensor noise). Everything is seeded: the same
seed writes the same bytes.
"""
import json
import os
import os.path as osp
from functools import lru_cache
from typing import Dict, Sequence, Tuple

import cv2
import numpy as np

from .acdc_layout import acdc_paths, save_png

GENERATOR_VERSION = 1
CONDITIONS = ('fog', 'night', 'rain', 'snow')
# Cityscapes train IDs used by the scenes
ROAD, SIDEWALK, BUILDING, POLE, SIGN, VEGETATION, TERRAIN, SKY, PERSON, CAR \
    = 0, 1, 2, 5, 7, 8, 9, 10, 11, 13
IGNORE = 255


@lru_cache(maxsize=None)
def _photo(name: str) -> np.ndarray:
    """A bundled scikit-image photograph as float32 RGB in [0, 1]."""
    import skimage.data
    img = getattr(skimage.data, name)()
    if img.ndim == 2:
        img = np.repeat(img[..., None], 3, axis=2)
    return img[..., :3].astype(np.float32) / 255.0


def _texture(rng, name: str, shape: Tuple[int, int], tint, scale=1.0,
             contrast=1.0) -> np.ndarray:
    """A random crop of a photograph, resized and tinted."""
    photo = _photo(name)
    h, w = shape
    ph, pw = photo.shape[:2]
    ch = int(min(ph - 1, max(8, h * scale)))
    cw = int(min(pw - 1, max(8, w * scale)))
    y, x = rng.integers(0, ph - ch), rng.integers(0, pw - cw)
    crop = cv2.resize(photo[y:y + ch, x:x + cw], (w, h),
                      interpolation=cv2.INTER_LINEAR)
    gray = crop.mean(axis=2, keepdims=True)
    detail = (crop - gray) * 0.3 + (gray - gray.mean()) * contrast
    return np.clip(np.asarray(tint, np.float32) + detail, 0, 1)


def _paint(image, labels, mask, texture, label):
    image[mask] = texture[mask]
    labels[mask] = label


def render_scene(rng: np.random.Generator,
                 size: Tuple[int, int] = (256, 128)
                 ) -> Tuple[np.ndarray, np.ndarray]:
    """One street scene: ``(image uint8 HxWx3 RGB, labels uint8 HxW)``."""
    w, h = size
    yy, xx = np.mgrid[0:h, 0:w]
    image = np.zeros((h, w, 3), np.float32)
    labels = np.zeros((h, w), np.uint8)
    horizon = int(h * rng.uniform(0.35, 0.5))
    vx = w * rng.uniform(0.35, 0.65)

    sky_tint = np.array([0.45, 0.6, 0.85]) * rng.uniform(0.8, 1.1)
    sky = _texture(rng, 'hubble_deep_field', (h, w), sky_tint, contrast=0.2)
    sky *= (1.1 - 0.4 * yy / h)[..., None]
    _paint(image, labels, yy < h, np.clip(sky, 0, 1), SKY)

    # buildings: blocks standing on the horizon, brick-textured, windows
    x = 0
    while x < w:
        bw = int(rng.integers(w // 8, w // 3))
        top = int(rng.integers(2, max(3, horizon - 4)))
        tint = rng.uniform(0.3, 0.7, 3)
        block = (xx >= x) & (xx < x + bw) & (yy >= top) & (yy < horizon + 2)
        if rng.random() < 0.8:
            tex = _texture(rng, 'brick', (h, w), tint, scale=0.7)
            for _ in range(int(rng.integers(3, 9))):
                wy = int(rng.integers(top, max(top + 1, horizon - 3)))
                wx = int(rng.integers(x, x + max(1, bw - 3)))
                tex[wy:wy + 3, wx:wx + 3] *= 0.35
            _paint(image, labels, block, tex, BUILDING)
        else:  # a gap filled with trees
            crown = block & (yy >= top + (horizon - top) // 3)
            _paint(image, labels, crown,
                   _texture(rng, 'grass', (h, w), (0.2, 0.45, 0.15)),
                   VEGETATION)
        x += bw

    # ground: terrain, sidewalks and the road towards the vanishing point
    ground = yy >= horizon
    _paint(image, labels, ground,
           _texture(rng, 'grass', (h, w), (0.4, 0.5, 0.25), scale=0.5),
           TERRAIN)
    depth = np.clip((yy - horizon) / max(1, h - horizon), 0, 1)
    half_road = 2 + depth * w * rng.uniform(0.35, 0.5)
    half_walk = half_road + 1 + depth * w * rng.uniform(0.08, 0.18)
    walk = ground & (np.abs(xx - vx) < half_walk)
    _paint(image, labels, walk,
           _texture(rng, 'brick', (h, w), (0.62, 0.58, 0.55), scale=0.4,
                    contrast=0.5), SIDEWALK)
    road = ground & (np.abs(xx - vx) < half_road)
    _paint(image, labels, road,
           _texture(rng, 'gravel', (h, w), (0.33, 0.33, 0.35), scale=0.6,
                    contrast=0.6), ROAD)
    lane = road & (np.abs(xx - vx) < 0.6 + depth * 1.2) & \
        ((yy // 6) % 2 == 0)
    image[lane] = 0.85

    things = np.zeros((h, w), bool)
    # poles with traffic signs on the sidewalk
    for side in (-1, 1):
        if rng.random() < 0.7:
            py = int(rng.integers(horizon + (h - horizon) // 3, h - 2))
            d = (py - horizon) / max(1, h - horizon)
            px = int(vx + side * (half_road[py, 0] + 2 + d * 4))
            ph = int(6 + d * h * 0.5)
            pw = max(1, int(1 + d * 2))
            pole = (np.abs(xx - px) <= pw // 2) & (yy <= py) & \
                (yy > py - ph)
            _paint(image, labels, pole, np.full((h, w, 3), 0.35, np.float32),
                   POLE)
            sign = (np.abs(xx - px) <= pw + 2) & (yy > py - ph - 4) & \
                (yy <= py - ph + 1)
            _paint(image, labels, sign,
                   np.broadcast_to(np.array([0.9, 0.75, 0.1], np.float32),
                                   (h, w, 3)).copy(), SIGN)
            things |= pole | sign

    # cars on the road, persons on the sidewalks (far ones first)
    objects = []
    for _ in range(int(rng.integers(1, 4))):
        objects.append(('car', int(rng.integers(horizon + 3, h))))
    for _ in range(int(rng.integers(1, 4))):
        objects.append(('person', int(rng.integers(horizon + 3, h))))
    for kind, base in sorted(objects, key=lambda o: o[1]):
        d = (base - horizon) / max(1, h - horizon)
        if kind == 'car':
            cw, ch = int(8 + d * w * 0.35), int(5 + d * h * 0.3)
            cx = int(vx + rng.uniform(-0.8, 0.8) * half_road[base - 1, 0])
            body = (np.abs(xx - cx) < cw / 2) & (yy < base) & \
                (yy >= base - ch)
            tex = _texture(rng, 'coffee', (h, w), rng.uniform(0.1, 0.8, 3),
                           contrast=0.4)
            glass = body & (yy < base - ch * 0.55) & \
                (np.abs(xx - cx) < cw * 0.35)
            tex[glass] *= 0.3
            _paint(image, labels, body, tex, CAR)
            things |= body
        else:
            side = rng.choice([-1, 1])
            px = int(vx + side * (half_road[base - 1, 0] +
                                  0.5 * (half_walk - half_road)[base - 1, 0]))
            pw_, ph_ = max(2, int(2 + d * w * 0.04)), int(5 + d * h * 0.45)
            body = (((xx - px) / (pw_ / 2 + 0.5))**2 +
                    ((yy - (base - ph_ / 2)) / (ph_ / 2))**2) < 1
            tex = _texture(rng, 'astronaut', (h, w),
                           rng.uniform(0.1, 0.7, 3), contrast=0.7)
            _paint(image, labels, body, tex, PERSON)
            things |= body

    # void (ignored) pixels around object outlines, as in Cityscapes
    edges = cv2.morphologyEx(things.astype(np.uint8), cv2.MORPH_GRADIENT,
                             np.ones((2, 2), np.uint8)).astype(bool)
    labels[edges & ~things] = IGNORE
    light = rng.uniform(0.8, 1.15) * (1 + 0.1 * (xx / w - 0.5))[..., None]
    image = np.clip(image * light + rng.normal(0, 0.01, image.shape), 0, 1)
    return (image * 255).round().astype(np.uint8), labels


# --------------------------------------------------------------- weather
def _seeded_corrupt(image: np.ndarray, name: str, severity: int,
                    seed: int) -> np.ndarray:
    from imagecorruptions import corrupt
    state = np.random.get_state()
    np.random.seed(seed % (2**32))  # imagecorruptions draws from numpy's RNG
    try:
        return np.asarray(corrupt(image, corruption_name=name,
                                  severity=severity)).astype(np.uint8)
    finally:
        np.random.set_state(state)


def add_rain(image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Motion-blurred rain streaks over a darker, slightly blurred scene."""
    h, w = image.shape[:2]
    streaks = np.zeros((h, w), np.float32)
    n = int(h * w / 60)
    ys, xs = rng.integers(0, h, n), rng.integers(0, w, n)
    streaks[ys, xs] = rng.uniform(0.5, 1.0, n)
    length = max(3, h // 10)
    kernel = np.zeros((length, length), np.float32)
    cv2.line(kernel, (length // 2 + length // 6, 0),
             (length // 2 - length // 6, length - 1), 1.0, 1)
    streaks = cv2.filter2D(streaks, -1, kernel / kernel.sum() * 2.5)
    base = cv2.GaussianBlur(image.astype(np.float32) / 255, (3, 3), 0)
    base = base * 0.7 + 0.08
    out = base + streaks[..., None] * np.array([0.7, 0.75, 0.8])
    return (np.clip(out, 0, 1) * 255).round().astype(np.uint8)


def add_night(image: np.ndarray, rng: np.random.Generator,
              seed: int) -> np.ndarray:
    """Low light (gamma + blue tint) and sensor noise (imagecorruptions)."""
    img = (image.astype(np.float32) / 255)**1.8 * 0.45
    img *= np.array([0.75, 0.85, 1.2], np.float32)
    h, w = image.shape[:2]
    for _ in range(int(rng.integers(1, 4))):  # street lights
        cy, cx = rng.integers(0, h // 2), rng.integers(0, w)
        yy, xx = np.mgrid[0:h, 0:w]
        glow = np.exp(-((yy - cy)**2 + (xx - cx)**2) / (2 * (h / 8)**2))
        img += glow[..., None] * np.array([0.35, 0.3, 0.15])
    dark = (np.clip(img, 0, 1) * 255).round().astype(np.uint8)
    return _seeded_corrupt(dark, 'shot_noise', 2, seed)


def apply_condition(image: np.ndarray, condition: str, seed: int
                    ) -> np.ndarray:
    """The target-domain version of a clean image."""
    rng = np.random.default_rng(seed)
    if condition == 'fog':
        return _seeded_corrupt(image, 'fog', 4, seed)
    if condition == 'snow':
        return _seeded_corrupt(image, 'snow', 3, seed)
    if condition == 'rain':
        return add_rain(image, rng)
    if condition == 'night':
        return add_night(image, rng, seed)
    raise ValueError(f'unknown condition {condition!r}; choose from '
                     f'{CONDITIONS}')


# --------------------------------------------------------------- writers
def _scene(seed: int, index: int, size):
    return render_scene(np.random.default_rng([seed, index]), size)


def write_cityscapes_like(root: str, num_train: int, num_val: int,
                          size=(256, 128), seed: int = 0) -> None:
    """Clean source scenes in Cityscapes' layout
    (``leftImg8bit/<split>/<city>/*_leftImg8bit.png``,
    ``gtFine/<split>/<city>/*_gtFine_labelTrainIds.png``)."""
    for split, count, offset, city in (('train', num_train, 0, 'synthtown'),
                                       ('val', num_val, 10**6, 'synthcity')):
        for i in range(count):
            image, labels = _scene(seed, offset + i, size)
            name = f'{city}_{i // 100:06d}_{i % 100:06d}'
            save_png(osp.join(root, 'leftImg8bit', split, city,
                              f'{name}_leftImg8bit.png'), image)
            save_png(osp.join(root, 'gtFine', split, city,
                              f'{name}_gtFine_labelTrainIds.png'), labels)


def write_acdc_like(root: str, images_per_condition: int, size=(256, 128),
                    seed: int = 0, conditions: Sequence[str] = CONDITIONS,
                    split: str = 'train') -> None:
    """Target scenes (new layouts, unseen in training) under each weather
    condition, in ACDC's layout."""
    for c_idx, condition in enumerate(conditions):
        for i in range(images_per_condition):
            index = 2 * 10**6 + c_idx * 10**4 + i
            image, labels = _scene(seed, index, size)
            image = apply_condition(image, condition, seed * 7919 + index)
            img_path, gt_path = acdc_paths(root, condition, split,
                                           f'GOPR0{100 + c_idx * 10 + i // 5}',
                                           i)
            save_png(img_path, image)
            save_png(gt_path, labels)


def make_demo_benchmark(root: str,
                        size: Tuple[int, int] = (256, 128),
                        num_train: int = 240,
                        num_val: int = 16,
                        images_per_condition: int = 10,
                        seed: int = 0,
                        force: bool = False) -> Dict[str, str]:
    """Write ``<root>/cityscapes`` and ``<root>/acdc`` unless a manifest with
    the same parameters says they are there already."""
    params = dict(version=GENERATOR_VERSION, size=list(size),
                  num_train=num_train, num_val=num_val,
                  images_per_condition=images_per_condition, seed=seed)
    manifest = osp.join(root, 'manifest.json')
    paths = dict(cityscapes=osp.join(root, 'cityscapes'),
                 acdc=osp.join(root, 'acdc'))
    if not force and osp.isfile(manifest):
        with open(manifest) as f:
            if json.load(f) == params:
                return paths
    import shutil
    for path in paths.values():
        shutil.rmtree(path, ignore_errors=True)
    write_cityscapes_like(paths['cityscapes'], num_train, num_val, size, seed)
    write_acdc_like(paths['acdc'], images_per_condition, size, seed)
    os.makedirs(root, exist_ok=True)
    with open(manifest, 'w') as f:
        json.dump(params, f)
    return paths
