"""Canvases of varied shape: a built-in set with native aspect ratios for native-aspect training (no download).

`AspectCanvas` gives item i of a dataset that renders items (`render(index, R)`) a canvas of its own shape: aspect
ratio W / H drawn log-uniformly in [1 / max_aspect, max_aspect], area `side`^2, every side at least the item's
size. The item sits at a random place on it (training: the global torch RNG, seeded per item by the loader;
evaluation: a generator seeded by the index). Drawn at another size (`render_size`), the canvas is scaled as a
whole: the item by the same factor, at the same relative place.

`fashion-mnist-native` registers Fashion-MNIST this way (28 px garments on canvases of 1:3 to 3:1 by default).
"""

from __future__ import annotations

import math

import torch
from torch.utils.data import Dataset

from ..registry import register_dataset
from ..seeding import mix_seed
from . import fashion_mnist as fm
from .canvas import OnCanvas, place

__all__ = ["AspectCanvas", "fashion_mnist_native"]


class AspectCanvas(OnCanvas):
    """Items of `base` on canvases of varied aspect ratio; `native_size(i)`, `render_size(i, (H, W))`."""

    def __init__(
        self, base: Dataset, item: int, side: int, max_aspect: float, fill: float, training: bool, seed: int = 0
    ):
        super().__init__(base, fill, training, seed)
        if max_aspect < 1:
            raise ValueError(f"max_aspect must be at least 1 (1: square canvases), got {max_aspect}")
        self.item, self.side, self.max_aspect = int(item), int(side), float(max_aspect)
        g = torch.Generator().manual_seed(mix_seed(self.seed, 0xA5C))
        log_ar = (2 * torch.rand(len(base), generator=g, dtype=torch.float64) - 1) * math.log(self.max_aspect)
        ar = log_ar.exp()  # W / H
        self.heights = (self.side / ar.sqrt()).round().clamp(min=self.item).long()
        self.widths = (self.side * ar.sqrt()).round().clamp(min=self.item).long()

    def native_size(self, index: int) -> tuple[int, int]:
        return int(self.heights[index]), int(self.widths[index])

    def render_size(self, index: int, size: tuple[int, int]) -> tuple[torch.Tensor, int]:
        """Item `index`'s canvas drawn at `size` (H, W), scaled as a whole from its native size."""
        H, W = int(size[0]), int(size[1])
        h, w = self.native_size(index)
        px = max(1, min(H, W, round(self.item * math.sqrt(H * W / (h * w)))))
        image, target = self.base.render(index, px)
        g = None if self.training else torch.Generator().manual_seed(mix_seed(self.seed, index))
        u = torch.rand(2, generator=g).tolist()
        top, left = round(u[0] * (H - px)), round(u[1] * (W - px))
        return place(image, (H, W), top, left, self.fill), target

    def render(self, index: int, resolution: int) -> tuple[torch.Tensor, int]:
        return self.render_size(index, (resolution, resolution))

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return self.render_size(index, self.native_size(index))


def _native_canvas_augmentation(options: dict, aug: dict) -> str:
    garment = fm.garment_augmentation({"shift": 0, **options, "crop": "shift"}, aug)
    where = "the garment at a random position on a canvas of its item's aspect ratio"
    return where + ("" if garment == "none" else f"; {garment}")


@register_dataset(
    "fashion-mnist-native", num_classes=10, in_chans=1, kind="image", augmentation=_native_canvas_augmentation
)
def fashion_mnist_native(
    split: str = "train",
    resolution: int = 32,
    root: str | None = None,
    training: bool = False,
    item: int = 28,
    side: int = 56,
    max_aspect: float = 3.0,
    shift: int = 0,
    num_train: int | None = None,
    num_val: int | None = None,
    aug: dict | None = None,
) -> AspectCanvas:
    """Fashion-MNIST garments of `item` px on canvases of area `side`^2 px and aspect ratio 1:max_aspect to
    max_aspect:1 (per item); the placement is the translation augmentation. Square sizes (`render`) serve the
    usual evaluation at eval.resolutions."""
    base = fm.fashion_mnist(
        split, item, root, training=training, shift=shift, num_train=num_train, num_val=num_val, aug=aug
    )
    split_seed = 0 if split == "train" else 1
    return AspectCanvas(base, item, side, max_aspect, fm.BLACK, training, seed=split_seed)
