"""timm's own NaFlex loader as the training loader of `data.native.loader=timm` (padded batches only).

`timm.data.create_naflex_loader` draws a sequence length per batch from `seq_lens` (or the one `max_tokens`), resizes
with its `RandomResizedCropToSequence` (aug.scale / aug.ratio / aug.hflip / aug.color_jitter) and pads every image
to the batch's length with its NaFlexCollator. Our datasets give normalised tensors, so timm's normalisation is
the identity (mean 0, std 1). A dataset with `native_item` (an image folder, whose items are squares of the
square route) gives timm each image whole at its own size instead. Its batches become NativeBatch; `start_at`
skips batches by reading them (timm's augmentation draws from the process's RNG, so a mid-epoch resume gets the
right images, not the same crops, and warns: `TimmResumeWarning`). Each worker process draws its own crops, so the
worker count (data.workers) changes the trained model on this route (a resume refuses a changed count, changes.py).
"""

from __future__ import annotations

import warnings

from timm.data import create_naflex_loader
from torch.utils.data import Dataset

from .collate import NativeBatch
from .plan import NativePlan

__all__ = ["TimmNaflexBatches", "TimmResumeWarning"]


class TimmResumeWarning(UserWarning):
    """A run on timm's NaFlex loader resumed mid-epoch: the rest of the epoch gets other crops than it would have."""


class _NativeItems(Dataset):
    """A dataset's `native_item`s: each image whole at its own size, for timm to crop."""

    def __init__(self, dataset: Dataset):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int):
        return self.dataset.native_item(index)


class TimmNaflexBatches:
    """Iterates NativeBatch from timm's NaFlex loader; set_epoch / start_at / num_batches as our samplers."""

    def __init__(self, dataset: Dataset, plan: NativePlan, aug: dict, seed: int, workers: int, rank: int, world: int):
        if not plan.sampler.naflex:
            raise ValueError("data.native.loader=timm pads every image to its batch's length: use mode=padded")
        if callable(getattr(dataset, "native_item", None)):
            dataset = _NativeItems(dataset)
        channels = int(dataset[0][0].shape[0])
        self.loader = create_naflex_loader(
            dataset,
            patch_size=plan.patch,
            train_seq_lens=plan.budgets,
            max_seq_len=max(plan.budgets),
            batch_size=max(1, plan.tokens_per_batch // max(plan.budgets)),
            is_training=True,
            scale=tuple(aug.get("scale", (0.08, 1.0))),
            ratio=tuple(aug.get("ratio", (3 / 4, 4 / 3))),
            hflip=float(aug.get("hflip", 0.5)),
            color_jitter=float(aug.get("color_jitter", 0.0)),
            interpolation="bilinear",
            mean=(0.0,) * channels,
            std=(1.0,) * channels,
            channels=channels,
            num_workers=workers,
            distributed=world > 1,
            rank=rank,
            world_size=world,
            seed=seed,
            use_prefetcher=False,
            pin_memory=False,
        )
        self.batch_sampler = self  # what the trainer steers (loader.epoch_batches)
        self.start, self.rank = 0, rank

    def set_epoch(self, epoch: int) -> None:
        self.loader.dataset.set_epoch(epoch)

    def start_at(self, batch: int) -> None:
        self.start = batch
        if batch and self.rank == 0:
            warnings.warn(
                f"data.native.loader=timm resumed at batch {batch} of an epoch: timm's loader draws its crops from "
                f"each process's RNG, so the rest of this epoch sees the same images with other crops (not "
                f"bit-identical to an uninterrupted run; data.native.loader=visionpe resumes exactly)",
                TimmResumeWarning,
                stacklevel=2,
            )

    def num_batches(self) -> int:
        return len(self.loader.dataset)

    def __len__(self) -> int:
        return max(self.num_batches() - self.start, 0)

    def __iter__(self):
        for b, (inputs, targets) in enumerate(self.loader):
            if b < self.start:
                continue
            inputs = {k: v for k, v in inputs.items() if k != "seq_len"}
            valid = inputs["patch_valid"]
            yield NativeBatch(inputs, targets, None, (), int(valid.sum()), valid.numel(), len(targets))
