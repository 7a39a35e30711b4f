"""Images drawn at the size a native-aspect key names, as patches: what a dataset offers and how it is read.

A dataset serves native-aspect batches through, in order of preference:
- `native_size(index) -> (h, w)` and `render_size(index, (H, W)) -> (image, target)` (draw item i at any size);
- `render(index, R)` alone: square items, drawn at the square size the budget gives;
- plain (image [C, h, w], target) items, all of the first item's size, resized to the budget's size.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.utils.data import Dataset

from ..seeding import preserved_rngs, seed_rngs
from .resize import patchify, resize_hw
from .sampler import NativeKey

__all__ = ["native_sizes", "NativeDataset"]


def native_sizes(dataset: Dataset, resolution: int) -> Callable[[int], tuple[int, int]]:
    """index -> the item's native (h, w): the dataset's `native_size`, else `resolution` square for datasets that
    render any size, else the first item's size."""
    if callable(getattr(dataset, "native_size", None)):
        return dataset.native_size
    if callable(getattr(dataset, "render", None)):
        size = (int(resolution), int(resolution))
    else:
        first = dataset[0][0]
        if not isinstance(first, torch.Tensor) or first.ndim != 3:
            raise ValueError(
                f"native-aspect batches take image tensors [C, H, W]; {type(dataset).__name__} gives "
                f"{type(first).__name__} inputs (use data.native.loader=timm for PIL image datasets)"
            )
        size = (int(first.shape[-2]), int(first.shape[-1]))
    return lambda index: size


class NativeDataset(Dataset):
    """NativeKey -> (patch dict of timm's Patchify, target, key), or (image, target, key) when `patch` is None;
    items seeded per key, the global RNGs kept."""

    def __init__(self, dataset: Dataset, patch: int | None):
        self.dataset, self.patch = dataset, patch
        self.render_size = getattr(dataset, "render_size", None)
        self.render = getattr(dataset, "render", None)

    def __len__(self) -> int:
        return len(self.dataset)

    def _draw(self, key: NativeKey):
        H, W = key.size
        if self.render_size is not None:
            return self.render_size(key.index, (H, W))
        if self.render is not None and H == W:
            return self.render(key.index, H)
        return self.dataset[key.index]

    def _item(self, key: NativeKey):
        if key.seed is not None:
            seed_rngs(key.seed)
        image, target = self._draw(key)
        if not isinstance(image, torch.Tensor) or image.ndim != 3:
            got = f"a tensor of shape {list(image.shape)}" if isinstance(image, torch.Tensor) else type(image).__name__
            raise TypeError(f"native-aspect items must be images [C, H, W], got {got}")
        image = resize_hw(image, key.size)
        return (patchify(image, self.patch) if self.patch else image), target, key

    def __getitem__(self, key: NativeKey):
        return self.__getitems__([key])[0]

    def __getitems__(self, keys: list[NativeKey]) -> list:
        if all(k.seed is None for k in keys):
            return [self._item(k) for k in keys]
        with preserved_rngs():
            return [self._item(k) for k in keys]
