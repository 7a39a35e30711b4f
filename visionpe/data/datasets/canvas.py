"""Field-of-view canvases: an item kept at its training scale, placed on a canvas of any size.

Upsampling an image to a larger size changes the content's scale together with the positions; a larger canvas with
the item drawn at the same pixel size changes only the field of view (how many positions there are, and where the
item sits). `CanvasDataset` wraps a dataset that renders items (`render(index, resolution)`) and places item i at a
random position on an H x W canvas: during training from the global torch RNG (seeded per item by the engine's
loader), at evaluation from a generator seeded by (index, H, W), so every model sees the same canvases.

`fashion-mnist-canvas` registers Fashion-MNIST this way: 28 px garments (the dataset's own augmentation applied to
the item) on a canvas of `resolution` px filled with the images' black. With `item_min` below `item`, training draws
each garment at a random size from `item_min` to `item` px (its scale varies as well as its place); evaluation keeps
`item` px.
"""

from __future__ import annotations

import torch
from torch.utils.data import Dataset

from ..registry import register_dataset
from . import fashion_mnist as fm

__all__ = ["place", "canvas_offset", "OnCanvas", "CanvasDataset", "fashion_mnist_canvas"]


def place(item: torch.Tensor, canvas: tuple[int, int], top: int, left: int, fill: float) -> torch.Tensor:
    """`item` [C, h, w] pasted at (top, left) onto a [C, H, W] canvas of `fill`."""
    c, h, w = item.shape
    H, W = canvas
    if not (0 <= top <= H - h and 0 <= left <= W - w):
        raise ValueError(f"a {h} x {w} item at ({top}, {left}) does not fit a {H} x {W} canvas")
    out = item.new_full((c, H, W), fill)
    out[:, top : top + h, left : left + w] = item
    return out


def canvas_offset(
    item: tuple[int, int], canvas: tuple[int, int], generator: torch.Generator | None = None
) -> tuple[int, int]:
    """A uniform random (top, left) at which an item fits inside the canvas."""
    top = torch.randint(0, canvas[0] - item[0] + 1, (), generator=generator).item()
    left = torch.randint(0, canvas[1] - item[1] + 1, (), generator=generator).item()
    return int(top), int(left)


class OnCanvas(Dataset):
    """The items of `base` (a dataset that renders them at a chosen size), each placed on a canvas of `fill`: at a
    random place in training, at one seeded by the item (and `seed`) in evaluation. Its classes are the base's."""

    def __init__(self, base: Dataset, fill: float, training: bool, seed: int = 0):
        if not callable(getattr(base, "render", None)):
            raise TypeError(f"{type(base).__name__} cannot render items at a chosen size; a canvas needs render()")
        self.base, self.fill, self.training, self.seed = base, float(fill), training, int(seed)
        self.num_classes = getattr(base, "num_classes", None)
        self.classes = getattr(base, "classes", None)

    def __len__(self) -> int:
        return len(self.base)


class CanvasDataset(OnCanvas):
    """Items of `base` rendered at `item_size` px and placed on canvases; `render(i, R)` gives an R x R canvas,
    `render_canvas(i, (H, W))` any canvas, `[i]` the canvas of `resolution` px. `item_min`: in training, each item at
    a random size from `item_min` to `item_size` px (global torch RNG); evaluation draws `item_size` px."""

    def __init__(
        self,
        base: Dataset,
        item_size: int,
        resolution: int,
        fill: float,
        training: bool,
        seed: int = 0,
        item_min: int | None = None,
    ):
        super().__init__(base, fill, training, seed)
        if resolution < item_size:
            raise ValueError(f"the canvas ({resolution} px) must be at least the item size ({item_size} px)")
        item_min = item_size if item_min is None else int(item_min)
        if not 1 <= item_min <= item_size:
            raise ValueError(
                f"item_min (the smallest training item) must be from 1 to the item size {item_size} px, got {item_min}"
            )
        self.item_size, self.resolution, self.item_min = int(item_size), int(resolution), item_min

    def render_canvas(self, index: int, size: tuple[int, int]) -> tuple[torch.Tensor, int]:
        h, w = size
        if h < self.item_size or w < self.item_size:
            raise ValueError(
                f"a field-of-view canvas of {h} x {w} px cannot hold the {self.item_size} px item; evaluate at "
                f"sizes of at least {self.item_size} px"
            )
        size = self.item_size
        if self.training and self.item_min < size:  # a random scale, then a random place
            size = int(torch.randint(self.item_min, size + 1, ()).item())
        item, target = self.base.render(index, size)
        g = None
        if not self.training:  # the same canvas for every model and run
            g = torch.Generator().manual_seed(((self.seed * 1_000_003 + index) * 4099 + h) * 4099 + w)
        top, left = canvas_offset(tuple(item.shape[-2:]), (h, w), g)
        return place(item, (h, w), top, left, self.fill), target

    def render(self, index: int, resolution: int) -> tuple[torch.Tensor, int]:
        return self.render_canvas(index, (resolution, resolution))

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return self.render(index, self.resolution)


def _canvas_augmentation(options: dict, aug: dict) -> str:
    garment = fm.garment_augmentation({"shift": 0, **options}, aug)
    item, smallest = options.get("item", 28), options.get("item_min")
    scale = f" and a random size of {smallest}-{item} px" if smallest is not None and smallest < item else ""
    return f"the garment at a random position{scale} on the canvas" + ("" if garment == "none" else f"; {garment}")


@register_dataset("fashion-mnist-canvas", num_classes=10, in_chans=1, kind="image", augmentation=_canvas_augmentation)
def fashion_mnist_canvas(
    split: str = "train",
    resolution: int = 32,
    root: str | None = None,
    training: bool = False,
    item: int = 28,
    shift: int = 0,
    num_train: int | None = None,
    num_val: int | None = None,
    crop: str = "shift",
    aug: dict | None = None,
    item_min: int | None = None,
) -> CanvasDataset:
    """Fashion-MNIST garments of `item` px at random positions on a `resolution` px canvas (the placement is the
    translation augmentation; `shift`/`crop`/flips act on the item as in `fashion-mnist`); `item_min` < `item`:
    training garments at a random size from `item_min` to `item` px, so they train with background around them."""
    base = fm.fashion_mnist(
        split, item, root, training=training, shift=shift, num_train=num_train, num_val=num_val, crop=crop, aug=aug
    )
    return CanvasDataset(base, item, resolution, fill=fm.BLACK, training=training, item_min=item_min)
