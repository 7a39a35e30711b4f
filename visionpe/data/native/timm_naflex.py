"""timm's own NaFlex loader as the training loader of `data.native.loader=timm` (padded batches only).

`timm.data.create_naflex_loader` draws a sequence length per batch from `seq_lens` (or the one `max_tokens`), crops
with its `RandomResizedCropToSequence` (aug.scale / aug.ratio / aug.hflip) and pads every image to the batch's length
with its NaFlexCollator. A dataset with `native_item` (an image folder) gives timm each image whole, as the decoded
PIL image, so timm's whole training pipeline applies as it does for timm's own folders: crop, flip, colour jitter,
auto-augment, the folder's normalisation (aug.mean / aug.std or the model's) and random erasing. Our other datasets
give normalised tensors (their own augmentation already applied): timm crops, flips and erases them with the
identity normalisation, and colour options are refused (timm's jitter clips a tensor to [0, 1], auto-augment needs
PIL images). Its batches become NativeBatch; `start_at` skips batches by reading them (timm's augmentation draws
from the process's RNG, so a mid-epoch resume gets the right images, not the same crops, and warns:
`TimmResumeWarning`). Each worker process draws its own crops, so the worker count (data.workers) changes the
trained model on this route (a resume refuses a changed count, changes.py).
"""

from __future__ import annotations

import warnings

from timm.data import create_naflex_loader
from torch.utils.data import Dataset

from .collate import NativeBatch
from .plan import NativePlan

__all__ = ["TimmNaflexBatches", "TimmResumeWarning", "naflex_augmentation", "naflex_transform_kwargs"]

COLOUR_OPTIONS = ("color_jitter", "auto_augment")  # timm's PIL-image options: wrong or failing on normalised tensors


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
        options = naflex_transform_kwargs(dataset, aug)
        self.loader = create_naflex_loader(
            _NativeItems(dataset) if _whole_images(dataset) else dataset,
            patch_size=plan.patch,
            train_seq_lens=plan.budgets,
            max_seq_len=max(plan.budgets),
            batch_size=max(1, plan.tokens_per_batch // max(plan.budgets)),
            is_training=True,
            **options,
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


def _whole_images(dataset: Dataset) -> bool:
    """Whether the dataset gives timm each image whole (`native_item`: an image folder's decoded images)."""
    return callable(getattr(dataset, "native_item", None))


def naflex_transform_kwargs(dataset: Dataset, aug: dict) -> dict:
    """create_naflex_loader's augmentation and normalisation arguments for `dataset` and the aug section: a folder's
    whole PIL images get every aug setting and the folder's mean / std / interpolation; normalised tensors get the
    crop, flips and erasing with the identity normalisation, and a colour option is a ValueError."""
    crops = dict(
        scale=tuple(aug.get("scale") or (0.08, 1.0)),
        ratio=tuple(aug.get("ratio") or (3 / 4, 4 / 3)),
        hflip=float(aug.get("hflip", 0.5)),
        re_prob=float(aug.get("re_prob") or 0.0),
    )
    if _whole_images(dataset):
        folder = dataset.transform_kwargs  # the square route's timm arguments: the same normalisation
        colour = dict(color_jitter=float(aug.get("color_jitter") or 0.0), auto_augment=aug.get("auto_augment"))
        norm = dict(mean=tuple(folder["mean"]), std=tuple(folder["std"]), interpolation=folder["interpolation"])
        return crops | colour | norm | dict(channels=3)
    refused = [k for k in COLOUR_OPTIONS if aug.get(k)]
    if refused:
        off = " and ".join(f"aug.{k}={'0' if k == 'color_jitter' else 'null'}" for k in refused)
        raise ValueError(
            f"data.native.loader=timm: {', '.join(f'aug.{k}={aug[k]}' for k in refused)} cannot apply to "
            f"{type(dataset).__name__}'s items, which are normalised tensors (timm's colour jitter clips them to "
            f"[0, 1]; auto-augment needs PIL images). Set {off}, or use data.native.loader=visionpe"
        )
    channels = int(dataset[0][0].shape[0])
    identity = dict(mean=(0.0,) * channels, std=(1.0,) * channels, interpolation="bilinear", channels=channels)
    return crops | dict(color_jitter=0.0) | identity


def naflex_augmentation(whole_images: bool, dataset_words: str, aug: dict) -> str:
    """What timm's NaFlex loader does to the training items, in words: to a folder's whole images (whole_images), or
    after the dataset's own augmentation (`dataset_words`) to its normalised tensors."""
    ratio = [round(r, 2) for r in aug.get("ratio") or (3 / 4, 4 / 3)]
    crops = (
        f"timm's NaFlex crops (area {list(aug.get('scale') or (0.08, 1.0))}, aspect {ratio}) sized to each batch's "
        f"sequence length and flips (p={aug.get('hflip', 0.5)})"
    )
    options = COLOUR_OPTIONS + ("re_prob",) if whole_images else ("re_prob",)
    extra = [f"{k}={aug[k]}" for k in options if aug.get(k)]
    crops += f", {', '.join(extra)}" if extra else ""
    if whole_images:
        return crops + " of each image whole"
    return crops if dataset_words == "none" else f"{dataset_words}, then {crops}"
