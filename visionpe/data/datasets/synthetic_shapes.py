"""`synthetic-shapes`: a procedural image set rendered at any resolution, no download.

Each image holds one shape (disk, ring, bar, cross) of random size, rotation and colour on a noisy
background. The class is the shape *and* the quadrant it sits in (4 x 4 = 16 classes), so a model has to know where
things are, not only what they are: a model without positional information (NoPE with CLS pooling) cannot exceed
1/4 accuracy. Scenes live in continuous [0, 1]^2 coordinates and are rasterised with signed distance functions, so
the same item rendered at 16 or 64 px shows the same scene; everything is a function of (seed, split, index).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ..registry import register_dataset
from ..seeding import mix_seed
from ..splits import split_size
from .rendered import RenderedDataset, no_files

__all__ = ["SyntheticShapes", "SHAPES", "REGIONS", "CLASS_NAMES", "synthetic_shapes"]

SHAPES = ("disk", "ring", "bar", "cross")
REGIONS = ("top-left", "top-right", "bottom-left", "bottom-right")
CLASS_NAMES = tuple(f"{s}@{r}" for s in SHAPES for r in REGIONS)  # class = shape * 4 + region
MEAN, STD = 0.5, 0.25
DEFAULT_SIZES = {"train": 5000, "val": 1000}


def _sdf(shape: int, x: np.ndarray, y: np.ndarray, r: float) -> np.ndarray:
    """Signed distance (negative inside) to a shape of radius r centred at the origin, in shape coordinates."""
    if shape == 0:  # disk
        return np.sqrt(x * x + y * y) - r
    if shape == 1:  # ring: the disk with a hole of half its radius
        return np.abs(np.sqrt(x * x + y * y) - 0.75 * r) - 0.25 * r
    ax, ay = np.abs(x), np.abs(y)
    bar = np.maximum(ax - r, ay - 0.3 * r)  # half-length r, half-width 0.3 r
    if shape == 2:  # bar
        return bar
    return np.minimum(bar, np.maximum(ay - r, ax - 0.3 * r))  # cross: two bars


class SyntheticShapes(RenderedDataset, classes=CLASS_NAMES, default_sizes=DEFAULT_SIZES):
    """Shapes x quadrants; `render(i, resolution)` draws item i at any size, `self[i]` at the default size."""

    def __init__(self, split: str = "train", resolution: int = 32, **draw):
        """draw: num_samples (default: the class's split sizes), seed, noise (see RenderedDataset)."""
        super().__init__(split, **draw)
        self.resolution = int(resolution)

    def scene(self, index: int) -> dict:
        """The resolution-free description of item `index`."""
        u = np.random.default_rng(mix_seed(self.seed, self.split_id, index)).random(12).tolist()
        target = int(u[0] * len(CLASS_NAMES)) % len(CLASS_NAMES)
        shape, region = divmod(target, len(REGIONS))
        r = 0.12 + 0.08 * u[1]  # radius as a fraction of the side
        qx, qy = 0.5 * (region % 2), 0.5 * (region // 2)
        reach = 1.05 * r + 0.02  # the largest extent of any shape, plus a margin: the shape stays in its quadrant
        cx = qx + reach + (0.5 - 2 * reach) * u[2]
        cy = qy + reach + (0.5 - 2 * reach) * u[3]
        dark_on_light = u[4] < 0.5
        bg = [0.6 + 0.4 * v if dark_on_light else 0.35 * v for v in u[5:8]]
        fg = [0.35 * v if dark_on_light else 0.6 + 0.4 * v for v in u[8:11]]
        return dict(
            target=target,
            shape=shape,
            region=region,
            radius=r,
            centre=(cx, cy),
            angle=2 * math.pi * u[11],
            bg=bg,
            fg=fg,
        )

    def render(self, index: int, resolution: int) -> tuple[torch.Tensor, int]:
        """Item `index` as a normalised image [3, R, R] and its class."""
        s = self.checked_scene(index)
        R = int(resolution)
        c = (np.arange(R, dtype=np.float32) + 0.5) / R  # pixel centres in [0, 1]
        x, y = (c - s["centre"][0])[None, :], (c - s["centre"][1])[:, None]  # broadcast to (R, R)
        cos, sin = math.cos(s["angle"]), math.sin(s["angle"])
        xr, yr = cos * x + sin * y, -sin * x + cos * y  # rotate the frame by -angle
        alpha = np.clip(0.5 - _sdf(s["shape"], xr, yr, s["radius"]) * R, 0, 1)  # one-pixel anti-aliasing
        bg = np.asarray(s["bg"], dtype=np.float32)[:, None, None]
        fg = np.asarray(s["fg"], dtype=np.float32)[:, None, None]
        img = bg + (fg - bg) * alpha  # (3, R, R)
        if self.noise > 0:
            rng = np.random.default_rng(mix_seed(self.seed, self.split_id, index, R))
            img = img + self.noise * rng.standard_normal((3, R, R), dtype=np.float32)
        img = torch.from_numpy(img.astype(np.float32))
        return (img - MEAN) / STD, s["target"]


@register_dataset("synthetic-shapes", num_classes=len(CLASS_NAMES), in_chans=3, kind="image")
def synthetic_shapes(
    split: str = "train",
    resolution: int = 32,
    root: str | None = None,
    num_train: int = 5000,
    num_val: int = 1000,
    seed: int = 0,
    noise: float = 0.05,
) -> SyntheticShapes:
    """16 classes (4 shapes x 4 quadrants) rendered procedurally at any resolution; num_train / num_val items."""
    no_files("synthetic-shapes", root)
    n = split_size(split, None, num_train, num_val)
    return SyntheticShapes(split, resolution, num_samples=n, seed=seed, noise=noise)
