"""`clipart-scenes`: scenes of several clip-art drawings on white, each pixel labelled with its drawing's class.

A segmentation set built on `clipart` (clipart.py): the drawings of one split (val scenes hold only val drawings),
their classes 1..C, background 0. A scene is a list of objects (drawing, scale, x, y): k drawings (`objects`, a range)
each a square of `scale` (a range) of the canvas side at a place given as fractions of the free room, painted in order
(a later one covers an earlier one). Labels come from the alpha of each drawing's RGBA render: a pixel where the
drawing's alpha is at least 0.5 gets its class.

- evaluation scenes are fixed by the item index (the same scene in every run and at every size);
  `render(i, R)` is that scene drawn at R px (the upsample protocol: more pixels, finer detail, objects at the same
  place and relative size); `render_canvas(i, (H, W))` is a field of view: an H x W canvas with objects at their
  training pixel size and proportionally more of them (k x HW / R^2), so the base canvas is the same scene as render;
- training scenes are drawn anew for every item (from torch's RNG, which the loader seeds), with horizontal flips.

A drawing that does not render at some size is left out of the scene and reported through `pop_skipped()`.
"""

from __future__ import annotations

import os

import numpy as np
import torch
from torch.utils.data import Dataset

from ..registry import register_dataset
from ..splits import split_kind, split_size
from .clipart import MEAN, STD, ClipArt, RenderError
from .clipart_index import DEFAULT_ROOT, EXCLUDE, MIN_DRAWINGS, VAL_PERCENT

__all__ = ["ClipArtScenes", "clipart_scenes", "ALPHA_THRESHOLD"]

ALPHA_THRESHOLD = 0.5  # a pixel belongs to a drawing where its alpha is at least this
MIN_OBJECT_PX = 4  # the smallest side a drawing is rendered at


def _range(value, name: str, low: float, high: float, integer: bool = False) -> tuple:
    """A [min, max] option within [low, high]; a one-line ValueError otherwise."""
    try:
        a, b = (int(v) if integer else float(v) for v in value)
    except (TypeError, ValueError):
        a = b = None
    if a is None or not low <= a <= b <= high:
        raise ValueError(f"clipart-scenes option {name} must be [min, max] with {low:g} <= min <= max <= {high:g}, "
                         f"got {value!r}")  # fmt: skip
    return a, b


class ClipArtScenes(Dataset):
    """Items are (image [3, R, R] normalised, labels [R, R] int64: 0 background, 1..C the drawings' classes)."""

    renders_detail = True  # render(i, R) draws the same scene at more pixels (the upsample protocol)

    def __init__(
        self,
        drawings: ClipArt,
        resolution: int = 32,
        num_scenes: int = 1000,
        objects: tuple[int, int] = (2, 4),
        scale: tuple[float, float] = (0.25, 0.5),
        augment: bool = False,
        hflip: float = 0.5,
        seed: int = 0,
    ):
        if num_scenes < 1:
            raise ValueError(f"clipart-scenes needs at least one scene per split, got {num_scenes}")
        self.drawings = drawings
        self.resolution, self.num_scenes = int(resolution), int(num_scenes)
        self.objects = _range(objects, "objects", 1, 64, integer=True)
        self.scale = _range(scale, "scale", 0.01, 1.0)
        self.augment, self.hflip, self.seed = augment, float(hflip), int(seed)
        self.split = drawings.split
        self.classes = ("background", *drawings.classes)
        self.num_classes = len(self.classes)
        self.mean = torch.tensor(MEAN).view(3, 1, 1)
        self.std = torch.tensor(STD).view(3, 1, 1)
        self._skipped: list[str] = []

    def __len__(self) -> int:
        return self.num_scenes

    def layout(self, index: int, count_factor: float = 1.0) -> list[tuple[int, float, float, float]]:
        """The objects (drawing, scale, x, y) of scene `index`: fixed by the index in evaluation, new each call in
        training; `count_factor` multiplies their number (the first ones are the same)."""
        if self.augment:
            rng = np.random.default_rng(int(torch.randint(0, 2**62, ()).item()))
        else:
            rng = np.random.default_rng([self.seed, 0 if self.split == "train" else 1, int(index)])
        k = int(rng.integers(self.objects[0], self.objects[1] + 1))
        n = max(1, round(k * count_factor))
        return [(int(rng.integers(len(self.drawings))), float(rng.uniform(*self.scale)), float(rng.uniform()),
                 float(rng.uniform())) for _ in range(n)]  # fmt: skip

    def paint(self, objects: list, size: tuple[int, int], side_px) -> tuple[torch.Tensor, torch.Tensor]:
        """(image [3, H, W] normalised, labels [H, W]) of `objects` on a white H x W canvas; side_px(scale) is an
        object's side in px."""
        h, w = size
        rgb = np.ones((h, w, 3), dtype=np.float32)
        labels = np.zeros((h, w), dtype=np.int64)
        for drawing, scale, x, y in objects:
            d = min(max(MIN_OBJECT_PX, round(side_px(scale))), h, w)
            try:
                rgba = self.drawings.drawing(drawing, d, alpha=True).astype(np.float32) / 255.0
            except RenderError as e:
                self._skipped.append(f"{self.drawings.root / self.drawings.paths[drawing]} ({e})")
                continue
            top, left = round(y * (h - d)), round(x * (w - d))
            a = rgba[..., 3:]
            region = rgb[top : top + d, left : left + d]
            region[:] = rgba[..., :3] * a + region * (1.0 - a)
            labels[top : top + d, left : left + d][a[..., 0] >= ALPHA_THRESHOLD] = self.drawings.labels[drawing] + 1
        image = (torch.from_numpy(rgb).permute(2, 0, 1) - self.mean) / self.std
        target = torch.from_numpy(labels)
        if self.augment and self.hflip > 0 and torch.rand(()) < self.hflip:
            image, target = image.flip(-1), target.flip(-1)
        return image, target

    def render(self, index: int, resolution: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Scene `index` at R x R px: objects at the same relative place and size at every R."""
        r = int(resolution)
        return self.paint(self.layout(index), (r, r), lambda s: s * r)

    def render_canvas(self, index: int, size: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Field of view: an H x W canvas with objects at their training pixel size, k x HW / R^2 of them (R the
        training resolution); at (R, R) it is render(index, R)."""
        h, w = (int(s) for s in size)
        r = self.resolution
        if min(h, w) < r * self.scale[1]:
            raise ValueError(f"a {h} x {w} px canvas cannot hold the scenes' {r * self.scale[1]:g} px objects; use "
                             f"sizes of at least {r} px")  # fmt: skip
        return self.paint(self.layout(index, h * w / r**2), (h, w), lambda s: s * r)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.render(index, self.resolution)

    def pop_skipped(self) -> list[str]:
        """Drawings left out of scenes since the last call (they did not render)."""
        skipped, self._skipped = self._skipped + self.drawings.pop_skipped(), []
        return skipped


@register_dataset("clipart-scenes", num_classes=None, in_chans=3, kind="segmentation")
def clipart_scenes(
    split: str = "train",
    resolution: int = 32,
    root: str | None = None,
    training: bool = False,
    aug: dict | None = None,
    num_train: int = 2000,
    num_val: int = 200,
    objects: list[int] | tuple[int, int] = (2, 4),
    scale: list[float] | tuple[float, float] = (0.25, 0.5),
    min_drawings: int = MIN_DRAWINGS,
    exclude: list[str] | tuple[str, ...] = EXCLUDE,
    val_percent: int = VAL_PERCENT,
    max_per_class: int | None = None,
    cache_dir: str | os.PathLike | None = None,
    render_cache: bool = True,
    render_timeout: float = 20.0,
) -> ClipArtScenes:
    """Scenes of `objects` clip-art drawings (clipart's classes and split) on white, a label per pixel (0:
    background); num_train / num_val scenes per split (training draws new scenes for every item)."""
    drawings = ClipArt(
        root or DEFAULT_ROOT, split, resolution, augment=False, min_drawings=min_drawings, exclude=tuple(exclude or ()),
        val_percent=val_percent, max_per_class=max_per_class, cache_dir=cache_dir, render_cache=render_cache,
        render_timeout=render_timeout,
    )  # fmt: skip
    scenes = split_size(split, None, num_train, num_val)
    return ClipArtScenes(
        drawings, resolution, scenes, tuple(objects), tuple(scale), augment=training and split_kind(split) == "train",
        hflip=(aug or {}).get("hflip", 0.5),
    )  # fmt: skip
