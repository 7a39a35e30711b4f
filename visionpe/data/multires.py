"""Batches at a resolution of their own: a batch sampler that picks one resolution per batch, and a collate that
brings every item of a batch to it (ResFormer / ViTAR-style multi-resolution training; a list of one resolution is
plain fixed-size training).

The sampler yields keys `(index, resolution, item_seed)`; `KeyedDataset` (loader.py) turns a key into an item, rendered
natively at that resolution when the dataset can (`render(index, resolution)`), otherwise resized here. Everything the
sampler decides (order, resolutions, per-item augmentation seeds) is a function of (seed, epoch, position), so an
epoch can be restarted at any batch (`start_at`) and give the same batches, whatever the number of workers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch.utils.data import Sampler
from torch.utils.data._utils.collate import default_collate

from .seeding import mix_seed

__all__ = [
    "ResolutionBatchSampler",
    "Batch",
    "collate_to_resolution",
    "resize_to",
    "eval_batches",
    "resolution_schedule",
    "patch_size_of_batch",
]


class Batch(NamedTuple):
    inputs: torch.Tensor | dict  # images [B, C, R, R], clips [B, C, T, R, R], or a dict of model kwargs
    targets: torch.Tensor  # [B] class ids
    resolution: int | tuple[int, int]  # a square side, or (height, width)
    skipped: tuple[str, ...]  # unreadable files replaced (training) or left out (evaluation) in this batch


class EpochBatchSampler(Sampler):
    """A batch sampler over an index `sampler` (a DistributedSampler's `set_epoch` is forwarded) that resumes
    mid-epoch: `start_at(b)` skips the epoch's first b batches. Subclasses give `num_batches()` and `__iter__`."""

    sampler: object
    epoch: int = 0
    start: int = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)

    def start_at(self, batch: int) -> None:
        """Skip the first `batch` batches of the epoch (to resume mid-epoch)."""
        self.start = batch

    def num_batches(self) -> int:
        raise NotImplementedError

    def __len__(self) -> int:
        return max(self.num_batches() - self.start, 0)


class ResolutionBatchSampler(EpochBatchSampler):
    """Groups an index sampler into batches of keys, one resolution per batch drawn uniformly from `resolutions`.

    `sampler` may be a DistributedSampler (its `set_epoch` is forwarded); every rank draws the same resolution for the
    same batch position. `seed_items` adds a per-item seed (seed, epoch, index) for the augmentation of that item.
    """

    def __init__(
        self,
        sampler,
        batch_size: int,
        resolutions: Sequence[int],
        drop_last: bool = True,
        seed: int = 0,
        seed_items: bool = True,
    ):
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        if not resolutions:
            raise ValueError("resolutions must list at least one resolution")
        self.sampler = sampler
        self.batch_size = batch_size
        self.resolutions = [int(r) for r in resolutions]
        self.drop_last = drop_last
        self.seed = seed
        self.seed_items = seed_items
        self.epoch = 0
        self.start = 0

    def num_batches(self) -> int:
        n = len(self.sampler)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def schedule(self) -> list[int]:
        """The resolution of every batch of the current epoch."""
        return resolution_schedule(self.resolutions, self.seed, self.epoch, self.num_batches())

    def __iter__(self) -> Iterator[list[tuple[int, int, int | None]]]:
        indices = list(self.sampler)
        schedule = self.schedule()
        for b in range(self.start, self.num_batches()):
            res = schedule[b]
            chunk = indices[b * self.batch_size : (b + 1) * self.batch_size]
            yield [(i, res, mix_seed(self.seed, self.epoch, i) if self.seed_items else None) for i in chunk]


def resolution_schedule(resolutions: Sequence[int], seed: int, epoch: int, num_batches: int) -> list[int]:
    """The resolution of each of an epoch's batches, drawn uniformly from `resolutions` as a function of (seed,
    epoch): every process and loader (index-based or streaming) gets the same resolution at the same position."""
    resolutions = [int(r) for r in resolutions]
    if len(resolutions) == 1:
        return resolutions * num_batches
    g = torch.Generator().manual_seed(mix_seed(seed, epoch, 0x5E5))
    picks = torch.randint(len(resolutions), (num_batches,), generator=g)
    return [resolutions[i] for i in picks.tolist()]


def eval_batches(indices: Sequence[int], batch_size: int, resolution: int) -> list[list[tuple[int, int, None]]]:
    """Fixed, ordered batches of keys for evaluation."""
    idx = list(indices)
    return [[(i, resolution, None) for i in idx[s : s + batch_size]] for s in range(0, len(idx), batch_size)]


def resize_to(x: torch.Tensor, size: int | tuple[int, int]) -> torch.Tensor:
    """Resize the last two dims of an image [C, H, W] or clip [C, T, H, W] to size x size (or height x width; bilinear,
    antialiased when shrinking)."""
    h, w = (size, size) if isinstance(size, int) else size
    if x.shape[-2:] == (h, w):
        return x
    if x.ndim not in (3, 4):
        raise ValueError(f"can only resize images [C, H, W] or clips [C, T, H, W], got shape {tuple(x.shape)}")
    flat = x.reshape(-1, 1, *x.shape[-2:]) if x.ndim == 4 else x[None]
    shrink = h < x.shape[-2] or w < x.shape[-1]
    out = F.interpolate(flat.float(), size=(h, w), mode="bilinear", align_corners=False, antialias=shrink).to(x.dtype)
    return out.reshape(*x.shape[:-2], h, w)


def collate_to_resolution(items: list[tuple], collate_inputs: Callable | None = None) -> Batch:
    """Items (input, target, resolution or (height, width), skipped) -> a Batch at the batch's size. Dict inputs are
    collated by the dataset's `collate_inputs(list_of_dicts)` when it has one (e.g. to pad text), else by
    default_collate. Items whose input is None (unreadable files of an evaluation split) are left out; if none is
    left, the Batch has inputs None and no targets."""
    skipped = tuple(p for item in items for p in item[3])
    res = items[0][2]
    items = [item for item in items if item[0] is not None]
    if not items:
        return Batch(None, torch.zeros(0, dtype=torch.long), res, skipped)
    inputs, targets, _, _ = zip(*items)
    if isinstance(inputs[0], torch.Tensor):
        stacked = torch.stack([resize_to(x, res) for x in inputs])
    elif isinstance(inputs[0], dict):
        stacked = collate_inputs(list(inputs)) if collate_inputs else default_collate(list(inputs))
    else:
        raise TypeError(
            f"dataset items must be (tensor, target) or (dict of model kwargs, target), got {type(inputs[0]).__name__}"
        )
    target = torch.as_tensor(targets) if not isinstance(targets[0], torch.Tensor) else torch.stack(targets)
    return Batch(stacked, target, res, skipped)


_PATCH_SALT = 0xF1E7  # keeps the patch draw apart from the resolution draw of the same batch


def patch_size_of_batch(patch_sizes: Sequence[int], seed: int, epoch: int, batch: int) -> int:
    """The patch size of batch `batch` of epoch `epoch`, uniform over patch_sizes (`data.patch_sizes`, FlexiViT): a
    function of (seed, epoch, batch position), so a resumed run draws what the uninterrupted one drew."""
    if len(patch_sizes) == 1:
        return int(patch_sizes[0])
    g = torch.Generator().manual_seed(mix_seed(seed, epoch, batch, _PATCH_SALT))
    return int(patch_sizes[int(torch.randint(len(patch_sizes), (1,), generator=g))])
